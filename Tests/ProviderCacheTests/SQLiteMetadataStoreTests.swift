// The metadata store's schema moves forward without losing what older versions saved.

import ProviderModel
import SQLiteStore
import TestSupport
import Testing

@testable import ProviderCache

@Suite("SQLite metadata store: migrations")
struct SQLiteMetadataStoreTests {
    @Test("a content row saved before error offsets were kept loads with its error and no offset; new rows keep theirs")
    func errorOffsetMigration() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            // A database as the first schema left it.
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(1))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO contents (identifier, version, size, file_number, present, error_code, error_message)
                    VALUES ('a', 'v1', 1000, 1, '0-500', 'downloadFailed', 'broken')
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        let loaded = try store.loadContents()
        #expect(loaded.count == 1)
        #expect(loaded.first?.present == ByteRanges([0..<500]))
        #expect(loaded.first?.lastError == RecordedError(code: .downloadFailed, message: "broken", offset: nil))

        let record = ContentRecord(
            identifier: ItemIdentifier("b"), version: ContentVersion("v2"), size: 300, fileNumber: 2,
            present: ByteRanges([0..<100]), lastError: RecordedError(code: .corrupt, message: "mismatch", offset: 100))
        try store.saveContent(record)
        let reopened = try SQLiteMetadataStore(path: path)
        #expect(try reopened.loadContents().first { $0.identifier == ItemIdentifier("b") } == record)
    }

    @Test(
        "an item's serial number is saved and loaded; a row saved before serial numbers were kept loads with none (0)")
    func itemSerialMigration() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(5))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds, version,
                        permissions, children_listed)
                    VALUES ('old', '', 'old', 'file', 1, 0, 0, 'v1', 420, 0)
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        #expect(try store.loadItems().map(\.serial) == [0])
        let item = ProviderItem(
            identifier: ItemIdentifier("new"), parent: .root, name: "new", kind: .file, size: 2,
            modificationTime: ItemTime(seconds: 1), contentVersion: ContentVersion("v2"))
        try store.saveItems([StoredItem(item: item, childrenListed: false, serial: 4_000_000_007)])
        let reopened = try SQLiteMetadataStore(path: path)
        let loaded = try reopened.loadItems().first { $0.item.identifier == ItemIdentifier("new") }
        #expect(loaded?.serial == 4_000_000_007)
    }

    @Test("an item's owner is saved and loaded (D-397); a row saved before owners were kept loads with none")
    func itemOwnerMigration() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(6))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds, version,
                        permissions, children_listed, serial)
                    VALUES ('old', '', 'old', 'file', 1, 0, 0, 'v1', 420, 0, 7)
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        let old = try store.loadItems()
        #expect(old.map(\.item.owner) == [nil])
        #expect(old.map(\.serial) == [7])
        let item = ProviderItem(
            identifier: ItemIdentifier("new"), parent: .root, name: "new", kind: .file, size: 2,
            modificationTime: ItemTime(seconds: 1), contentVersion: ContentVersion("v2"),
            owner: ItemOwner(uid: 65534, gid: 4_000_000_001))
        try store.saveItems([StoredItem(item: item, childrenListed: false, serial: 9)])
        let reopened = try SQLiteMetadataStore(path: path)
        let loaded = try reopened.loadItems().first { $0.item.identifier == ItemIdentifier("new") }
        #expect(loaded?.item == item)
        #expect(loaded?.item.owner == ItemOwner(uid: 65534, gid: 4_000_000_001))
    }

    @Test("a file's listed checksums are saved and loaded with their version (D-526); an older row loads with none")
    func listedChecksumsMigration() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(10))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds, version,
                        permissions, children_listed, serial)
                    VALUES ('old', '', 'old', 'file', 1, 0, 0, 'v1', 420, 0, 7)
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        #expect(try store.loadItems().map(\.item.statedChecksums) == [nil])
        var item = ProviderItem(
            identifier: ItemIdentifier("new"), parent: .root, name: "new", kind: .file, size: 2,
            modificationTime: ItemTime(seconds: 1), contentVersion: ContentVersion("W/\"v2\""))
        item.statedChecksums = StatedChecksums(
            version: ContentVersion("\"v2\""),
            checksums: [
                ContentChecksum(.sha1, digest: Array(0..<20)), ContentChecksum(.md5, digest: Array(200..<216)),
                ContentChecksum(.adler32, digest: [0, 0xFF, 1, 0xFE]),
            ])
        try store.saveItems([StoredItem(item: item, childrenListed: false, serial: 9)])
        let reopened = try SQLiteMetadataStore(path: path)
        let loaded = try reopened.loadItems().first { $0.item.identifier == ItemIdentifier("new") }
        #expect(loaded?.item == item)
        #expect(loaded?.item.statedChecksums == item.statedChecksums)
        // Saved again without them (another version listed with none): none.
        item.contentVersion = ContentVersion("v3")
        item.statedChecksums = nil
        try reopened.saveItems([StoredItem(item: item, childrenListed: false, serial: 9)])
        #expect(try reopened.loadItems().first { $0.item.identifier == ItemIdentifier("new") }?.item == item)
        // Words that are no checksum are skipped; a value of none at all is none.
        #expect(
            SQLiteMetadataStore.checksums(
                from: "crc32:00000000 sha1:0011 md5:\(String(repeating: "g", count: 32)) adler32:00ff01fe")
                == [ContentChecksum(.adler32, digest: [0, 0xFF, 1, 0xFE])])
        #expect(SQLiteMetadataStore.checksums(from: "sha1").isEmpty)
    }

    @Test("a local-only node's type and device are saved and loaded (D-398); an older row loads as a provider item")
    func specialNodeMigration() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(7))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds, version,
                        permissions, children_listed, serial, uid, gid)
                    VALUES ('old', '', 'old', 'file', 1, 0, 0, 'v1', 420, 0, 7, 1, 2)
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        let old = try store.loadItems()
        #expect(old.map(\.item.special) == [nil])
        #expect(old.map(\.item.owner) == [ItemOwner(uid: 1, gid: 2)])
        let nodes = [
            SpecialNode(.fifo), SpecialNode(.socket), SpecialNode(.characterDevice, device: 0x0103),
            SpecialNode(.blockDevice, device: UInt64.max - 1),
        ]
        let items = nodes.enumerated().map { index, node in
            var item = ProviderItem(
                identifier: ItemIdentifier("n\(index)"), parent: .root, name: "n\(index)", kind: .file, size: 0,
                modificationTime: ItemTime(seconds: 1), contentVersion: ContentVersion("local-only"),
                permissions: 0o640, special: node)
            item.accessTime = ItemTime(seconds: 3_000_000_000 + Int64(index), nanoseconds: 5)
            item.changeTime = ItemTime(seconds: 2, nanoseconds: 999_999_999)
            return item
        }
        try store.saveItems(items.map { StoredItem(item: $0, childrenListed: false, serial: 1) })
        let reopened = try SQLiteMetadataStore(path: path)
        let loaded = try reopened.loadItems().filter { $0.item.identifier != ItemIdentifier("old") }
            .sorted { $0.item.identifier < $1.item.identifier }
        #expect(loaded.map(\.item) == items)
        #expect(loaded.map(\.item.accessTime) == items.map(\.accessTime))  // not part of ==
        #expect(old.map(\.item.accessTime) == [nil] && old.map(\.item.changeTime) == [nil])
    }
}
