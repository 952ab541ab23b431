// The catalog's race windows (D-407): a listing taken before a change through the mount and
// applied at a point inside that change (`CatalogHooks`, `CatalogStep`) must not undo it. Each
// test takes the listing as `listChildren` does (`beginListing`, the provider's answer, then
// `applyListing` with the count read at the start), applies it from the hook, and checks what
// the catalog keeps until the directory is listed again.

import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// A cache over an `UploadingProvider` whose catalog calls `armed` actions at their steps.
private final class WindowFixture: @unchecked Sendable {
    let fixture: WriteFixture
    /// The action for each step, taken (run once) when the step is reached.
    let armed = Locked<[CatalogStep: @Sendable (Catalog) -> Void]>([:])
    let cache: ProviderCache

    init(deferring: Bool = false) throws {
        fixture = try WriteFixture()
        fixture.provider.base.defersCreates = deferring
        let armed = self.armed
        cache = try ProviderCache(
            provider: fixture.provider, directory: fixture.directory.path, store: fixture.store,
            clock: fixture.clock, options: fixture.options,
            catalogHooks: CatalogHooks { catalog, step in
                armed.withLock { $0.removeValue(forKey: step) }?(catalog)
            })
    }

    var provider: UploadingProvider { fixture.provider }

    /// A listing of `directory` the provider answers now, applied later (`HeldListing.apply`).
    func takeListing(of directory: ItemIdentifier) async throws -> HeldListing {
        let count = cache.catalog.beginListing(of: directory)
        let children = try await provider.children(of: directory)
        return HeldListing(
            directory: directory, count: count, children: children, takenAt: cache.environment.timeline.now)
    }

    /// Applies `listing` when the catalog reaches `step`.
    func apply(_ listing: HeldListing, at step: CatalogStep) {
        armed.withLock { $0[step] = { catalog in listing.apply(to: catalog) } }
    }

    var stepsNotReached: [CatalogStep] { armed.withLock { Array($0.keys) } }

    /// The names the catalog keeps for `directory` (its listing as it stands, not asked again).
    func keptNames(of directory: ItemIdentifier) async throws -> [String] {
        try await cache.catalog.children(of: directory, maximumAge: .seconds(3600)).map(\.name).sorted()
    }
}

/// A listing taken at the provider, on its way until applied.
private struct HeldListing: Sendable {
    let directory: ItemIdentifier
    let count: UInt64
    let children: [ProviderItem]
    let takenAt: Duration

    func apply(to catalog: Catalog) {
        catalog.applyListing(of: directory, children: children, at: takenAt, changeCount: count)
    }
    func end(in catalog: Catalog) { catalog.endListing(of: directory, askedAt: count) }
}

@Suite struct ListingWindowTests {
    /// D-388 window 1 (`.moveRecorded`: the old identifier recorded absent, not yet moved) and 3
    /// (`.moveRekeyed`: `identifiersMoved` had put the new identifier in the old parent's
    /// listing): a listing of the parent taken before a directory's rename and applied there
    /// removed the directory's subtree (its children gone from the catalog, their numbers new).
    @Test(arguments: [CatalogStep.moveRecorded, .moveRekeyed])
    func aListingAppliedInsideAMoveKeepsTheMovedSubtree(step: CatalogStep) async throws {
        let window = try WindowFixture()
        window.provider.base.addDirectory("d")
        window.provider.base.putFile("d/f", .bytes([1]))
        window.provider.base.addDirectory("d/sub")
        window.provider.base.putFile("d/sub/g", .bytes([2]))
        let cache = window.cache
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        _ = try await cache.catalog.children(of: ItemIdentifier("d"), maximumAge: .zero)
        _ = try await cache.catalog.children(of: ItemIdentifier("d/sub"), maximumAge: .zero)
        let serial = cache.catalog.serialNumber(of: ItemIdentifier("d/sub/g"))
        let listing = try await window.takeListing(of: .root)
        window.apply(listing, at: step)
        let d = try await cache.catalog.item(ItemIdentifier("d"), maximumAge: .seconds(3600))
        let (moved, _) = try await cache.move(d, to: .root, named: "e", mode: .replacing, replaced: nil)
        listing.end(in: cache.catalog)
        #expect(window.stepsNotReached.isEmpty, "the listing was applied inside the move")
        #expect(moved.identifier == ItemIdentifier("e"))
        #expect(try await window.keptNames(of: .root) == ["e"])
        #expect(cache.catalog.isListed(ItemIdentifier("e")), "the moved directory keeps its listing")
        #expect(cache.catalog.cachedChildNames(of: ItemIdentifier("e")).map(\.name).sorted() == ["f", "sub"])
        #expect(cache.catalog.knownItem(ItemIdentifier("e/sub/g"))?.parent == ItemIdentifier("e/sub"))
        #expect(cache.catalog.serialNumber(of: ItemIdentifier("e/sub/g")) == serial, "st_ino kept (D-389)")
        #expect(cache.catalog.knownItem(ItemIdentifier("d")) == nil)
        await cache.shutdown()
    }

    /// D-388 window 2: `applyCreated` applied the new file, then recorded it for listings on
    /// their way; a listing taken before the create and applied in between dropped the file.
    @Test func aListingAppliedInsideACreateKeepsTheFile() async throws {
        let window = try WindowFixture(deferring: false)
        window.provider.base.putFile("a", .bytes([1]))
        let cache = window.cache
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let listing = try await window.takeListing(of: .root)
        window.apply(listing, at: .createApplied)
        let created = try await cache.createFile(named: "new", in: .root, permissions: 0o644)
        listing.end(in: cache.catalog)
        #expect(window.stepsNotReached.isEmpty, "the listing was applied inside the create")
        #expect(window.provider.base.content(of: "new") != nil, "created at the provider, not deferred")
        #expect(try await window.keptNames(of: .root) == ["a", "new"])
        #expect(try await cache.catalog.child(named: "new", of: .root)?.identifier == created.identifier)
        await cache.shutdown()
    }

    /// D-388 window 4: a file recorded for a listing on its way (its birth) whose identifier
    /// then changed (the provider gave the created file another identifier than the deferred
    /// one, `identifiersMoved`): the record kept the old identifier, so the listing, taken
    /// before the birth, removed the file under its new one.
    @Test func aRecordFollowsTheIdentifierOfItsItem() async throws {
        let window = try WindowFixture()
        let cache = window.cache
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let deferred = ItemIdentifier("deferred:late")
        let item = ProviderItem(
            identifier: deferred, parent: .root, name: "late", kind: .file, size: 0,
            modificationTime: ItemTime(seconds: 1), contentVersion: .unborn(1), permissions: 0o644)
        #expect(cache.catalog.createdUnborn(item, directory: nil))
        let listing = try await window.takeListing(of: .root)
        // The upload creates it at the provider, which names it by its path.
        window.provider.base.putFile("late", .bytes([3]))
        cache.catalog.born(deferred)
        let moves = cache.identifiersMoved(from: deferred, to: ItemIdentifier("late"))
        #expect(moves[deferred] == ItemIdentifier("late"))
        cache.catalog.apply(try await window.provider.item(for: ItemIdentifier("late")))
        listing.apply(to: cache.catalog)
        listing.end(in: cache.catalog)
        #expect(try await window.keptNames(of: .root) == ["late"])
        #expect(try await cache.catalog.child(named: "late", of: .root)?.identifier == ItemIdentifier("late"))
        await cache.shutdown()
    }

    /// D-388 window 5: a file created through the mount (deferred, D-386) under a name the
    /// catalog held for another identifier (its file gone at the provider). The held item's
    /// removal was not recorded for a listing on its way, and was a lock apart from the new
    /// file's record: a listing taken before brought the old item back, so the directory showed
    /// the name twice (applied in between) or the name led to the old item (applied after).
    @Test(arguments: [true, false]) func aDeferredCreateOverAHeldNameIsNotUndone(inTheWindow: Bool) async throws {
        let window = try WindowFixture(deferring: true)
        window.provider.base.putFile("x", .bytes([1]))
        let cache = window.cache
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let listing = try await window.takeListing(of: .root)
        window.provider.base.remove("x")
        if inTheWindow { window.apply(listing, at: .unbornNameFreed) }
        // A provider whose identifiers are not paths hands out a new one for the new file.
        let fresh = ItemIdentifier("deferred:x")
        let item = ProviderItem(
            identifier: fresh, parent: .root, name: "x", kind: .file, size: 0,
            modificationTime: ItemTime(seconds: 1), contentVersion: .unborn(1), permissions: 0o644)
        #expect(cache.catalog.createdUnborn(item, directory: nil))
        if !inTheWindow { listing.apply(to: cache.catalog) }
        listing.end(in: cache.catalog)
        #expect(window.stepsNotReached.isEmpty)
        #expect(try await window.keptNames(of: .root) == ["x"], "the name once")
        #expect(try await cache.catalog.child(named: "x", of: .root)?.identifier == fresh)
        #expect(cache.catalog.knownItem(ItemIdentifier("x")) == nil, "the old item is gone")
        await cache.shutdown()
    }
}
