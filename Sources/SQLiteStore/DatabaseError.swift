internal import CSQLite3

/// An SQLite result code (primary or extended), e.g. `SQLITE_CONSTRAINT` or
/// `SQLITE_CONSTRAINT_PRIMARYKEY`.
///
/// `~=` matches a primary code against its extended codes, so
/// `case ResultCode.constraint` catches every constraint violation.
public struct ResultCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The C value, e.g. 19 for `SQLITE_CONSTRAINT`.
    public let rawValue: Int32
    /// Wraps a C result code.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// The primary code (low 8 bits): `SQLITE_CONSTRAINT_PRIMARYKEY` → `SQLITE_CONSTRAINT`.
    public var primary: ResultCode { ResultCode(rawValue: rawValue & 0xFF) }

    /// `SQLITE_ERROR`: generic error, usually an SQL mistake.
    public static let error = ResultCode(rawValue: SQLITE_ERROR)
    /// `SQLITE_BUSY`: another connection holds a lock and the busy timeout ran out.
    public static let busy = ResultCode(rawValue: SQLITE_BUSY)
    /// `SQLITE_READONLY`: the database or its directory cannot be written.
    public static let readOnly = ResultCode(rawValue: SQLITE_READONLY)
    /// `SQLITE_IOERR`: an I/O error from the operating system.
    public static let ioError = ResultCode(rawValue: SQLITE_IOERR)
    /// `SQLITE_CORRUPT`: the database file is damaged.
    public static let corrupt = ResultCode(rawValue: SQLITE_CORRUPT)
    /// `SQLITE_FULL`: the disk (or the file system holding the database) is full.
    public static let full = ResultCode(rawValue: SQLITE_FULL)
    /// `SQLITE_CANTOPEN`: the file or its directory cannot be opened.
    public static let cannotOpen = ResultCode(rawValue: SQLITE_CANTOPEN)
    /// `SQLITE_CONSTRAINT`: a UNIQUE, NOT NULL, CHECK or FOREIGN KEY constraint failed.
    public static let constraint = ResultCode(rawValue: SQLITE_CONSTRAINT)
    /// `SQLITE_NOTADB`: the file is not an SQLite database.
    public static let notADatabase = ResultCode(rawValue: SQLITE_NOTADB)
    /// `SQLITE_MISUSE`: the library was called wrongly (a bug in this module).
    public static let misuse = ResultCode(rawValue: SQLITE_MISUSE)

    public var description: String {
        "\(String(cString: sqlite3_errstr(rawValue))) (code \(rawValue))"
    }

    /// True when `value`'s primary code is `pattern` (or `value` equals `pattern` exactly).
    public static func ~= (pattern: ResultCode, value: ResultCode) -> Bool {
        pattern == value || (pattern.rawValue == pattern.primary.rawValue && pattern == value.primary)
    }
}

/// Every error SQLiteStore throws.
///
/// `description` is one or two sentences for a person: what failed, on which file, and what to do.
/// `code` says what kind of failure it is; `resultCode`, `sql` and `path` keep the details.
public struct DatabaseError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure, for callers that branch on it.
    public enum Code: Sendable, Equatable {
        /// An SQL statement failed; `resultCode` says why.
        case sqlite
        /// The file at `path` is not an SQLite database, or it is damaged. Nothing was changed.
        case notADatabase
        /// The file or its directory cannot be opened or created (missing or read-only directory).
        case cannotOpen
        /// The database is read-only (read-only file, directory or file system).
        case readOnly
        /// The disk holding the database is full; the transaction was rolled back.
        case diskFull
        /// The database was written by a newer ProviderFS: it records migrations this build does not know.
        case newerSchema
        /// The recorded migrations do not match this build's list (a migration was inserted or renamed).
        case migrationMismatch
        /// A column could not be decoded as the requested Swift type.
        case decodingFailed
        /// A `write` closure committed or rolled back the transaction itself.
        case transactionEndedByBody
    }

    /// What kind of failure.
    public var code: Code
    /// The SQLite result code, when SQLite reported the failure.
    public var resultCode: ResultCode?
    /// The human explanation (without the path and SQL, which `description` adds).
    public var message: String
    /// The database file, when known.
    public var path: String?
    /// The statement that failed, when one did.
    public var sql: String?

    /// Makes an error; prefer the static helpers in this module.
    public init(code: Code, resultCode: ResultCode? = nil, message: String, path: String? = nil, sql: String? = nil) {
        self.code = code
        self.resultCode = resultCode
        self.message = message
        self.path = path
        self.sql = sql
    }

    public var description: String {
        var text = ""
        if let path { text += "\(path): " }
        text += message
        if let sql { text += " [SQL: \(sql)]" }
        return text
    }

    /// Classifies an SQLite failure and writes the advice a person needs.
    static func sqlite(_ rc: Int32, message: String, path: String, sql: String?) -> DatabaseError {
        let result = ResultCode(rawValue: rc)
        switch result.primary {
        case .notADatabase, .corrupt:
            return DatabaseError(
                code: .notADatabase, resultCode: result,
                message:
                    "this file is not a usable SQLite database (\(message)). ProviderFS did not change it. "
                    + "Move it aside (or restore it from a backup) and start again; a new database will be created.",
                path: path, sql: sql)
        case .cannotOpen:
            return DatabaseError(
                code: .cannotOpen, resultCode: result,
                message:
                    "cannot open or create the database (\(message)). Check that the directory exists and is "
                    + "writable by this user, and that the file system is mounted read-write.",
                path: path, sql: sql)
        case .readOnly:
            return DatabaseError(
                code: .readOnly, resultCode: result,
                message:
                    "the database cannot be written (\(message)). The file, its directory or its file system is "
                    + "read-only; make it writable or choose another location.",
                path: path, sql: sql)
        case .full:
            return DatabaseError(
                code: .diskFull, resultCode: result,
                message:
                    "the disk holding the database is full (\(message)); the transaction was rolled back and "
                    + "nothing was lost. Free some space and try again.",
                path: path, sql: sql)
        default:
            return DatabaseError(code: .sqlite, resultCode: result, message: message, path: path, sql: sql)
        }
    }
}
