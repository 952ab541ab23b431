import Foundation
import SQLiteStore
import TestScheduling
import Testing

@Suite(.blockingThreads) struct TransactionTests {
    let directory = TemporaryDirectory()

    func makeStore() throws -> DatabaseQueue {
        try DatabaseQueue(path: directory.file("test.db"), migrator: testMigrator())
    }

    struct Boom: Error {}

    @Test func writeCommitsAndThrowRollsBack() throws {
        let store = try makeStore()
        try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 100]) }
        #expect(throws: Boom.self) {
            try store.write { db in
                try db.execute("UPDATE accounts SET balance = 0 WHERE id = ?", [1])
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [2, 5])
                throw Boom()
            }
        }
        #expect(try store.read { db in try db.fetchValues(Int64.self, "SELECT balance FROM accounts") } == [100])
        // A failing statement inside the closure also rolls back what came before it.
        #expect(throws: DatabaseError.self) {
            try store.write { db in
                try db.execute("UPDATE accounts SET balance = 1 WHERE id = ?", [1])
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 5])
            }
        }
        #expect(try store.read { db in try db.fetchValues(Int64.self, "SELECT balance FROM accounts") } == [100])
    }

    @Test func asyncReadAndWrite() async throws {
        let store = try makeStore()
        try await store.write { db in
            for id in 1...10 { try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [id, id * 10]) }
        }
        let total = try await store.read { db in try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts") }
        #expect(total == 550)
        await #expect(throws: Boom.self) {
            try await store.write { db in
                try db.execute("DELETE FROM accounts")
                throw Boom()
            }
        }
        #expect(try await store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts") } == 10)
    }

    @Test func aWriteClosureCannotEndTheTransactionItself() throws {
        let store = try makeStore()
        let error = try #require(throws: DatabaseError.self) {
            try store.write { db in
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1])
                try db.execute("ROLLBACK")
            }
        }
        #expect(error.code == .transactionEndedByBody)
        // The store is still usable afterwards.
        try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1]) }
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM accounts") } == 1)
    }

    @Test func aReadClosureCannotWrite() throws {
        let store = try makeStore()
        let error = try #require(throws: DatabaseError.self) {
            try store.read { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 1]) }
        }
        #expect(error.code == .readOnly)
        #expect(error.message.contains("use `write"))
    }

    /// WAL: a reader started before a commit keeps its snapshot and does not wait for the writer.
    @Test func readersDoNotWaitForAWriterAndSeeOneSnapshot() throws {
        let store = try makeStore()
        try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [1, 100]) }
        let writerInside = DispatchSemaphore(value: 0)
        let readerDone = DispatchSemaphore(value: 0)
        let writerFinished = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            try! store.write { db in
                try db.execute("UPDATE accounts SET balance = 0 WHERE id = ?", [1])
                writerInside.signal()
                // Hold the write transaction open until the reader has finished: if readers waited
                // for writers, this would time out instead.
                #expect(readerDone.wait(timeout: .now() + 10) == .success)
            }
            writerFinished.signal()
        }
        writerInside.wait()
        let seen = try store.read { db in try db.fetchValue(Int64.self, "SELECT balance FROM accounts") }
        readerDone.signal()
        #expect(seen == 100)
        writerFinished.wait()
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT balance FROM accounts") } == 0)
    }

    @Test func foreignKeysAreEnforcedAndCascade() throws {
        let store = try makeStore()
        #expect(throws: DatabaseError.self) {
            try store.write { db in try db.execute("INSERT INTO versions (item_id, version) VALUES (?, ?)", [9, "v1"]) }
        }
        try store.write { db in
            try db.insert(Item(id: 1, name: "a"))
            try db.execute("INSERT INTO versions (item_id, version) VALUES (?, ?)", [1, "v1"])
            try db.execute("DELETE FROM items WHERE id = ?", [1])
        }
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM versions") } == 0)
    }

    @Test func connectionSettings() throws {
        let store = try makeStore()
        let settings = try store.write { db in
            (
                try db.fetchValue(String.self, "PRAGMA journal_mode"),
                try db.fetchValue(Int64.self, "PRAGMA synchronous"),
                try db.fetchValue(Int64.self, "PRAGMA foreign_keys"),
                try db.fetchValue(Int64.self, "PRAGMA busy_timeout")
            )
        }
        #expect(settings.0 == "wal")
        #expect(settings.1 == 1)  // NORMAL
        #expect(settings.2 == 1)
        #expect(settings.3 == 5000)
        var configuration = DatabaseQueue.Configuration()
        configuration.synchronous = .full
        let full = try DatabaseQueue(path: directory.file("full.db"), configuration: configuration)
        #expect(try full.write { db in try db.fetchValue(Int64.self, "PRAGMA synchronous") } == 2)
    }

    /// D-533: a store that checkpoints at a few pages keeps its WAL (which every first open in a
    /// process reads back whole) that short; SQLite's default lets it grow to 1,000 pages.
    @Test func theWALIsCheckpointedAtTheConfiguredSize() throws {
        var small = DatabaseQueue.Configuration()
        small.walAutocheckpointPages = 8
        var sizes: [Int] = []
        for (name, configuration) in [("default.db", DatabaseQueue.Configuration()), ("small.db", small)] {
            let store = try DatabaseQueue(
                path: directory.file(name), migrator: testMigrator(), configuration: configuration)
            for id in 1...100 {
                try store.write { db in
                    try db.execute(
                        "INSERT INTO items (id, name, data) VALUES (?, ?, ?)",
                        [Int64(id), "item \(id)", Data(repeating: UInt8(id), count: 1000)])
                }
            }
            // While the store is open: the last connection's close checkpoints and removes it.
            var info = stat()
            sizes.append(stat(directory.file(name) + "-wal", &info) == 0 ? Int(info.st_size) : -1)
            withExtendedLifetime(store) {}
        }
        #expect(sizes[0] > 100 * 4096, "one page or more a commit, none checkpointed")
        #expect(sizes[1] > 0 && sizes[1] < 20 * 4120, "restarted after every 8 pages or so")
    }

    /// D-475: one commit of a NORMAL store made FULL, and the store's own setting back after it,
    /// also when the write throws; a FULL store's writes asked for NORMAL commit with NORMAL.
    @Test func oneWriteCommitsWithItsOwnDurability() throws {
        let store = try makeStore()
        let synchronous = { (db: Database) in try db.fetchValue(Int64.self, "PRAGMA synchronous") }
        #expect(try store.write(synchronous: .full, synchronous) == 2)
        #expect(try store.write(synchronous) == 1)
        struct Refused: Error {}
        #expect(throws: Refused.self) {
            try store.write(synchronous: .full) { db in
                #expect(try synchronous(db) == 2)
                throw Refused()
            }
        }
        #expect(try store.write(synchronous) == 1)
        try store.write(synchronous: .full) { db in try db.insert(Item(id: 7, name: "durable")) }
        #expect(
            try store.read { db in try db.fetchValue(String.self, "SELECT name FROM items WHERE id = 7") } == "durable")
        var configuration = DatabaseQueue.Configuration()
        configuration.synchronous = .full
        let full = try DatabaseQueue(path: directory.file("full2.db"), configuration: configuration)
        #expect(try full.write(synchronous: .normal, synchronous) == 1)
        #expect(try full.write(synchronous) == 2)
    }
}
