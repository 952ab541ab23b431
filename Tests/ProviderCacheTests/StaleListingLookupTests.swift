// D-378: a LOOKUP in a directory whose listing went stale asks a provider that looks names up
// (`.namedChildLookup`) for that one name instead of listing the directory again; readdir still
// lists again. Counted at the provider; manual clock, no sleeps.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

/// Forwards to an InMemoryProvider, adds a named-child lookup, and counts both kinds of call.
/// `immediate`: it also answers names at once (`childNow`, counted apart), as a watched local
/// directory does.
final class NameCountingProvider: Provider, Sendable {
    let base: InMemoryProvider
    let immediate: Bool
    private let calls = Locked((listings: 0, names: 0, immediateNames: 0))

    init(base: InMemoryProvider, immediate: Bool = false) {
        self.base = base
        self.immediate = immediate
    }

    var capabilities: ProviderCapabilities {
        base.capabilities.union(immediate ? [.namedChildLookup, .immediateMetadata] : .namedChildLookup)
    }
    /// Every call about names and listings fails as a server that cannot be reached does.
    let unreachable = Locked(false)
    var listings: Int { calls.withLock { $0.listings } }
    var names: Int { calls.withLock { $0.names } }
    var immediateNames: Int { calls.withLock { $0.immediateNames } }

    func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild {
        guard immediate else { return .declined }
        calls.withLock { $0.immediateNames += 1 }
        let identifier = ItemIdentifier(directory == .root ? name : directory.rawValue + "/" + name)
        do {
            return try base.itemNow(for: identifier).map { .found($0) } ?? .declined
        } catch let error as ProviderError where error.code == .noSuchItem {
            return .absent
        }
    }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem { try await base.item(for: identifier) }

    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        calls.withLock { $0.listings += 1 }
        if unreachable.withLock({ $0 }) { throw ProviderError(.unreachable, "the server is down") }
        return try await base.children(of: identifier)
    }

    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        calls.withLock { $0.names += 1 }
        if unreachable.withLock({ $0 }) { throw ProviderError(.unreachable, "the server is down") }
        return try await base.children(of: directory).first { $0.name == name }
    }

    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: version, range: range)
    }
}

@Suite struct StaleListingLookupTests {
    @Test func aLookupInAStaleListingAsksForTheNameAloneAndReaddirListsAgain() async throws {
        let base = InMemoryProvider()
        base.addDirectory("d")
        for name in ["a", "b", "c"] { base.putFile("d/\(name)", .bytes(Array(name.utf8))) }
        let provider = NameCountingProvider(base: base)
        let clock = ManualClock()
        let directory = try TemporaryDirectory(prefix: "providerfs-stale-listing")
        defer { directory.remove() }
        let options = CacheFixture.defaultOptions()
        let cache = try ProviderCache(
            provider: provider, directory: directory.path, store: InMemoryMetadataStore(), clock: clock,
            options: options)
        let d = ItemIdentifier("d")
        #expect(try await cache.catalog.children(of: d, maximumAge: nil).map(\.name) == ["a", "b", "c"])
        #expect(provider.listings == 1)

        // Fresh: answered from the listing, nothing asked.
        #expect(try await cache.catalog.child(named: "a", of: d)?.name == "a")
        #expect(provider.listings == 1 && provider.names == 0)

        // Stale (past directoryTTL); meanwhile a changed, b was removed, e was created.
        base.putFile("d/a", .bytes(Array("a2".utf8)))
        base.remove("d/b")
        base.putFile("d/e", .bytes(Array("e".utf8)))
        clock.advance(by: options.directoryTTL)
        #expect(try await cache.catalog.child(named: "missing", of: d) == nil)
        #expect(try await cache.catalog.child(named: "a", of: d)?.size == 2, "the changed item, asked alone")
        #expect(try await cache.catalog.child(named: "b", of: d) == nil, "removed at the provider")
        #expect(try await cache.catalog.child(named: "e", of: d)?.name == "e")
        #expect(provider.listings == 1, "no listing for a lookup")
        #expect(provider.names == 4)
        #expect(!cache.catalog.cachedChildNames(of: d).map(\.name).contains("b"))

        // readdir of the stale listing lists again.
        #expect(
            try await cache.catalog.children(of: d, maximumAge: options.directoryTTL).map(\.name) == ["a", "c", "e"])
        #expect(provider.listings == 2)
        await cache.shutdown()
    }

    /// D-492: a stale listing's lookup that gets no answer (a server that cannot be reached)
    /// keeps what the listing says, both ways: a listed name is found (it was ENOENT, so offline
    /// every file of a WebDAV mount vanished once its listing was older than the TTL), a name
    /// the listing lacks stays missing.
    @Test func aStaleLookupThatGetsNoAnswerKeepsTheListing() async throws {
        let base = InMemoryProvider()
        base.addDirectory("d")
        for name in ["a", "b"] { base.putFile("d/\(name)", .bytes(Array(name.utf8))) }
        let provider = NameCountingProvider(base: base)
        let clock = ManualClock()
        let directory = try TemporaryDirectory(prefix: "providerfs-stale-listing-offline")
        defer { directory.remove() }
        let options = CacheFixture.defaultOptions()
        let cache = try ProviderCache(
            provider: provider, directory: directory.path, store: InMemoryMetadataStore(), clock: clock,
            options: options)
        let d = ItemIdentifier("d")
        #expect(try await cache.catalog.children(of: d, maximumAge: nil).map(\.name) == ["a", "b"])
        clock.advance(by: options.directoryTTL)
        provider.unreachable.withLock { $0 = true }
        #expect(try await cache.catalog.child(named: "a", of: d)?.size == 1, "a listed name stays")
        #expect(try await cache.catalog.child(named: "missing", of: d) == nil)
        #expect(provider.names == 2, "the provider was asked both times")
        await cache.shutdown()
    }

    /// D-380: with a provider that answers a name at once (a watched local directory), the same
    /// lookups are answered on the calling thread (`childNow`), with the same results, and no
    /// async call at all.
    @Test func aProviderThatAnswersAtOnceAnswersTheStaleLookupsWithoutATask() async throws {
        let base = InMemoryProvider()
        base.addDirectory("d")
        for name in ["a", "b", "c"] { base.putFile("d/\(name)", .bytes(Array(name.utf8))) }
        base.answersImmediately = true
        let provider = NameCountingProvider(base: base, immediate: true)
        let clock = ManualClock()
        let directory = try TemporaryDirectory(prefix: "providerfs-stale-listing-now")
        defer { directory.remove() }
        let options = CacheFixture.defaultOptions()
        let cache = try ProviderCache(
            provider: provider, directory: directory.path, store: InMemoryMetadataStore(), clock: clock,
            options: options)
        let d = ItemIdentifier("d")
        // Never listed: the immediate path does not answer (the async one lists).
        guard case .unknown = cache.catalog.childNow(named: "a", of: d) else {
            Issue.record("a directory never listed was answered at once")
            return
        }
        #expect(try await cache.catalog.children(of: d, maximumAge: nil).map(\.name) == ["a", "b", "c"])
        guard case .found(let fresh, _) = cache.catalog.childNow(named: "a", of: d) else {
            Issue.record("a fresh listing did not answer")
            return
        }
        #expect(fresh.size == 1)
        #expect(provider.immediateNames == 0, "a fresh listing answers alone")

        base.putFile("d/a", .bytes(Array("a2".utf8)))
        base.remove("d/b")
        base.putFile("d/e", .bytes(Array("e".utf8)))
        clock.advance(by: options.directoryTTL)
        guard case .absent = cache.catalog.childNow(named: "missing", of: d) else {
            Issue.record("a missing name was not absent")
            return
        }
        guard case .found(let changed, _) = cache.catalog.childNow(named: "a", of: d) else {
            Issue.record("a changed item was not found")
            return
        }
        #expect(changed.size == 2)
        guard case .absent = cache.catalog.childNow(named: "b", of: d) else {
            Issue.record("an item removed at the provider was not absent")
            return
        }
        guard case .found(let created, _) = cache.catalog.childNow(named: "e", of: d) else {
            Issue.record("an item created at the provider was not found")
            return
        }
        #expect(created.name == "e")
        #expect(provider.immediateNames == 4)
        #expect(provider.names == 0 && provider.listings == 1, "no async call")
        #expect(!cache.catalog.cachedChildNames(of: d).map(\.name).contains("b"))
        // The async path sees what the immediate one recorded.
        #expect(try await cache.catalog.child(named: "e", of: d)?.name == "e")
        await cache.shutdown()
    }
}
