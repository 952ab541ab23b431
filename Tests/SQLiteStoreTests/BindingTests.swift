import Foundation
import SQLiteStore
import Testing

@Suite struct BindingTests {
    let directory = TemporaryDirectory()

    func makeStore() throws -> DatabaseQueue {
        try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
    }

    @Test func everyTypeRoundTrips() throws {
        let store = try makeStore()
        let date = Date(timeIntervalSince1970: 1_700_000_000.25)
        let values: [(any DatabaseValueConvertible, DatabaseValue)] = [
            (Int64.max, .integer(Int64.max)), (Int64.min, .integer(Int64.min)), (42, .integer(42)),
            (Int32(-7), .integer(-7)), (3.5, .real(3.5)), ("héllo\u{0}wörld", .text("héllo\u{0}wörld")),
            ("", .text("")), (Data([0, 1, 255]), .blob(Data([0, 1, 255]))), (Data(), .blob(Data())),
            (true, .integer(1)), (false, .integer(0)), (date, .real(1_700_000_000.25)), (DatabaseValue.null, .null),
            (String?.none, .null), (Int64?.some(5), .integer(5)),
        ]
        for (value, expected) in values {
            let stored = try store.write { db in
                try db.fetchValue(DatabaseValue.self, "SELECT ?", [value])
            }
            #expect(stored == expected, "binding \(value)")
        }
        // Typed reads back.
        try store.read { (db: Database) throws in
            #expect(try db.fetchValue(Int64.self, "SELECT ?", [Int64.max]) == Int64.max)
            #expect(try db.fetchValue(String.self, "SELECT ?", ["a\u{0}b"]) == "a\u{0}b")
            #expect(try db.fetchValue(Data.self, "SELECT ?", [Data()]) == Data())
            #expect(try db.fetchValue(Bool.self, "SELECT ?", [true]) == true)
            #expect(try db.fetchValue(Date.self, "SELECT ?", [date]) == date)
            #expect(try db.fetchValue(Double.self, "SELECT 2") == 2.0)
            #expect(try db.fetchValue(Int64?.self, "SELECT NULL") == .some(nil))
            #expect(try db.fetchValue(Int64.self, "SELECT 1 WHERE 0") == nil)
        }
    }

    @Test func recordsRoundTripThroughInsertUpsertAndDelete() throws {
        let store = try makeStore()
        let first = Item(
            id: 1, name: "a.txt", size: 10, modified: Date(timeIntervalSince1970: 1_600_000_000.5),
            data: Data("xyz".utf8), pinned: true)
        let second = Item(id: 2, name: "b.txt")
        try store.write { db in
            try db.insert(first)
            try db.insert(second)
        }
        #expect(
            try store.read { db in try db.fetchAll(Item.self, "SELECT * FROM items ORDER BY id") } == [first, second])

        var renamed = second
        renamed.name = "c.txt"
        renamed.size = 99
        try store.write { db in try db.upsert(renamed) }
        #expect(try store.read { db in try db.fetchOne(Item.self, "SELECT * FROM items WHERE id = ?", [2]) } == renamed)

        let deleted = try store.write { db in try db.delete(first) }
        #expect(deleted)
        #expect(try store.read { db in try db.fetchValues(Int64.self, "SELECT id FROM items") } == [2])
        #expect(try store.write { db in try db.delete(first) } == false)
    }

    @Test func duplicateInsertIsAConstraintError() throws {
        let store = try makeStore()
        try store.write { db in try db.insert(Item(id: 1, name: "a")) }
        let error = try #require(throws: DatabaseError.self) {
            try store.write { db in try db.insert(Item(id: 1, name: "again")) }
        }
        #expect(error.resultCode.map { ResultCode.constraint ~= $0 } == true)
        #expect(error.code == .sqlite)
        #expect(error.sql?.contains("INSERT INTO") == true)
    }

    @Test func decodingErrorsNameTheColumn() throws {
        let store = try makeStore()
        try store.write { db in
            try db.execute("INSERT INTO items (id, name, size, pinned) VALUES (1, 'x', NULL, 2)")
        }
        let nullError = try #require(throws: DatabaseError.self) {
            try store.read { db in try db.fetchValue(Int64.self, "SELECT size FROM items") }
        }
        #expect(nullError.code == .decodingFailed)
        #expect(nullError.message.contains("'size'") && nullError.message.contains("NULL"))

        let boolError = try #require(throws: DatabaseError.self) {
            try store.read { db in try db.fetchAll(Item.self, "SELECT * FROM items") }
        }
        #expect(boolError.message.contains("'pinned'") && boolError.message.contains("Bool"))

        let typeError = try #require(throws: DatabaseError.self) {
            try store.read { db in try db.fetchValue(Int64.self, "SELECT name FROM items") }
        }
        #expect(typeError.message.contains("TEXT"))

        let missing = try #require(throws: DatabaseError.self) {
            try store.read { db in
                try db.forEachRow("SELECT id FROM items") { row in _ = try row["nope"] as Int64 }
            }
        }
        #expect(missing.message.contains("no column named 'nope'"))
    }

    @Test func wrongArgumentCountIsAnError() throws {
        let store = try makeStore()
        let error = try #require(throws: DatabaseError.self) {
            try store.read { db in try db.fetchValue(Int64.self, "SELECT ? + ?", [1]) }
        }
        #expect(error.message.contains("2 parameters but 1 arguments"))
    }

    @Test func nestedUseOfTheSameStatementWorks() throws {
        let store = try makeStore()
        try store.write { db in
            for id in 1...3 { try db.insert(Item(id: Int64(id), name: "n\(id)")) }
        }
        let pairs = try store.read { db in
            var pairs: [String] = []
            try db.forEachRow("SELECT id FROM items WHERE id > ? ORDER BY id", [0]) { outer in
                let id: Int64 = try outer[0]
                try db.forEachRow("SELECT id FROM items WHERE id > ? ORDER BY id", [id]) { inner in
                    pairs.append("\(id)<\(try inner[0] as Int64)")
                }
            }
            return pairs
        }
        #expect(pairs == ["1<2", "1<3", "2<3"])
    }
}

/// Seed 002, caveats 3 and 4: a record's setters (custom or named `set…`) are plain value
/// mutations. Nothing intercepts them, and nothing reaches the database until a `write` says so.
@Suite struct RecordValueTests {
    struct Renamable: FetchableRecord, PersistableRecord, Equatable {
        static let databaseTableName = "items"
        var id: Int64
        private(set) var name: String
        var pinned = false
        init(id: Int64, name: String) {
            self.id = id
            self.name = name
        }
        init(row: Row) throws {
            id = try row["id"]
            name = try row["name"]
            pinned = try row["pinned"]
        }
        /// A custom setter with side logic, and a `set…`-named method: both ordinary Swift.
        mutating func setName(_ newName: String) {
            name = newName.trimmingCharacters(in: .whitespaces)
            pinned = true
        }
        func encode(to container: inout PersistenceContainer) {
            container["id"] = id
            container["name"] = name
            container["pinned"] = pinned
        }
    }

    @Test func mutatingAFetchedRecordChangesNothingUntilWritten() throws {
        let directory = TemporaryDirectory()
        let store = try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
        try store.write { db in try db.insert(Renamable(id: 1, name: "old")) }
        var record = try #require(try store.read { db in try db.fetchOne(Renamable.self, "SELECT * FROM items") })
        record.setName("  new  ")
        #expect(record.name == "new" && record.pinned)
        // Mutated on another thread too: it is a value, so there is nothing to protect.
        let copy = record
        let fromThread = DispatchQueue.global().sync {
            var local = copy
            local.setName("thread")
            return local
        }
        #expect(fromThread.name == "thread" && record.name == "new")
        #expect(try store.read { db in try db.fetchOne(Renamable.self, "SELECT * FROM items") }?.name == "old")
        try store.write { db in try db.upsert(record) }
        #expect(try store.read { db in try db.fetchOne(Renamable.self, "SELECT * FROM items") } == record)
    }
}
