import Foundation
import SQLiteStore
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// A process SIGKILLed in the middle of a write transaction leaves all or none of it.
/// The child is a real process: Swift Testing's exit test re-executes this test binary.
@Suite(.blockingThreads) struct CrashTests {
    static let accountCount = 50
    static let initialBalance: Int64 = 1000

    static func makeStore(_ path: String) throws -> DatabaseQueue {
        var migrator = testMigrator()
        migrator.registerMigration("create entries") { db in
            try db.execute("CREATE TABLE entries (batch INTEGER NOT NULL, n INTEGER NOT NULL, filler BLOB)")
        }
        return try DatabaseQueue(path: path, migrator: migrator)
    }

    static func seed(_ path: String) throws {
        let store = try makeStore(path)
        try store.write { db in
            for id in 1...accountCount {
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [id, initialBalance])
            }
        }
    }

    /// Checks what every crash test needs: intact file, conserved money, whole batches only.
    static func checkInvariants(_ path: String, batchSize: Int64) throws -> Int64 {
        let store = try makeStore(path)
        return try store.read { db in
            #expect(try db.fetchValue(String.self, "PRAGMA integrity_check") == "ok")
            #expect(
                try db.fetchValue(Int64.self, "SELECT sum(balance) FROM accounts")
                    == Int64(accountCount) * initialBalance)
            let partial = try db.fetchValue(
                Int64.self, "SELECT count(*) FROM (SELECT batch FROM entries GROUP BY batch HAVING count(*) != ?)",
                [batchSize])
            #expect(partial == 0)
            return try db.fetchValue(Int64.self, "SELECT count(DISTINCT batch) FROM entries") ?? 0
        }
    }

    /// The kill lands inside `write`, after the transaction has spilled pages into the WAL file.
    @Test func killedInsideAWriteLeavesNoneOfIt() async throws {
        let directory = TemporaryDirectory()
        let path = directory.file("crash.db")
        try Self.seed(path)
        await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String] in
            let store = try CrashTests.makeStore(path)
            try store.write { db in
                // A tiny page cache forces SQLite to write uncommitted pages to the WAL early.
                try db.execute("PRAGMA cache_size = 2")
                try db.execute("UPDATE accounts SET balance = balance - 10 WHERE id = ?", [1])
                for n in 0..<2000 {
                    try db.execute("INSERT INTO entries (batch, n, filler) VALUES (?, ?, ?)", [1, n, Data(count: 512)])
                }
                kill(getpid(), SIGKILL)
            }
        }
        let walSize = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
        #expect(walSize > 500_000, "the uncommitted transaction should have reached the WAL file")
        #expect(try Self.checkInvariants(path, batchSize: 2000) == 0)
    }

    /// The kill lands at a random moment while a child commits transfer batches in a loop; every
    /// batch it reported as committed must be there, and no batch may be partial.
    @Test(arguments: [1, 2, 3])
    func killedAtARandomMomentLeavesWholeTransactions(round: Int) async throws {
        let directory = TemporaryDirectory()
        let path = directory.file("crash.db")
        try Self.seed(path)
        let result = await #expect(processExitsWith: .signal(SIGKILL), observing: [\.standardOutputContent]) {
            [path = path as String, round = round as Int] in
            let store = try CrashTests.makeStore(path)
            var generator = SystemRandomNumberGenerator()
            for batch in 1... {
                if batch == 2 {
                    // Once one batch is reported (a loaded machine may take long to get here), kill
                    // after a delay that differs per round, so the kill lands at different points.
                    Thread.detachNewThread {
                        usleep(UInt32(3_000 + 37_000 * round))
                        kill(getpid(), SIGKILL)
                    }
                }
                try store.write { db in
                    let from = Int.random(in: 1...CrashTests.accountCount, using: &generator)
                    let to = Int.random(in: 1...CrashTests.accountCount, using: &generator)
                    try db.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", [7, from])
                    for n in 0..<20 {
                        try db.execute(
                            "INSERT INTO entries (batch, n, filler) VALUES (?, ?, ?)", [batch, n, Data(count: 64)])
                    }
                    try db.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", [7, to])
                }
                // One write(2) per line: lines survive the SIGKILL that may follow at any moment.
                let line = Array("committed \(batch)\n".utf8)
                _ = line.withUnsafeBytes { Glibc.write(1, $0.baseAddress, $0.count) }
            }
        }
        let output = String(decoding: result?.standardOutputContent ?? [], as: UTF8.self)
        let reported =
            output.split(separator: "\n").compactMap { Int64($0.split(separator: " ").last ?? "") }.max() ?? 0
        let batches = try Self.checkInvariants(path, batchSize: 20)
        #expect(reported > 0, "the child should have committed something before the kill")
        // Committed and reported batches survive; at most the one in flight when killed is extra.
        #expect(batches == reported || batches == reported + 1)
    }
}
