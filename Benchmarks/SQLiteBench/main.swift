// sqlite-bench: SQLiteStore's cost over raw SQLite, measured (Benchmarks/sqlite.sh runs it next to
// raw_sqlite.c and the sqlite3 CLI doing the same work; see docs/TESTING.md).
//
// Usage: sqlite-bench <directory> [rows] [lookups] [repetitions]
// Prints one line per measurement: "<name> <median ops/s> <median ops per CPU-second>". The CPU
// rate (process CPU time) is what to compare on a busy shared machine, where wall time mostly
// measures how much of a core the scheduler gave us.

import Foundation
import SQLiteStore
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

func seconds(_ clock: clockid_t = CLOCK_MONOTONIC) -> Double {
    var now = timespec()
    clock_gettime(clock, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted[sorted.count / 2]
}

/// The same key sequence as raw_sqlite.c: every row, in a scattered order.
@inline(__always) func key(_ index: Int, rows: Int) -> Int64 { Int64((index &* 7919) % rows + 1) }

struct KeyValue: FetchableRecord {
    var id: Int64
    var value: String
    var size: Int64
    init(row: Row) throws {
        id = try row[0]
        value = try row[1]
        size = try row[2]
    }
}

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    FileHandle.standardError.write(Data("usage: sqlite-bench <directory> [rows] [lookups] [repetitions]\n".utf8))
    exit(64)
}
let directory = arguments[1]
let rows = arguments.count > 2 ? Int(arguments[2])! : 100_000
let lookups = arguments.count > 3 ? Int(arguments[3])! : 200_000
let repetitions = arguments.count > 4 ? Int(arguments[4])! : 5
let only = arguments.count > 5 ? arguments[5] : nil  // run only the measurements whose name contains this
let lookupSQL = "SELECT id, value, size FROM kv WHERE id = ?"

func measure(_ name: String, operations: Int, always: Bool = false, _ body: () throws -> Void) rethrows {
    if let only, !always, !name.contains(only) { return }
    var rates: [Double] = []
    var cpuRates: [Double] = []
    for _ in 0..<repetitions {
        let start = seconds()
        let cpuStart = seconds(CLOCK_PROCESS_CPUTIME_ID)
        try body()
        rates.append(Double(operations) / (seconds() - start))
        cpuRates.append(Double(operations) / (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpuStart))
    }
    print("\(name) \(Int(median(rates))) \(Int(median(cpuRates)))")
}

func measureAsync(_ name: String, operations: Int, _ body: () async throws -> Void) async rethrows {
    if let only, !name.contains(only) { return }
    var rates: [Double] = []
    var cpuRates: [Double] = []
    for _ in 0..<repetitions {
        let start = seconds()
        let cpuStart = seconds(CLOCK_PROCESS_CPUTIME_ID)
        try await body()
        rates.append(Double(operations) / (seconds() - start))
        cpuRates.append(Double(operations) / (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpuStart))
    }
    print("\(name) \(Int(median(rates))) \(Int(median(cpuRates)))")
}

var migrator = DatabaseMigrator()
migrator.registerMigration("kv") { db in
    try db.execute("CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL, size INTEGER NOT NULL)")
    try db.execute("CREATE TABLE spill (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
}
let path = "\(directory)/swift.db"
for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
let store = try DatabaseQueue(path: path, migrator: migrator)

// Inserts in one transaction (the table is emptied before each repetition). Always run: the
// lookups need the rows.
// The values are made before timing (raw_sqlite.c does the same), so the measurement is the
// store, not String interpolation against snprintf.
let values = (0...rows).map { "item-\($0)-abcdefghijklmnop" }
try measure("insert_one_transaction", operations: rows, always: true) {
    try store.write { db in
        try db.execute("DELETE FROM kv")
        for index in 1...rows {
            try db.execute(
                "INSERT INTO kv (id, value, size) VALUES (?, ?, ?)", [Int64(index), values[index], Int64(index * 3)])
        }
    }
}

var checksum: Int64 = 0

// Point lookups, one `read` (own read transaction) per lookup: what a FUSE getattr does.
try measure("lookup_read_per_lookup", operations: lookups) {
    for index in 0..<lookups {
        let record = try store.read { db in try db.fetchOne(KeyValue.self, lookupSQL, [key(index, rows: rows)]) }
        checksum &+= record!.size
    }
}

// Point lookups, many per `read`: a directory listing or a batch.
try measure("lookup_batched_1000", operations: lookups) {
    for batch in stride(from: 0, to: lookups, by: 1000) {
        try store.read { db in
            for index in batch..<min(batch + 1000, lookups) {
                let record = try db.fetchOne(KeyValue.self, lookupSQL, [key(index, rows: rows)])
                checksum &+= record!.size
            }
        }
    }
}

// Point lookups from a task: each `await store.read` hops to the reader queue and back.
let asyncLookups = lookups / 4
try await measureAsync("lookup_async_read_per_lookup", operations: asyncLookups) {
    for index in 0..<asyncLookups {
        let record = try await store.read { db in try db.fetchOne(KeyValue.self, lookupSQL, [key(index, rows: rows)]) }
        checksum &+= record!.size
    }
}

// Point lookups while a writer thread keeps write transactions open back to back.
let writerRunning = Locked(true)
let writerDone = DispatchSemaphore(value: 0)
Thread.detachNewThread {
    var next: Int64 = 0
    while writerRunning.value {
        try! store.write { db in
            for _ in 0..<1000 {
                next += 1
                try db.execute(
                    "INSERT OR REPLACE INTO spill (id, value) VALUES (?, ?)", [next % 50_000, "busy writer"])
            }
        }
    }
    writerDone.signal()
}
try measure("lookup_while_writing", operations: lookups) {
    for index in 0..<lookups {
        let record = try store.read { db in try db.fetchOne(KeyValue.self, lookupSQL, [key(index, rows: rows)]) }
        checksum &+= record!.size
    }
}
writerRunning.withLock { $0 = false }
writerDone.wait()

FileHandle.standardError.write(Data("checksum \(checksum)\n".utf8))
