// Changes pushed by the provider (`.changeNotifying`, D-228): what they do to the catalog's answers,
// and what the cache tells its observer (the file system, which tells the kernel).

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@Suite("Changes pushed by the provider")
struct PushedChangesTests {
    /// A cache over a provider that pushes changes, holding "a" and "b" in the root, listed once;
    /// `told` collects what the cache tells its observer.
    static func listedCache() async throws -> (
        CacheFixture, ChangeNotifyingProvider, ProviderCache, Locked<[CatalogChange]>
    ) {
        let fixture = try CacheFixture()
        fixture.provider.putFile("a", .bytes([1]))
        fixture.provider.putFile("b", .bytes([2, 2]))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        let told = Locked<[CatalogChange]>([])
        cache.catalog.observeChanges { changes in told.withLock { $0 += changes } }
        _ = try await cache.catalog.children(of: .root, maximumAge: fixture.options.directoryTTL)
        return (fixture, provider, cache, told)
    }

    func found(_ answer: Catalog.ChildAnswer) -> (ProviderItem, tracked: Bool)? {
        if case .found(let item, let tracked) = answer { return (item, tracked) }
        return nil
    }

    @Test("a child written on the provider is asked for alone; its siblings still answer from the listing, tracked")
    func aWrittenChildIsAskedForAlone() async throws {
        let (fixture, provider, cache, told) = try await Self.listedCache()
        #expect(cache.catalog.pushesChanges)
        #expect(found(cache.catalog.childNow(named: "a", of: .root))?.tracked == true)

        fixture.provider.putFile("a", .bytes([1, 1, 1]))
        provider.report([.entry(directory: .root, name: "a")])
        #expect(told.value == [.entry(directory: .root, name: "a", identifier: ItemIdentifier("a"))])
        #expect(found(cache.catalog.childNow(named: "a", of: .root)) == nil, "asked for again")
        #expect(cache.catalog.itemNow(ItemIdentifier("a"), maximumAge: .seconds(3600), askingProvider: false) == nil)
        #expect(found(cache.catalog.childNow(named: "b", of: .root))?.tracked == true)

        let calls = fixture.provider.counters
        #expect(try await cache.catalog.child(named: "a", of: .root)?.size == 3)
        #expect(fixture.provider.counters.childrenCalls == calls.childrenCalls, "no listing")
        #expect(fixture.provider.counters.itemCalls == calls.itemCalls + 1, "one item call")
        let again = try #require(found(cache.catalog.childNow(named: "a", of: .root)))
        #expect(again.0.size == 3)
        #expect(again.tracked)
    }

    @Test("a name created or deleted expires the listing: the next answer lists again and is exact")
    func membershipExpiresTheListing() async throws {
        let (fixture, provider, cache, told) = try await Self.listedCache()
        fixture.provider.putFile("c", .bytes([3]))
        fixture.provider.remove("b")
        provider.report([.membership(directory: .root, name: "c"), .membership(directory: .root, name: "b")])
        #expect(
            Set(told.value.map { "\($0)" })
                == Set(
                    [
                        CatalogChange.entry(directory: .root, name: "c", identifier: nil),
                        .entry(directory: .root, name: "b", identifier: ItemIdentifier("b")),
                    ].map { "\($0)" }))
        #expect(found(cache.catalog.childNow(named: "a", of: .root)) == nil, "the listing expired")
        #expect(try await cache.catalog.child(named: "c", of: .root)?.size == 1)
        #expect(try await cache.catalog.child(named: "b", of: .root) == nil)
        #expect(fixture.provider.counters.childrenCalls == 2)
        #expect(found(cache.catalog.childNow(named: "a", of: .root))?.tracked == true)
    }

    @Test("lost events expire every listing and every item's metadata")
    func lostEventsExpireEverything() async throws {
        let (fixture, provider, cache, told) = try await Self.listedCache()
        _ = try await cache.catalog.item(ItemIdentifier("a"), maximumAge: .zero)
        provider.report(nil)
        #expect(told.value.last == .everything)
        #expect(found(cache.catalog.childNow(named: "a", of: .root)) == nil)
        #expect(
            cache.catalog.itemNow(ItemIdentifier("a"), maximumAge: fixture.options.attributeTTL, askingProvider: false)
                == nil)
        #expect(try await cache.catalog.child(named: "b", of: .root)?.size == 2)
        #expect(fixture.provider.counters.childrenCalls == 2)
    }

    @Test("a listing that began before a reported change stands but is not trusted past its answer")
    func aListingOverlappingAChangeIsNotTrusted() async throws {
        let (fixture, provider, cache, _) = try await Self.listedCache()
        let ttl = fixture.options.directoryTTL
        fixture.clock.advance(by: ttl + .seconds(1))
        provider.report([.membership(directory: .root, name: "x")])  // voids the token: lists again
        provider.holdNextListing()
        let listing = Task { try await cache.catalog.children(of: .root, maximumAge: ttl).map(\.name) }
        var rounds = 0
        while !provider.isHoldingListing && rounds < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        #expect(provider.isHoldingListing)
        // Taken before "c" was created, reported while the listing is on its way.
        fixture.provider.putFile("c", .bytes([3]))
        provider.report([.membership(directory: .root, name: "c")])
        provider.releaseListing()
        #expect(try await listing.value == ["a", "b"])
        #expect(found(cache.catalog.childNow(named: "a", of: .root)) == nil, "expired at once")
        #expect(try await cache.catalog.child(named: "c", of: .root)?.size == 1)
        #expect(found(cache.catalog.childNow(named: "c", of: .root))?.tracked == true)
    }

    @Test("what a re-list finds changed is told, also without pushed changes; nothing is tracked then")
    func changesFoundByAListingAreTold() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("a", .bytes([1]))
        fixture.provider.putFile("b", .bytes([2]))
        let cache = try fixture.makeCache()
        let told = Locked<[CatalogChange]>([])
        cache.catalog.observeChanges { changes in told.withLock { $0 += changes } }
        let ttl = fixture.options.directoryTTL
        _ = try await cache.catalog.children(of: .root, maximumAge: ttl)
        #expect(told.value.isEmpty, "a first listing tells nothing")
        #expect(!cache.catalog.pushesChanges)
        #expect(found(cache.catalog.childNow(named: "a", of: .root))?.tracked == false)
        fixture.provider.putFile("a", .bytes([1, 1]))
        fixture.provider.remove("b")
        fixture.clock.advance(by: ttl + .seconds(1))
        _ = try await cache.catalog.children(of: .root, maximumAge: ttl)
        #expect(
            Set(told.value.map { "\($0)" })
                == Set(
                    [
                        CatalogChange.entry(directory: .root, name: "a", identifier: ItemIdentifier("a")),
                        .entry(directory: .root, name: "b", identifier: ItemIdentifier("b")),
                    ].map { "\($0)" }))
    }
}
