import Foundation
import TestScheduling
import Testing

@testable import SQLiteStore

/// A read sees one snapshot however its statements run (D-161): its first query runs without
/// BEGIN, so these tests commit from another thread at each point where a read without that
/// care would see the commit, and check that it does not.
@Suite(.blockingThreads) struct SnapshotTests {
    let directory = TemporaryDirectory()

    func makeStore() throws -> DatabaseQueue {
        let store = try DatabaseQueue(path: directory.file("snapshot.db"), migrator: testMigrator())
        try store.write { db in
            for id in 1...3 { try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [id, 100]) }
        }
        return store
    }

    /// Runs `change` in a write transaction on another thread and returns once it has committed.
    /// The calling thread may be inside a read: in WAL mode the writer does not wait for it.
    func commitElsewhere(_ store: DatabaseQueue, _ change: @escaping @Sendable (Database) throws -> Void) {
        let committed = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            do {
                try store.write(change)
            } catch {
                Issue.record(error)
            }
            committed.signal()
        }
        committed.wait()
    }

    func balance(_ db: Database, _ id: Int) throws -> Int64? {
        try db.fetchValue(Int64.self, "SELECT balance FROM accounts WHERE id = ?", [id])
    }

    @Test func aCommitAfterTheFirstRowIsNotSeenByLaterStatements() throws {
        let store = try makeStore()
        let seen = try store.read { db in
            let first = try balance(db, 1)  // one row: runs without BEGIN and holds the snapshot
            commitElsewhere(store) { db in
                try db.execute("UPDATE accounts SET balance = balance - 30 WHERE id = ?", [1])
                try db.execute("UPDATE accounts SET balance = balance + 30 WHERE id = ?", [2])
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [4, 5])
            }
            return [first, try balance(db, 2), try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts")]
        }
        #expect(seen == [100, 100, 300])
        // The next read (same thread, so the same reader connection) sees the commit: the
        // statement that held the snapshot was reset when the read ended.
        #expect(try store.read { db in try balance(db, 1) } == 70)
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts") } == 305)
    }

    @Test func aCommitAfterAnEmptyFirstQueryIsNotSeenByLaterStatements() throws {
        let store = try makeStore()
        let seen = try store.read { db in
            let missing = try balance(db, 9)  // no row: its own read transaction has already ended
            commitElsewhere(store) { db in
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [9, 1])
            }
            return (missing, try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts"), try balance(db, 9))
        }
        #expect(seen.0 == nil)
        #expect(seen.1 == 3)
        #expect(seen.2 == nil)
        #expect(try store.read { db in try balance(db, 9) } == 1)
    }

    /// The rare case: a commit lands between the moment the first query found nothing and the
    /// moment the read takes its snapshot. The query runs again in that snapshot, so what the
    /// closure sees still belongs to one state of the database.
    @Test func aCommitBeforeAnEmptyResultIsConfirmedRunsTheQueryAgain() throws {
        let store = try makeStore()
        let seen = try store.read { db in
            db.afterEmptyFirstQuery = {
                commitElsewhere(store) { db in
                    try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [9, 1])
                }
            }
            let found = try balance(db, 9)
            return (found, try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts"))
        }
        #expect(seen.0 == 1)
        #expect(seen.1 == 4)
        // A commit that does not touch the query's rows: the query runs again and still finds
        // nothing, and later statements see the same (new) state.
        let unrelated = try store.read { db in
            db.afterEmptyFirstQuery = {
                commitElsewhere(store) { db in try db.execute("UPDATE accounts SET balance = 0 WHERE id = ?", [1]) }
            }
            return (try balance(db, 8), try balance(db, 1))
        }
        #expect(unrelated.0 == nil)
        #expect(unrelated.1 == 0)
    }

    @Test func aCommitBetweenRowsOfTheFirstQueryIsNotSeen() throws {
        let store = try makeStore()
        let seen = try store.read { db in
            var balances: [Int64] = []
            try db.forEachRow("SELECT balance FROM accounts ORDER BY id") { row in
                balances.append(try row[0])
                if balances.count == 1 {
                    commitElsewhere(store) { db in try db.execute("UPDATE accounts SET balance = 0") }
                }
            }
            return (balances, try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts"))
        }
        #expect(seen.0 == [100, 100, 100])
        #expect(seen.1 == 300)
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts") } == 0)
    }

    @Test func aReadThatThrowsLeavesNoSnapshotBehind() throws {
        let store = try makeStore()
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try store.read { db in
                _ = try balance(db, 1)
                throw Stop()
            }
        }
        #expect(throws: Stop.self) {
            try store.read { db in
                _ = try balance(db, 1)
                _ = try balance(db, 2)  // now inside BEGIN … rolled back on throw
                throw Stop()
            }
        }
        try store.write { db in try db.execute("UPDATE accounts SET balance = 1 WHERE id = ?", [1]) }
        #expect(try store.read { db in try balance(db, 1) } == 1)
    }

    /// Statements other than plain queries still run inside a transaction, as before D-161.
    @Test func aReadStartingWithAnythingButAQueryRunsInATransaction() throws {
        let store = try makeStore()
        let inTransaction = try store.read { db in
            try db.execute("PRAGMA cache_size = -4000")
            return try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts")
        }
        #expect(inTransaction == 3)
    }
}
