import Foundation
import SQLiteStore
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct BadInputTests {
    let directory = TemporaryDirectory()

    func contents(_ path: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path)) }

    @Test func aFileThatIsNotSQLiteIsRefusedAndKept() throws {
        let path = directory.file("notes.db")
        let garbage = Data((0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: testMigrator()) }
        #expect(error.code == .notADatabase)
        #expect(error.description.hasPrefix(path + ": "))
        #expect(error.description.contains("did not change it") && error.description.contains("Move it aside"))
        #expect(try contents(path) == garbage)
        #expect(!FileManager.default.fileExists(atPath: path + "-wal"))
    }

    @Test func aCorruptDatabaseIsRefusedAndKept() throws {
        let path = directory.file("meta.db")
        do {
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.write { db in try db.insert(Item(id: 1, name: "a")) }
        }  // closing the last connection checkpoints the WAL into the main file
        var bytes = try contents(path)
        #expect(bytes.count >= 4096 && !FileManager.default.fileExists(atPath: path + "-wal"))
        // Keep the 100-byte header, scramble the schema b-tree of page 1.
        for index in 100..<4096 { bytes[index] = UInt8(truncatingIfNeeded: index &* 13) }
        try bytes.write(to: URL(fileURLWithPath: path))
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: testMigrator()) }
        #expect(error.code == .notADatabase)
        #expect(error.resultCode.map { ResultCode.corrupt ~= $0 } == true)
        #expect(error.description.contains(path))
        #expect(try contents(path) == bytes)
    }

    @Test func aMissingDirectoryIsAClearError() throws {
        let path = directory.file("no/such/dir/meta.db")
        let error = try #require(throws: DatabaseError.self) { try DatabaseQueue(path: path, migrator: testMigrator()) }
        #expect(error.code == .cannotOpen)
        #expect(error.description.contains(path) && error.description.contains("directory exists"))
    }

    @Test(.enabled(if: rootTestsEnabled)) func aReadOnlyFileSystemIsAClearError() throws {
        let mount = try TmpfsMount(size: "4m")
        let existing = mount.file("meta.db")
        do {
            let store = try DatabaseQueue(path: existing, migrator: testMigrator())
            try store.write { db in try db.insert(Item(id: 1, name: "kept")) }
        }
        let before = try contents(existing)
        try mount.remountReadOnly()

        let openExisting = try #require(throws: DatabaseError.self) {
            try DatabaseQueue(path: existing, migrator: testMigrator())
        }
        #expect(openExisting.code == .readOnly)
        #expect(openExisting.description.contains(existing) && openExisting.description.contains("read-only"))
        #expect(try contents(existing) == before)

        let fresh = mount.file("new.db")
        let createNew = try #require(throws: DatabaseError.self) {
            try DatabaseQueue(path: fresh, migrator: testMigrator())
        }
        #expect(createNew.code == .cannotOpen, "\(createNew)")
        #expect(createNew.description.contains(fresh) && createNew.description.contains("EROFS"), "\(createNew)")
    }

    @Test(.enabled(if: rootTestsEnabled)) func aFullDiskRollsBackCleanlyAndRecovers() throws {
        let mount = try TmpfsMount(size: "1m")
        let path = mount.file("meta.db")
        let store = try DatabaseQueue(path: path, migrator: testMigrator())
        // Another file on the same disk, deleted later to "free some space" as a user would.
        let ballast = mount.file("ballast")
        try Data(count: 256 * 1024).write(to: URL(fileURLWithPath: ballast))
        var committed: Int64 = 0
        var failure: DatabaseError?
        // Each transaction adds 16 KiB; the file system fills within a few dozen.
        for id in 1...200 {
            do {
                try store.write { db in
                    try db.insert(Item(id: Int64(id), name: "item \(id)", data: Data(count: 16 * 1024)))
                }
                committed += 1
            } catch let error as DatabaseError {
                failure = error
                break
            }
        }
        let error = try #require(failure)
        #expect(error.code == .diskFull)
        #expect(error.description.contains(path) && error.description.contains("Free some space"))
        #expect(committed > 0)
        // Every committed row is readable, and nothing of the failed transaction is.
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM items") } == committed)
        // After space is freed, the same store writes again.
        try FileManager.default.removeItem(atPath: ballast)
        try store.write { db in try db.insert(Item(id: 1000, name: "after", data: Data(count: 1024))) }
        #expect(try store.read { db in try db.fetchValue(Int64.self, "SELECT count(*) FROM items") } == committed + 1)
        #expect(try store.read { db in try db.fetchValue(String.self, "PRAGMA integrity_check") } == "ok")
    }
}
