// A provider that does not show a file while the mount's own call changes it (D-465): rclone's
// WebDAV MOVE deletes the destination and then renames the uploaded copy onto it, so a listing
// or a lookup in between finds no file. Such a miss, and one from a question asked before the
// call ended, is not a deletion: the catalog keeps the file, and the first answer to a question
// asked after the call ended decides. The provider double (`UploadingProvider.replacesInTwoSteps`)
// takes the file away for as long as its held upload call runs: no sleeps, each window is held.

import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// A cache over a file `f` ("hello") whose edit (" world" appended) is published and whose upload
/// call is held at the provider, which meanwhile has no `f`.
private struct HeldUpload {
    let fixture: WriteFixture
    let cache: ProviderCache
    let file: ItemIdentifier
    let published: ProviderItem
    /// What the catalog told its observer, in order.
    let told = Locked<[CatalogChange]>([])

    init(looksUpNames: Bool = false) async throws {
        fixture = try WriteFixture()
        fixture.provider.replacesInTwoSteps.withLock { $0 = true }
        fixture.provider.looksUpNames.withLock { $0 = looksUpNames }
        fixture.provider.base.putFile("f", .bytes(Array("hello".utf8)))
        fixture.provider.base.putFile("g", .bytes(Array("other".utf8)))
        cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        file = ItemIdentifier("f")
        let item = try await cache.catalog.item(file, maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array(" world".utf8), at: 5)
        fixture.provider.hold()
        published = try #require(try await cache.writes.closeWriter(item.identifier)).item
        let fixture = fixture
        #expect(await eventually { fixture.provider.startedCount == 1 }, "the upload call is held")
        #expect(fixture.provider.base.content(of: "f") == nil, "the provider shows no file now")
        let told = told
        cache.catalog.observeChanges { changes in told.withLock { $0 += changes } }
    }

    /// Whether the kernel was told that `f`'s entry changed (a removal tells it).
    var toldOfTheFile: Bool {
        told.withLock { changes in
            changes.contains { if case .entry(_, "f", _) = $0 { true } else { false } }
        }
    }

    func names(maximumAge: Duration?) async throws -> Set<String> {
        Set(try await cache.catalog.children(of: .root, maximumAge: maximumAge).map(\.name))
    }
}

@Suite struct PassingMissTests {
    /// The bug of issue 26 (ENOENT opening a file right after its upload through a mount of
    /// rclone): a listing and a lookup during the upload call removed the file and told the kernel.
    @Test func aListingOrLookupDuringTheUploadCallKeepsTheFile() async throws {
        let held = try await HeldUpload()
        let cache = held.cache
        #expect(try await held.names(maximumAge: .zero) == ["f", "g"])
        let looked = try await cache.catalog.item(held.file, maximumAge: .zero)
        #expect(looked.contentVersion == held.published.contentVersion && looked.size == 11)
        #expect(try await cache.catalog.child(named: "f", of: .root)?.identifier == held.file)
        let toldOfTheFile = held.toldOfTheFile
        #expect(!toldOfTheFile, "the kernel was told the file changed")
        #expect(try await readAll(cache, looked) == Array("hello world".utf8))
        held.fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(held.file))
        #expect(held.fixture.provider.base.content(of: "f")?.0 == .bytes(Array("hello world".utf8)))
        #expect(try await held.names(maximumAge: .zero) == ["f", "g"])
        // A miss asked after the call ended is a deletion, as ever.
        held.fixture.provider.base.remove("f")
        #expect(try await held.names(maximumAge: .zero) == ["g"])
        let toldOfTheDeletion = held.toldOfTheFile
        #expect(toldOfTheDeletion)
        let error = await #expect(throws: CacheError.self) {
            _ = try await cache.catalog.item(held.file, maximumAge: .zero)
        }
        #expect(error?.code == .notFound)
        await cache.shutdown()
    }

    /// A listing asked while the call ran and answered after it ended (the upload's result already
    /// recorded) shows the file missing too: the catalog keeps it until a listing asked after.
    @Test func aListingAskedDuringTheCallAndAnsweredAfterItKeepsTheFile() async throws {
        let held = try await HeldUpload()
        let cache = held.cache
        let provider = held.fixture.provider
        provider.holdNextListing()
        let listing = Task { try await held.names(maximumAge: .zero) }
        #expect(await eventually { provider.isHoldingListing })
        provider.release()
        #expect(await cache.writes.waitUntilUploaded(held.file))
        provider.releaseListing()
        #expect(try await listing.value == ["f", "g"])
        let toldOfTheFile = held.toldOfTheFile
        #expect(!toldOfTheFile, "the kernel was told the file changed")
        #expect(cache.catalog.knownItem(held.file)?.size == 11)
        #expect(try await held.names(maximumAge: .zero) == ["f", "g"])
        await cache.shutdown()
    }

    /// The same for a lookup of the one name (`.namedChildLookup`, a WebDAV PROPFIND Depth 0) asked
    /// during the call and answered "absent" after it ended.
    @Test func aNameAskedDuringTheCallAndAnsweredAfterItIsFound() async throws {
        let held = try await HeldUpload(looksUpNames: true)
        let cache = held.cache
        let provider = held.fixture.provider
        held.fixture.clock.advance(by: held.fixture.options.directoryTTL + .seconds(1))
        provider.holdNextListing()
        let lookup = Task { try await cache.catalog.child(named: "f", of: .root) }
        #expect(await eventually { provider.isHoldingListing }, "the provider was asked for the name")
        provider.release()
        #expect(await cache.writes.waitUntilUploaded(held.file))
        provider.releaseListing()
        #expect(try await lookup.value?.identifier == held.file)
        let toldOfTheFile = held.toldOfTheFile
        #expect(!toldOfTheFile, "the kernel was told the file changed")
        #expect(try await cache.catalog.child(named: "f", of: .root)?.size == 11)
        await cache.shutdown()
    }
}
