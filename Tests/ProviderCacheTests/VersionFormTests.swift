// D-500: a provider that names one content by two version strings (Apache's ETag is `W/"x"` for a
// second after a change, then `"x"`) does not make the catalog supersede it: an open reader of
// it reads on. A real change still does.

import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// InMemoryProvider whose versions are reported weak (`W/…`) while `weak` holds, as Apache does
/// for a file changed within the last second, and whose `sameContent` is the weak comparison.
final class VersionFormProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    let weak = Locked(true)

    init(base: InMemoryProvider) { self.base = base }

    private func reported(_ item: ProviderItem) -> ProviderItem {
        guard item.kind == .file, weak.withLock({ $0 }) else { return item }
        var item = item
        item.contentVersion = ContentVersion("W/" + item.contentVersion.rawValue)
        return item
    }

    private static func plain(_ version: ContentVersion) -> ContentVersion {
        version.rawValue.hasPrefix("W/") ? ContentVersion(String(version.rawValue.dropFirst(2))) : version
    }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        reported(try await base.item(for: identifier))
    }

    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await base.children(of: identifier).map(reported)
    }

    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: Self.plain(version), range: range)
    }

    func sameContent(_ one: ContentVersion, _ other: ContentVersion) -> Bool { Self.plain(one) == Self.plain(other) }
}

@Suite struct VersionFormTests {
    func make() throws -> (CacheFixture, VersionFormProvider, ProviderCache) {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 3, size: 1 << 20))
        let provider = VersionFormProvider(base: fixture.provider)
        var options = fixture.options
        options.backgroundCompletion = false  // the reader's ranges only: most of it is missing
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: options)
        return (fixture, provider, cache)
    }

    @Test func theSameContentUnderAnotherVersionFormIsNoChange() async throws {
        let (fixture, provider, cache) = try make()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        #expect(item.contentVersion.rawValue.hasPrefix("W/"))
        let reader = try await cache.pinContent(of: item)
        defer { cache.content.unpin(reader) }
        _ = try await reader.read(offset: 0, count: 4096)
        #expect(!reader.isMaterialized)
        provider.weak.withLock { $0 = false }  // a second later: the strong form
        let asked = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        #expect(asked.contentVersion == item.contentVersion, "the known form is kept")
        let listed = try await cache.catalog.children(of: .root, maximumAge: .zero)
        #expect(listed.first { $0.name == "f" }?.contentVersion == item.contentVersion)
        // The reader reads on (superseded, its missing bytes failed with ESTALE).
        let rest = try await reader.read(offset: 4096, count: (1 << 20) - 4096)
        #expect(rest.count == (1 << 20) - 4096)
        _ = fixture
    }

    @Test func aRealChangeStillSupersedes() async throws {
        let (fixture, _, cache) = try make()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let reader = try await cache.pinContent(of: item)
        defer { cache.content.unpin(reader) }
        _ = try await reader.read(offset: 0, count: 4096)
        fixture.provider.putFile("f", .ramp(seed: 4, size: 1 << 20))
        let asked = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        #expect(asked.contentVersion != item.contentVersion)
        do {
            _ = try await reader.read(offset: 512 << 10, count: 4096)
            Issue.record("read bytes of a version changed on the provider")
        } catch {
            #expect(error.code == .stale)
        }
    }
}
