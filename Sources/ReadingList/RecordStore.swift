// The app's records in SQLite (SQLiteStore): one row per document, pending until its file is in
// the library, and one row per import attempt for `reading-list report`.

public import Foundation
import SQLiteStore

/// A document the app owns (or is taking: `pending`).
public struct DocumentRecord: Sendable, Equatable, Codable {
    public enum State: String, Sendable, Codable {
        /// Created before the file is moved into the library; not shown by `list` or `open`.
        case pending
        /// Its file is in the library and validated.
        case available
    }

    /// A UUID; the library file is `<id>.pdf`.
    public var id: String
    /// The name the source had. Only a field: never part of a path.
    public var displayName: String
    public var state: State
    public var size: Int64
    /// SHA-256 of the bytes, hex.
    public var sha256: String
    public var pageCount: Int
    /// qpdf warned while validating (accepted, flagged).
    public var repaired: Bool
    public var warnings: [String]
    public var encrypted: Bool
    public var sourcePath: String
    public var sourceCategory: SourceCategory
    public var importedAt: Date
    /// The process importing it while `pending` (pid and /proc start time), so that reconcile
    /// in another process leaves an import that is still running alone.
    public var ownerPID: Int32?
    public var ownerStartTime: UInt64?

    public init(
        id: String, displayName: String, state: State, size: Int64, sha256: String, pageCount: Int, repaired: Bool,
        warnings: [String], encrypted: Bool, sourcePath: String, sourceCategory: SourceCategory, importedAt: Date,
        ownerPID: Int32?, ownerStartTime: UInt64?
    ) {
        self.id = id
        self.displayName = displayName
        self.state = state
        self.size = size
        self.sha256 = sha256
        self.pageCount = pageCount
        self.repaired = repaired
        self.warnings = warnings
        self.encrypted = encrypted
        self.sourcePath = sourcePath
        self.sourceCategory = sourceCategory
        self.importedAt = importedAt
        self.ownerPID = ownerPID
        self.ownerStartTime = ownerStartTime
    }
}

/// Where a document came from, as the report groups sources.
public enum SourceCategory: String, Sendable, Codable, CaseIterable {
    /// `MOUNTPOINT/.scoped/<token>/…` of a ProviderFS mount.
    case tokenPath
    /// A plain path inside a ProviderFS mount.
    case mountPath
    /// Any other file.
    case localFile
}

/// The records database.
public final class RecordStore: Sendable {
    let queue: DatabaseQueue

    public init(path: String) throws(ReadingListError) {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("documents and attempts") { db in
            try db.execute(
                """
                CREATE TABLE documents (
                    id TEXT PRIMARY KEY NOT NULL,
                    display_name TEXT NOT NULL,
                    state TEXT NOT NULL CHECK (state IN ('pending', 'available')),
                    size INTEGER NOT NULL,
                    sha256 TEXT NOT NULL,
                    page_count INTEGER NOT NULL,
                    repaired INTEGER NOT NULL,
                    warnings TEXT NOT NULL,
                    encrypted INTEGER NOT NULL,
                    source_path TEXT NOT NULL,
                    source_category TEXT NOT NULL,
                    imported_at REAL NOT NULL,
                    owner_pid INTEGER,
                    owner_start_time INTEGER
                )
                """)
            try db.execute(
                """
                CREATE TABLE attempts (
                    id TEXT PRIMARY KEY NOT NULL,
                    started_at REAL NOT NULL,
                    source_path TEXT NOT NULL,
                    source_category TEXT NOT NULL,
                    file_type TEXT NOT NULL,
                    result TEXT NOT NULL,
                    failed_stage TEXT,
                    error TEXT,
                    document_id TEXT,
                    stages TEXT NOT NULL,
                    versions TEXT NOT NULL,
                    owner_pid INTEGER,
                    owner_start_time INTEGER
                )
                """)
            try db.execute("CREATE INDEX attempts_by_time ON attempts (started_at)")
        }
        var configuration = DatabaseQueue.Configuration()
        // Two imports (two processes) may write at once: wait for each other, do not fail.
        configuration.busyTimeout = .seconds(30)
        // Commits are durable against a crash of the process; the ones an import's outcome rests
        // on (a record made available or removed) are also fsynced, and with them every earlier
        // commit (D-475).
        configuration.synchronous = .normal
        // One process per import opens the records, and its first read recovers the WAL's index
        // from the whole WAL: checkpointing at 100 pages (~11 imports; two syncs each time) keeps
        // that read short instead of growing to SQLite's 1,000 (D-533).
        configuration.walAutocheckpointPages = 100
        configuration.label = "reading-list"
        do {
            queue = try DatabaseQueue(path: path, migrator: migrator, configuration: configuration)
        } catch {
            throw ReadingListError("cannot open the records at \(path): \(error)")
        }
    }

    // MARK: Documents

    public func insert(_ record: DocumentRecord) throws(ReadingListError) {
        try write("create the record of \(record.id)") { db in
            try db.execute(
                """
                INSERT INTO documents (id, display_name, state, size, sha256, page_count, repaired, warnings,
                    encrypted, source_path, source_category, imported_at, owner_pid, owner_start_time)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
                [
                    record.id, record.displayName, record.state.rawValue, record.size, record.sha256,
                    record.pageCount, record.repaired, Self.json(record.warnings), record.encrypted,
                    record.sourcePath, record.sourceCategory.rawValue, record.importedAt,
                    record.ownerPID.map(Int64.init), record.ownerStartTime.map { Int64(bitPattern: $0) },
                ])
        }
    }

    /// Marks a pending document available (its file is in the library); false if it is gone.
    @discardableResult
    public func markAvailable(_ id: String) throws(ReadingListError) -> Bool {
        try write("mark \(id) available", durable: true) { db in
            try db.execute(
                "UPDATE documents SET state = 'available', owner_pid = NULL, owner_start_time = NULL WHERE id = ?",
                [id])
            return db.changesCount > 0
        }
    }

    /// Removes a document's record; false if there was none.
    @discardableResult
    public func delete(_ id: String) throws(ReadingListError) -> Bool {
        try write("delete the record of \(id)", durable: true) { db in
            try db.execute("DELETE FROM documents WHERE id = ?", [id])
            return db.changesCount > 0
        }
    }

    public func document(_ id: String) throws(ReadingListError) -> DocumentRecord? {
        try read("read the record of \(id)") { db in
            try db.fetchOne(DocumentRow.self, "SELECT * FROM documents WHERE id = ?", [id])?.record
        }
    }

    /// Documents, oldest first; `state` nil for every state.
    public func documents(state: DocumentRecord.State? = nil) throws(ReadingListError) -> [DocumentRecord] {
        try read("list the documents") { db in
            if let state {
                return try db.fetchAll(
                    DocumentRow.self, "SELECT * FROM documents WHERE state = ? ORDER BY imported_at, id",
                    [state.rawValue]
                ).map(\.record)
            }
            return try db.fetchAll(DocumentRow.self, "SELECT * FROM documents ORDER BY imported_at, id").map(\.record)
        }
    }

    /// What reconcile reads at every start, in one snapshot: the pending documents whole, and
    /// only the ids of the available ones (their rows are not decoded: a start costs little per
    /// document, D-520).
    public func reconcileView() throws(ReadingListError) -> (pending: [DocumentRecord], available: [String]) {
        try read("list the documents") { db in
            let pending = try db.fetchAll(
                DocumentRow.self, "SELECT * FROM documents WHERE state = 'pending' ORDER BY imported_at, id"
            ).map(\.record)
            let available = try db.fetchValues(
                String.self, "SELECT id FROM documents WHERE state = 'available' ORDER BY imported_at, id")
            return (pending, available)
        }
    }

    // MARK: Attempts

    /// Writes (inserts or updates) an attempt's row; with `keepingAttempts`, also keeps only
    /// that many of the newest attempts, in the same transaction. An attempt keeps the start time
    /// of its first save: an update leaves the indexed columns (id, start) alone and so rewrites
    /// one page, not three (an import saves its attempt four times, and every page written is
    /// one more for the next start to read back from the WAL, D-533).
    public func save(_ attempt: ImportAttempt, keepingAttempts: Int? = nil) throws(ReadingListError) {
        try write("record the import attempt") { db in
            try db.execute(
                """
                INSERT INTO attempts (id, started_at, source_path, source_category, file_type, result,
                    failed_stage, error, document_id, stages, versions, owner_pid, owner_start_time)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (id) DO UPDATE SET source_path = excluded.source_path,
                    source_category = excluded.source_category, file_type = excluded.file_type,
                    result = excluded.result, failed_stage = excluded.failed_stage, error = excluded.error,
                    document_id = excluded.document_id, stages = excluded.stages, versions = excluded.versions,
                    owner_pid = excluded.owner_pid, owner_start_time = excluded.owner_start_time
                """,
                [
                    attempt.id, attempt.startedAt, attempt.sourcePath, attempt.sourceCategory.rawValue,
                    attempt.fileType, attempt.result.rawValue, attempt.failedStage?.rawValue, attempt.error,
                    attempt.documentID, Self.json(attempt.stages), Self.json(attempt.versions),
                    attempt.ownerPID.map(Int64.init), attempt.ownerStartTime.map { Int64(bitPattern: $0) },
                ])
            if let keepingAttempts { try Self.prune(db, keeping: keepingAttempts) }
        }
    }

    /// The newest `limit` attempts, oldest first.
    public func attempts(limit: Int = 50) throws(ReadingListError) -> [ImportAttempt] {
        try read("read the import attempts") { db in
            try db.fetchAll(
                AttemptRow.self,
                "SELECT * FROM (SELECT * FROM attempts ORDER BY started_at DESC, id DESC LIMIT ?) ORDER BY started_at, id",
                [max(0, limit)]
            ).map(\.attempt)
        }
    }

    /// The attempts still marked running (by a live import, or one whose process ended).
    public func runningAttempts() throws(ReadingListError) -> [ImportAttempt] {
        try read("read the running import attempts") { db in
            try db.fetchAll(
                AttemptRow.self, "SELECT * FROM attempts WHERE result = ? ORDER BY started_at, id",
                [ImportAttempt.Result.running.rawValue]
            ).map(\.attempt)
        }
    }

    /// Keeps the newest `count` attempts.
    public func pruneAttempts(keeping count: Int) throws(ReadingListError) {
        try write("prune the import attempts") { db in try Self.prune(db, keeping: count) }
    }

    static func prune(_ db: Database, keeping count: Int) throws {
        try db.execute(
            "DELETE FROM attempts WHERE id NOT IN (SELECT id FROM attempts ORDER BY started_at DESC LIMIT ?)",
            [max(0, count)])
    }

    // MARK: Plumbing

    /// A write transaction; `durable` ones are fsynced before this returns (D-475).
    func write<T>(
        _ what: String, durable: Bool = false, _ body: (Database) throws -> T
    ) throws(ReadingListError) -> T {
        do {
            return try durable ? queue.write(synchronous: .full, body) : queue.write(body)
        } catch {
            throw ReadingListError("cannot \(what): \(error)")
        }
    }

    func read<T>(_ what: String, _ body: (Database) throws -> T) throws(ReadingListError) -> T {
        do {
            return try queue.read(body)
        } catch {
            throw ReadingListError("cannot \(what): \(error)")
        }
    }

    static func json<T: Encodable>(_ value: T) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
    }

    static func decode<T: Decodable>(_ type: T.Type, _ text: String) throws -> T {
        try JSONDecoder().decode(type, from: Data(text.utf8))
    }
}

private struct DocumentRow: FetchableRecord {
    var record: DocumentRecord

    init(row: Row) throws {
        let state: String = try row["state"]
        let category: String = try row["source_category"]
        let warnings: String = try row["warnings"]
        let pid: Int64? = try row["owner_pid"]
        let start: Int64? = try row["owner_start_time"]
        record = DocumentRecord(
            id: try row["id"], displayName: try row["display_name"],
            state: DocumentRecord.State(rawValue: state) ?? .pending, size: try row["size"],
            sha256: try row["sha256"], pageCount: try row["page_count"], repaired: try row["repaired"],
            warnings: (try? RecordStore.decode([String].self, warnings)) ?? [], encrypted: try row["encrypted"],
            sourcePath: try row["source_path"], sourceCategory: SourceCategory(rawValue: category) ?? .localFile,
            importedAt: try row["imported_at"], ownerPID: pid.map { Int32(truncatingIfNeeded: $0) },
            ownerStartTime: start.map { UInt64(bitPattern: $0) })
    }
}

private struct AttemptRow: FetchableRecord {
    var attempt: ImportAttempt

    init(row: Row) throws {
        let category: String = try row["source_category"]
        let result: String = try row["result"]
        let failed: String? = try row["failed_stage"]
        let stages: String = try row["stages"]
        let versions: String = try row["versions"]
        let pid: Int64? = try row["owner_pid"]
        let start: Int64? = try row["owner_start_time"]
        attempt = ImportAttempt(
            id: try row["id"], startedAt: try row["started_at"], sourcePath: try row["source_path"],
            sourceCategory: SourceCategory(rawValue: category) ?? .localFile, fileType: try row["file_type"],
            result: ImportAttempt.Result(rawValue: result) ?? .interrupted,
            failedStage: failed.flatMap(ImportStage.init(rawValue:)), error: try row["error"],
            documentID: try row["document_id"],
            stages: (try? RecordStore.decode([StageResult].self, stages)) ?? [],
            versions: (try? RecordStore.decode(Versions.self, versions))
                ?? Versions(system: "?", provider: nil, app: "?"),
            ownerPID: pid.map { Int32(truncatingIfNeeded: $0) }, ownerStartTime: start.map { UInt64(bitPattern: $0) })
    }
}
