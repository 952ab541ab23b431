// Big directories (D-470, D-471, D-485, D-486): a listing streams (readdir answers with the
// provider's first batches while it still lists), readdirplus gives each entry the attributes
// getattr gives, a plain listing makes no node per entry, and its end is answered before its
// save to the store.

import Foundation
import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import VirtualFileSystem

/// Opened once; every waiter before and after goes on.
final class ListingGate: Sendable {
    private let state = Locked<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
    /// How many batches the provider has handed over.
    let handedOver = Locked(0)

    func wait() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let open = state.withLock { state -> Bool in
                if !state.open { state.waiters.append(waiter) }
                return state.open
            }
            if open { waiter.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// A provider (over an InMemoryProvider) that lists in batches of `batchSize` and, after
/// `holdAfter` batches, waits for `gate` before handing over the rest.
struct BatchedListingProvider: Provider {
    let base: InMemoryProvider
    let batchSize: Int
    let holdAfter: Int
    let gate: ListingGate

    var capabilities: ProviderCapabilities { [.listingChangeTracking] }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem { try await base.item(for: identifier) }

    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await base.children(of: identifier)
    }

    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: version, range: range)
    }

    func trackedChildren(
        of directory: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (children: [ProviderItem], token: ListingChangeToken?) {
        let children = try await base.children(of: directory)
        var start = 0
        var batches = 0
        while start < children.count {
            if batches == holdAfter { await gate.wait() }
            let end = min(children.count, start + batchSize)
            batch(Array(children[start..<end]))
            gate.handedOver.withLock { $0 += 1 }
            batches += 1
            start = end
        }
        return (children, nil)
    }
}

/// An in-memory store whose saves of `slowAtLeast` items or more first call `probe` and then
/// take `delay`: a listing's save, made slow, and what the file system answers meanwhile.
final class SlowListingStore: MetadataStore {
    let base = InMemoryMetadataStore()
    let slowAtLeast: Int
    let delay: TimeInterval
    let probe = Locked<(@Sendable () -> Void)?>(nil)

    init(slowAtLeast: Int, delay: TimeInterval) {
        self.slowAtLeast = slowAtLeast
        self.delay = delay
    }

    func loadItems() throws -> [StoredItem] { try base.loadItems() }
    func saveItems(_ items: [StoredItem]) throws {
        if items.count >= slowAtLeast {
            probe.withLock { $0 }?()
            Thread.sleep(forTimeInterval: delay)
        }
        try base.saveItems(items)
    }
    func deleteItems(_ identifiers: [ItemIdentifier]) throws { try base.deleteItems(identifiers) }
    func loadContents() throws -> [ContentRecord] { try base.loadContents() }
    func saveContent(_ record: ContentRecord) throws { try base.saveContent(record) }
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        try base.deleteContent(identifier: identifier, version: version)
    }
    func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] { try base.loadAttributeOverrides() }
    func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        try base.saveAttributeOverride(override, for: identifier)
    }
}

@Suite struct BigDirectoryTests {
    @Test func aListingIsAnsweredBeforeTheProviderHasListedTheWholeDirectory() async throws {
        let fixture = try VFSFixture()
        for index in 0..<1000 { fixture.provider.putFile(String(format: "f%04d", index), .bytes([1])) }
        let gate = ListingGate()
        let provider = BatchedListingProvider(base: fixture.provider, batchSize: 100, holdAfter: 2, gate: gate)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let handle = try await fileSystem.openDirectory(.root, context: .kernel)
        // The provider handed over 200 of 1,000 children and waits: the first readdirs are
        // answered all the same.
        let first = try await withDeadline(.seconds(30), "readdir while the provider lists") {
            try await fileSystem.readDirectory(.root, handle: handle, after: 0, limit: 150, context: .kernel)
        }
        #expect(gate.handedOver.withLock { $0 } == 2, "the provider is still listing")
        #expect(first.count == 150)
        #expect(first.prefix(2).map(\.name) == [".", ".."])
        #expect(first.map(\.cookie) == Array(1...150))
        let next = try await withDeadline(.seconds(30), "readdir of the rest of what was handed over") {
            try await fileSystem.readDirectory(.root, handle: handle, after: 150, limit: 500, context: .kernel)
        }
        #expect(next.count == 52, "everything handed over so far: 2 dots and 200 children")
        // The rest once the provider goes on; every name once, each batch in name order.
        gate.open()
        var entries = first + next
        while true {
            let cookie = entries.last!.cookie
            let batch = try await withDeadline(.seconds(30), "readdir after the provider went on") {
                try await fileSystem.readDirectory(.root, handle: handle, after: cookie, limit: 300, context: .kernel)
            }
            if batch.isEmpty { break }
            entries += batch
        }
        fileSystem.releaseDirectory(.root, handle: handle)
        let names = entries.dropFirst(2).map(\.name)
        #expect(names.count == 1000)
        #expect(Set(names) == Set((0..<1000).map { String(format: "f%04d", $0) }))
        #expect(entries.map(\.cookie) == Array(1...UInt64(entries.count)))
        // The catalog has the listing now: st_ino shown in the listing is what a lookup shows.
        for entry in entries.dropFirst(2).prefix(20) {
            let looked = try await fileSystem.lookup(parent: .root, name: entry.name, context: .kernel)
            #expect(looked.attributes.serialNumber == entry.serialNumber)
        }
    }

    @Test func aListingInOneBatchIsAnsweredInNameOrder() async throws {
        let fixture = try VFSFixture()
        for name in ["delta", "alpha", "charlie", "bravo"] { fixture.provider.putFile(name, .bytes([1])) }
        let gate = ListingGate()
        gate.open()
        let provider = BatchedListingProvider(base: fixture.provider, batchSize: 100, holdAfter: 5, gate: gate)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        #expect(try await childNames(fileSystem, .root) == ["alpha", "bravo", "charlie", "delta"])
    }

    @Test func readdirplusGivesEachEntryTheAttributesGetattrGives() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.addDirectory("d/sub")
        fixture.provider.putFile("d/a.txt", .bytes(Array(repeating: 7, count: 1234)))
        fixture.provider.putFile("d/b.bin", .bytes([1, 2, 3]))
        fixture.provider.putSymbolicLink("d/link", target: "a.txt")
        let fileSystem = try fixture.makeFileSystem()
        #expect(fileSystem.givesDirectoryAttributes)
        let directory = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        let handle = try await fileSystem.openDirectory(directory.inode, context: .kernel)
        defer { fileSystem.releaseDirectory(directory.inode, handle: handle) }
        let entries = try await fileSystem.readDirectoryPlus(
            directory.inode, handle: handle, after: 0, limit: 100, context: .kernel)
        #expect(entries.map(\.entry.name) == [".", "..", "a.txt", "b.bin", "link", "sub"])
        // "." and ".." carry no lookup (the kernel takes no reference of them).
        #expect(entries.prefix(2).allSatisfy { $0.lookup == nil })
        for plus in entries.dropFirst(2) {
            let lookup = try #require(plus.lookup, "\(plus.entry.name) has its attributes")
            let attributes = try await fileSystem.getAttributes(lookup.inode, context: .kernel)
            #expect(lookup.attributes.serialNumber == attributes.serialNumber, "st_ino of \(plus.entry.name)")
            #expect(lookup.attributes.serialNumber == plus.entry.serialNumber, "d_ino of \(plus.entry.name)")
            #expect(lookup.attributes.type == attributes.type)
            #expect(lookup.attributes.type == plus.entry.type)
            #expect(lookup.attributes.permissions == attributes.permissions)
            #expect(lookup.attributes.size == attributes.size, "size of \(plus.entry.name)")
            let looked = try await fileSystem.lookup(parent: directory.inode, name: plus.entry.name, context: .kernel)
            #expect(looked.inode == lookup.inode)
            #expect(looked.attributes == lookup.attributes)
        }
        #expect(entries.first { $0.entry.name == "a.txt" }?.lookup?.attributes.size == 1234)
        // Each entry took a lookup reference, as a LOOKUP does: after the lookup above (two in
        // all), one forget leaves the node known, the second lets it go.
        let a = try #require(entries.first { $0.entry.name == "a.txt" }?.lookup?.inode)
        fileSystem.forget(a, count: 1)
        _ = try await fileSystem.getAttributes(a, context: .kernel)
        fileSystem.forget(a, count: 1)
        await #expect(throws: FileSystemError.self) { try await fileSystem.getAttributes(a, context: .kernel) }
    }

    @Test func aPlainListingMakesNoNodePerEntry() async throws {
        let fixture = try VFSFixture()
        for index in 0..<500 { fixture.provider.putFile(String(format: "f%04d", index), .bytes([1])) }
        let fileSystem = try fixture.makeFileSystem()
        let nodes = { fileSystem.state.withLock { $0.inodes.count } }
        let before = nodes()
        let entries = try await listAll(fileSystem, .root, limit: 100)
        #expect(entries.count == 502)
        #expect(nodes() == before, "no node for a listed entry the kernel was not given")
        // A lookup makes the node: the id the entry named (its serial number, free) and the
        // st_ino readdir gave as d_ino.
        let entry = try #require(entries.first { $0.name == "f0123" })
        let looked = try await fileSystem.lookup(parent: .root, name: entry.name, context: .kernel)
        #expect(nodes() == before + 1)
        #expect(looked.attributes.serialNumber == entry.serialNumber)
        #expect(looked.inode == entry.inode)
        // Listed again: the entry names the node it has now.
        let again = try await listAll(fileSystem, .root, limit: 100)
        #expect(again.first { $0.name == "f0123" }?.inode == looked.inode)
        #expect(nodes() == before + 1)
    }

    @Test func aListingsEndIsAnsweredBeforeItsSave() async throws {
        let fixture = try VFSFixture()
        let count = 1000
        for index in 0..<count { fixture.provider.putFile(String(format: "f%04d", index), .bytes([1])) }
        let store = SlowListingStore(slowAtLeast: count, delay: 0.3)
        let cache = try ProviderCache(
            provider: fixture.provider, directory: fixture.directory.path, store: store, clock: fixture.clock,
            options: fixture.options.cache)
        let fileSystem = ProviderFileSystem(cache: cache, options: fixture.options)
        let handle = try await fileSystem.openDirectory(.root, context: .kernel)
        // What a readdir past the last entry gets when the save begins: the end (an empty
        // answer), not "wait".
        let atSave = Locked<Result<[DirectoryEntry], FileSystemError>??>(nil)
        let saving = ListingGate()
        store.probe.withLock {
            $0 = {
                let now = fileSystem.readDirectoryNow(
                    .root, handle: handle, after: UInt64(count + 2), limit: 10, context: .kernel)
                atSave.withLock { $0 = .some(now) }
                saving.open()
            }
        }
        var entries: [DirectoryEntry] = []
        while true {
            let cookie = entries.last?.cookie ?? 0
            let batch = try await withDeadline(.seconds(30), "readdir") {
                try await fileSystem.readDirectory(.root, handle: handle, after: cookie, limit: 300, context: .kernel)
            }
            if batch.isEmpty { break }
            entries += batch
        }
        #expect(entries.count == count + 2)
        try await withDeadline(.seconds(30), "the listing's save") { await saving.wait() }
        fileSystem.releaseDirectory(.root, handle: handle)
        let seen = try #require(atSave.withLock { $0 }, "the listing was saved")
        let answer = try #require(seen, "a readdir at the end was answered while the listing was saved")
        #expect(try answer.get().isEmpty)
        await fileSystem.shutdown()
        let saved = try store.base.loadItems()
        #expect(saved.filter { $0.item.name.hasPrefix("f") }.count == count, "\(saved.count) saved")
    }

    @Test func shutdownSavesTheListingsWaitingForTheirSave() async throws {
        let fixture = try VFSFixture()
        for directory in ["a", "b"] {
            fixture.provider.addDirectory(directory)
            for index in 0..<300 { fixture.provider.putFile("\(directory)/f\(index)", .bytes([1])) }
        }
        let fileSystem = try fixture.makeFileSystem()
        for directory in ["a", "b"] {
            let entry = try await fileSystem.lookup(parent: .root, name: directory, context: .kernel)
            #expect(try await listAll(fileSystem, entry.inode, limit: 100).count == 302)
        }
        // Both listings wait for their save (a second after the first answer); shutdown saves
        // them now, and returns once they are in the store.
        await fileSystem.shutdown()
        let saved = try fixture.store.loadItems()
        #expect(saved.filter { $0.item.parent == ItemIdentifier("a") }.count == 300)
        #expect(saved.filter { $0.item.parent == ItemIdentifier("b") }.count == 300)
    }
}
