import Foundation
import SQLiteStore
import SystemSupport
import TestScheduling
import Testing

/// 16 writers (8 plain threads, 8 tasks) move money between accounts while 8 readers (4 threads,
/// 4 tasks) check, in every snapshot, that the total never changes.
@Suite(.blockingThreads) struct StressTests {
    static let accounts = 20
    static let initialBalance: Int64 = 1000
    static let transfersPerWriter = 60

    struct Snapshot: FetchableRecord {
        var total: Int64
        var count: Int64
        var transfers: Int64
        init(row: Row) throws {
            total = try row["total"]
            count = try row["count"]
            transfers = try row["transfers"]
        }
    }

    static func transfer(_ db: Database, seed: Int) throws {
        var generator = SplitMix64(seed: UInt64(seed))
        let from = Int.random(in: 1...accounts, using: &generator)
        let to = Int.random(in: 1...accounts, using: &generator)
        let amount = Int64.random(in: 1...50, using: &generator)
        // Read-modify-write inside one transaction: a lost update would break conservation.
        let balance = try db.fetchValue(Int64.self, "SELECT balance FROM accounts WHERE id = ?", [from]) ?? 0
        try db.execute("UPDATE accounts SET balance = ? WHERE id = ?", [balance - amount, from])
        try db.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", [amount, to])
        try db.execute("UPDATE counters SET transfers = transfers + 1")
    }

    static func check(_ db: Database) throws -> Snapshot {
        let snapshot = try db.fetchOne(
            Snapshot.self,
            "SELECT (SELECT sum(balance) FROM accounts) AS total, (SELECT count(*) FROM accounts) AS count, "
                + "(SELECT transfers FROM counters) AS transfers")!
        // Separate statements in one read see one snapshot too: summing account by account,
        // with writers committing in between, must still give the same total.
        var again: Int64 = 0
        for id in 1...accounts {
            again += try db.fetchValue(Int64.self, "SELECT balance FROM accounts WHERE id = ?", [id]) ?? 0
        }
        #expect(again == snapshot.total)
        return snapshot
    }

    @Test func concurrentTransfersFromThreadsAndTasksConserveTheTotal() async throws {
        let directory = TemporaryDirectory()
        var migrator = testMigrator()
        migrator.registerMigration("counters") { db in
            try db.execute("CREATE TABLE counters (transfers INTEGER NOT NULL); INSERT INTO counters VALUES (0);")
        }
        let store = try DatabaseQueue(path: directory.file("stress.db"), migrator: migrator)
        try await store.write { db in
            for id in 1...Self.accounts {
                try db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", [id, Self.initialBalance])
            }
        }
        let expectedTotal = Int64(Self.accounts) * Self.initialBalance
        let writersDone = Locked(0)
        let badSnapshots = Locked<[String]>([])
        let snapshotsChecked = Locked(0)
        let observedCommits = Locked(0)
        store.observe(tables: ["accounts"]) { _ in observedCommits.withLock { $0 += 1 } }

        let readerLoop: @Sendable () throws -> Void = {
            var lastTransfers: Int64 = 0
            while writersDone.value < 16 {
                let snapshot = try store.read { db in try Self.check(db) }
                snapshotsChecked.withLock { $0 += 1 }
                if snapshot.total != expectedTotal || snapshot.count != Int64(Self.accounts)
                    || snapshot.transfers < lastTransfers
                {
                    badSnapshots.withLock { $0.append("\(snapshot.total) \(snapshot.count) \(snapshot.transfers)") }
                }
                lastTransfers = snapshot.transfers
            }
        }

        // Plain threads: 8 writers, 4 readers.
        let threadsFinished = DispatchGroup()
        for writer in 0..<8 {
            threadsFinished.enter()
            Thread.detachNewThread {
                defer { threadsFinished.leave() }
                for index in 0..<Self.transfersPerWriter {
                    try! store.write { db in try Self.transfer(db, seed: writer * 10_000 + index) }
                }
                writersDone.withLock { $0 += 1 }
            }
        }
        for _ in 0..<4 {
            threadsFinished.enter()
            Thread.detachNewThread {
                defer { threadsFinished.leave() }
                try! readerLoop()
            }
        }
        // Tasks: 8 writers, 4 readers.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for writer in 8..<16 {
                group.addTask {
                    for index in 0..<Self.transfersPerWriter {
                        try await store.write { db in try Self.transfer(db, seed: writer * 10_000 + index) }
                    }
                    writersDone.withLock { $0 += 1 }
                }
            }
            for _ in 0..<4 {
                group.addTask {
                    var lastTransfers: Int64 = 0
                    while writersDone.value < 16 {
                        let snapshot = try await store.read { db in try Self.check(db) }
                        snapshotsChecked.withLock { $0 += 1 }
                        if snapshot.total != expectedTotal || snapshot.transfers < lastTransfers {
                            badSnapshots.withLock { $0.append("\(snapshot.total) \(snapshot.transfers)") }
                        }
                        lastTransfers = snapshot.transfers
                    }
                }
            }
            try await group.waitForAll()
        }
        await withCheckedContinuation { continuation in
            threadsFinished.notify(queue: .global()) { continuation.resume() }
        }

        #expect(badSnapshots.value.isEmpty, "inconsistent snapshots: \(badSnapshots.value.prefix(5))")
        #expect(snapshotsChecked.value > 8)
        let final = try await store.read { db in try Self.check(db) }
        #expect(final.total == expectedTotal)
        #expect(final.transfers == Int64(16 * Self.transfersPerWriter))
        store.waitForObservers()
        #expect(observedCommits.value == 16 * Self.transfersPerWriter)
    }
}

/// A small seeded generator, so each writer's transfers are reproducible.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
