// Pin states (issue 27 item 2, D-445): an item's policy is its own state or its nearest
// ancestor's; a pinned directory's files are downloaded without a read, those added later at the
// provider and those moved in too; eviction and the limits refuse them; states survive a restart.

import Foundation
import ProviderModel
import SQLiteStore
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

@Suite struct PinTests {
    /// A cache over a provider that pushes changes and takes writes: "d/a", "d/sub/b", "out/c",
    /// every directory listed.
    static func pinnedTree(
        store: (any MetadataStore)? = nil, options: CacheOptions? = nil
    ) async throws -> (CacheFixture, ChangeNotifyingProvider, ProviderCache) {
        let fixture = try CacheFixture(options: options ?? CacheFixture.defaultOptions(), store: store)
        fixture.provider.addDirectory("d")
        fixture.provider.addDirectory("d/sub")
        fixture.provider.addDirectory("out")
        fixture.provider.putFile("d/a", .ramp(seed: 1, size: 200_000))
        fixture.provider.putFile("d/sub/b", .ramp(seed: 2, size: 300_000))
        fixture.provider.putFile("out/c", .ramp(seed: 3, size: 100_000))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        for directory in ["", "d", "d/sub", "out"] {
            _ = try await cache.catalog.children(of: ItemIdentifier(directory), maximumAge: nil)
        }
        return (fixture, provider, cache)
    }

    func state(_ cache: ProviderCache, _ path: String) -> ItemStatus.State? {
        cache.status(of: ItemIdentifier(path))?.state
    }

    @Test("a policy is the item's own state, else its nearest ancestor's, else download on read")
    func resolution() async throws {
        let (fixture, _, cache) = try await Self.pinnedTree()
        let (d, sub, b, a) = (
            ItemIdentifier("d"), ItemIdentifier("d/sub"), ItemIdentifier("d/sub/b"), ItemIdentifier("d/a")
        )
        #expect(cache.pinPolicy(of: b) == PinPolicy(pinned: false, decidedBy: nil))
        #expect(cache.pinState(of: b) == .inherited)

        try cache.setPinState(.pinned, of: d)
        #expect(cache.pinState(of: d) == .pinned)
        #expect(cache.pinState(of: b) == .inherited)
        #expect(cache.pinPolicy(of: b) == PinPolicy(pinned: true, decidedBy: d))
        #expect(cache.pinPolicy(of: a) == PinPolicy(pinned: true, decidedBy: d))
        #expect(cache.pinPolicy(of: ItemIdentifier("out/c")) == PinPolicy(pinned: false, decidedBy: nil))

        try cache.setPinState(.unpinned, of: sub)
        #expect(cache.pinPolicy(of: b) == PinPolicy(pinned: false, decidedBy: sub))
        #expect(cache.pinPolicy(of: a) == PinPolicy(pinned: true, decidedBy: d))

        try cache.setPinState(.inherited, of: sub)
        #expect(cache.pinState(of: sub) == .inherited)
        #expect(cache.pinPolicy(of: b) == PinPolicy(pinned: true, decidedBy: d))
        try cache.setPinState(.inherited, of: d)
        #expect(cache.pinPolicy(of: b) == PinPolicy(pinned: false, decidedBy: nil))

        // The root pinned: everything is.
        try cache.setPinState(.pinned, of: .root)
        #expect(cache.pinPolicy(of: ItemIdentifier("out/c")) == PinPolicy(pinned: true, decidedBy: .root))
        try cache.setPinState(.inherited, of: .root)
        #expect(throws: CacheError.self) { try cache.setPinState(.pinned, of: ItemIdentifier("nothing")) }
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("pinning a directory downloads every file under it without a read, and nothing outside it")
    func pinningDownloads() async throws {
        let (fixture, _, cache) = try await Self.pinnedTree()
        #expect(state(cache, "d/a") == .dataless)
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/a") == .materialized)
        #expect(state(cache, "d/sub/b") == .materialized)
        #expect(state(cache, "out/c") == .dataless)
        let item = try #require(cache.catalog.knownItem(ItemIdentifier("d/sub/b")))
        #expect(try await readAll(cache, item) == expectedBytes(fixture.provider, "d/sub/b", 0..<300_000))
        let status = try #require(cache.pinsStatus())
        #expect(status.pinnedItems == 1 && status.files == 2 && status.downloadedFiles == 2)
        #expect(status.presentBytes == 500_000 && status.totalBytes == 500_000)
        #expect(status.queued == 0 && status.downloading == 0 && status.failures.isEmpty)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("eviction refuses a pinned file (and one in a pinned directory) with `pinned`; unpinned, it is evicted")
    func evictionRefusesPinned() async throws {
        let (fixture, _, cache) = try await Self.pinnedTree()
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        #expect(try await cache.evict(ItemIdentifier("d/a")) == .refused(.pinned))
        #expect(try await cache.evict(ItemIdentifier("d/sub/b")) == .refused(.pinned))
        #expect(state(cache, "d/a") == .materialized)
        try cache.setPinState(.unpinned, of: ItemIdentifier("d/sub"))
        #expect(cache.filesWithContent(atOrUnder: ItemIdentifier("d/sub")) == [ItemIdentifier("d/sub/b")])
        guard case .evicted = try await cache.evict(ItemIdentifier("d/sub/b")) else {
            Issue.record("not evicted once unpinned")
            return
        }
        #expect(try await cache.evict(ItemIdentifier("d/a")) == .refused(.pinned))
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("the limits keep pinned files; when pinned content fills the limit, new downloads fail with ENOSPC saying so")
    func limitsKeepPinned() async throws {
        var options = CacheFixture.defaultOptions()
        options.maximumSize = 400_000
        let (fixture, _, cache) = try await Self.pinnedTree(options: options)
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        await cache.checkLimits()
        #expect(state(cache, "d/a") == .materialized, "pinned: not evicted by the limit")
        #expect(state(cache, "d/sub/b") == .materialized)
        let reason = try #require(cache.limitsStatus?.blockedReason)
        #expect(reason.contains("pinned"), "\(reason)")
        let other = try #require(cache.catalog.knownItem(ItemIdentifier("out/c")))
        await #expect {
            _ = try await cache.pinContent(of: other)
        } throws: { ($0 as? CacheError)?.code == .noSpace }
        // Unpinned, the limit evicts them again and downloads are allowed.
        try cache.setPinState(.inherited, of: ItemIdentifier("d"))
        await cache.checkLimits()
        #expect(cache.limitsStatus?.blockedReason == nil)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("a file created at the provider in a pinned directory is downloaded when the provider reports it")
    func addedAtTheProvider() async throws {
        let (fixture, provider, cache) = try await Self.pinnedTree()
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        fixture.provider.putFile("d/sub/new", .ramp(seed: 4, size: 150_000))
        provider.report([.membership(directory: ItemIdentifier("d/sub"), name: "new")])
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/sub/new") == .materialized)
        // Rewritten at the provider: its new version is downloaded too.
        fixture.provider.putFile("d/a", .ramp(seed: 5, size: 250_000))
        provider.report([.entry(directory: ItemIdentifier("d"), name: "a")])
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/a") == .materialized)
        #expect(cache.status(of: ItemIdentifier("d/a"))?.presentBytes == 250_000)
        // Outside the pin: nothing.
        fixture.provider.putFile("out/new", .ramp(seed: 6, size: 1000))
        provider.report([.membership(directory: ItemIdentifier("out"), name: "new")])
        await cache.waitForPinnedDownloads()
        _ = try await cache.catalog.children(of: ItemIdentifier("out"), maximumAge: .zero)
        #expect(state(cache, "out/new") == .dataless)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("at a provider that pushes no changes, `refresh` of a pinned folder downloads what appeared there")
    func refreshedAtAQuietProvider() async throws {
        let fixture = try CacheFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/a", .ramp(seed: 10, size: 90_000))
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: nil)
        _ = try await cache.catalog.children(of: ItemIdentifier("d"), maximumAge: nil)
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/a") == .materialized)
        fixture.provider.putFile("d/new", .ramp(seed: 11, size: 70_000))
        _ = try await cache.catalog.refresh(path: "d")
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/new") == .materialized)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("at a provider that pushes no changes, the poll of listed folders downloads what appeared in a pinned one")
    func polledAtAQuietProvider() async throws {
        let fixture = try CacheFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.addDirectory("out")
        fixture.provider.putFile("d/a", .ramp(seed: 12, size: 90_000))
        let cache = try fixture.makeCache()
        for directory in ["", "d", "out"] {
            _ = try await cache.catalog.children(of: ItemIdentifier(directory), maximumAge: nil)
        }
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/a") == .materialized)
        fixture.provider.putFile("d/new", .ramp(seed: 13, size: 70_000))
        fixture.provider.putFile("out/other", .ramp(seed: 14, size: 50_000))
        #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 3)
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/new") == .materialized)
        #expect(state(cache, "out/other") == .dataless)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("a pinned file changed at the provider while it downloads is downloaded again, in its newest version")
    func changedWhileDownloading() async throws {
        let (fixture, provider, cache) = try await Self.pinnedTree()
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        await cache.waitForPinnedDownloads()
        fixture.provider.hold()
        fixture.provider.putFile("d/a", .ramp(seed: 8, size: 210_000))
        provider.report([.entry(directory: ItemIdentifier("d"), name: "a")])
        var spins = 0
        while cache.pinsStatus()?.downloading != 1, spins < 100_000 {
            spins += 1
            await Task.yield()
        }
        #expect(cache.pinsStatus()?.downloading == 1, "its download runs (held)")
        fixture.provider.putFile("d/a", .ramp(seed: 9, size: 220_000))
        provider.report([.entry(directory: ItemIdentifier("d"), name: "a")])
        fixture.provider.release()
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "d/a") == .materialized)
        let item = try #require(cache.catalog.knownItem(ItemIdentifier("d/a")))
        #expect(item.size == 220_000)
        #expect(try await readAll(cache, item) == expectedBytes(fixture.provider, "d/a", 0..<220_000))
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("a file moved through the mount into a pinned directory is downloaded; a pin follows its item's move")
    func movedIn() async throws {
        let (fixture, _, cache) = try await Self.pinnedTree()
        try cache.setPinState(.pinned, of: ItemIdentifier("d/sub"))
        await cache.waitForPinnedDownloads()
        #expect(state(cache, "out/c") == .dataless)
        let c = try #require(cache.catalog.knownItem(ItemIdentifier("out/c")))
        let (moved, _) = try await cache.move(
            c, to: ItemIdentifier("d/sub"), named: "c", mode: .noReplace, replaced: nil)
        #expect(cache.pinPolicy(of: moved.identifier).pinned)
        await cache.waitForPinnedDownloads()
        #expect(cache.status(of: moved.identifier)?.state == .materialized)
        // The pinned directory itself moved (the in-memory provider's identifiers are paths).
        let sub = try #require(cache.catalog.knownItem(ItemIdentifier("d/sub")))
        let (movedSub, _) = try await cache.move(sub, to: .root, named: "kept", mode: .noReplace, replaced: nil)
        #expect(cache.pinState(of: movedSub.identifier) == .pinned)
        #expect(cache.pinState(of: ItemIdentifier("d/sub")) == .inherited)
        await cache.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("pin states survive a restart (SQLite store), and a restarted cache downloads what a pin still lacks")
    func persistence() async throws {
        let directory = try TemporaryDirectory(prefix: "pins-store")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        var store = try SQLiteMetadataStore(path: path)
        let (fixture, _, cache) = try await Self.pinnedTree(store: store)
        try cache.setPinState(.pinned, of: ItemIdentifier("d"))
        try cache.setPinState(.unpinned, of: ItemIdentifier("d/sub"))
        await cache.waitForPinnedDownloads()
        await cache.shutdown()
        #expect(try store.loadPins() == [ItemIdentifier("d"): .pinned, ItemIdentifier("d/sub"): .unpinned])

        // A file added while the mount was down.
        fixture.provider.putFile("d/later", .ramp(seed: 7, size: 80_000))
        store = try SQLiteMetadataStore(path: path)
        let again = try ProviderCache(
            provider: ChangeNotifyingProvider(base: fixture.provider), directory: fixture.directory.path,
            store: store, clock: fixture.clock, options: fixture.options)
        #expect(again.pinState(of: ItemIdentifier("d")) == .pinned)
        #expect(again.pinState(of: ItemIdentifier("d/sub")) == .unpinned)
        #expect(
            again.pinPolicy(of: ItemIdentifier("d/sub/b"))
                == PinPolicy(pinned: false, decidedBy: ItemIdentifier("d/sub")))
        await again.waitForPinnedDownloads()
        #expect(again.status(of: ItemIdentifier("d/later"))?.state == .materialized)
        #expect(again.status(of: ItemIdentifier("d/sub/b"))?.state == .dataless)
        await again.shutdown()
        withExtendedLifetime(fixture) {}
    }

    @Test("a store from before pin states migrates: its rows load, no item has a state")
    func migration() throws {
        let directory = try TemporaryDirectory(prefix: "pins-migration")
        defer { directory.remove() }
        let path = directory.path + "/metadata.sqlite"
        do {
            let old = try DatabaseQueue(path: path, migrator: SQLiteMetadataStore.migrator.prefix(8))
            try old.write { db in
                try db.execute(
                    """
                    INSERT INTO items (identifier, parent, name, kind, size, mtime_seconds, mtime_nanoseconds, version,
                        permissions, children_listed)
                    VALUES ('d', '', 'd', 'directory', 0, 0, 0, 'v', 493, 1)
                    """)
            }
        }
        let store = try SQLiteMetadataStore(path: path)
        #expect(try store.loadItems().map(\.item.identifier) == [ItemIdentifier("d")])
        #expect(try store.loadPins().isEmpty)
        try store.savePin(.pinned, for: ItemIdentifier("d"))
        #expect(try store.loadPins() == [ItemIdentifier("d"): .pinned])
        try store.savePin(.inherited, for: ItemIdentifier("d"))
        #expect(try store.loadPins().isEmpty)
    }
}
