internal import CSQLite3
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One SQLite connection, handed to you by `DatabaseQueue.read` or `DatabaseQueue.write`.
///
/// `Database` is deliberately not Sendable and has no public initializer: the only way to get one
/// is as the argument of a `read`/`write` closure, and it may be used only inside that closure, on
/// the thread running it. Any other use traps with a message naming the mistake (the "watchdog",
/// after GRDB's `SchedulingWatchdog`): a connection kept after its closure returned, or passed to
/// another thread or task.
///
/// Statements are prepared once per connection and cached by SQL text, so pass values as
/// arguments (`?`) rather than building SQL strings.
public final class Database {
    /// The database file.
    public let path: String
    /// True for the pool's read-only connections.
    public let isReadOnly: Bool
    /// For a read-only connection, the index of its `DatabaseQueue` reader slot; -1 for the writer.
    let readerSlot: Int
    let handle: OpaquePointer
    private var statementCache: [String: Statement] = [:]
    /// Tried before `statementCache` (no hashing of the SQL). Touched on every statement, only by
    /// the owning thread, in scopes that call nothing that touches it: unchecked (D-162).
    @exclusivity(unchecked) private var mostRecentStatement: Statement?
    private var internalStatements: [Statement] = []
    /// `PRAGMA schema_version`, prepared on first use: takes a read's snapshot (D-161).
    private var snapshotStatement: Statement?
    /// How the current `read` closure's statements share one snapshot (D-161). Same access rule.
    @exclusivity(unchecked) private var readPhase = ReadPhase.none
    /// The statement whose read transaction is the current read's snapshot, while `readPhase` is
    /// `.firstQuery` or `.holdingSnapshot`. Same access rule.
    @exclusivity(unchecked) private var snapshotHolder: Statement?
    private var lostSnapshotError: DatabaseError?
    /// Test hook (SnapshotTests): runs once, right after a read's first query found no row and
    /// before that result is confirmed. Always nil outside tests.
    var afterEmptyFirstQuery: (() -> Void)?
    private static let statementCacheLimit = 512

    /// The thread currently allowed to use this connection (`pthread_t`), or 0 between closures.
    /// Atomic so that a misuse from another thread is a clean trap, not a data race on the check.
    private let accessThread = Atomic<UInt>(0)

    /// Tables the authorizer saw as written while preparing the current statement.
    fileprivate var authorizedWrites: Set<String> = []
    /// Tables changed by the current write transaction (for observers); reset on commit/rollback.
    private(set) var changedTables: Set<String> = []
    /// Bumped whenever `changedTables` is cleared, so a statement adds its tables to the set once
    /// per transaction instead of hashing them on every row it inserts.
    private var changeEpoch: UInt64 = 1

    /// Forgets the changed tables (at BEGIN, COMMIT and ROLLBACK).
    func resetChangedTables() {
        changedTables.removeAll(keepingCapacity: true)
        changeEpoch &+= 1
    }

    /// A connection: read-only when it belongs to a reader slot, else the writer.
    init(path: String, handle: OpaquePointer, readerSlot: Int?) {
        self.path = path
        self.handle = handle
        self.isReadOnly = readerSlot != nil
        self.readerSlot = readerSlot ?? -1
        if !isReadOnly {
            // The authorizer runs at prepare time and reports every table a statement (including
            // the triggers it fires) may insert into, update or delete from. Unlike
            // sqlite3_update_hook it also covers WITHOUT ROWID tables and truncating DELETEs.
            sqlite3_set_authorizer(handle, databaseAuthorizer, Unmanaged.passUnretained(self).toOpaque())
        }
    }

    deinit {
        mostRecentStatement = nil
        snapshotStatement = nil
        internalStatements.removeAll()
        statementCache.removeAll()  // finalize statements before closing the connection
        sqlite3_close_v2(handle)
    }

    // MARK: - Watchdog

    /// Allows the calling thread to use the connection until `endAccess`.
    func beginAccess() {
        accessThread.store(UInt(pthread_self()), ordering: .releasing)
    }

    /// Ends the closure's access; any later use traps.
    func endAccess() {
        accessThread.store(0, ordering: .releasing)
    }

    /// True while `thread` (a `pthread_t`) runs a closure of this connection. Relaxed: a thread
    /// only needs to see its own last store; any other thread's value differs from it anyway.
    func isAccessed(by thread: UInt) -> Bool {
        accessThread.load(ordering: .relaxed) == thread
    }

    @usableFromInline
    func checkAccess() {
        let owner = accessThread.load(ordering: .acquiring)
        if owner != UInt(pthread_self()) { accessViolation(owner: owner) }
    }

    private func accessViolation(owner: UInt) -> Never {
        if owner == 0 {
            fatalError(
                "SQLiteStore misuse: a Database for \(path) was used outside the read/write closure that "
                    + "provided it (the connection escaped its closure). Do all database work inside "
                    + "`store.read { db in … }` or `store.write { db in … }` and return values, never the Database.")
        }
        fatalError(
            "SQLiteStore misuse: a Database for \(path) was used from a different thread than the one running its "
                + "read/write closure. Database is not Sendable: do not hand it to another thread or task; "
                + "call `store.read`/`store.write` there instead.")
    }

    // MARK: - Executing SQL

    // The @inlinable methods below are inlined into the calling module, specialized for its
    // record type, with its argument array kept on the stack. That needs `public`: Swift 6.3
    // never hands the body of a `package` @inlinable declaration to another module (D-163).

    /// Runs one statement with arguments, or, without arguments, a script of several statements
    /// separated by semicolons (migrations).
    ///
    /// - Throws: `DatabaseError` naming the file and the SQL that failed.
    @inlinable
    public func execute(_ sql: String, _ arguments: [any DatabaseValueConvertible] = []) throws {
        checkAccess()
        if arguments.isEmpty {
            try executeScript(sql)
            return
        }
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        while try step(statement) {}
    }

    /// The number of rows the last INSERT, UPDATE or DELETE changed (not counting triggers).
    public var changesCount: Int {
        checkAccess()
        return Int(sqlite3_changes64(handle))
    }

    /// The rowid of the last successful INSERT on this connection.
    public var lastInsertedRowID: Int64 {
        checkAccess()
        return sqlite3_last_insert_rowid(handle)
    }

    /// Calls `body` for each row of a query, in order. `body` must not keep the `Row`.
    @inlinable
    public func forEachRow(
        _ sql: String, _ arguments: [any DatabaseValueConvertible] = [], _ body: (Row) throws -> Void
    ) throws {
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        while try step(statement) {
            try body(Row(statement: statement))
        }
    }

    /// Every row of a query, decoded as `Record`.
    @inlinable
    public func fetchAll<Record: FetchableRecord>(
        _ type: Record.Type, _ sql: String, _ arguments: [any DatabaseValueConvertible] = []
    ) throws -> [Record] {
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        var records: [Record] = []
        while try step(statement) {
            records.append(try Record(row: Row(statement: statement)))
        }
        return records
    }

    /// The first row of a query decoded as `Record`, or nil when there is none.
    @inlinable
    public func fetchOne<Record: FetchableRecord>(
        _ type: Record.Type, _ sql: String, _ arguments: [any DatabaseValueConvertible] = []
    ) throws -> Record? {
        // Inlinable (like the other fetch methods) so that the caller's module specializes it for
        // its record type: unspecialized, each call paid for runtime generic-metadata lookups.
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        guard try step(statement) else { return nil }
        return try Record(row: Row(statement: statement))
    }

    /// The first column of the first row decoded as `Value`, or nil when there is no row.
    ///
    /// A NULL value in an existing row decodes as `Value` would (`Optional` → `.some(nil)`, a
    /// non-optional type → `.decodingFailed`).
    @inlinable
    public func fetchValue<Value: DatabaseValueConvertible>(
        _ type: Value.Type, _ sql: String, _ arguments: [any DatabaseValueConvertible] = []
    ) throws -> Value? {
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        guard try step(statement) else { return nil }
        return try Row(statement: statement)[0] as Value
    }

    /// The first column of every row, decoded as `Value`.
    @inlinable
    public func fetchValues<Value: DatabaseValueConvertible>(
        _ type: Value.Type, _ sql: String, _ arguments: [any DatabaseValueConvertible] = []
    ) throws -> [Value] {
        let statement = try beginStatement(sql)
        defer { endStatement(statement) }
        try bind(arguments, to: statement)
        var values: [Value] = []
        while try step(statement) {
            values.append(try Row(statement: statement)[0] as Value)
        }
        return values
    }

    // MARK: - Records

    /// Inserts `record` into its table. Throws `SQLITE_CONSTRAINT` if the key exists.
    public func insert<Record: PersistableRecord>(_ record: Record) throws {
        var container = PersistenceContainer()
        record.encode(to: &container)
        let columns = container.columns.map(quoted).joined(separator: ", ")
        let placeholders = Array(repeating: "?", count: container.columns.count).joined(separator: ", ")
        try execute(
            "INSERT INTO \(quoted(Record.databaseTableName)) (\(columns)) VALUES (\(placeholders))", container.values)
    }

    /// Inserts `record`, or updates the existing row with the same primary key in place.
    ///
    /// Uses `INSERT … ON CONFLICT DO UPDATE`, never `INSERT OR REPLACE`: a replace deletes the old
    /// row first, which would fire `ON DELETE CASCADE` on every child row.
    public func upsert<Record: PersistableRecord>(_ record: Record) throws {
        var container = PersistenceContainer()
        record.encode(to: &container)
        let keys = Record.primaryKeyColumns
        let columns = container.columns.map(quoted).joined(separator: ", ")
        let placeholders = Array(repeating: "?", count: container.columns.count).joined(separator: ", ")
        let updates = container.columns.filter { !keys.contains($0) }.map { "\(quoted($0)) = excluded.\(quoted($0))" }
        let action = updates.isEmpty ? "DO NOTHING" : "DO UPDATE SET \(updates.joined(separator: ", "))"
        try execute(
            "INSERT INTO \(quoted(Record.databaseTableName)) (\(columns)) VALUES (\(placeholders)) "
                + "ON CONFLICT (\(keys.map(quoted).joined(separator: ", "))) \(action)", container.values)
    }

    /// Deletes the row whose primary key equals `record`'s. Returns whether a row was deleted.
    @discardableResult
    public func delete<Record: PersistableRecord>(_ record: Record) throws -> Bool {
        var container = PersistenceContainer()
        record.encode(to: &container)
        let keys = Record.primaryKeyColumns
        let keyValues = keys.map { container[$0]?.databaseValue ?? .null }
        let condition = keys.map { "\(quoted($0)) = ?" }.joined(separator: " AND ")
        try execute("DELETE FROM \(quoted(Record.databaseTableName)) WHERE \(condition)", keyValues)
        return changesCount > 0
    }

    private func quoted(_ identifier: String) -> String {
        "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    // MARK: - Statements

    /// Checks access, takes the cached statement for `sql` (or prepares one) and, in a read,
    /// lets it join the read's snapshot. Pair every successful call with `endStatement`, and bind
    /// the arguments with `bind(_:to:)` in between.
    @usableFromInline
    func beginStatement(_ sql: String) throws -> Statement {
        checkAccess()
        let statement: Statement
        if let recent = mostRecentStatement, !recent.isInUse, recent.sql == sql {
            // Repeated SQL (a loop of lookups) skips hashing the text: comparing two copies of the
            // same string literal is a pointer comparison.
            statement = recent
        } else if let cached = statementCache[sql], !cached.isInUse {
            statement = cached
            mostRecentStatement = cached
        } else {
            statement = try prepare(sql)
            // A statement already stepping (same SQL nested inside forEachRow) is not replaced.
            if statementCache[sql] == nil {
                // Bounded: SQL built with interpolated values (a mistake, but not a crash) would
                // otherwise grow the cache forever. In-use statements stay referenced by callers.
                if statementCache.count >= Self.statementCacheLimit { statementCache.removeAll() }
                statementCache[sql] = statement
                mostRecentStatement = statement
            }
        }
        if readPhase != .none {
            if readPhase == .notTaken && statement.isQuery {  // the common case, inline
                readPhase = .firstQuery
                snapshotHolder = statement
            } else {
                try joinReadSnapshot(statement)
            }
        }
        statement.isInUse = true
        return statement
    }

    /// Binds `arguments` to a statement from `beginStatement`.
    ///
    /// Inlinable, with `arguments` passed on element by element, so that the caller's array
    /// literal does not escape and the optimizer can keep it on the stack (no allocation).
    @inlinable @inline(__always)
    func bind(_ arguments: [any DatabaseValueConvertible], to statement: Statement) throws {
        guard Int(statement.parameterCount) == arguments.count else {
            throw argumentCountError(statement, count: arguments.count)
        }
        for index in arguments.indices {  // by index: no copy of each existential
            try bind(arguments[index].databaseValue, at: Int32(truncatingIfNeeded: index &+ 1), of: statement)
        }
    }

    @usableFromInline
    func bind(_ value: DatabaseValue, at index: Int32, of statement: Statement) throws {
        let rc = statement.bind(value, at: index)
        if rc != SQLITE_OK { throw error(rc, sql: statement.sql) }
    }

    @usableFromInline
    func argumentCountError(_ statement: Statement, count: Int) -> DatabaseError {
        DatabaseError(
            code: .sqlite, resultCode: .misuse,
            message: "the statement has \(statement.parameterCount) parameters but \(count) arguments were given",
            path: path, sql: statement.sql)
    }

    /// Ends a statement from `beginStatement` so it can be reused; any `Row` of it goes stale.
    ///
    /// Resets it, except the first query of a read while it holds the read's snapshot: that one
    /// stays open (parked) until the read ends or a second statement joins the snapshot (D-161).
    @usableFromInline
    func endStatement(_ statement: Statement) {
        statement.generation &+= 1
        statement.isInUse = false
        if statement === snapshotHolder {
            if readPhase == .holdingSnapshot { return }  // parked: it holds the read's snapshot
            readPhase = .notTaken  // it never stepped: no snapshot was taken
            snapshotHolder = nil
        }
        sqlite3_reset(statement.handle)
    }

    /// Prepares one statement (not cached) and records which tables it may write.
    func prepare(_ sql: String) throws -> Statement {
        var handle: OpaquePointer?
        authorizedWrites.removeAll(keepingCapacity: true)
        let rc = sql.withCString {
            sqlite3_prepare_v3(self.handle, $0, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &handle, nil)
        }
        guard rc == SQLITE_OK, let handle else { throw error(rc, sql: sql) }
        return Statement(handle: handle, sql: sql, writtenTables: authorizedWrites)
    }

    /// Steps once: true when a row is ready, false when done.
    @usableFromInline
    func step(_ statement: Statement) throws -> Bool {
        statement.generation &+= 1
        if isReadOnly {
            if statement === snapshotHolder { return try stepFirstQuery(statement) }
            return try stepResult(sqlite3_step(statement.handle), statement)
        }
        let before = sqlite3_total_changes64(handle)
        let rc = sqlite3_step(statement.handle)
        if sqlite3_total_changes64(handle) != before {
            if statement.changeEpoch != changeEpoch {
                changedTables.formUnion(statement.writtenTables)
                statement.changeEpoch = changeEpoch
            }
        }
        return try stepResult(rc, statement)
    }

    private func stepResult(_ rc: Int32, _ statement: Statement) throws -> Bool {
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw error(rc, sql: statement.sql)
        }
    }

    /// Runs several statements with no arguments, one after the other.
    @usableFromInline
    func executeScript(_ sql: String) throws {
        if readPhase != .none { try joinReadSnapshot(nil) }
        try sql.withCString { start in
            var cursor: UnsafePointer<CChar>? = start
            while let current = cursor, current.pointee != 0 {
                var handle: OpaquePointer?
                var tail: UnsafePointer<CChar>?
                authorizedWrites.removeAll(keepingCapacity: true)
                let rc = sqlite3_prepare_v2(self.handle, current, -1, &handle, &tail)
                let text = String(cString: current)
                guard rc == SQLITE_OK else { throw error(rc, sql: text) }
                cursor = tail
                guard let handle else { continue }  // whitespace or a comment
                let statement = Statement(
                    handle: handle, sql: sqlite3_sql(handle).map { String(cString: $0) } ?? text,
                    writtenTables: authorizedWrites)
                while try step(statement) {}
            }
        }
    }

    /// Runs a statement that SQLiteStore itself issues (BEGIN, COMMIT, ROLLBACK, PRAGMA …).
    ///
    /// These have their own tiny cache, searched linearly: every `read` runs BEGIN and COMMIT, and
    /// keeping them out of the main cache spares a hash of the SQL text and leaves the caller's
    /// statement as the most recent one.
    func executeInternal(_ sql: String) throws {
        let statement = try internalStatement(sql)
        defer { endStatement(statement) }
        while try step(statement) {}
    }

    private func internalStatement(_ sql: String) throws -> Statement {
        checkAccess()
        if let cached = internalStatements.first(where: { $0.sql == sql }) { return cached }
        let statement = try prepare(sql)
        internalStatements.append(statement)
        return statement
    }

    // MARK: - One snapshot per read (D-161)

    /// How the statements of the current `read` closure share one snapshot.
    ///
    /// A read starts no transaction up front. Its first statement, if a query, runs in SQLite's
    /// autocommit mode. A statement that has returned a row and was not reset keeps its read
    /// transaction open, and BEGIN turns an open read transaction into the read's explicit one.
    /// So a read of one row costs no BEGIN/COMMIT; a second statement, or a second step of the
    /// first (which could finish it and so end its transaction), first runs BEGIN and then sees
    /// the very snapshot the first row came from. A first query that finds no row has already
    /// ended its transaction when SQLite reports it: see `confirmEmptyFirstQuery`.
    enum ReadPhase {
        /// Not inside a read (always, for the writer connection).
        case none
        /// Inside a read; no statement has run yet.
        case notTaken
        /// The read's first statement (`snapshotHolder`), a query, runs in autocommit mode and
        /// has not returned a row yet.
        case firstQuery
        /// `snapshotHolder` returned a row and has not stepped or been reset since: its open read
        /// transaction is the read's snapshot. When its caller ends it, it is parked unreset.
        case holdingSnapshot
        /// BEGIN ran: later statements share its snapshot until `endRead`.
        case transaction
        /// BEGIN failed in the middle of the read: the snapshot cannot be kept, so every later
        /// statement of this read throws `lostSnapshotError`.
        case lost
    }

    /// Starts a read closure on this (read-only) connection. No SQL runs yet.
    func beginRead() {
        readPhase = .notTaken
    }

    /// Ends a read closure: resets the statement holding the snapshot, or ends the read
    /// transaction (COMMIT, or ROLLBACK when the closure threw). Never leaves a transaction open.
    func endRead(closureThrew: Bool) throws {
        readPhase = .none
        if let holder = snapshotHolder {
            snapshotHolder = nil
            if !holder.isInUse {
                holder.generation &+= 1
                sqlite3_reset(holder.handle)  // ends its autocommit read transaction, if open
            }
        }
        if lostSnapshotError != nil { lostSnapshotError = nil }
        guard sqlite3_get_autocommit(handle) == 0 else { return }
        if closureThrew {
            try? executeInternal("ROLLBACK")
            return
        }
        do {
            try executeInternal("COMMIT")
        } catch {
            // Never return a connection to the pool with a transaction still open.
            if sqlite3_get_autocommit(handle) == 0 { try? executeInternal("ROLLBACK") }
            throw error
        }
    }

    /// Called before `statement` (nil: a script, which may be anything) runs in a read: decides
    /// whether it may run on its own or must join (or start) the read's transaction.
    private func joinReadSnapshot(_ statement: Statement?) throws {
        switch readPhase {
        case .none, .transaction:
            return
        case .lost:
            throw lostSnapshotError!
        case .notTaken:
            if let statement, statement.isQuery {
                readPhase = .firstQuery
                snapshotHolder = statement
            } else {
                // Anything but a plain query (PRAGMA assignments, ATTACH, scripts) runs in a
                // transaction, as every statement of a read did before D-161.
                try beginReadTransaction()
            }
        case .firstQuery, .holdingSnapshot:
            // A second statement: BEGIN while the first one still holds its read transaction
            // (a parked holder is reset by `beginReadTransaction`; the transaction stays).
            try beginReadTransaction()
        }
    }

    /// BEGIN DEFERRED, then resets a parked snapshot holder; the phase becomes `.transaction`
    /// (or `.lost` if BEGIN fails).
    private func beginReadTransaction() throws {
        var parked: Statement?
        if readPhase == .holdingSnapshot, let holder = snapshotHolder, !holder.isInUse { parked = holder }
        readPhase = .transaction
        snapshotHolder = nil  // from now on an ordinary statement of the transaction
        do {
            try executeInternal("BEGIN DEFERRED")
        } catch {
            let failure = error as? DatabaseError ?? DatabaseError(code: .sqlite, message: "\(error)", path: path)
            readPhase = .lost
            lostSnapshotError = failure
            if let parked { sqlite3_reset(parked.handle) }
            throw failure
        }
        if let parked { sqlite3_reset(parked.handle) }  // autocommit is off: the snapshot stays
    }

    /// Steps the read's first query while it runs in autocommit mode.
    private func stepFirstQuery(_ statement: Statement) throws -> Bool {
        if readPhase == .holdingSnapshot {
            // This step may finish the query, which would end its read transaction: BEGIN first,
            // so the snapshot of the row already returned stays the read's snapshot.
            try beginReadTransaction()
            return try stepResult(sqlite3_step(statement.handle), statement)
        }
        let rc = sqlite3_step(statement.handle)
        switch rc {
        case SQLITE_ROW:
            readPhase = .holdingSnapshot
            return true
        case SQLITE_DONE:
            return try confirmEmptyFirstQuery(statement)
        default:
            readPhase = .notTaken  // nothing was returned, so nothing was seen
            snapshotHolder = nil
            throw error(rc, sql: statement.sql)
        }
    }

    /// The read's first query found no row, and finishing ended its autocommit read transaction.
    /// Nobody has seen that result yet. Take the read's snapshot now: step a statement that
    /// reads the database header (`PRAGMA schema_version`) once and leave it unreset, so it holds
    /// its read transaction as a first row would. Keep "no row" if the database did not change
    /// since the query's snapshot: SQLite's data version changes whenever a read transaction of
    /// this connection starts on a database state other than its previous one, and nothing else
    /// can read or write on this connection in between. Otherwise run the query again, inside
    /// a transaction begun on the new snapshot.
    private func confirmEmptyFirstQuery(_ statement: Statement) throws -> Bool {
        let queried = dataVersion()
        if let hook = afterEmptyFirstQuery {
            afterEmptyFirstQuery = nil
            hook()
        }
        let holder: Statement
        do {
            if let prepared = snapshotStatement {
                holder = prepared
            } else {
                holder = try prepare("PRAGMA schema_version")
                snapshotStatement = holder
            }
            holder.generation &+= 1
            let rc = sqlite3_step(holder.handle)
            if rc != SQLITE_ROW {
                sqlite3_reset(holder.handle)
                throw error(rc, sql: holder.sql)
            }
        } catch {
            readPhase = .notTaken  // the caller sees this error, not the empty result
            snapshotHolder = nil
            throw error
        }
        readPhase = .holdingSnapshot
        snapshotHolder = holder  // parked (not in use): `endRead` or BEGIN resets it
        if dataVersion() == queried { return false }
        try beginReadTransaction()
        sqlite3_reset(statement.handle)
        statement.generation &+= 1
        return try stepResult(sqlite3_step(statement.handle), statement)
    }

    /// SQLITE_FCNTL_DATA_VERSION of the main database.
    private func dataVersion() -> UInt32 {
        var version: UInt32 = 0
        sqlite3_file_control(handle, nil, SQLITE_FCNTL_DATA_VERSION, &version)
        return version
    }

    func error(_ rc: Int32, sql: String?) -> DatabaseError {
        let message = String(cString: sqlite3_errmsg(handle))
        if isReadOnly, ResultCode(rawValue: rc).primary == .readOnly {
            return DatabaseError(
                code: .readOnly, resultCode: ResultCode(rawValue: rc),
                message: "a read closure tried to write (\(message)); use `write { db in … }` for changes",
                path: path, sql: sql)
        }
        return DatabaseError.sqlite(rc, message: message, path: path, sql: sql)
    }
}

@available(*, unavailable)
extension Database: Sendable {}

/// The authorizer callback: records the tables a statement may write; allows everything.
private let databaseAuthorizer:
    @convention(c) (
        UnsafeMutableRawPointer?, Int32, UnsafePointer<CChar>?, UnsafePointer<CChar>?, UnsafePointer<CChar>?,
        UnsafePointer<CChar>?
    ) -> Int32 = { context, action, first, _, _, _ in
        guard let context, let first else { return SQLITE_OK }
        switch action {
        case SQLITE_INSERT, SQLITE_UPDATE, SQLITE_DELETE:
            let table = String(cString: first)
            if !table.hasPrefix("sqlite_") {
                // Safe: the authorizer runs inside sqlite3_prepare on the connection's owning
                // thread, and the Database outlives its connection.
                Unmanaged<Database>.fromOpaque(context).takeUnretainedValue().authorizedWrites.insert(table)
            }
        default:
            break
        }
        return SQLITE_OK
    }
