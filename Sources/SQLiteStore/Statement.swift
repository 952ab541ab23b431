internal import CSQLite3
import Foundation

/// A prepared statement. Internal: callers only see SQL strings and `Row`.
@usableFromInline
final class Statement {
    let handle: OpaquePointer
    let sql: String
    /// Tables this statement (and the triggers it fires) may write, as the authorizer reported
    /// them at prepare time. Used for observation: see `Database.noteChanges`.
    let writtenTables: Set<String>
    // The mutable fields below are touched on every lookup, only by the thread that owns the
    // connection, in scopes that call nothing that could touch them again: `@exclusivity(unchecked)`
    // spares each access a runtime exclusivity check (~80 instructions; D-162).

    /// Bumped on every step and reset, so a `Row` kept past its step traps instead of reading
    /// another row's values.
    @exclusivity(unchecked) @usableFromInline var generation: UInt64 = 0
    /// True while a caller is stepping it; a nested use of the same SQL gets a fresh statement.
    @exclusivity(unchecked) var isInUse = false
    @usableFromInline let parameterCount: Int32
    /// True for a statement that returns rows and changes nothing (a SELECT, a reporting
    /// PRAGMA): the only kind a `read` may start outside an explicit transaction (D-161).
    let isQuery: Bool
    /// The `Database.changeEpoch` in which `writtenTables` were last added to the changed set.
    @exclusivity(unchecked) var changeEpoch: UInt64 = 0
    private var columnIndexCache: [String: Int32]?
    private var cachedColumnCount: Int32 = -1

    init(handle: OpaquePointer, sql: String, writtenTables: Set<String>) {
        self.handle = handle
        self.sql = sql
        self.writtenTables = writtenTables
        self.parameterCount = sqlite3_bind_parameter_count(handle)
        self.isQuery = sqlite3_stmt_readonly(handle) != 0 && sqlite3_column_count(handle) > 0
    }

    deinit {
        sqlite3_finalize(handle)
    }

    var columnCount: Int32 { sqlite3_column_count(handle) }

    func columnName(_ index: Int32) -> String {
        String(cString: sqlite3_column_name(handle, index))
    }

    /// The index of a result column by name; the first match wins. Exact names are found by one
    /// dictionary lookup; other spellings fall back to a case-insensitive search, as SQL names are.
    func columnIndex(_ name: String) -> Int32? {
        // SQLite re-prepares a statement after a schema change (SELECT * may gain a column).
        if columnIndexCache == nil || cachedColumnCount != columnCount {
            cachedColumnCount = columnCount
            var cache: [String: Int32] = [:]
            for index in 0..<columnCount {
                let key = columnName(index)
                if cache[key] == nil { cache[key] = index }
            }
            columnIndexCache = cache
        }
        if let index = columnIndexCache?[name] { return index }
        let lowered = name.lowercased()
        return (0..<columnCount).first { columnName($0).lowercased() == lowered }
    }

    /// Binds one value to the 1-based parameter `index`.
    func bind(_ value: DatabaseValue, at index: Int32) -> Int32 {
        switch value {
        case .null:
            return sqlite3_bind_null(handle, index)
        case .integer(let integer):
            return sqlite3_bind_int64(handle, index, integer)
        case .real(let real):
            return sqlite3_bind_double(handle, index, real)
        case .text(let text):
            // Length from utf8.count, not -1: a string with an embedded NUL stays whole.
            return text.withCString {
                sqlite3_bind_text(handle, index, $0, Int32(text.utf8.count), csqlite3_transient())
            }
        case .blob(let data):
            // An empty Data may have no base address, and a NULL pointer would bind SQL NULL.
            if data.isEmpty { return sqlite3_bind_zeroblob(handle, index, 0) }
            return data.withUnsafeBytes {
                sqlite3_bind_blob(handle, index, $0.baseAddress, Int32($0.count), csqlite3_transient())
            }
        }
    }

    /// The value of result column `index` of the current row.
    func value(at index: Int32) -> DatabaseValue {
        switch sqlite3_column_type(handle, index) {
        case SQLITE_NULL:
            return .null
        case SQLITE_INTEGER:
            return .integer(sqlite3_column_int64(handle, index))
        case SQLITE_FLOAT:
            return .real(sqlite3_column_double(handle, index))
        case SQLITE_TEXT:
            let count = Int(sqlite3_column_bytes(handle, index))
            guard let bytes = sqlite3_column_text(handle, index) else { return .text("") }
            return .text(String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self))
        default:
            let count = Int(sqlite3_column_bytes(handle, index))
            guard count > 0, let bytes = sqlite3_column_blob(handle, index) else { return .blob(Data()) }
            return .blob(Data(bytes: bytes, count: count))
        }
    }
}
