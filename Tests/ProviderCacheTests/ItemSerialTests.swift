// st_ino (D-389): every item the catalog holds has a serial number for its whole life in a mount,
// through renames (with everything below a moved directory), new versions at the provider, a
// deferred create's upload, an exchange, and a restart on the same store; a number another item
// still has is never handed out, and a new item under an old name gets a new one.

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

@Suite struct ItemSerialTests {
    @Test func aTableKeepsNumbersThroughMovesAndNeverHandsOutATakenOne() {
        var serials = ItemSerials()
        #expect(serials[.root] == 1)
        let a = serials.number(for: ItemIdentifier("a"))
        let b = serials.number(for: ItemIdentifier("a/b"))
        #expect(a != b && a > 1 && b > 1)
        #expect(serials.number(for: ItemIdentifier("a")) == a, "asked again: the same number")
        serials.rekey([ItemIdentifier("a"): ItemIdentifier("c"), ItemIdentifier("a/b"): ItemIdentifier("c/b")])
        #expect(serials[ItemIdentifier("c")] == a && serials[ItemIdentifier("c/b")] == b)
        #expect(serials[ItemIdentifier("a")] == nil)
        // A swap (an exchange) in one call.
        serials.rekey([ItemIdentifier("c"): ItemIdentifier("c/b"), ItemIdentifier("c/b"): ItemIdentifier("c")])
        #expect(serials[ItemIdentifier("c")] == b && serials[ItemIdentifier("c/b")] == a)
        serials.remove(ItemIdentifier("c"))
        let fresh = serials.number(for: ItemIdentifier("c"))
        #expect(fresh != a && fresh != b, "a removed item's identifier gets a number no one had")
        serials.renew(ItemIdentifier("c/b"))
        #expect(serials[ItemIdentifier("c/b")] != a, "a new item under a name: a new number")
        serials.remove(.root)
        #expect(serials[.root] == 1, "the root keeps 1")
        // Restored numbers are never handed out again; a row without one gets a fresh one.
        var restored = ItemSerials()
        let keptX = restored.restore(ItemIdentifier("x"), 40)
        let keptY = restored.restore(ItemIdentifier("y"), 0)
        #expect(!keptX && keptY, "a row without a number is to be saved again")
        restored.numberRestored([ItemIdentifier("y")])
        #expect(restored[ItemIdentifier("x")] == 40 && restored[ItemIdentifier("y")] == 41)
        let z = restored.number(for: ItemIdentifier("z"))
        #expect(z == 42)
    }

    /// Through the cache, on an SQLite store that a restart reopens.
    /// The names of one file (hard links, D-396) share its number; nlink counts them.
    @Test func theNamesOfOneFileShareANumber() {
        var serials = ItemSerials()
        let a = ItemIdentifier("a")
        let b = ItemIdentifier("d/b")
        let c = ItemIdentifier("c")
        let other = ItemIdentifier("other")
        let number = serials.number(for: a)
        let otherNumber = serials.number(for: other)
        #expect(serials.share(b, with: a, link: "d1-i7") == number)
        #expect(serials[b] == number && serials.linkCount(of: a) == 2 && serials.linkCount(of: b) == 2)
        #expect(serials.linkCount(of: other) == 1)
        // A name listed with the same identity joins; another identity does not.
        #expect(serials.number(for: c, link: "d1-i7") == number)
        #expect(serials.linkCount(of: a) == 3)
        #expect(Set(serials.otherNames(of: a)) == [b, c])
        #expect(serials.number(for: ItemIdentifier("x"), link: "d1-i8") != number)
        // A rename keeps the group; removing names lowers the count; the last name keeps the number.
        serials.rekey([b: ItemIdentifier("d/moved")])
        #expect(serials.linkCount(of: ItemIdentifier("d/moved")) == 3)
        serials.remove(a)
        #expect(serials.linkCount(of: c) == 2)
        serials.remove(ItemIdentifier("d/moved"))
        #expect(serials.linkCount(of: c) == 1 && serials[c] == number)
        // Two names numbered before they were seen to be one file: the lower number wins.
        var later = ItemSerials()
        let first = later.number(for: a)
        let second = later.number(for: b, link: "d2-i9")  // b listed first with its identity
        #expect(second > first)
        #expect(later.number(for: a, link: "d2-i9") == first)
        #expect(later[b] == first && later.linkCount(of: b) == 2)
        #expect(serials[other] == otherNumber)
        // A restart: names kept with one number are one file again.
        var restored = ItemSerials()
        _ = restored.restore(a, 50)
        _ = restored.restore(b, 50)
        _ = restored.restore(c, 51)
        restored.numberRestored([])
        #expect(restored.linkCount(of: a) == 2 && restored.linkCount(of: c) == 1)
    }

    @Test func anItemKeepsItsNumberForItsWholeLifeAndAcrossARestart() async throws {
        let scratch = try TemporaryDirectory(prefix: "providerfs-serials")
        defer { scratch.remove() }
        let fixture = try WriteFixture(store: try SQLiteMetadataStore(path: scratch.path + "/metadata.sqlite"))
        fixture.provider.base.defersCreates = true
        let base = fixture.provider.base
        base.addDirectory("d")
        base.putFile("d/a", .bytes(Array("a".utf8)))
        base.putFile("b", .bytes(Array("b".utf8)))
        base.putFile("gone", .bytes(Array("g".utf8)))
        let cache = try fixture.makeCache()
        func serial(_ path: String) -> UInt64 { cache.catalog.serialNumber(of: ItemIdentifier(path)) }
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        _ = try await cache.catalog.children(of: ItemIdentifier("d"), maximumAge: .zero)
        let (d, a, b, gone) = (serial("d"), serial("d/a"), serial("b"), serial("gone"))
        #expect(serial("") == 1)
        #expect(Set([1, d, a, b, gone]).count == 5, "every item its own number")

        // A rename carries the directory's number and its children's.
        let directory = try await cache.catalog.item(ItemIdentifier("d"), maximumAge: .zero)
        _ = try await cache.move(directory, to: .root, named: "e", mode: .replacing, replaced: nil)
        #expect(serial("e") == d && serial("e/a") == a)

        // A new version at the provider: the same item.
        base.putFile("b", .bytes(Array("changed".utf8)))
        let changed = try await cache.catalog.item(ItemIdentifier("b"), maximumAge: .zero)
        #expect(changed.size == 7 && serial("b") == b)

        // A deferred create keeps its number through its upload.
        let created = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        let n = serial("n")
        #expect(!Set([1, d, a, b, gone]).contains(n))
        #expect(cache.catalog.isUnborn(created.identifier), "deferred: not at the provider yet")
        let staging = try await cache.writes.openWriter(created, truncating: false)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        _ = try await cache.writes.closeWriter(created.identifier)
        #expect(await cache.writes.waitUntilUploaded(created.identifier))
        #expect(base.content(of: "n")?.0 == .bytes(Array("new".utf8)))
        #expect(!cache.catalog.isUnborn(created.identifier) && serial("n") == n, "born: the same number")

        // A rename over another item: the moved one keeps its number, the replaced one's is gone.
        let newFile = try await cache.catalog.item(ItemIdentifier("n"), maximumAge: .zero)
        let replaced = try await cache.catalog.item(ItemIdentifier("b"), maximumAge: .zero)
        _ = try await cache.move(newFile, to: .root, named: "b", mode: .replacing, replaced: replaced)
        #expect(serial("b") == n)

        // Deleted at the provider, made again under its name: another item, another number.
        base.remove("gone")
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        base.putFile("gone", .bytes(Array("again".utf8)))
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let again = serial("gone")
        #expect(!Set([1, d, a, b, gone, n]).contains(again))

        // A restart on the same store shows the same numbers; a new item gets a number no item has.
        await cache.shutdown()
        let reopened = try fixture.makeCache()
        func reopenedSerial(_ path: String) -> UInt64 { reopened.catalog.serialNumber(of: ItemIdentifier(path)) }
        #expect(reopenedSerial("e") == d && reopenedSerial("e/a") == a && reopenedSerial("b") == n)
        #expect(reopenedSerial("gone") == again && reopenedSerial("") == 1)
        base.putFile("later", .bytes([]))
        _ = try await reopened.catalog.children(of: .root, maximumAge: .zero)
        #expect(!Set([1, d, a, n, again]).contains(reopenedSerial("later")))
        await reopened.shutdown()
    }

    /// RENAME_EXCHANGE at a provider whose identifiers are paths: the catalog forgets both
    /// subtrees, but listed again each item shows the number it had, at its new place.
    @Test func anExchangeSwapsTheNumbersWithTheItems() async throws {
        let fixture = try WriteFixture()
        let base = fixture.provider.base
        base.addDirectory("x")
        base.putFile("x/inner", .bytes([1]))
        base.putFile("y", .bytes([2]))
        let cache = try fixture.makeCache()
        func serial(_ path: String) -> UInt64 { cache.catalog.serialNumber(of: ItemIdentifier(path)) }
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        _ = try await cache.catalog.children(of: ItemIdentifier("x"), maximumAge: .zero)
        let (x, inner, y) = (serial("x"), serial("x/inner"), serial("y"))
        let directory = try await cache.catalog.item(ItemIdentifier("x"), maximumAge: .zero)
        let file = try await cache.catalog.item(ItemIdentifier("y"), maximumAge: .zero)
        _ = try await cache.move(directory, to: .root, named: "y", mode: .exchange, replaced: file)
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        _ = try await cache.catalog.children(of: ItemIdentifier("y"), maximumAge: .zero)
        #expect(try await cache.catalog.item(ItemIdentifier("y"), maximumAge: .zero).kind == .directory)
        #expect(serial("y") == x && serial("y/inner") == inner && serial("x") == y)
        await cache.shutdown()
    }
}
