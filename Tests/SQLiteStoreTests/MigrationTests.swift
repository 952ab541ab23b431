import Dispatch
import Foundation
import SQLiteStore
import SystemSupport
import Testing

@Suite struct MigrationTests {
    let directory = TemporaryDirectory()

    struct SchemaObject: FetchableRecord, Equatable, CustomStringConvertible {
        var type: String
        var name: String
        var table: String
        var sql: String?
        init(row: Row) throws {
            type = try row["type"]
            name = try row["name"]
            table = try row["tbl_name"]
            sql = try row["sql"]
        }
        var description: String { "\(type) \(name): \(sql ?? "-")" }
    }

    func schema(_ store: DatabaseQueue) throws -> [SchemaObject] {
        try store.read { db in
            try db.fetchAll(
                SchemaObject.self, "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
        }
    }

    func recorded(_ store: DatabaseQueue) throws -> [String] {
        try store.read { db in try db.fetchValues(String.self, "SELECT name FROM schema_migrations ORDER BY rowid") }
    }

    @Test func freshAndStepByStepDatabasesEndWithTheSameSchema() throws {
        let migrator = testMigrator()
        let fresh = try DatabaseQueue(path: directory.file("fresh.db"), migrator: migrator)

        let stepPath = directory.file("steps.db")
        for count in 1...migrator.migrationNames.count {
            let store = try DatabaseQueue(path: stepPath, migrator: migrator.prefix(count))
            #expect(try recorded(store) == Array(migrator.migrationNames.prefix(count)))
        }
        let stepped = try DatabaseQueue(path: stepPath, migrator: migrator)
        let freshSchema = try schema(fresh)
        #expect(freshSchema.count == 6)  // schema_migrations + its pk index, 3 tables, items_by_name
        #expect(freshSchema.contains { $0.name == "versions" })
        #expect(try schema(stepped) == freshSchema)
        #expect(try recorded(stepped) == migrator.migrationNames)
    }

    @Test func reopeningAppliesNothingTwice() throws {
        let path = directory.file("test.db")
        var counting = DatabaseMigrator()
        let runs = ManagedCounter()
        counting.registerMigration("one") { db in
            runs.increment()
            try db.execute("CREATE TABLE t (x)")
        }
        _ = try DatabaseQueue(path: path, migrator: counting)
        _ = try DatabaseQueue(path: path, migrator: counting)
        #expect(runs.value == 1)
    }

    /// Two first starts of an app at once (reading-list in two shells) open the same new
    /// database together: each migration runs once, and every open succeeds.
    @Test func openingANewDatabaseFromManyConnectionsAtOnceAppliesEachMigrationOnce() throws {
        for round in 0..<10 {
            let path = directory.file("race-\(round).db")
            var counting = DatabaseMigrator()
            let runs = ManagedCounter()
            counting.registerMigration("one") { db in
                runs.increment()
                // Slow, as a first migration's fsyncs are: the others read what is applied meanwhile.
                usleep(20_000)
                try db.execute("CREATE TABLE t (x)")
            }
            counting.registerMigration("two") { db in
                runs.increment()
                usleep(20_000)
                try db.execute("CREATE TABLE u (y)")
            }
            let migrator = counting
            let failures = Locked<[String]>([])
            let start = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for _ in 0..<6 {
                group.enter()
                Thread {
                    start.wait()
                    do {
                        _ = try DatabaseQueue(path: path, migrator: migrator)
                    } catch {
                        failures.withLock { $0.append("\(error)") }
                    }
                    group.leave()
                }.start()
            }
            for _ in 0..<6 { start.signal() }
            group.wait()
            #expect(failures.value.isEmpty, "round \(round): \(failures.value)")
            #expect(runs.value == 2, "round \(round): \(runs.value) migration runs")
        }
    }

    @Test func aFailingMigrationIsRolledBackAndNotRecorded() throws {
        let path = directory.file("test.db")
        var migrator = testMigrator().prefix(1)
        migrator.registerMigration("broken") { db in
            try db.execute("CREATE TABLE half (x)")
            try db.execute("THIS IS NOT SQL")
        }
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: migrator) }
        #expect(error.sql == "THIS IS NOT SQL")
        let store = try DatabaseQueue(path: path, migrator: testMigrator().prefix(1))
        #expect(try recorded(store) == ["create accounts"])
        #expect(try schema(store).contains { $0.name == "half" } == false)
    }

    @Test func aNewerSchemaIsRefusedAndNothingIsTouched() throws {
        let path = directory.file("test.db")
        var newer = testMigrator()
        newer.registerMigration("from the future") { db in try db.execute("CREATE TABLE future (x)") }
        do {
            let store = try DatabaseQueue(path: path, migrator: newer)
            try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (1, 7)") }
        }
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let error = try #require(throws: DatabaseError.self) {
            try DatabaseQueue(path: path, migrator: testMigrator())
        }
        #expect(error.code == .newerSchema)
        #expect(error.description.contains(path))
        #expect(error.description.contains("from the future"))
        #expect(error.description.contains("newer version of ProviderFS"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        // The newer build still opens it with its data intact.
        let store = try DatabaseQueue(path: path, migrator: newer)
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT balance FROM accounts") } == 7)
    }

    @Test func aReorderedMigrationListIsRefused() throws {
        let path = directory.file("test.db")
        _ = try DatabaseQueue(path: path, migrator: testMigrator().prefix(1))
        var reordered = DatabaseMigrator()
        reordered.registerMigration("inserted first") { _ in }
        reordered.registerMigration("create accounts") { _ in }
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: reordered) }
        #expect(error.code == .migrationMismatch)
    }

    @Test func aForeignSQLiteDatabaseIsRefusedAndNothingIsTouched() throws {
        let path = directory.file("other-app.db")
        do {
            let other = try DatabaseQueue(path: path)  // no migrations: creates only schema_migrations
            try other.write { db in
                try db.execute("DROP TABLE schema_migrations")
                try db.execute("CREATE TABLE notes (body TEXT)")
                try db.execute("INSERT INTO notes VALUES (?)", ["precious"])
            }
        }
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: testMigrator()) }
        #expect(error.code == .migrationMismatch)
        #expect(error.description.contains("not created by ProviderFS"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
    }
}

/// A thread-safe counter for migration closures (which are @Sendable).
final class ManagedCounter: Sendable {
    private let count = Locked(0)
    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.value }
}
