import Foundation
import SQLiteStore

#if canImport(Glibc)
import Glibc
#endif

/// A fresh directory under /tmp, removed (with everything in it) when the value goes away.
final class TemporaryDirectory: Sendable {
    let path: String

    init() {
        var template = Array("/tmp/sqlitestore-test-XXXXXX".utf8CString)
        let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(created != nil, "mkdtemp failed: \(errno)")
        path = String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    func file(_ name: String) -> String { "\(path)/\(name)" }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// The schema the tests use: accounts (for transfers) and items with a child table.
func testMigrator() -> DatabaseMigrator {
    var migrator = DatabaseMigrator()
    migrator.registerMigration("create accounts") { db in
        try db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
    }
    migrator.registerMigration("create items") { db in
        try db.execute(
            """
            CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, size INTEGER, modified REAL,
                                data BLOB, pinned INTEGER NOT NULL DEFAULT 0);
            CREATE INDEX items_by_name ON items (name);
            """)
    }
    migrator.registerMigration("create versions") { db in
        try db.execute(
            """
            CREATE TABLE versions (item_id INTEGER NOT NULL REFERENCES items (id) ON DELETE CASCADE,
                                   version TEXT NOT NULL, PRIMARY KEY (item_id, version)) WITHOUT ROWID;
            """)
    }
    return migrator
}

/// A record covering every supported column type.
struct Item: FetchableRecord, PersistableRecord, Equatable {
    static let databaseTableName = "items"
    var id: Int64
    var name: String
    var size: Int64?
    var modified: Date?
    var data: Data?
    var pinned: Bool

    init(id: Int64, name: String, size: Int64? = nil, modified: Date? = nil, data: Data? = nil, pinned: Bool = false) {
        self.id = id
        self.name = name
        self.size = size
        self.modified = modified
        self.data = data
        self.pinned = pinned
    }

    init(row: Row) throws {
        id = try row["id"]
        name = try row["name"]
        size = try row["size"]
        modified = try row["modified"]
        data = try row["data"]
        pinned = try row["pinned"]
    }

    func encode(to container: inout PersistenceContainer) {
        container["id"] = id
        container["name"] = name
        container["size"] = size
        container["modified"] = modified
        container["data"] = data
        container["pinned"] = pinned
    }
}
