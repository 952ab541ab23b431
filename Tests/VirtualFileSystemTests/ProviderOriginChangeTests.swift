// Presenters hear the provider (D-403), through the file system over a real local directory: a
// change made in the source reaches the provider-change listener once, promptly (inotify marks
// the item, the catalog refreshes it because the listener wants it); a change made through the
// mount never does (the mount's own claims tell presenters of those).

import Foundation
import ProviderCache
import ProviderFSCommands
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// Records provider-origin changes; wants those at `wanted` paths (and below/above), or all.
final class RecordingProviderChanges: ProviderChangeListener {
    let heard = Locked<[ProviderOriginChange]>([])
    let wanted: [String]?
    init(wanted: [String]? = nil) { self.wanted = wanted }
    func wantsChanges(near path: String?) -> Bool {
        guard let wanted, let path else { return true }
        return wanted.contains { $0 == path || path.hasPrefix($0 + "/") || $0.hasPrefix(path + "/") }
    }
    func providerChanged(_ changes: [ProviderOriginChange]) { heard.withLock { $0 += changes } }
}

@Suite("Provider-origin changes")
struct ProviderOriginChangeTests {
    struct Mounted {
        let source: TemporaryDirectory
        let cacheDirectory: TemporaryDirectory
        let fileSystem: ProviderFileSystem
        let heard: RecordingProviderChanges
        func remove() {
            source.remove()
            cacheDirectory.remove()
        }
    }

    static func mounted(wanted: [String]? = nil) async throws -> Mounted {
        let source = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        try source.write("d/f.txt", Array("one\n".utf8))
        try source.write("d/g.txt", Array("gee\n".utf8))
        try source.write("d/h.txt", Array("aitch\n".utf8))
        try source.write("unwatched/.keep", [])  // never listed: no inotify watch (`appear`)
        let heard = RecordingProviderChanges(wanted: wanted)
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cacheDirectory.path, options: VFSFixture.writableOptions(),
            providerChanges: heard)
        // Listed and read once: the directories are watched (inotify), as a mount's are once used.
        let file = try await resolve(fileSystem, "d/f.txt")
        #expect(try await readAll(fileSystem, file.inode) == Array("one\n".utf8))
        _ = try await childNames(fileSystem, try await resolve(fileSystem, "d").inode)
        return Mounted(source: source, cacheDirectory: cacheDirectory, fileSystem: fileSystem, heard: heard)
    }

    /// Rewrites `path` in place with one write of as many bytes (one inotify event, one version).
    static func overwrite(_ path: String, _ text: String) {
        let fd = open(path, O_WRONLY)
        #expect(fd >= 0)
        let bytes = Array(text.utf8)
        #expect(bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) } == bytes.count)
        close(fd)
    }

    /// Writes a file outside the watched directories, then renames it into `relativePath`: it
    /// appears whole, in one event.
    static func appear(_ m: Mounted, _ relativePath: String, _ text: String) throws {
        try m.source.write("unwatched/staged", Array(text.utf8))
        #expect(rename(m.source.path + "/unwatched/staged", m.source.path + "/" + relativePath) == 0)
    }

    /// How long a test waits for what must be told: generous, since these also run under
    /// ThreadSanitizer on a loaded CI machine. The latency itself (≤ 1 s from a change in the
    /// source, measured 0–50 ms) is the scenario `presenter-provider`'s to check.
    static let bound: Duration = .seconds(10)

    /// Polls `condition` every 5 ms for at most `limit`; the time it took, nil if it never held.
    static func within(_ limit: Duration, _ condition: () -> Bool) async -> Duration? {
        let clock = ContinuousClock()
        let start = clock.now
        while clock.now - start < limit {
            if condition() { return clock.now - start }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return condition() ? clock.now - start : nil
    }

    @Test("a change, a rename and a delete in the source are each told once")
    func sourceChangesAreToldOnce() async throws {
        let m = try await Self.mounted()
        defer { m.remove() }
        #expect(m.heard.heard.value.isEmpty, "listing and reading change nothing")

        Self.overwrite(m.source.path + "/d/f.txt", "TWO\n")
        let changed = await Self.within(Self.bound) { !m.heard.heard.value.isEmpty }
        #expect(changed != nil, "no refresh of the changed file within \(Self.bound)")
        // A stat and a read through the mount, and explicit refreshes: still told once.
        let file = try await resolve(m.fileSystem, "d/f.txt")
        #expect(try await readAll(m.fileSystem, file.inode) == Array("TWO\n".utf8))
        _ = try await m.fileSystem.cache.catalog.item(ItemIdentifier("d/f.txt"), maximumAge: .zero)
        _ = try await m.fileSystem.cache.catalog.children(of: ItemIdentifier("d"), maximumAge: .zero)
        await m.fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        #expect(m.heard.heard.value == [.changed(path: "d/f.txt")])

        m.heard.heard.withLock { $0 = [] }
        #expect(rename(m.source.path + "/d/g.txt", m.source.path + "/d/g2.txt") == 0)
        let moved = await Self.within(Self.bound) { !m.heard.heard.value.isEmpty }
        #expect(moved != nil)
        await m.fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        // A rename within a directory keeps the inode, so the local provider's content version:
        // one listing sees the same version gone under one name and new under another.
        #expect(m.heard.heard.value == [.moved(from: "d/g.txt", to: "d/g2.txt")])

        m.heard.heard.withLock { $0 = [] }
        #expect(unlink(m.source.path + "/d/h.txt") == 0)
        let deleted = await Self.within(Self.bound) { !m.heard.heard.value.isEmpty }
        #expect(deleted != nil)
        await m.fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        _ = try? await m.fileSystem.cache.catalog.item(ItemIdentifier("d/h.txt"), maximumAge: .zero)
        #expect(m.heard.heard.value == [.deleted(path: "d/h.txt")])

        m.heard.heard.withLock { $0 = [] }
        try Self.appear(m, "d/new.txt", "new\n")
        #expect(await Self.within(Self.bound) { !m.heard.heard.value.isEmpty } != nil)
        await m.fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        #expect(m.heard.heard.value == [.changed(path: "d/new.txt")], "a new item: its directory's presenters hear")
        await m.fileSystem.cache.shutdown()
    }

    @Test("changes made through the mount are never told as provider changes")
    func mountChangesAreNotTold() async throws {
        let m = try await Self.mounted()
        defer { m.remove() }
        let directory = try await resolve(m.fileSystem, "d")
        let file = try await resolve(m.fileSystem, "d/f.txt")
        // Rewrite, create, chmod, rename and delete through the mount.
        let opened = try await m.fileSystem.open(
            file.inode, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        _ = try await m.fileSystem.write(
            file.inode, handle: opened.handle, offset: 0, data: Array("mine\n".utf8), context: .kernel)
        await m.fileSystem.release(file.inode, handle: opened.handle)
        let (created, handle) = try await m.fileSystem.create(
            parent: directory.inode, name: "made.txt", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY),
            context: .kernel)
        _ = try await m.fileSystem.write(
            created.inode, handle: handle.handle, offset: 0, data: Array("made\n".utf8), context: .kernel)
        await m.fileSystem.release(created.inode, handle: handle.handle)
        try await m.fileSystem.rename(
            parent: directory.inode, name: "g.txt", newParent: directory.inode, newName: "g3.txt", flags: 0,
            context: .kernel)
        try await m.fileSystem.unlink(parent: directory.inode, name: "h.txt", context: .kernel)
        let cache = m.fileSystem.cache
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("d/f.txt")))
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("d/made.txt")))
        #expect(String(decoding: try readFile(m.source.path + "/d/f.txt"), as: UTF8.self) == "mine\n")
        #expect(String(decoding: try readFile(m.source.path + "/d/made.txt"), as: UTF8.self) == "made\n")
        // The source's inotify events of those uploads have been seen once a change made after
        // them is (events arrive in order): that change is the only one told.
        try Self.appear(m, "d/marker.txt", "x\n")
        #expect(
            await Self.within(Self.bound) { m.heard.heard.value.contains(.changed(path: "d/marker.txt")) } != nil)
        await cache.catalog.waitForProviderChangeRefreshes()
        // And the provider's answers, asked for again, are what the mount already has.
        for name in ["f.txt", "made.txt", "g3.txt"] {
            _ = try await cache.catalog.item(ItemIdentifier("d/" + name), maximumAge: .zero)
        }
        _ = try await cache.catalog.children(of: ItemIdentifier("d"), maximumAge: .zero)
        #expect(m.heard.heard.value == [.changed(path: "d/marker.txt")])
        await cache.shutdown()
    }

    @Test("only items someone wants are refreshed when the source reports them changed")
    func onlyWantedItemsAreRefreshed() async throws {
        let m = try await Self.mounted(wanted: ["d/f.txt"])
        defer { m.remove() }
        let before = m.fileSystem.cache.catalog.knownItem(ItemIdentifier("d/g.txt"))?.contentVersion
        #expect(before != nil)
        Self.overwrite(m.source.path + "/d/g.txt", "GEE\n")
        Self.overwrite(m.source.path + "/d/f.txt", "ONE\n")
        #expect(await Self.within(Self.bound) { !m.heard.heard.value.isEmpty } != nil)
        await m.fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        // g.txt was reported changed too, but nobody wants it: it stays stale until a lookup.
        #expect(m.heard.heard.value == [.changed(path: "d/f.txt")])
        #expect(m.fileSystem.cache.catalog.knownItem(ItemIdentifier("d/g.txt"))?.contentVersion == before)
        await m.fileSystem.cache.shutdown()
    }

    @Test("a read that finds a new version (ESTALE) makes the catalog learn it, and it is told")
    func staleReadIsTold() async throws {
        // A provider that pushes nothing: only the failed fetch says the version changed.
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .bytes(Array(repeating: 1, count: 200_000)))
        let heard = RecordingProviderChanges()
        let fileSystem = try fixture.makeFileSystem(providerChanges: heard)
        let file = try await resolve(fileSystem, "f")
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        fixture.provider.putFile("f", .bytes(Array(repeating: 2, count: 200_000)))
        let failure = await failureErrno {
            _ = try await fileSystem.read(file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        }
        #expect(failure == .stale)
        await fileSystem.release(file.inode, handle: opened.handle)
        #expect(await Self.within(Self.bound) { !heard.heard.value.isEmpty } != nil)
        await fileSystem.cache.catalog.waitForProviderChangeRefreshes()
        #expect(heard.heard.value == [.changed(path: "f")])
        let reread = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        let bytes = try await fileSystem.read(file.inode, handle: reread.handle, offset: 0, count: 4, context: .kernel)
        #expect(bytes.bytes == [2, 2, 2, 2])
        await fileSystem.release(file.inode, handle: reread.handle)
        await fileSystem.cache.shutdown()
    }
}
