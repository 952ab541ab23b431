// The authority's files in the mount's cache directory, all mode 0600 and none holding a token:
// - `tokens.db`, SQLite through SQLiteStore (D-335): one `authority` row (tag, salt, the store
//   clock, D-336) and one `tokens` row per remembered token (its `StoredTokens.Token` as JSON). A
//   change writes only the rows it changed, in one transaction that is on disk (WAL, synchronous
//   FULL) before the call returns: the cost does not grow with the number of tokens.
// - `tokens-audit.jsonl`, the audit log, one JSON object a line, appended; rewritten with the
//   entries kept when it holds twice as many.
// - `tokens.json`, the token file of earlier versions, is read once, migrated into tokens.db in
//   one transaction, then renamed `tokens.json.migrated-…` (never read again: a later downgrade
//   must not bring back tokens revoked since).
// A store that cannot be read is moved aside and logged; the mount starts without its tokens.

import Foundation
import SQLiteStore
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

final class TokenStore: Sendable {
    let databasePath: String
    let legacyPath: String
    let auditPath: String
    private let log: @Sendable (String) -> Void
    /// Orders token writes: a batch of changed rows is taken from the authority and written while
    /// it is held, so a later batch is always written after an earlier one. Held across the
    /// write by design; the authority's state lock is never held while waiting for it.
    private let writer = Lock()
    /// Orders audit appends and rewrites (a denial's audit line never waits for a token write).
    private let auditWriter = Lock()
    /// nil when the database could not be opened (nothing can be saved: grants are refused).
    private let database = Locked<DatabaseQueue?>(nil)
    private let files = Locked(Files())

    private struct Files {
        var auditLines = 0
        /// Token rows written or deleted since the store opened (tests: a change writes its own
        /// rows, not the table).
        var rowsWritten = 0
    }

    var rowsWritten: Int { files.withLock { $0.rowsWritten } }

    /// The `authority` row.
    struct Header: Equatable {
        var mountTag: String
        /// Hex.
        var salt: String
        /// The store clock (D-336) when the row was last written: nanoseconds of the monotonic
        /// time the store has been open, summed over restarts, plus the downtime by the wall clock.
        var clockNanoseconds: Int64
        /// The wall clock when the row was last written.
        var wall: Date
    }

    /// What one save writes: the header and the changed rows (nil: delete the row).
    struct Batch {
        var header: Header
        var rows: [(id: String, token: StoredTokens.Token?)]
    }

    enum Loaded {
        case loaded(Header, [StoredTokens.Token])
        /// `tokens.json` of an earlier version, and no tokens.db yet: to be migrated.
        case legacy(StoredTokens)
        case missing
        /// Unreadable, moved aside; the string says why and where it went.
        case setAside(String)
    }

    init(directory: String, log: @escaping @Sendable (String) -> Void) {
        databasePath = directory + "/tokens.db"
        legacyPath = directory + "/tokens.json"
        auditPath = directory + "/tokens-audit.jsonl"
        self.log = log
    }

    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .secondsSince1970
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }

    static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        return decoder
    }

    // MARK: Schema

    static let migrator: DatabaseMigrator = {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("tokens v1") { db in
            try db.execute(
                """
                CREATE TABLE authority (
                    id INTEGER PRIMARY KEY CHECK (id = 1),
                    mount_tag TEXT NOT NULL,
                    salt TEXT NOT NULL,
                    clock_ns INTEGER NOT NULL,
                    wall REAL NOT NULL
                )
                """)
            try db.execute("CREATE TABLE tokens (id TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID")
        }
        return migrator
    }()

    // MARK: Loading

    /// Opens tokens.db (creating it) and reads it; without one, reads a legacy tokens.json.
    func load() -> Loaded {
        let problem: String
        switch openAndRead() {
        case .success(let contents?):
            if exists(legacyPath) {
                // Migrated already (the rename after the migration was cut short): stale.
                retireLegacy(reason: "migrated to \(databasePath) already")
            }
            return .loaded(contents.header, contents.tokens)
        case .success(nil):
            // A new store, or a migration cut short before its one transaction committed.
            return exists(legacyPath) ? loadLegacy() : .missing
        case .failure(let failure):
            problem = failure.reason
        }
        let message = setAsideDatabase(problem)
        if exists(legacyPath) {
            // Not trusted either: it may be older than the damaged database.
            retireLegacy(reason: "the token database that replaced it was set aside")
        }
        return .setAside(message)
    }

    private func openAndRead() -> Result<(header: Header, tokens: [StoredTokens.Token])?, LoadFailure> {
        let queue: DatabaseQueue
        do {
            queue = try openDatabase()
        } catch {
            return .failure(LoadFailure(reason: "cannot open it: \(error)"))
        }
        database.withLock { $0 = queue }
        do {
            return .success(try Self.read(queue))
        } catch let failure as LoadFailure {
            return .failure(failure)
        } catch {
            return .failure(LoadFailure(reason: "cannot read it: \(error)"))
        }
    }

    private struct LoadFailure: Error {
        var reason: String
    }

    private static func read(_ queue: DatabaseQueue) throws -> (header: Header, tokens: [StoredTokens.Token])? {
        try queue.write { db -> (header: Header, tokens: [StoredTokens.Token])? in
            // A damaged page or index shows here rather than as a missing row later.
            let check = try db.fetchValues(String.self, "PRAGMA quick_check")
            guard check == ["ok"] else {
                throw LoadFailure(reason: "SQLite's quick_check: \(check.prefix(3).joined(separator: "; "))")
            }
            var header: Header?
            try db.forEachRow("SELECT mount_tag, salt, clock_ns, wall FROM authority WHERE id = 1") { row in
                header = Header(mountTag: try row[0], salt: try row[1], clockNanoseconds: try row[2], wall: try row[3])
            }
            guard let header else {
                let count = try db.fetchValue(Int64.self, "SELECT count(*) FROM tokens") ?? 0
                if count > 0 { throw LoadFailure(reason: "it has \(count) tokens and no tag or salt") }
                return nil
            }
            let decoder = decoder()
            var tokens: [StoredTokens.Token] = []
            try db.forEachRow("SELECT id, record FROM tokens") { row in
                let id: String = try row[0]
                let text: String = try row[1]
                guard let token = try? decoder.decode(StoredTokens.Token.self, from: Data(text.utf8)), token.id == id
                else { throw LoadFailure(reason: "the row of token \(id.prefix(64)) is not a token") }
                tokens.append(token)
            }
            return (header, tokens)
        }
    }

    private func openDatabase() throws -> DatabaseQueue {
        // Created here at 0600: SQLite gives its -wal and -shm files the database's mode.
        let fd = open(databasePath, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 { close(fd) }
        var configuration = DatabaseQueue.Configuration()
        configuration.synchronous = .full
        configuration.maximumReaderCount = 1
        configuration.label = "tokens"
        return try DatabaseQueue(path: databasePath, migrator: Self.migrator, configuration: configuration)
    }

    private func loadLegacy() -> Loaded {
        let bytes: [UInt8]
        switch AtomicFile.contents(of: legacyPath) {
        case .success(let read): bytes = read
        case .failure(let error) where error == .noSuchFileOrDirectory: return .missing
        case .failure(let error): return .setAside(setAsideLegacy("cannot read it: \(error.message)"))
        }
        do {
            let stored = try Self.decoder().decode(StoredTokens.self, from: Data(bytes))
            guard stored.version == StoredTokens.formatVersion else {
                return .setAside(
                    setAsideLegacy("format version \(stored.version) is not \(StoredTokens.formatVersion)"))
            }
            return .legacy(stored)
        } catch {
            return .setAside(setAsideLegacy("it is not a token store (\(error))"))
        }
    }

    // MARK: Setting aside

    /// Moves the database (and its WAL) aside for a person to look at, and opens a new, empty
    /// one. Returns the log line.
    func setAsideDatabase(_ reason: String) -> String {
        database.withLock { $0 = nil }  // closes it
        let aside = asideName(databasePath, "bad")
        var message: String
        if rename(databasePath, aside) == 0 {
            _ = rename(databasePath + "-wal", aside + "-wal")
            unlink(databasePath + "-shm")
            message = "\(databasePath) is unreadable (\(reason)); kept as \(aside)"
        } else {
            message = "\(databasePath) is unreadable (\(reason)) and cannot be moved aside (\(Errno.current.message))"
        }
        do {
            let queue = try openDatabase()
            database.withLock { $0 = queue }
        } catch {
            message += "; a new one cannot be created either (\(error)): no token can be granted"
        }
        log(message)
        return message
    }

    /// Moves the legacy file aside as damaged. Returns the log line.
    func setAsideLegacy(_ reason: String) -> String {
        let aside = asideName(legacyPath, "bad")
        let message =
            rename(legacyPath, aside) == 0
            ? "\(legacyPath) is unreadable (\(reason)); kept as \(aside)"
            : "\(legacyPath) is unreadable (\(reason)) and cannot be moved aside (\(Errno.current.message))"
        log(message)
        return message
    }

    /// Renames the legacy file once its tokens are in the database (or must not be used).
    func retireLegacy(reason: String) {
        let aside = asideName(legacyPath, "migrated")
        if rename(legacyPath, aside) == 0 {
            log("\(legacyPath): \(reason); kept as \(aside)")
        } else {
            log("\(legacyPath): \(reason), and it cannot be renamed (\(Errno.current.message))")
        }
    }

    private func asideName(_ path: String, _ word: String) -> String {
        path + ".\(word)-\(time(nil))-\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
    }

    private func exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

    // MARK: Saving

    /// Takes a batch (`take`, called with the writer lock held) and writes it in one
    /// transaction, unless it has no rows (the header alone is written only when `force`d).
    /// When it cannot be written, `failed` gets the batch's ids back (still under the lock) and
    /// the reason is returned; nil when written.
    ///
    /// Callers that arrive while a write is running wait for it, and the next of them writes
    /// every change made meanwhile in one transaction: concurrent changes share a commit.
    func save(force: Bool = false, take: () -> Batch, failed: ([String]) -> Void) -> String? {
        writer.withLock { () -> String? in
            let batch = take()
            if batch.rows.isEmpty && !force { return nil }
            guard let queue = database.value else {
                failed(batch.rows.map(\.id))
                return "the token database is not open"
            }
            let encoder = Self.encoder()
            do {
                let rows = try batch.rows.map { row -> (id: String, record: String?) in
                    (row.id, try row.token.map { String(decoding: try encoder.encode($0), as: UTF8.self) })
                }
                try queue.write { db in
                    for row in rows {
                        if let record = row.record {
                            try db.execute(
                                "INSERT INTO tokens (id, record) VALUES (?, ?) "
                                    + "ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                                [row.id, record])
                        } else {
                            try db.execute("DELETE FROM tokens WHERE id = ?", [row.id])
                        }
                    }
                    let header = batch.header
                    try db.execute(
                        "INSERT INTO authority (id, mount_tag, salt, clock_ns, wall) VALUES (1, ?, ?, ?, ?) "
                            + "ON CONFLICT (id) DO UPDATE SET mount_tag = excluded.mount_tag, salt = excluded.salt, "
                            + "clock_ns = excluded.clock_ns, wall = excluded.wall",
                        [header.mountTag, header.salt, header.clockNanoseconds, header.wall])
                }
                files.withLock { $0.rowsWritten += rows.count }
                return nil
            } catch {
                failed(batch.rows.map(\.id))
                return "cannot write \(databasePath): \(error)"
            }
        }
    }

    // MARK: Audit

    /// The audit file's entries in sequence order (the newest `limit`), and how many lines could
    /// not be read (skipped, not fatal: a crash may cut the last line short).
    func loadAudit(limit: Int) -> (entries: [TokenAuditEntry], badLines: Int) {
        guard case .success(let bytes) = AtomicFile.contents(of: auditPath) else { return ([], 0) }
        let decoder = Self.decoder()
        var entries: [TokenAuditEntry] = []
        var bad = 0
        var lines = 0
        for line in bytes.split(separator: UInt8(ascii: "\n")) {
            lines += 1
            if let entry = try? decoder.decode(TokenAuditEntry.self, from: Data(line)) {
                entries.append(entry)
            } else {
                bad += 1
            }
        }
        files.withLock { $0.auditLines = lines }
        if bad > 0 { log("\(auditPath): \(bad) unreadable lines skipped") }
        entries.sort { $0.sequence < $1.sequence }
        return (Array(entries.suffix(limit)), bad)
    }

    /// Appends entries; true when the file holds more than `compactAbove` lines and should be
    /// rewritten with `rewriteAudit`.
    func appendAudit(_ entries: [TokenAuditEntry], compactAbove: Int) -> Bool {
        guard !entries.isEmpty else { return false }
        let encoder = Self.encoder()
        var bytes: [UInt8] = []
        for entry in entries {
            guard let data = try? encoder.encode(entry) else { continue }
            bytes += data
            bytes.append(0x0A)
        }
        let failure = auditWriter.withLock { AtomicFile.append(bytes, to: auditPath) }
        if let failure {
            log("cannot append to \(auditPath): \(failure)")
            return false
        }
        return files.withLock { files in
            files.auditLines += entries.count
            return files.auditLines > compactAbove
        }
    }

    /// Replaces the audit file with `entries` (the ones kept in memory).
    func rewriteAudit(_ entries: [TokenAuditEntry]) {
        let encoder = Self.encoder()
        var bytes: [UInt8] = []
        for entry in entries {
            guard let data = try? encoder.encode(entry) else { continue }
            bytes += data
            bytes.append(0x0A)
        }
        let failure = auditWriter.withLock { AtomicFile.replace(auditPath, with: bytes) }
        if let failure {
            log("cannot rewrite \(auditPath): \(failure)")
            return
        }
        files.withLock { $0.auditLines = entries.count }
    }
}
