// The metadata store of a mount: `<cache>/metadata.sqlite`, through SQLiteStore's DatabaseQueue.

public import ProviderModel
import SQLiteStore

/// `MetadataStore` over SQLite. Two tables: `items` (the provider's namespace as last seen) and
/// `contents` (one row per sparse content file: item, version, size, file number, present ranges
/// in ByteRanges' text form, last error: code, message and byte offset). WAL with synchronous=NORMAL (SQLiteStore's defaults): a
/// committed row survives a process crash; a power cut may lose the last commits, which only makes
/// the cache forget ranges (they are fetched again), never claim bytes it does not have.
public final class SQLiteMetadataStore: MetadataStore {
    let queue: DatabaseQueue

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("provider cache v1") { db in
            try db.execute(
                """
                CREATE TABLE items (
                    identifier TEXT PRIMARY KEY NOT NULL,
                    parent TEXT NOT NULL,
                    name TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    size INTEGER NOT NULL,
                    mtime_seconds INTEGER NOT NULL,
                    mtime_nanoseconds INTEGER NOT NULL,
                    version TEXT NOT NULL,
                    permissions INTEGER NOT NULL,
                    link_target TEXT,
                    children_listed INTEGER NOT NULL
                )
                """)
            try db.execute(
                """
                CREATE TABLE contents (
                    identifier TEXT NOT NULL,
                    version TEXT NOT NULL,
                    size INTEGER NOT NULL,
                    file_number INTEGER NOT NULL,
                    present TEXT NOT NULL,
                    error_code TEXT,
                    error_message TEXT,
                    PRIMARY KEY (identifier, version)
                )
                """)
        }
        // The byte where the last failure happened (issue 11). Rows of older databases keep NULL:
        // their error shows without an offset.
        migrator.registerMigration("provider cache v2: error offset") { db in
            try db.execute("ALTER TABLE contents ADD COLUMN error_offset INTEGER")
        }
        // chmod and utimens kept by the mount for a provider that does not store them (issue 14).
        migrator.registerMigration("provider cache v3: attribute overrides") { db in
            try db.execute(
                """
                CREATE TABLE attributes (
                    identifier TEXT PRIMARY KEY NOT NULL,
                    permissions INTEGER,
                    mtime_seconds INTEGER,
                    mtime_nanoseconds INTEGER,
                    version TEXT NOT NULL
                )
                """)
        }
        // The write-back queue (issue 14, D-362): one row per item with a local version, kept
        // after the upload as the mapping of the local version to the provider's.
        migrator.registerMigration("provider cache v4: uploads") { db in
            try db.execute(
                """
                CREATE TABLE uploads (
                    identifier TEXT PRIMARY KEY NOT NULL,
                    local_version TEXT NOT NULL,
                    base_version TEXT,
                    phase TEXT NOT NULL,
                    attempts INTEGER NOT NULL,
                    last_error TEXT,
                    provider_version TEXT,
                    conflict_name TEXT
                )
                """)
        }
        // A chmod carried by a pending upload (D-385); an upload that creates the file (D-386).
        migrator.registerMigration("provider cache v5: upload permissions, creates") { db in
            try db.execute("ALTER TABLE uploads ADD COLUMN permissions INTEGER")
            try db.execute("ALTER TABLE uploads ADD COLUMN creates INTEGER NOT NULL DEFAULT 0")
        }
        // The item's serial number, what stat shows as st_ino (D-389). Rows of older caches keep
        // NULL and get a number when loaded.
        migrator.registerMigration("provider cache v6: item serial numbers") { db in
            try db.execute("ALTER TABLE items ADD COLUMN serial INTEGER")
        }
        // The item's owner where the provider stores one (D-397); NULL: none (rows of older
        // caches too, until the provider is asked again).
        migrator.registerMigration("provider cache v7: item owners") { db in
            try db.execute("ALTER TABLE items ADD COLUMN uid INTEGER")
            try db.execute("ALTER TABLE items ADD COLUMN gid INTEGER")
        }
        // A FIFO, socket or device the mount keeps alone (D-398): its type and device number;
        // NULL for provider items.
        // And the access and change times where the provider keeps them; NULL: they read as mtime.
        migrator.registerMigration("provider cache v8: local-only special nodes, access and change times") { db in
            try db.execute("ALTER TABLE items ADD COLUMN special TEXT")
            try db.execute("ALTER TABLE items ADD COLUMN device INTEGER")
            for column in ["atime_seconds", "atime_nanoseconds", "ctime_seconds", "ctime_nanoseconds"] {
                try db.execute("ALTER TABLE items ADD COLUMN \(column) INTEGER")
            }
        }
        // Pin states set explicitly (issue 27, D-445): a row per pinned or unpinned item; no
        // row: inherited. Older caches have none.
        migrator.registerMigration("provider cache v9: pin states") { db in
            try db.execute(
                """
                CREATE TABLE pins (
                    identifier TEXT PRIMARY KEY NOT NULL,
                    state TEXT NOT NULL
                )
                """)
        }
        // An mtime a utimens held while the upload was queued or running (D-460); NULL: none.
        migrator.registerMigration("provider cache: held upload mtimes (D-460)") { db in
            try db.execute("ALTER TABLE uploads ADD COLUMN mtime_seconds INTEGER")
            try db.execute("ALTER TABLE uploads ADD COLUMN mtime_nanoseconds INTEGER")
        }
        // Checksums of a file's content listed by the provider (D-526), as `sha1:<hex> md5:<hex>`,
        // and the version they are of; NULL: none (rows of older caches too, until listed again).
        migrator.registerMigration("provider cache: listed checksums (D-526)") { db in
            try db.execute("ALTER TABLE items ADD COLUMN checksums TEXT")
            try db.execute("ALTER TABLE items ADD COLUMN checksums_version TEXT")
        }
        return migrator
    }

    /// Opens (creating or migrating) the database at `path`.
    public init(path: String) throws(CacheError) {
        do {
            queue = try DatabaseQueue(path: path, migrator: Self.migrator)
        } catch {
            throw CacheError(.io, "cannot open the metadata database: \(error)")
        }
    }

    /// `queue.write`, a full disk read as `.noSpace` (ENOSPC where it reaches a writer, D-390).
    private func writing(_ updates: (Database) throws -> Void) throws {
        do {
            try queue.write(updates)
        } catch let error as DatabaseError where error.code == .diskFull {
            throw CacheError(.noSpace, "\(error)")
        }
    }

    public func loadItems() throws -> [StoredItem] {
        try queue.read { db in
            var result: [StoredItem] = []
            try db.forEachRow("SELECT * FROM items") { row in
                let kind: String = try row["kind"]
                var item = ProviderItem(
                    identifier: ItemIdentifier(try row["identifier"] as String),
                    parent: ItemIdentifier(try row["parent"] as String), name: try row["name"],
                    kind: ItemKind(rawValue: kind) ?? .file, size: try row["size"],
                    modificationTime: ItemTime(
                        seconds: try row["mtime_seconds"], nanoseconds: try row["mtime_nanoseconds"]),
                    contentVersion: ContentVersion(try row["version"] as String),
                    permissions: UInt16(truncatingIfNeeded: try row["permissions"] as Int64),
                    symbolicLinkTarget: try row["link_target"])
                let uid: Int64? = try row["uid"]
                let gid: Int64? = try row["gid"]
                if let uid, let gid {
                    item.owner = ItemOwner(uid: UInt32(truncatingIfNeeded: uid), gid: UInt32(truncatingIfNeeded: gid))
                }
                let special: String? = try row["special"]
                if let special, let kind = SpecialNode.Kind(rawValue: special) {
                    let device: Int64? = try row["device"]
                    item.special = SpecialNode(kind, device: UInt64(bitPattern: device ?? 0))
                }
                let atime: (Int64?, Int64?) = (try row["atime_seconds"], try row["atime_nanoseconds"])
                if let seconds = atime.0 {
                    item.accessTime = ItemTime(seconds: seconds, nanoseconds: Int32(truncatingIfNeeded: atime.1 ?? 0))
                }
                let ctime: (Int64?, Int64?) = (try row["ctime_seconds"], try row["ctime_nanoseconds"])
                if let seconds = ctime.0 {
                    item.changeTime = ItemTime(seconds: seconds, nanoseconds: Int32(truncatingIfNeeded: ctime.1 ?? 0))
                }
                let checksums: (String?, String?) = (try row["checksums"], try row["checksums_version"])
                if let text = checksums.0, let version = checksums.1 {
                    let parsed = Self.checksums(from: text)
                    if !parsed.isEmpty {
                        item.statedChecksums = StatedChecksums(version: ContentVersion(version), checksums: parsed)
                    }
                }
                let serial: Int64? = try row["serial"]
                result.append(
                    StoredItem(
                        item: item, childrenListed: try row["children_listed"],
                        serial: UInt64(clamping: max(0, serial ?? 0))))
            }
            return result
        }
    }

    public func saveItems(_ items: [StoredItem]) throws {
        guard !items.isEmpty else { return }
        try writing { db in try Self.insert(items, into: db) }
    }

    /// One transaction for both (D-529).
    public func save(items: [StoredItem], uploads: [UploadRecord]) throws {
        guard !items.isEmpty || !uploads.isEmpty else { return }
        try writing { db in
            try Self.insert(items, into: db)
            for record in uploads { try Self.insert(record, into: db) }
        }
    }

    private static func insert(_ items: [StoredItem], into db: Database) throws {
        for stored in items {
            let item = stored.item
            try db.execute(
                """
                INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds,
                    version, permissions, link_target, children_listed, serial, uid, gid, special, device,
                    atime_seconds, atime_nanoseconds, ctime_seconds, ctime_nanoseconds, checksums,
                    checksums_version)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (identifier) DO UPDATE SET parent = excluded.parent, name = excluded.name,
                    kind = excluded.kind, size = excluded.size, mtime_seconds = excluded.mtime_seconds,
                    mtime_nanoseconds = excluded.mtime_nanoseconds, version = excluded.version,
                    permissions = excluded.permissions, link_target = excluded.link_target,
                    children_listed = excluded.children_listed, serial = excluded.serial,
                    uid = excluded.uid, gid = excluded.gid, special = excluded.special,
                    device = excluded.device, atime_seconds = excluded.atime_seconds,
                    atime_nanoseconds = excluded.atime_nanoseconds, ctime_seconds = excluded.ctime_seconds,
                    ctime_nanoseconds = excluded.ctime_nanoseconds, checksums = excluded.checksums,
                    checksums_version = excluded.checksums_version
                """,
                [
                    item.identifier.rawValue, item.parent.rawValue, item.name, item.kind.rawValue, item.size,
                    item.modificationTime.seconds, item.modificationTime.nanoseconds, item.contentVersion.rawValue,
                    Int64(item.permissions), item.symbolicLinkTarget, stored.childrenListed,
                    Int64(clamping: stored.serial), item.owner.map { Int64($0.uid) },
                    item.owner.map { Int64($0.gid) }, item.special?.kind.rawValue,
                    item.special.map { Int64(bitPattern: $0.device) }, item.accessTime?.seconds,
                    item.accessTime.map { Int64($0.nanoseconds) }, item.changeTime?.seconds,
                    item.changeTime.map { Int64($0.nanoseconds) },
                    item.statedChecksums.map { $0.checksums.map(\.description).joined(separator: " ") },
                    item.statedChecksums?.version.rawValue,
                ])
        }
    }

    /// `sha1:<hex> md5:<hex>` (`ContentChecksum.description`s) read back; a word that is not one
    /// (an unknown algorithm, a wrong length) is skipped.
    static func checksums(from text: String) -> [ContentChecksum] {
        text.split(separator: " ").compactMap { ContentChecksum(description: $0) }
    }

    public func deleteItems(_ identifiers: [ItemIdentifier]) throws {
        guard !identifiers.isEmpty else { return }
        try writing { db in
            for identifier in identifiers {
                try db.execute("DELETE FROM items WHERE identifier = ?", [identifier.rawValue])
            }
        }
    }

    public func loadContents() throws -> [ContentRecord] {
        try queue.read { db in
            var result: [ContentRecord] = []
            try db.forEachRow("SELECT * FROM contents") { row in
                let errorCode: String? = try row["error_code"]
                let errorMessage: String? = try row["error_message"]
                let errorOffset: Int64? = try row["error_offset"]
                let present: String = try row["present"]
                result.append(
                    ContentRecord(
                        identifier: ItemIdentifier(try row["identifier"] as String),
                        version: ContentVersion(try row["version"] as String), size: try row["size"],
                        fileNumber: try row["file_number"],
                        // A damaged range map counts as nothing present: bytes are fetched again.
                        present: ByteRanges(parsing: present) ?? ByteRanges(),
                        lastError: errorCode.flatMap(CacheError.Code.init(rawValue:)).map {
                            RecordedError(code: $0, message: errorMessage ?? "", offset: errorOffset)
                        }))
            }
            return result
        }
    }

    public func saveContent(_ record: ContentRecord) throws {
        try writing { db in
            try db.execute(
                """
                INSERT INTO contents (identifier, version, size, file_number, present, error_code, error_message,
                    error_offset)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (identifier, version) DO UPDATE SET size = excluded.size,
                    file_number = excluded.file_number, present = excluded.present,
                    error_code = excluded.error_code, error_message = excluded.error_message,
                    error_offset = excluded.error_offset
                """,
                [
                    record.identifier.rawValue, record.version.rawValue, record.size, record.fileNumber,
                    record.present.description, record.lastError?.code.rawValue, record.lastError?.message,
                    record.lastError?.offset,
                ])
        }
    }

    public func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        try writing { db in
            try db.execute(
                "DELETE FROM contents WHERE identifier = ? AND version = ?", [identifier.rawValue, version.rawValue])
        }
    }

    public func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] {
        try queue.read { db in
            var result: [ItemIdentifier: AttributeOverride] = [:]
            try db.forEachRow("SELECT * FROM attributes") { row in
                let permissions: Int64? = try row["permissions"]
                let seconds: Int64? = try row["mtime_seconds"]
                let nanoseconds: Int64? = try row["mtime_nanoseconds"]
                result[ItemIdentifier(try row["identifier"] as String)] = AttributeOverride(
                    permissions: permissions.map { UInt16(truncatingIfNeeded: $0) },
                    modificationTime: seconds.map {
                        ItemTime(seconds: $0, nanoseconds: Int32(truncatingIfNeeded: nanoseconds ?? 0))
                    },
                    version: ContentVersion(try row["version"] as String))
            }
            return result
        }
    }

    public func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        try writing { db in
            guard let override else {
                try db.execute("DELETE FROM attributes WHERE identifier = ?", [identifier.rawValue])
                return
            }
            try db.execute(
                """
                INSERT INTO attributes (identifier, permissions, mtime_seconds, mtime_nanoseconds, version)
                VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (identifier) DO UPDATE SET permissions = excluded.permissions,
                    mtime_seconds = excluded.mtime_seconds, mtime_nanoseconds = excluded.mtime_nanoseconds,
                    version = excluded.version
                """,
                [
                    identifier.rawValue, override.permissions.map { Int64($0) }, override.modificationTime?.seconds,
                    override.modificationTime.map { Int64($0.nanoseconds) }, override.version.rawValue,
                ])
        }
    }

    public func loadUploads() throws -> [UploadRecord] {
        try queue.read { db in
            var result: [UploadRecord] = []
            try db.forEachRow("SELECT * FROM uploads") { row in
                let base: String? = try row["base_version"]
                let provider: String? = try row["provider_version"]
                let phase: String = try row["phase"]
                let identifier: String = try row["identifier"]
                let local: String = try row["local_version"]
                let attempts: Int64 = try row["attempts"]
                let lastError: String? = try row["last_error"]
                let conflictName: String? = try row["conflict_name"]
                let permissions: Int64? = try row["permissions"]
                let creates: Int64 = try row["creates"]
                let seconds: Int64? = try row["mtime_seconds"]
                let nanoseconds: Int64? = try row["mtime_nanoseconds"]
                result.append(
                    UploadRecord(
                        identifier: ItemIdentifier(identifier), localVersion: ContentVersion(local),
                        baseVersion: base.map { ContentVersion($0) }, phase: UploadPhase(rawValue: phase) ?? .dirty,
                        attempts: Int(attempts), lastError: lastError,
                        providerVersion: provider.map { ContentVersion($0) },
                        conflictName: conflictName,
                        permissions: permissions.map { UInt16(truncatingIfNeeded: $0) }, creates: creates != 0,
                        modificationTime: seconds.map {
                            ItemTime(seconds: $0, nanoseconds: Int32(truncatingIfNeeded: nanoseconds ?? 0))
                        }))
            }
            return result
        }
    }

    public func saveUpload(_ record: UploadRecord) throws {
        try writing { db in try Self.insert(record, into: db) }
    }

    private static func insert(_ record: UploadRecord, into db: Database) throws {
        try db.execute(
            """
            INSERT OR REPLACE INTO uploads (identifier, local_version, base_version, phase, attempts, last_error,
                provider_version, conflict_name, permissions, creates, mtime_seconds, mtime_nanoseconds)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                record.identifier.rawValue, record.localVersion.rawValue, record.baseVersion?.rawValue,
                record.phase.rawValue, Int64(record.attempts), record.lastError, record.providerVersion?.rawValue,
                record.conflictName, record.permissions.map { Int64($0) }, Int64(record.creates ? 1 : 0),
                record.modificationTime.map { $0.seconds }, record.modificationTime.map { Int64($0.nanoseconds) },
            ])
    }

    public func deleteUpload(_ identifier: ItemIdentifier) throws {
        try writing { db in
            try db.execute("DELETE FROM uploads WHERE identifier = ?", [identifier.rawValue])
        }
    }

    public func loadPins() throws -> [ItemIdentifier: PinState] {
        try queue.read { db in
            var result: [ItemIdentifier: PinState] = [:]
            try db.forEachRow("SELECT * FROM pins") { row in
                let state: String = try row["state"]
                // A state this version does not know reads as inherited.
                guard let pin = PinState(rawValue: state), pin != .inherited else { return }
                result[ItemIdentifier(try row["identifier"] as String)] = pin
            }
            return result
        }
    }

    public func savePin(_ state: PinState, for identifier: ItemIdentifier) throws {
        try writing { db in
            guard state != .inherited else {
                try db.execute("DELETE FROM pins WHERE identifier = ?", [identifier.rawValue])
                return
            }
            try db.execute(
                "INSERT OR REPLACE INTO pins (identifier, state) VALUES (?, ?)", [identifier.rawValue, state.rawValue])
        }
    }
}
