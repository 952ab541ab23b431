// sqlite-bench: SQLiteStore's cost over raw SQLite, measured (Benchmarks/sqlite.sh runs it next to
// raw_sqlite.c and the sqlite3 CLI doing the same work; see Benchmarks/README.md).
//
// Usage: sqlite-bench <directory> [rows] [lookups] [repetitions] [only,only…]
// Prints one line per measurement: "<name> <median ops/s> <median ops per CPU-second> <checksum>".
// The CPU rate (process CPU time) is what to compare on a busy shared machine, where wall time
// mostly measures how much of a core the scheduler gave us.
//
// One lookup does what raw_sqlite.c's does, through the API callers use: `fetchOne` of a record
// whose `init(row:)` reads id (Int64), value (a String: its own copy of the text) and size
// (Int64); the checksum adds id + UTF-8 byte count of value + its last byte + size, and sqlite.sh
// fails the run when the two programs' checksums differ. Each measured loop is its own
// non-inlined function whose name starts with `run`, so `sqlite.sh --callgrind` can count exactly
// its instructions. The top-level code never awaits (the async measurement blocks on a
// semaphore): an async main ends in libdispatch's sigsuspend, which valgrind cannot run.

import Dispatch
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

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("sqlite-bench: \(message)\n".utf8))
    exit(1)
}

struct Parameters: Sendable {
    var rows: Int
    var lookups: Int
    var repetitions: Int
    var only: String?  // comma-separated: run only the measurements whose name contains one

    func wants(_ name: String) -> Bool {
        guard let only else { return true }
        return only.split(separator: ",").contains { name.contains($0) }
    }

    /// The same key sequence as raw_sqlite.c: every row, in a scattered order.
    @inline(__always) func key(_ index: Int) -> Int64 { Int64((index &* 7919) % rows + 1) }
}

struct KeyValue: FetchableRecord {
    var id: Int64
    var value: String
    var size: Int64
    init(row: Row) throws {
        id = try row[0]
        value = try row[1]
        size = try row[2]
    }

    /// id + UTF-8 byte count of value + its last byte + size. The last byte is read from the
    /// string's contiguous UTF-8 storage, as raw_sqlite.c indexes its copy (`value.utf8.last`
    /// walks the collection generically: 78 instructions, more than the rest of the checksum).
    var checksum: Int64 {
        let lastByte = value.utf8.withContiguousStorageIfAvailable { $0.last ?? 0 } ?? value.utf8.last ?? 0
        return id &+ Int64(value.utf8.count) &+ Int64(lastByte) &+ size
    }
}

let lookupSQL = "SELECT id, value, size FROM kv WHERE id = ?"

/// Runs `body` `repetitions` times; prints the median rates and the checksum all repetitions agree
/// on: what `body` returns, or, when given, what `checksum` returns after each (untimed) run.
func measure(
    _ name: String, operations: Int, _ parameters: Parameters, always: Bool = false,
    checksum untimedChecksum: (() throws -> Int64)? = nil, _ body: () throws -> Int64
) throws {
    if !always && !parameters.wants(name) { return }
    var rates: [Double] = []
    var cpuRates: [Double] = []
    var checksums: Set<Int64> = []
    for _ in 0..<parameters.repetitions {
        let start = seconds()
        let cpuStart = seconds(CLOCK_PROCESS_CPUTIME_ID)
        var checksum = try body()
        rates.append(Double(operations) / (seconds() - start))
        cpuRates.append(Double(operations) / (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpuStart))
        if let untimedChecksum { checksum = try untimedChecksum() }
        checksums.insert(checksum)
    }
    guard checksums.count == 1, let checksum = checksums.first else {
        fail("\(name): repetitions disagree on the checksum: \(checksums.sorted())")
    }
    FileHandle.standardOutput.write(Data("\(name) \(Int(median(rates))) \(Int(median(cpuRates))) \(checksum)\n".utf8))
}

// MARK: - The measured loops

@inline(never)
func runInserts(_ store: DatabaseQueue, values: [String], _ parameters: Parameters) throws {
    try store.write { db in
        try db.execute("DELETE FROM kv")
        for index in 1...parameters.rows {
            try db.execute(
                "INSERT INTO kv (id, value, size) VALUES (?, ?, ?)", [Int64(index), values[index], Int64(index * 3)])
        }
    }
}

/// One `read` per lookup: what a FUSE getattr does.
@inline(never)
func runPerReadLookups(_ store: DatabaseQueue, _ parameters: Parameters) throws -> Int64 {
    var checksum: Int64 = 0
    for index in 0..<parameters.lookups {
        let record = try store.read { db in try db.fetchOne(KeyValue.self, lookupSQL, [parameters.key(index)]) }
        guard let record else { fail("no row for key \(parameters.key(index))") }
        checksum &+= record.checksum
    }
    return checksum
}

/// One `read` per lookup of a key past the last row: a negative lookup (ENOENT). Counts the misses.
@inline(never)
func runMissingLookups(_ store: DatabaseQueue, _ parameters: Parameters) throws -> Int64 {
    var misses: Int64 = 0
    for index in 0..<parameters.lookups {
        let key = parameters.key(index) + Int64(parameters.rows)
        if try store.read({ db in try db.fetchOne(KeyValue.self, lookupSQL, [key]) }) == nil { misses += 1 }
    }
    return misses
}

/// 1000 lookups per `read`: a directory listing or a batch.
@inline(never)
func runBatchedLookups(_ store: DatabaseQueue, _ parameters: Parameters) throws -> Int64 {
    var checksum: Int64 = 0
    for batch in stride(from: 0, to: parameters.lookups, by: 1000) {
        try store.read { db in
            for index in batch..<min(batch + 1000, parameters.lookups) {
                guard let record = try db.fetchOne(KeyValue.self, lookupSQL, [parameters.key(index)]) else {
                    fail("no row for key \(parameters.key(index))")
                }
                checksum &+= record.checksum
            }
        }
    }
    return checksum
}

/// One `await read` per lookup, from a task: each hops to the reader queue and back.
func runAsyncReadLookups(_ store: DatabaseQueue, _ parameters: Parameters) async throws -> Int64 {
    var checksum: Int64 = 0
    for index in 0..<parameters.lookups / 4 {
        let key = parameters.key(index)
        let record = try await store.read { db in try db.fetchOne(KeyValue.self, lookupSQL, [key]) }
        guard let record else { fail("no row for key \(key)") }
        checksum &+= record.checksum
    }
    return checksum
}

func tableChecksum(_ store: DatabaseQueue) throws -> Int64 {
    try store.read { db in
        try db.fetchValue(Int64.self, "SELECT count(*) + sum(id) + sum(length(value)) + sum(size) FROM kv") ?? 0
    }
}

// MARK: - Main

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    fail("usage: sqlite-bench <directory> [rows] [lookups] [repetitions] [only]")
}
let parameters = Parameters(
    rows: arguments.count > 2 ? Int(arguments[2])! : 100_000,
    lookups: arguments.count > 3 ? Int(arguments[3])! : 200_000,
    repetitions: arguments.count > 4 ? Int(arguments[4])! : 5,
    only: arguments.count > 5 ? arguments[5] : nil)

var migrator = DatabaseMigrator()
migrator.registerMigration("kv") { db in
    try db.execute("CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL, size INTEGER NOT NULL)")
    try db.execute("CREATE TABLE spill (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
}
let path = "\(arguments[1])/swift.db"
for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
let store = try DatabaseQueue(path: path, migrator: migrator)

// Inserts in one transaction (the table is emptied before each repetition). Always run: the
// lookups need the rows. The values are made before timing (raw_sqlite.c does the same), so the
// measurement is the store, not String interpolation against snprintf.
let values = (0...parameters.rows).map { "item-\($0)-abcdefghijklmnop" }
try measure(
    "insert_one_transaction", operations: parameters.rows, parameters, always: true,
    checksum: { try tableChecksum(store) }
) {
    try runInserts(store, values: values, parameters)
    return 0
}

try measure("lookup_read_per_lookup", operations: parameters.lookups, parameters) {
    try runPerReadLookups(store, parameters)
}

try measure("lookup_missing_read_per_lookup", operations: parameters.lookups, parameters) {
    try runMissingLookups(store, parameters)
}

try measure("lookup_batched_1000", operations: parameters.lookups, parameters) {
    try runBatchedLookups(store, parameters)
}

// The async loop runs in a detached task; the main thread waits (it is not a pool thread).
try measure("lookup_async_read_per_lookup", operations: parameters.lookups / 4, parameters) {
    let result = Locked<Result<Int64, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task.detached { [store, parameters] in
        do {
            let checksum = try await runAsyncReadLookups(store, parameters)
            result.withLock { $0 = .success(checksum) }
        } catch {
            result.withLock { $0 = .failure(error) }
        }
        done.signal()
    }
    done.wait()
    return try result.value!.get()
}

// Point lookups while a writer thread keeps write transactions open back to back.
if parameters.wants("lookup_while_writing") {
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
    try measure("lookup_while_writing", operations: parameters.lookups, parameters) {
        try runPerReadLookups(store, parameters)
    }
    writerRunning.withLock { $0 = false }
    writerDone.wait()
}
