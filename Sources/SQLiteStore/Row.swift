internal import CSQLite3

/// The current row of a query, valid only inside the closure or initializer it was passed to.
///
/// A `Row` reads straight from SQLite's statement (no copy). It is not Sendable and must not be
/// kept: using it after the query moved on traps with a message saying so. Decode what you need
/// into a `FetchableRecord` value instead.
public struct Row {
    @usableFromInline let statement: Statement
    @usableFromInline let generation: UInt64

    @usableFromInline
    init(statement: Statement) {
        self.statement = statement
        self.generation = statement.generation
    }

    private func checkCurrent() {
        precondition(
            statement.generation == generation,
            "SQLiteStore misuse: a Row was used after its query moved to the next row or finished "
                + "(\(statement.sql)). Copy the values out inside init(row:) or the row closure.")
    }

    /// The number of result columns.
    public var count: Int {
        checkCurrent()
        return Int(statement.columnCount)
    }

    /// The result column names, in order.
    public var columnNames: [String] {
        checkCurrent()
        return (0..<statement.columnCount).map(statement.columnName)
    }

    /// The raw value of column `index` (0-based).
    public func databaseValue(at index: Int) -> DatabaseValue {
        checkCurrent()
        precondition(
            index >= 0 && index < Int(statement.columnCount), "SQLiteStore: column index \(index) out of range")
        return statement.value(at: Int32(index))
    }

    /// Column `index` (0-based) decoded as `Value`.
    ///
    /// - Throws: `DatabaseError` `.decodingFailed` naming the column when the value does not fit
    ///   `Value` (e.g. NULL for a non-optional, TEXT for an Int64).
    @inlinable
    public subscript<Value: DatabaseValueConvertible>(_ index: Int) -> Value {
        // Inlinable so that a record's `init(row:)` calls the decoder of each column's type
        // directly instead of through unspecialized generic code (D-163).
        get throws {
            try Value.decode(from: self, at: index)
        }
    }

    // The typed readers below take the column's value once (sqlite3_column_value) and read its
    // type and contents from it: every sqlite3_column_* call enters and leaves the connection's
    // API (mutex calls, error bookkeeping), sqlite3_value_* calls do not. SQLite calls the
    // value "unprotected" because no mutex is held while it is read; connections here are opened
    // SQLITE_OPEN_NOMUTEX and used by one thread at a time, so sqlite3_column_* would hold none
    // either, and the value is read before the statement steps again (D-162).

    /// The column's INTEGER value, or nil when it holds another storage class.
    func integerIfInteger(at index: Int) -> Int64? {
        let value = columnValue(index)
        guard sqlite3_value_type(value) == SQLITE_INTEGER else { return nil }
        return sqlite3_value_int64(value)
    }

    /// The column's TEXT value, or nil when it holds another storage class.
    func textIfText(at index: Int) -> String? {
        let value = columnValue(index)
        guard sqlite3_value_type(value) == SQLITE_TEXT else { return nil }
        guard let bytes = sqlite3_value_text(value) else { return "" }
        let count = Int(sqlite3_value_bytes(value))  // after sqlite3_value_text, as SQLite advises
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }

    /// True when the column is NULL.
    func isNull(at index: Int) -> Bool {
        sqlite3_value_type(columnValue(index)) == SQLITE_NULL
    }

    /// The current row's value of column `index`, valid until the statement steps or resets.
    private func columnValue(_ index: Int) -> OpaquePointer? {
        checkCurrent()
        precondition(
            index >= 0 && index < Int(statement.columnCount), "SQLiteStore: column index \(index) out of range")
        return sqlite3_column_value(statement.handle, Int32(index))
    }

    /// Column `name` decoded as `Value`. Column names match case-insensitively.
    ///
    /// - Throws: `DatabaseError` `.decodingFailed` when there is no such column or the value
    ///   does not fit `Value`.
    public subscript<Value: DatabaseValueConvertible>(_ name: String) -> Value {
        get throws {
            checkCurrent()
            guard let index = statement.columnIndex(name) else {
                throw DatabaseError(
                    code: .decodingFailed,
                    message:
                        "no column named '\(name)' in the result (columns: \(columnNames.joined(separator: ", ")))",
                    sql: statement.sql)
            }
            return try self[Int(index)]
        }
    }

    @usableFromInline
    func decodingError(index: Int, value: DatabaseValue, type: Any.Type) -> DatabaseError {
        let column = statement.columnName(Int32(index))
        return DatabaseError(
            code: .decodingFailed,
            message: "column '\(column)' holds \(value.storageClassName) \(value), which cannot be read as \(type)",
            sql: statement.sql)
    }
}

@available(*, unavailable)
extension Row: Sendable {}

/// A value type built from a query row.
///
/// Records are plain Sendable structs: no base class, no context object, no setters to
/// intercept. Mutate a copy and write it back inside `write` (see docs/DECISIONS.md D-151).
///
/// ```swift
/// struct Item: FetchableRecord {
///     var id: Int64
///     var name: String
///     init(row: Row) throws {
///         id = try row["id"]
///         name = try row["name"]
///     }
/// }
/// ```
public protocol FetchableRecord: Sendable {
    /// Decodes one row. Throw (usually by letting `Row`'s subscripts throw) when it does not fit.
    init(row: Row) throws
}

/// A value type that can be written to one table.
///
/// `encode(to:)` lists the columns and their values; `Database.insert`, `upsert` and `delete`
/// build the SQL from it.
public protocol PersistableRecord: Sendable {
    /// The table the record lives in.
    static var databaseTableName: String { get }
    /// The primary key columns, used by `upsert` and `delete`. Defaults to `["id"]`.
    static var primaryKeyColumns: [String] { get }
    /// Writes every column value into `container`, in a stable order.
    func encode(to container: inout PersistenceContainer)
}

extension PersistableRecord {
    /// `["id"]`.
    public static var primaryKeyColumns: [String] { ["id"] }
}

/// The column → value list a `PersistableRecord` encodes itself into.
public struct PersistenceContainer: Sendable {
    /// The columns in the order they were set.
    public private(set) var columns: [String] = []
    /// The values, parallel to `columns`.
    public private(set) var values: [DatabaseValue] = []

    /// An empty container.
    public init() {}

    /// Sets column `column` to `value` (replacing an earlier value for the same column).
    public subscript(column: String) -> (any DatabaseValueConvertible)? {
        get {
            columns.firstIndex(of: column).map { values[$0] }
        }
        set {
            let value = newValue?.databaseValue ?? .null
            if let index = columns.firstIndex(of: column) {
                values[index] = value
            } else {
                columns.append(column)
                values.append(value)
            }
        }
    }
}
