// A full cache disk (issue 23 item 3, D-390), without a mount: the cache's free space is injected
// (`ProviderCache.init(freeSpace:)`) and the metadata store made full (`FillableStore`), so each
// rule is pinned on its own: a write that does not fit leaves what was written before, which the
// next fsync or close publishes; no descriptor of a dropped staging file outlives its last close;
// a full store is ENOSPC, never EIO; an unborn file whose publish failed is created, not left
// parked; a delete the store had no room for is not undone by a restart; an upload that found no
// room reads as ENOSPC.

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// An in-memory store whose writes fail as SQLiteMetadataStore's do on a full disk
/// (`.noSpace`) while `full` is set.
final class FillableStore: MetadataStore {
    let base = InMemoryMetadataStore()
    let full = Locked(false)
    private func check() throws {
        if full.withLock({ $0 }) { throw CacheError(.noSpace, "database or disk is full (test)") }
    }
    func loadItems() throws -> [StoredItem] { try base.loadItems() }
    func saveItems(_ items: [StoredItem]) throws {
        try check()
        try base.saveItems(items)
    }
    func deleteItems(_ identifiers: [ItemIdentifier]) throws {
        try check()
        try base.deleteItems(identifiers)
    }
    func loadContents() throws -> [ContentRecord] { try base.loadContents() }
    func saveContent(_ record: ContentRecord) throws {
        try check()
        try base.saveContent(record)
    }
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        try check()
        try base.deleteContent(identifier: identifier, version: version)
    }
    func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] { try base.loadAttributeOverrides() }
    func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        try check()
        try base.saveAttributeOverride(override, for: identifier)
    }
    func loadUploads() throws -> [UploadRecord] { try base.loadUploads() }
    func saveUpload(_ record: UploadRecord) throws {
        try check()
        try base.saveUpload(record)
    }
    func deleteUpload(_ identifier: ItemIdentifier) throws {
        try check()
        try base.deleteUpload(identifier)
    }
}

/// Descriptors of this process open on deleted files under `directory`.
func deletedFilesOpen(under directory: String) -> [String] {
    let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return descriptors.compactMap { descriptor in
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + descriptor)
        else { return nil }
        return target.hasPrefix(directory) && target.hasSuffix(" (deleted)") ? target : nil
    }
}

/// A cache over an `UploadingProvider` whose file system has `free` bytes free (whatever the real
/// one has) and whose store can be made full.
final class FullDiskFixture: @unchecked Sendable {
    let writes: WriteFixture
    let store = FillableStore()
    let free = Locked<Int64>(1 << 40)
    var reserve: Int64 { writes.options.reservedSpace }

    init() throws { writes = try WriteFixture(store: store) }

    var provider: UploadingProvider { writes.provider }
    var directory: String { writes.directory.path }

    func makeCache() throws -> ProviderCache {
        let free = self.free
        return try ProviderCache(
            provider: writes.provider, directory: writes.directory.path, store: store, clock: writes.clock,
            options: writes.options, freeSpace: { _ in free.withLock { $0 } })
    }

    /// The file system has `bytes` free above the reserve.
    func leave(_ bytes: Int64) { free.withLock { [reserve] in $0 = reserve + bytes } }
}

@Suite struct FullDiskTests {
    let hello = Array("hello".utf8)

    /// The writer gets ENOSPC at the write that does not fit and nothing of it lands; what it
    /// wrote before stays, rewriting those bytes still works (no new blocks), and the close
    /// publishes and uploads exactly them.
    @Test func aWriteThatDoesNotFitLeavesWhatWasWrittenForTheClose() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.putFile("f", .bytes(hello))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        fixture.leave(10)
        try await cache.writes.write(staging, Array("0123456789".utf8), at: 0)
        fixture.leave(0)  // (those 10 bytes took it)
        let refused = await #expect(throws: CacheError.self) {
            try await cache.writes.write(staging, Array("abc".utf8), at: 10)
        }
        #expect(refused?.code == .noSpace)
        // (The same on the FUSE thread's path.)
        let now = cache.writes.writeNow(staging, Array("abc".utf8), at: 10)
        guard case .failure(let error)? = now else {
            Issue.record("writeNow took bytes that do not fit: \(String(describing: now))")
            return
        }
        #expect(error.code == .noSpace)
        #expect(staging.size == 10)
        try await cache.writes.write(staging, Array("AB".utf8), at: 0)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(published.item.size == 10)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("AB23456789".utf8)))
        await cache.shutdown()
    }

    /// The disk fills between the free-space check and the write: the staging file's pwrite
    /// itself fails with ENOSPC (injected through `SystemCallFaults`, D-516). The writer gets
    /// ENOSPC, nothing of that write lands, and the close publishes what was written before.
    @Test func aWriteTheDiskRefusesIsENOSPCAndKeepsWhatWasWritten() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.putFile("f", .bytes(hello))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("0123456789".utf8), at: 0)
        let fault = SystemCallFaults.arm(.pwrite, errno: ENOSPC, under: fixture.directory)
        let refused = await #expect(throws: CacheError.self) {
            try await cache.writes.write(staging, Array("abc".utf8), at: 10)
        }
        #expect(SystemCallFaults.disarm(fault) == 1)
        #expect(refused?.code == .noSpace)
        #expect(staging.size == 10)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(published.item.size == 10)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("0123456789".utf8)))
        await cache.shutdown()
    }

    /// Space freed by someone else counts at the next write (no cached answer), and a fallocate
    /// that does not fit is ENOSPC while one that does makes later writes there safe.
    @Test func freedSpaceLetsTheNextWriteThroughAtOnce() async throws {
        let fixture = try FullDiskFixture()
        let cache = try fixture.makeCache()
        fixture.provider.base.putFile("f", .bytes(hello))
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        fixture.leave(-1)
        await #expect(throws: CacheError.self) { try await cache.writes.write(staging, [1], at: 5) }
        await #expect(throws: CacheError.self) {
            try await cache.writes.allocate(staging, offset: 0, length: 100, keepSize: false)
        }
        #expect(staging.size == 5)
        fixture.leave(100)
        try await cache.writes.allocate(staging, offset: 0, length: 100, keepSize: false)
        fixture.leave(0)
        try await cache.writes.write(staging, Array(repeating: 7, count: 95), at: 5)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(try await readAll(cache, published.item) == hello + Array(repeating: 7, count: 95))
        await cache.shutdown()
    }

    /// A copy of a version that does not fit (an open without O_TRUNC) is ENOSPC, not EIO.
    @Test func aCopyThatDoesNotFitIsENOSPC() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.putFile("f", .bytes(hello))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        _ = try await readAll(cache, item)
        fixture.leave(4)
        let refused = await #expect(throws: CacheError.self) {
            try await cache.writes.openWriter(item, truncating: false)
        }
        #expect(refused?.code == .noSpace)
        #expect(try FileManager.default.contentsOfDirectory(atPath: fixture.directory + "/staging").isEmpty)
        await cache.shutdown()
    }

    /// fsync and close with the store full are ENOSPC (they were EIO), fsync keeps the bytes to
    /// publish, and the last close, failing too, drops them but leaves no descriptor of the
    /// staging file open (the disk stayed full until unmount).
    @Test func aFullStoreIsENOSPCAndTheLastCloseLetsGoOfTheFile() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.putFile("f", .bytes(hello))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array(" world".utf8), at: 5)
        fixture.store.full.withLock { $0 = true }
        let fsync = await #expect(throws: CacheError.self) { try await cache.writes.sync(staging) }
        #expect(fsync?.code == .noSpace)
        fixture.store.full.withLock { $0 = false }
        let synced = try #require(try await cache.writes.sync(staging))
        #expect(try await readAll(cache, synced.item) == Array("hello world".utf8))
        try await cache.writes.write(staging, Array("!".utf8), at: 11)
        fixture.store.full.withLock { $0 = true }
        let close = await #expect(throws: CacheError.self) { try await cache.writes.closeWriter(staging) }
        #expect(close?.code == .noSpace)
        let staged = fixture.directory + "/staging/"
        #expect(deletedFilesOpen(under: staged).isEmpty, "\(deletedFilesOpen(under: staged))")
        fixture.store.full.withLock { $0 = false }
        #expect(cache.catalog.knownItem(item.identifier)?.contentVersion == synced.item.contentVersion)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("hello world".utf8)))
        await cache.shutdown()
    }

    /// A new file not at the provider yet (D-386) whose only publish failed is created there
    /// empty, as the mount shows it; its queue row is not left parked.
    @Test func anUnbornFileWhosePublishFailedIsCreated() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let item = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, hello, at: 0)
        fixture.store.full.withLock { $0 = true }
        await #expect(throws: CacheError.self) { try await cache.writes.closeWriter(staging) }
        fixture.store.full.withLock { $0 = false }
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "n")?.0 == .bytes([]))
        #expect(cache.writes.pendingUploads.isEmpty)
        await cache.shutdown()
        #expect(try fixture.store.base.loadUploads().allSatisfy { !$0.isPending }, "a row left behind")
    }

    /// rm of a file not at the provider yet while the store is full: the restart after space came
    /// back (the shutdown wrote the refused rows) does not create it (it came back, 0 bytes, at
    /// the mount and at the source).
    @Test func aDeleteWhileTheStoreIsFullIsNotUndoneByARestart() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.defersCreates = true
        var cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let item = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, hello, at: 0)
        _ = try #require(try await cache.writes.closeWriter(staging))
        fixture.store.full.withLock { $0 = true }
        let current = try #require(cache.catalog.knownItem(item.identifier))
        try await cache.delete(current)
        fixture.store.full.withLock { $0 = false }
        await cache.shutdown()
        #expect(try fixture.store.base.loadUploads().isEmpty)
        cache = try fixture.makeCache()
        #expect(cache.catalog.knownItem(item.identifier) == nil)
        #expect(cache.writes.pendingUploads.isEmpty)
        try await Task.sleep(for: .milliseconds(50))  // (a resumed create would have run by now)
        #expect(fixture.provider.base.content(of: "n") == nil)
        await cache.shutdown()
    }

    /// `FullDiskStore`: a refused row is written at the next write or at `flush`, and a kept row
    /// never comes back over a newer one written since.
    @Test func refusedRowsAreWrittenAgainNeverOverNewerOnes() throws {
        let base = FillableStore()
        let store = FullDiskStore(base)
        let id = ItemIdentifier("f")
        func record(_ version: String) -> UploadRecord {
            UploadRecord(identifier: id, localVersion: ContentVersion(version), baseVersion: nil)
        }
        try store.saveUpload(record("l1"))
        base.full.withLock { $0 = true }
        #expect(throws: CacheError.self) { try store.saveUpload(record("l2")) }
        #expect(throws: CacheError.self) { try store.deleteItems([ItemIdentifier("gone")]) }
        #expect(store.pendingCount == 2)
        base.full.withLock { $0 = false }
        try store.saveUpload(record("l3"))
        #expect(store.flush())
        #expect(try base.loadUploads().map(\.localVersion) == [ContentVersion("l3")])
        // A delete refused, then nothing else written: `flush` (the shutdown) writes it.
        base.full.withLock { $0 = true }
        #expect(throws: CacheError.self) { try store.deleteUpload(id) }
        #expect(!store.flush())
        base.full.withLock { $0 = false }
        #expect(store.flush() && store.pendingCount == 0)
        #expect(try base.loadUploads().isEmpty)
    }

    /// An upload refused for want of space at the provider shows as ENOSPC (it showed "EIO:
    /// upload failed: noSpace"), then goes through when retried.
    @Test func anUploadWithNoRoomAtTheProviderIsENOSPC() async throws {
        let fixture = try FullDiskFixture()
        fixture.provider.base.putFile("f", .bytes(hello))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        fixture.provider.failNext(1, with: ProviderError(.noSpace, "No space left on device", errno: ENOSPC))
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(staging))
        #expect(await eventually { cache.status(of: item.identifier)?.state == .error })
        let error = try #require(cache.status(of: item.identifier)?.lastError)
        #expect(error.code == .noSpace, "\(error)")
        #expect(error.message.hasPrefix("upload failed: noSpace:"), "\(error.message)")
        // The retry waits on the manual clock: moved on until it got through.
        #expect(
            await eventually {
                fixture.writes.clock.advance(by: .seconds(1))
                return cache.writes.uploadRecord(of: item.identifier)?.isPending == false
            })
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        await cache.shutdown()
    }
}
