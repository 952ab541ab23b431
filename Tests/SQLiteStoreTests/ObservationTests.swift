import Foundation
import SQLiteStore
import SystemSupport
import TestScheduling
import Testing

@Suite(.blockingThreads) struct ObservationTests {
    let directory = TemporaryDirectory()

    final class Recorder: Sendable {
        private let changes = Locked<[Set<String>]>([])
        func record(_ tables: Set<String>) { changes.withLock { $0.append(tables) } }
        var value: [Set<String>] { changes.value }
    }

    @Test func committedWritesReportChangedTablesAndRollbacksReportNothing() throws {
        let store = try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
        let all = Recorder()
        let itemsOnly = Recorder()
        store.observe { all.record($0) }
        store.observe(tables: ["items"]) { itemsOnly.record($0) }

        try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1]) }
        try store.write { db in
            try db.insert(Item(id: 1, name: "a"))
            // WITHOUT ROWID table: not seen by sqlite3_update_hook, seen by the authorizer.
            try db.execute("INSERT INTO versions (item_id, version) VALUES (?, ?)", [1, "v1"])
        }
        struct Boom: Error {}
        _ = try? store.write { db in
            try db.execute("DELETE FROM accounts")
            throw Boom()
        }
        // A statement that matches no row changes nothing.
        try store.write { db in try db.execute("UPDATE accounts SET balance = 2 WHERE id = ?", [99]) }
        // A cascading delete reports the child table too; a truncating DELETE (no WHERE) is seen.
        try store.write { db in try db.execute("DELETE FROM items") }
        store.waitForObservers()

        #expect(all.value == [["accounts"], ["items", "versions"], ["items", "versions"]])
        #expect(itemsOnly.value == [["items", "versions"], ["items", "versions"]])
    }

    @Test func cancelledObserversAreNotCalled() async throws {
        let store = try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
        let recorder = Recorder()
        let observation = store.observe { recorder.record($0) }
        try await store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1]) }
        store.waitForObservers()
        observation.cancel()
        try await store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [2, 1]) }
        store.waitForObservers()
        #expect(recorder.value == [["accounts"]])
    }

    @Test func anObserverMayReadTheStore() throws {
        let store = try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
        let seen = Locked<[Int64]>([])
        store.observe { _ in
            let count = try? store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts") }
            seen.withLock { $0.append(count ?? -1) }
        }
        try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1]) }
        store.waitForObservers()
        #expect(seen.value == [1])
    }
}
