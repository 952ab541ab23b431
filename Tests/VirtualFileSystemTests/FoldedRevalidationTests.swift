import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

/// D-479: over a provider whose fetches check the version (`.versionCheckedFetch`, WebDAV), the
/// open of a file known within the attribute TTL with nothing cached is revalidated by its first
/// fetch: no item call. A change since the listing still gives the open the new version (never
/// ESTALE, never the old bytes), and everything else asks as D-208 does.
@Suite("An open's revalidation carried by its first fetch (D-479)")
struct FoldedRevalidationTests {
    private static let readOnly = OpenFlags(rawValue: 0)

    private func make(
        capabilities: ProviderCapabilities = InMemoryProvider.defaultCapabilities.union(.versionCheckedFetch)
    ) throws -> (VFSFixture, InMemoryProvider, ProviderFileSystem) {
        let fixture = try VFSFixture()
        let provider = InMemoryProvider(capabilities: capabilities)
        return (fixture, provider, try fixture.makeFileSystem(provider: provider))
    }

    private func readAll(
        _ fileSystem: ProviderFileSystem, _ inode: InodeNumber, _ handle: FileHandleID
    ) async throws -> [UInt8] {
        try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel).bytes
    }

    @Test("a file just looked up opens with one fetch, which the first read uses")
    func oneRequest() async throws {
        let (fixture, provider, fileSystem) = try make()
        provider.putFile("f", .bytes(Array("hello".utf8)))
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let before = provider.counters
        let opened = try await fileSystem.open(file.inode, flags: Self.readOnly, context: .kernel)
        #expect(provider.counters.itemCalls == before.itemCalls)
        #expect(provider.counters.childrenCalls == before.childrenCalls)
        #expect(provider.counters.fetchCalls == before.fetchCalls + 1)
        #expect(try await readAll(fileSystem, file.inode, opened.handle) == Array("hello".utf8))
        #expect(provider.counters.fetchCalls == before.fetchCalls + 1)
        await fileSystem.release(file.inode, handle: opened.handle)
        _ = fixture
    }

    @Test("a file changed since it was looked up: the open reads the new version")
    func changedSinceTheLookup() async throws {
        let (fixture, provider, fileSystem) = try make()
        provider.putFile("f", .bytes(Array("one".utf8)))
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        provider.putFile("f", .bytes(Array("two, longer".utf8)))
        let before = provider.counters
        let opened = try await fileSystem.open(file.inode, flags: Self.readOnly, context: .kernel)
        // The fetch of the old version was refused; the open then asked, as D-208's does.
        #expect(provider.counters.itemCalls == before.itemCalls + 1)
        #expect(try await readAll(fileSystem, file.inode, opened.handle) == Array("two, longer".utf8))
        await fileSystem.release(file.inode, handle: opened.handle)
        _ = fixture
    }

    @Test("bytes already cached, an item gone, a provider without the capability: the open asks (D-208)")
    func otherwiseTheOpenAsks() async throws {
        let (fixture, provider, fileSystem) = try make()
        provider.putFile("f", .bytes(Array("hello".utf8)))
        provider.putFile("g", .bytes(Array("gone".utf8)))
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let first = try await fileSystem.open(file.inode, flags: Self.readOnly, context: .kernel)
        #expect(try await readAll(fileSystem, file.inode, first.handle) == Array("hello".utf8))
        await fileSystem.release(file.inode, handle: first.handle)
        // Its bytes are here: only asking tells whether they are still the provider's.
        var before = provider.counters
        let second = try await fileSystem.open(file.inode, flags: Self.readOnly, context: .kernel)
        #expect(provider.counters.itemCalls == before.itemCalls + 1)
        #expect(provider.counters.fetchCalls == before.fetchCalls)
        await fileSystem.release(file.inode, handle: second.handle)

        // Removed since the lookup: the fetch fails, the open asks and gets ENOENT.
        let gone = try await fileSystem.lookup(parent: .root, name: "g", context: .kernel)
        provider.remove("g")
        let error = await #expect(throws: FileSystemError.self) {
            _ = try await fileSystem.open(gone.inode, flags: Self.readOnly, context: .kernel)
        }
        #expect(error?.code == .notFound)
        _ = fixture

        let (plainFixture, plain, plainFileSystem) = try make(capabilities: InMemoryProvider.defaultCapabilities)
        plain.putFile("f", .bytes(Array("hello".utf8)))
        let plainFile = try await plainFileSystem.lookup(parent: .root, name: "f", context: .kernel)
        before = plain.counters
        let opened = try await plainFileSystem.open(plainFile.inode, flags: Self.readOnly, context: .kernel)
        #expect(plain.counters.itemCalls == before.itemCalls + 1)
        #expect(plain.counters.fetchCalls == before.fetchCalls)
        await plainFileSystem.release(plainFile.inode, handle: opened.handle)
        _ = plainFixture
    }
}
