public import Foundation

/// One SQLite value: what a column holds or a statement parameter receives.
public enum DatabaseValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob(Data)

    /// True for `.null`.
    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// The SQLite storage class name, for error messages ("INTEGER", "TEXT", ...).
    public var storageClassName: String {
        switch self {
        case .null: "NULL"
        case .integer: "INTEGER"
        case .real: "REAL"
        case .text: "TEXT"
        case .blob: "BLOB"
        }
    }

    public var description: String {
        switch self {
        case .null: "NULL"
        case .integer(let value): String(value)
        case .real(let value): String(value)
        case .text(let value): "'\(value)'"
        case .blob(let value): "<\(value.count) bytes>"
        }
    }
}

/// A Swift type that can be stored in and read back from one SQLite column.
///
/// Conforming types: `Int64`, `Int`, `Int32`, `Double`, `String`, `Data`, `Bool`, `Date`,
/// `DatabaseValue`, and `Optional` of any of them (NULL ⇄ nil). A non-optional type read from a
/// NULL column, or from a column of the wrong storage class, throws `DatabaseError` with code
/// `.decodingFailed` naming the column.
public protocol DatabaseValueConvertible: Sendable {
    /// The value to bind for this Swift value.
    var databaseValue: DatabaseValue { get }

    /// The Swift value for a column value, or nil when the column holds something this type
    /// cannot represent (wrong storage class, NULL for a non-optional, out-of-range integer).
    static func fromDatabaseValue(_ value: DatabaseValue) -> Self?

    /// Reads column `index` of `row` directly. The default goes through `fromDatabaseValue`;
    /// the built-in types read SQLite's column without building a `DatabaseValue` first, which
    /// keeps record decoding close to raw C speed (see the SQLiteStore benchmark in docs/MOUNT.md's
    /// measurement log).
    ///
    /// - Throws: `DatabaseError` `.decodingFailed` naming the column.
    static func decode(from row: Row, at index: Int) throws -> Self
}

extension DatabaseValueConvertible {
    /// Decodes through `fromDatabaseValue`.
    public static func decode(from row: Row, at index: Int) throws -> Self {
        let value = row.databaseValue(at: index)
        guard let decoded = fromDatabaseValue(value) else {
            throw row.decodingError(index: index, value: value, type: Self.self)
        }
        return decoded
    }
}

extension DatabaseValue: DatabaseValueConvertible {
    /// The value itself.
    public var databaseValue: DatabaseValue { self }
    /// Always succeeds: a `DatabaseValue` column accepts any storage class.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> DatabaseValue? { value }
}

extension Int64: DatabaseValueConvertible {
    /// Reads an INTEGER column without an intermediate `DatabaseValue`.
    public static func decode(from row: Row, at index: Int) throws -> Int64 {
        if let integer = row.integerIfInteger(at: index) { return integer }
        let value = row.databaseValue(at: index)
        throw row.decodingError(index: index, value: value, type: Int64.self)
    }

    /// `.integer`.
    public var databaseValue: DatabaseValue { .integer(self) }
    /// Accepts INTEGER only: a REAL or TEXT column is a schema mistake, not something to coerce.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Int64? {
        if case .integer(let integer) = value { return integer }
        return nil
    }
}

extension Int: DatabaseValueConvertible {
    /// Reads an INTEGER column without an intermediate `DatabaseValue`.
    public static func decode(from row: Row, at index: Int) throws -> Int {
        if let integer = row.integerIfInteger(at: index), let value = Int(exactly: integer) { return value }
        let value = row.databaseValue(at: index)
        throw row.decodingError(index: index, value: value, type: Int.self)
    }

    /// `.integer`.
    public var databaseValue: DatabaseValue { .integer(Int64(self)) }
    /// Accepts INTEGER only.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Int? {
        if case .integer(let integer) = value { return Int(exactly: integer) }
        return nil
    }
}

extension Int32: DatabaseValueConvertible {
    /// `.integer`.
    public var databaseValue: DatabaseValue { .integer(Int64(self)) }
    /// Accepts INTEGER values that fit in 32 bits.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Int32? {
        if case .integer(let integer) = value { return Int32(exactly: integer) }
        return nil
    }
}

extension UInt32: DatabaseValueConvertible {
    /// `.integer`.
    public var databaseValue: DatabaseValue { .integer(Int64(self)) }
    /// Accepts INTEGER values in 0...UInt32.max.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> UInt32? {
        if case .integer(let integer) = value { return UInt32(exactly: integer) }
        return nil
    }
}

extension Double: DatabaseValueConvertible {
    /// `.real`.
    public var databaseValue: DatabaseValue { .real(self) }
    /// Accepts REAL, and INTEGER (SQLite stores integral REAL values as INTEGER in some cases,
    /// e.g. after `CAST` or in columns with INTEGER affinity).
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Double? {
        switch value {
        case .real(let real): real
        case .integer(let integer): Double(integer)
        default: nil
        }
    }
}

extension String: DatabaseValueConvertible {
    /// Reads a TEXT column without an intermediate `DatabaseValue`.
    public static func decode(from row: Row, at index: Int) throws -> String {
        if let text = row.textIfText(at: index) { return text }
        let value = row.databaseValue(at: index)
        throw row.decodingError(index: index, value: value, type: String.self)
    }

    /// `.text`.
    public var databaseValue: DatabaseValue { .text(self) }
    /// Accepts TEXT only.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> String? {
        if case .text(let text) = value { return text }
        return nil
    }
}

extension Data: DatabaseValueConvertible {
    /// `.blob`.
    public var databaseValue: DatabaseValue { .blob(self) }
    /// Accepts BLOB only.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Data? {
        if case .blob(let blob) = value { return blob }
        return nil
    }
}

extension Bool: DatabaseValueConvertible {
    /// `.integer(1)` or `.integer(0)`, as SQLite's own boolean expressions produce.
    public var databaseValue: DatabaseValue { .integer(self ? 1 : 0) }
    /// Accepts INTEGER 0 and 1 only; any other number is a bug worth hearing about.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Bool? {
        switch value {
        case .integer(0): false
        case .integer(1): true
        default: nil
        }
    }
}

extension Date: DatabaseValueConvertible {
    /// `.real` seconds since 1970-01-01T00:00:00Z (D-155): sortable, readable with SQLite's
    /// `datetime(x, 'unixepoch')`, and sub-millisecond precise for present-day dates.
    public var databaseValue: DatabaseValue { .real(timeIntervalSince1970) }
    /// Accepts REAL or INTEGER seconds since 1970.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Date? {
        Double.fromDatabaseValue(value).map { Date(timeIntervalSince1970: $0) }
    }
}

extension Optional: DatabaseValueConvertible where Wrapped: DatabaseValueConvertible {
    /// NULL reads as nil; anything else must decode as `Wrapped`.
    public static func decode(from row: Row, at index: Int) throws -> Wrapped? {
        if row.isNull(at: index) { return nil }
        return try Wrapped.decode(from: row, at: index)
    }

    /// `.null` for nil, else the wrapped value's.
    public var databaseValue: DatabaseValue {
        switch self {
        case .none: .null
        case .some(let wrapped): wrapped.databaseValue
        }
    }
    /// NULL reads as `.some(nil)`; anything else must decode as `Wrapped`.
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Wrapped?? {
        if value.isNull { return .some(nil) }
        guard let wrapped = Wrapped.fromDatabaseValue(value) else { return nil }
        return .some(wrapped)
    }
}
