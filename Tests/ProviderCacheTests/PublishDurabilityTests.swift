// A publish's durability, through the cache's `FileSync` seam (the one the downloads' range-map
// saves use, `ProviderCache.init(fileSync:)`). The seam records, at each sync, where the
// descriptor's file is at that moment (/proc/self/fd: under `staging/` until the publish renames
// it, under `content/` after), its inode and its bytes. So a sync that is dropped, or that comes
// after the rename, shows: the published content file's inode has no sync, or its only sync
// named the content path. D-381: a new file's close publishes unsynced, fsync syncs it; an edit
// of a file that had bytes, and every later publish of an edit, is synced before the rename.

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

#if canImport(Glibc)
import Glibc
#endif

/// One call of the sync seam: where the file was (the descriptor's path then), its inode, its bytes.
struct RecordedSync: Sendable, Equatable {
    var path: String
    var inode: UInt64
    var bytes: [UInt8]
}

/// A cache over `fixture`'s provider whose syncs are recorded (then done with fdatasync).
private func recordingCache(_ fixture: WriteFixture) throws -> (ProviderCache, Locked<[RecordedSync]>) {
    let log = Locked<[RecordedSync]>([])
    let cache = try ProviderCache(
        provider: fixture.provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
        options: fixture.options,
        fileSync: { descriptor in
            var info = stat()
            guard fstat(descriptor, &info) == 0 else { return Errno.current }
            var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
            let got = bytes.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
            let path =
                (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(descriptor)")) ?? "?"
            if let error = fileDataSync(descriptor) { return error }
            log.withLock {
                $0.append(
                    RecordedSync(path: path, inode: UInt64(info.st_ino), bytes: Array(bytes.prefix(max(0, got)))))
            }
            return nil
        })
    return (cache, log)
}

/// The inode of the content file `published` was stored as.
private func contentInode(_ cache: ProviderCache, _ published: PublishedVersion) throws -> UInt64 {
    let path = try #require(cache.content.contentFilePath(published.item.identifier, published.item.contentVersion))
    var info = stat()
    try #require(stat(path, &info) == 0, "\(path): \(Errno.current.message)")
    return UInt64(info.st_ino)
}

/// What `body` published, and the syncs of its content file that happened meanwhile (by inode,
/// taken while the file exists: a deleted file's inode number may be reused later).
private func syncsOfPublish(
    _ cache: ProviderCache, _ log: Locked<[RecordedSync]>, _ body: () async throws -> PublishedVersion?
) async throws -> (PublishedVersion, [RecordedSync]) {
    let mark = log.value.count
    let published = try #require(try await body())
    let inode = try contentInode(cache, published)
    return (published, log.value[mark...].filter { $0.inode == inode })
}

/// The cache directory as the kernel names it (the descriptors' paths are resolved).
private func resolvedDirectory(_ fixture: WriteFixture) -> String {
    URL(fileURLWithPath: fixture.directory.path).resolvingSymlinksInPath().path
}

@Suite("Durability of publishes: the staging file synced before its rename (D-379, D-381)")
struct PublishDurabilityTests {
    /// An edit of a file that had bytes: every publish (a flush, an fsync, the last close) syncs
    /// the staging file, holding exactly the published bytes, while it is still the staging file
    /// (before the rename into the content store). Fails if the publish drops its fdatasync or
    /// moves it after the rename.
    @Test func anEditIsSyncedInStagingBeforeItsRename() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("old bytes".utf8)))
        let (cache, syncs) = try recordingCache(fixture)
        let staging = resolvedDirectory(fixture) + "/staging/"
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let writer = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(writer, Array("new".utf8), at: 0)
        // close(2)'s flush of a handle that stays open, then an fsync, then the last close: three
        // publishes (the second and third first copy the published file back, D-379).
        let steps: [(String, String, () async throws -> PublishedVersion?)] = [
            ("flush", "new bytes", { try await cache.writes.sync(writer, durable: false) }),
            (
                "fsync", "new bytes!",
                {
                    try await cache.writes.write(writer, Array("!".utf8), at: 9)
                    return try await cache.writes.sync(writer, durable: true)
                }
            ),
            (
                "close", "new bytes!?",
                {
                    try await cache.writes.write(writer, Array("?".utf8), at: 10)
                    return try await cache.writes.closeWriter(writer)
                }
            ),
        ]
        for (what, bytes, step) in steps {
            let (published, ofIt) = try await syncsOfPublish(cache, syncs, step)
            #expect(ofIt.count == 1, "\(what): \(ofIt.count) syncs of the published file (\(ofIt.map(\.path)))")
            guard let sync = ofIt.first else { continue }
            #expect(
                sync.path.hasPrefix(staging),
                "\(what): synced as \(sync.path), not as the staging file: the rename came first")
            #expect(sync.bytes == Array(bytes.utf8), "\(what): synced \(String(decoding: sync.bytes, as: UTF8.self))")
            #expect(!cache.content.isUnsynced(published.item.identifier, published.item.contentVersion))
        }
        await cache.shutdown()
    }

    /// D-381: a new file's close publishes without fdatasync (as close(2) on a local file system
    /// promises nothing); an fsync afterwards (through any descriptor: here with no writer open)
    /// syncs the published content file, once. A later publish of the same edit (a flush, then
    /// more writes and the last close) is synced in staging before its rename.
    @Test func aNewFilesCloseIsUnsyncedUntilFsync() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let (cache, syncs) = try recordingCache(fixture)
        let directory = resolvedDirectory(fixture)

        // Created, written, closed: published unsynced.
        let created = try await cache.createFile(named: "n.txt", in: .root, permissions: 0o644)
        let writer = try await cache.writes.openWriter(created, truncating: true)
        try await cache.writes.write(writer, Array("abc".utf8), at: 0)
        let (closed, atClose) = try await syncsOfPublish(cache, syncs) { try await cache.writes.closeWriter(writer) }
        #expect(atClose.isEmpty, "the close of a new file synced it: \(atClose.map(\.path))")
        #expect(cache.content.isUnsynced(closed.item.identifier, closed.item.contentVersion))

        // fsync: the content file itself is synced (it is not a staging file any more), once.
        let inode = try contentInode(cache, closed)
        let path = try #require(cache.content.contentFilePath(closed.item.identifier, closed.item.contentVersion))
        let mark = syncs.value.count
        _ = try await cache.writes.sync(closed.item.identifier, durable: true)
        let synced = syncs.value[mark...].filter { $0.inode == inode }
        #expect(synced.map(\.path) == [URL(fileURLWithPath: path).resolvingSymlinksInPath().path])
        #expect(synced.first?.bytes == Array("abc".utf8))
        #expect(!cache.content.isUnsynced(closed.item.identifier, closed.item.contentVersion))
        _ = try await cache.writes.sync(closed.item.identifier, durable: true)
        #expect(syncs.value[mark...].filter { $0.inode == inode }.count == 1, "a second fsync synced again")

        // Another new file kept open across a flush: the flush's publish is its first (unsynced),
        // the last close's is a later one, synced in staging before the rename.
        let second = try await cache.createFile(named: "m.txt", in: .root, permissions: 0o644)
        let open = try await cache.writes.openWriter(second, truncating: true)
        try await cache.writes.write(open, Array("first".utf8), at: 0)
        let (_, atFlush) = try await syncsOfPublish(cache, syncs) { try await cache.writes.sync(open, durable: false) }
        #expect(atFlush.isEmpty, "the first publish of a new file synced it: \(atFlush.map(\.path))")
        try await cache.writes.write(open, Array(" second".utf8), at: 5)
        let (last, atLast) = try await syncsOfPublish(cache, syncs) { try await cache.writes.closeWriter(open) }
        #expect(atLast.map(\.bytes) == [Array("first second".utf8)])
        #expect(atLast.allSatisfy { $0.path.hasPrefix(directory + "/staging/") }, "\(atLast.map(\.path))")
        #expect(!cache.content.isUnsynced(last.item.identifier, last.item.contentVersion))
        await cache.shutdown()
    }
}
