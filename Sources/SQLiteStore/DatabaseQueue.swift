internal import CSQLite3
import Dispatch
import Foundation
import Synchronization
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The one owner of a database file: every read and write goes through it.
///
/// - `write { db in … }` runs on the store's writer connection, one at a time, inside
///   `BEGIN IMMEDIATE … COMMIT`. If the closure throws, the transaction is rolled back and the
///   error rethrown. After a commit, observers learn which tables changed.
/// - `read { db in … }` runs on one of a small pool of read-only connections, inside a read
///   transaction, so it sees one consistent snapshot and never waits for a writer (WAL mode).
/// - Both come in two forms. The synchronous form is for plain threads (FUSE workers, the CLI):
///   it blocks the calling thread until the work is done. The `async` form is for Swift tasks: the
///   work runs on the store's own dispatch queues and the task is resumed by a continuation, so a
///   cooperative-pool thread never blocks on SQLite.
/// - Calling `read` or `write` from inside a `read`/`write` closure of the same store traps with a
///   message saying so (it would deadlock, or read a snapshot without your own changes). Use the
///   `db` you already have.
///
/// Open a store once per file and share it (it is Sendable). Connections close when the last
/// reference goes away; in-flight async work keeps the store alive until it finishes.
///
/// ```swift
/// let store = try DatabaseQueue(path: "/var/lib/providerfs/meta.db", migrator: migrator)
/// try store.write { db in try db.execute("INSERT INTO items (id, name) VALUES (?, ?)", [7, "a.txt"]) }
/// let name = try await store.read { db in try db.fetchValue(String.self, "SELECT name FROM items WHERE id = ?", [7]) }
/// ```
public final class DatabaseQueue: @unchecked Sendable {
    // Safe to share: `writer` is only touched on `writerQueue`; a reader connection is only
    // touched by the one thread that owns its `ReaderSlot` (claimed and released with atomics,
    // which order the hand-off); everything else is immutable, atomic or a `Locked`.

    /// How a store opens and uses its connections.
    public struct Configuration: Sendable {
        /// How long a connection waits for another process's lock before failing with `SQLITE_BUSY`.
        public var busyTimeout: Duration = .seconds(5)
        /// The most read-only connections open at once (readers beyond that wait for one).
        public var maximumReaderCount = 4
        /// The durability of a commit (D-153).
        public var synchronous: Synchronous = .normal
        /// A label for the dispatch queues (shows in debuggers and crash logs).
        public var label = "SQLiteStore"
        /// The WAL size, in pages, past which a commit checkpoints it (`PRAGMA wal_autocheckpoint`);
        /// nil keeps SQLite's 1,000. Every first open in a process reads the whole WAL back, so a
        /// store opened by many short processes keeps it smaller (D-533).
        public var walAutocheckpointPages: Int?

        /// `PRAGMA synchronous` in WAL mode.
        public enum Synchronous: String, Sendable {
            /// A commit survives a process crash; an OS crash or power loss may drop the last
            /// commits but never corrupts the database.
            case normal = "NORMAL"
            /// Every commit is fsynced before `write` returns; it survives power loss too.
            case full = "FULL"
        }

        /// The defaults: 5 s busy timeout, 4 readers, synchronous NORMAL.
        public init() {}
    }

    /// The database file.
    public let path: String
    /// The configuration the store was opened with.
    public let configuration: Configuration

    private let writer: Database
    private let writerQueue: DispatchQueue
    private let readerQueue: DispatchQueue
    /// `maximumReaderCount` places for read-only connections, each opened on first use.
    private let readerSlots: [ReaderSlot]
    /// Counts the free slots: a reader waits here when all are in use.
    private let freeReaderSlots: DispatchSemaphore
    private let observers = ObserverRegistry()

    /// Opens (creating if needed) the database at `path` and applies `migrator`'s pending migrations.
    ///
    /// Before changing anything it checks that the file is an SQLite database written by
    /// ProviderFS with a known migration history. It never deletes, recreates or overwrites a file
    /// it cannot use.
    ///
    /// #### Errors
    /// `DatabaseError` with code `.notADatabase` (garbage or corrupt file), `.cannotOpen` (missing or
    /// unwritable directory), `.readOnly` (read-only file or file system), `.diskFull`,
    /// `.newerSchema` (written by a newer ProviderFS), `.migrationMismatch`, or `.sqlite` when a
    /// migration fails (that migration is rolled back; earlier ones stay applied).
    public init(
        path: String, migrator: DatabaseMigrator = DatabaseMigrator(), configuration: Configuration = .init()
    )
        throws
    {
        precondition(configuration.maximumReaderCount >= 1, "SQLiteStore: maximumReaderCount must be at least 1")
        self.path = path
        self.configuration = configuration
        writerQueue = DispatchQueue(label: "\(configuration.label).writer")
        readerQueue = DispatchQueue(label: "\(configuration.label).readers", attributes: .concurrent)
        readerSlots = (0..<configuration.maximumReaderCount).map { _ in ReaderSlot() }
        freeReaderSlots = DispatchSemaphore(value: configuration.maximumReaderCount)
        writer = try Self.openConnection(path: path, readerSlot: nil, configuration: configuration)
        try Self.prepareWriter(writer, migrator: migrator, configuration: configuration)
    }

    // MARK: - Writing

    /// Runs `updates` in a write transaction on the calling thread's behalf and returns its result.
    ///
    /// Blocks the calling thread while other writes of this store run. Commits when `updates`
    /// returns; rolls back and rethrows when it throws.
    ///
    /// - Throws: what `updates` throws, or `DatabaseError` if BEGIN or COMMIT fails (e.g. `.diskFull`).
    public func write<T>(_ updates: (Database) throws -> T) throws -> T {
        checkNotNested("write")
        return try writerQueue.sync { try performWrite(updates) }
    }

    /// Runs `updates` like `write(_:)`, but commits with the durability `synchronous` instead of
    /// the store's configured one (D-475). A store opened `.normal` makes one commit survive power
    /// loss with `.full`; in WAL mode that commit's sync also makes every earlier commit durable.
    public func write<T>(synchronous: Configuration.Synchronous, _ updates: (Database) throws -> T) throws -> T {
        checkNotNested("write")
        return try writerQueue.sync { try performWrite(updates, synchronous: synchronous) }
    }

    /// Runs `updates` in a write transaction on the store's writer queue and resumes with its result.
    ///
    /// The calling task is suspended, not blocked. Task cancellation does not interrupt a write
    /// that has been queued.
    public func write<T: Sendable>(_ updates: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            writerQueue.async {
                continuation.resume(with: Result { try self.performWrite(updates) })
            }
        }
    }

    private func performWrite<T>(
        _ updates: (Database) throws -> T, synchronous: Configuration.Synchronous? = nil
    ) throws -> T {
        let db = writer
        db.beginAccess()
        defer { db.endAccess() }
        if let synchronous, synchronous != configuration.synchronous {
            // Outside a transaction, so that it applies to this commit; back once it is made.
            try db.executeInternal("PRAGMA synchronous = \(synchronous.rawValue)")
        }
        defer {
            if let synchronous, synchronous != configuration.synchronous {
                try? db.executeInternal("PRAGMA synchronous = \(configuration.synchronous.rawValue)")
            }
        }
        db.resetChangedTables()
        try db.executeInternal("BEGIN IMMEDIATE")
        let result: T
        do {
            result = try updates(db)
        } catch {
            rollback(db)
            throw error
        }
        guard sqlite3_get_autocommit(db.handle) == 0 else {
            db.resetChangedTables()
            throw DatabaseError(
                code: .transactionEndedByBody,
                message:
                    "a write closure ended the transaction itself (COMMIT, ROLLBACK or END). Let `write` commit "
                    + "(return normally) or roll back (throw).",
                path: path)
        }
        do {
            try db.executeInternal("COMMIT")
        } catch {
            rollback(db)
            throw error
        }
        let changed = db.changedTables
        db.resetChangedTables()
        if !changed.isEmpty { observers.notify(changed) }
        return result
    }

    private func rollback(_ db: Database) {
        // SQLite rolls back by itself after some errors (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM).
        if sqlite3_get_autocommit(db.handle) == 0 {
            do {
                try db.executeInternal("ROLLBACK")
            } catch {
                // A failed ROLLBACK leaves SQLite's own recovery (the next BEGIN) to clean up; the
                // original error is the one worth reporting.
            }
        }
        db.resetChangedTables()
    }

    // MARK: - Reading

    /// Runs `value` on a read-only connection inside a read transaction and returns its result.
    ///
    /// Sees the last committed state when it starts and nothing committed later; never waits for
    /// a writer. Blocks the calling thread only if all `maximumReaderCount` readers are busy.
    ///
    /// All statements of the closure see one snapshot. A closure that only reads one row costs no
    /// BEGIN/COMMIT: its query runs in SQLite's autocommit mode and holds the snapshot, and a
    /// second statement joins it with BEGIN (D-161).
    @inlinable
    public func read<T>(_ value: (Database) throws -> T) throws -> T {
        // Inlinable, so that the caller's closure is called directly (usually inlined) rather
        // than through unspecialized generic code (D-163).
        let db = try startRead()
        let result: T
        do {
            result = try value(db)
        } catch {
            try? finishRead(db, closureThrew: true)
            throw error
        }
        try finishRead(db, closureThrew: false)
        return result
    }

    /// Claims a reader connection for the calling thread and opens its access; pair with `finishRead`.
    @usableFromInline
    func startRead() throws -> Database {
        let thread = UInt(pthread_self())
        checkNotNested("read", thread: thread)
        let slot = try checkOutReader(for: thread)
        let db = slot.connection.unsafelyUnwrapped  // checkOutReader opened it
        db.beginAccess()
        db.beginRead()
        return db
    }

    /// Ends the read (COMMIT/ROLLBACK if it began a transaction) and returns the connection to
    /// its slot, even when ending throws.
    @usableFromInline
    func finishRead(_ db: Database, closureThrew: Bool) throws {
        defer {
            db.endAccess()
            checkIn(readerSlots[db.readerSlot])
        }
        try db.endRead(closureThrew: closureThrew)
    }

    /// Runs `value` on a read-only connection from the store's reader queue and resumes with its result.
    public func read<T: Sendable>(_ value: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            readerQueue.async {
                continuation.resume(with: Result { try self.read(value) })
            }
        }
    }

    /// Waits for a free reader slot, claims it for `thread` and opens its connection if needed.
    private func checkOutReader(for thread: UInt) throws -> ReaderSlot {
        freeReaderSlots.wait()
        // The semaphore guarantees a free slot; several threads may race for it, so claim with a
        // compare-and-exchange. Acquiring: see the last owner's work on the connection.
        for (index, slot) in readerSlots.enumerated()
        where slot.owner.compareExchange(expected: 0, desired: thread, ordering: .acquiring).exchanged {
            if slot.connection == nil {
                do {
                    slot.connection = try Self.openConnection(
                        path: path, readerSlot: index, configuration: configuration)
                } catch {
                    checkIn(slot)
                    throw error
                }
            }
            return slot
        }
        preconditionFailure("SQLiteStore: the reader semaphore granted a slot but none was free")
    }

    private func checkIn(_ slot: ReaderSlot) {
        slot.owner.store(0, ordering: .releasing)
        freeReaderSlots.signal()
    }

    /// Traps when `thread` is inside a read or write closure of this store: the writer connection
    /// or a reader slot is then marked with it (no thread-local lookup needed).
    private func checkNotNested(_ operation: String, thread: UInt = UInt(pthread_self())) {
        var nested = writer.isAccessed(by: thread)
        for slot in readerSlots where slot.owner.load(ordering: .relaxed) == thread { nested = true }
        if nested {
            fatalError(
                "SQLiteStore misuse: \(operation) was called from inside a read or write closure of the same "
                    + "DatabaseQueue (\(path)). Nested transactions would deadlock or miss your own changes: "
                    + "use the `db` argument you already have.")
        }
    }

    // MARK: - Observation

    /// Calls `handler` after every committed write transaction that changed at least one of
    /// `tables` (or any table, when `tables` is nil), with the set of changed tables.
    ///
    /// Handlers run one at a time on the store's notification queue, in commit order, after
    /// `write` has committed (a rolled-back transaction reports nothing). A handler may call
    /// `read` or `write`. Tables are reported when an INSERT, UPDATE or DELETE (or a trigger it
    /// fired) changed at least one row in them.
    ///
    /// The store keeps the handler until the observation is cancelled, so a handler that
    /// captures the store keeps it (and its connections) open until then.
    ///
    /// - Returns: a token; call `cancel()` on it to stop.
    @discardableResult
    public func observe(
        tables: Set<String>? = nil, _ handler: @escaping @Sendable (Set<String>) -> Void
    ) -> DatabaseObservation {
        observers.add(tables: tables, handler)
    }

    /// Waits until every notification for transactions committed so far has been delivered.
    /// Traps when called from inside an observer handler (it would wait for itself).
    public func waitForObservers() {
        observers.drain()
    }

    // MARK: - Opening

    /// Opens the writer connection (`readerSlot` nil) or the read-only connection of a reader slot.
    private static func openConnection(
        path: String, readerSlot: Int?, configuration: Configuration
    ) throws -> Database {
        let readOnly = readerSlot != nil
        var handle: OpaquePointer?
        let flags =
            (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
            | SQLITE_OPEN_EXRESCODE
        let rc = sqlite3_open_v2(path, &handle, flags, nil)
        guard rc == SQLITE_OK, let handle else {
            var message = handle.map { describe(sqlite3_errmsg($0), systemErrno: sqlite3_system_errno($0)) } ?? ""
            if let reason = diagnoseOpenFailure(path: path, readOnly: readOnly) { message = reason }
            if let handle { sqlite3_close_v2(handle) }
            throw DatabaseError.sqlite(rc, message: message, path: path, sql: nil)
        }
        let db = Database(path: path, handle: handle, readerSlot: readerSlot)
        let milliseconds =
            configuration.busyTimeout.components.seconds * 1000
            + configuration.busyTimeout.components.attoseconds / 1_000_000_000_000_000
        sqlite3_busy_timeout(handle, Int32(clamping: milliseconds))
        if !readOnly && sqlite3_db_readonly(handle, "main") == 1 {
            // SQLite silently falls back to read-only when the file is write-protected.
            throw DatabaseError(
                code: .readOnly, resultCode: .readOnly,
                message:
                    "the database file or its file system is read-only, so it cannot be written. Make it "
                    + "writable or choose another location.",
                path: path)
        }
        return db
    }

    /// SQLite's errno after a failed open is often from its last fallback attempt (ENOENT after
    /// a read-only retry), so look at the path ourselves for the reason a person can act on.
    private static func diagnoseOpenFailure(path: String, readOnly: Bool) -> String? {
        let directory =
            (path as NSString).deletingLastPathComponent.isEmpty
            ? "." : (path as NSString).deletingLastPathComponent
        var status = stat()
        if stat(directory, &status) != 0 {
            return "the directory \(directory) cannot be used: \(Errno.current)"
        }
        if (status.st_mode & S_IFMT) != S_IFDIR {
            return "\(directory) is not a directory"
        }
        if stat(path, &status) != 0 && !readOnly && access(directory, W_OK) != 0 {
            return "the database does not exist and its directory \(directory) is not writable: \(Errno.current)"
        }
        if stat(path, &status) == 0 && access(path, readOnly ? R_OK : R_OK | W_OK) != 0 {
            return "the database file cannot be \(readOnly ? "read" : "read and written"): \(Errno.current)"
        }
        return nil
    }

    private static func switchToWAL(_ db: Database, within timeout: Duration) throws -> String? {
        let deadline = ContinuousClock.now + timeout
        while true {
            do {
                return try db.fetchValue(String.self, "PRAGMA journal_mode = WAL")
            } catch let error as DatabaseError where error.resultCode == .busy && ContinuousClock.now < deadline {
                usleep(2_000)
            }
        }
    }

    private static func describe(_ message: UnsafePointer<CChar>?, systemErrno: Int32) -> String {
        let text = message.map { String(cString: $0) } ?? "unknown error"
        return systemErrno == 0 ? text : "\(text): \(Errno(systemErrno))"
    }

    /// Checks the file, sets the connection up, and migrates; see `init` for the order and why.
    private static func prepareWriter(_ db: Database, migrator: DatabaseMigrator, configuration: Configuration) throws {
        db.beginAccess()
        defer { db.endAccess() }
        do {
            // 1. Read-only checks first: a garbage file, a foreign database or a newer schema must
            //    fail before anything (even the journal mode) is written.
            let objectCount = try db.fetchValue(Int64.self, "SELECT count(*) FROM sqlite_master") ?? 0
            let hasMigrationTable =
                try db.fetchValue(
                    Int64.self, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                    [DatabaseMigrator.tableName]) == 1
            if objectCount > 0 && !hasMigrationTable {
                throw DatabaseError(
                    code: .migrationMismatch,
                    message:
                        "this SQLite database was not created by ProviderFS (it has tables but no "
                        + "\(DatabaseMigrator.tableName) table). Nothing was changed. Choose another path, or move "
                        + "this file aside.",
                    path: db.path)
            }
            let recorded =
                hasMigrationTable
                ? try db.fetchValues(String.self, "SELECT name FROM \(DatabaseMigrator.tableName) ORDER BY rowid") : []
            let pending = try migrator.pendingMigrations(recorded: recorded, path: db.path)

            // 2. Connection settings (D-153). Switching a new file to WAL needs it alone: while
            //    another connection migrates it (two first opens at once), SQLite answers BUSY at
            //    once, without its busy handler (which would deadlock), so it is asked again
            //    until the busy timeout (D-367).
            let journalMode = try Self.switchToWAL(db, within: configuration.busyTimeout)
            guard journalMode?.lowercased() == "wal" else {
                throw DatabaseError(
                    code: .cannotOpen,
                    message: "cannot switch the database to WAL mode (it reports '\(journalMode ?? "?")')",
                    path: db.path)
            }
            try db.executeInternal("PRAGMA synchronous = \(configuration.synchronous.rawValue)")
            try db.executeInternal("PRAGMA foreign_keys = ON")
            if let pages = configuration.walAutocheckpointPages {
                try db.executeInternal("PRAGMA wal_autocheckpoint = \(pages)")
            }

            // 3. Migrations, each in its own transaction with its record.
            if !hasMigrationTable {  // an empty file: a foreign one was refused above
                try db.execute(
                    "CREATE TABLE IF NOT EXISTS \(DatabaseMigrator.tableName) "
                        + "(name TEXT NOT NULL PRIMARY KEY, applied_at REAL NOT NULL)")
            }
            //    What is applied is read again inside each write transaction: another process
            //    opening the same new database at the same moment may have applied it meanwhile
            //    (two first starts at once), and a migration must run exactly once.
            for migration in pending {
                try db.executeInternal("BEGIN IMMEDIATE")
                do {
                    let applied = try db.fetchValues(
                        String.self, "SELECT name FROM \(DatabaseMigrator.tableName) ORDER BY rowid")
                    _ = try migrator.pendingMigrations(recorded: applied, path: db.path)
                    if !applied.contains(migration.name) {
                        try migration.migrate(db)
                        try db.execute(
                            "INSERT INTO \(DatabaseMigrator.tableName) (name, applied_at) VALUES (?, ?)",
                            [migration.name, Date()])
                    }
                    try db.executeInternal("COMMIT")
                } catch {
                    if sqlite3_get_autocommit(db.handle) == 0 { try? db.executeInternal("ROLLBACK") }
                    throw error
                }
            }
            db.resetChangedTables()
        }
    }
}

// MARK: - Reader slots

/// A place for one read-only connection of a store.
///
/// `owner` is the `pthread_t` of the thread running a `read` closure on it, or 0 when free; only
/// that thread touches `connection` (opened on first use), so the field needs no lock, and the
/// claim (acquiring) and release (releasing) order one owner's work before the next one's.
private final class ReaderSlot {
    let owner = Atomic<UInt>(0)
    /// Read and written only by the owner, once per `read`: unchecked exclusivity (D-162).
    @exclusivity(unchecked) var connection: Database?
}
