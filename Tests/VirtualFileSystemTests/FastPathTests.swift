import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

/// What a fast-path answer was: nil (declined: the async path must answer), a value, or an error code.
private enum Answer<T: Equatable>: Equatable {
    case declined, value(T), error(FileSystemError.Code)
    init(_ result: Result<T, FileSystemError>?) {
        switch result {
        case nil: self = .declined
        case .success(let value)?: self = .value(value)
        case .failure(let error)?: self = .error(error.code)
        }
    }
}

/// The answers given on the FUSE thread (docs/ARCHITECTURE.md, "Fast path") agree with the async
/// methods, are given only within the same TTLs, and never ask the provider.
@Suite("Fast path: answers without waiting")
struct FastPathTests {
    @Test("lookup and getattr answer from the cache within their TTLs, and decline after them")
    func metadataWithinTTL() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .bytes(Array("hello".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        func lookup(_ parent: InodeNumber, _ name: String) -> Answer<Entry> {
            Answer(fileSystem.lookupNow(parent: parent, name: name, context: .kernel))
        }
        func attributes(_ inode: InodeNumber) -> Answer<NodeAttributes> {
            Answer(fileSystem.getAttributesNow(inode, context: .kernel))
        }
        // Nothing listed yet: the fast path cannot know, so it declines.
        #expect(lookup(.root, "d") == .declined)
        let directory = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        let file = try await fileSystem.lookup(parent: directory.inode, name: "f", context: .kernel)
        let calls = fixture.provider.counters

        #expect(lookup(directory.inode, "f") == .value(file))
        #expect(attributes(file.inode) == .value(file.attributes))

        // A name missing from a fresh listing is ENOENT at once; once the listing is older than
        // missRefreshInterval (500 ms), the async path (which re-lists) must answer.
        #expect(lookup(directory.inode, "nope") == .error(.notFound))
        fixture.clock.advance(by: .milliseconds(600))
        #expect(lookup(directory.inode, "nope") == .declined)

        // getattr trusts an item for attributeTTL (1 s), lookup a listing for directoryTTL (5 s).
        fixture.clock.advance(by: .milliseconds(500))
        #expect(attributes(file.inode) == .declined)
        #expect(lookup(directory.inode, "f") == .value(file))
        fixture.clock.advance(by: .seconds(4))
        #expect(lookup(directory.inode, "f") == .declined)
        #expect(fixture.provider.counters.itemCalls == calls.itemCalls)
        #expect(fixture.provider.counters.childrenCalls == calls.childrenCalls)
    }

    @Test("invalid names are refused as the async path refuses them (one core, D-512); unknown nodes are left to it")
    func refusesInvalidNamesAsTheAsyncPath() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        _ = try await listAll(fileSystem, .root)
        #expect(fileSystem.lookupNow(parent: .root, name: "f", context: .kernel) != nil)
        for (name, code) in [
            ("", FileSystemError.Code.invalidArgument), (".", .invalidArgument), ("..", .invalidArgument),
            ("a/b", .invalidArgument), (String(repeating: "x", count: 256), .nameTooLong),
        ] {
            guard case .failure(let immediate)? = fileSystem.lookupNow(parent: .root, name: name, context: .kernel)
            else {
                Issue.record("lookupNow did not refuse '\(name)'")
                continue
            }
            #expect(immediate.code == code, "\(name)")
            do {
                _ = try await fileSystem.lookup(parent: .root, name: name, context: .kernel)
                Issue.record("lookup did not refuse '\(name)'")
            } catch {
                #expect(error.code == code && error.message == immediate.message, "\(name)")
            }
        }
        #expect(fileSystem.lookupNow(parent: InodeNumber(999), name: "f", context: .kernel) == nil)
        #expect(fileSystem.getAttributesNow(InodeNumber(999), context: .kernel) == nil)
    }

    @Test("a read is answered at once only when every byte it needs is on disk")
    func readsOnlyPresentBytes() async throws {
        let fixture = try VFSFixture()
        let size: Int64 = 300_000
        let content = InMemoryContent.ramp(seed: 7, size: size)
        fixture.provider.putFile("big", content)
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "big", context: .kernel)
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        func readNow(_ offset: Int64, _ count: Int, handle: FileHandleID = opened.handle) -> Answer<[UInt8]> {
            Answer(
                fileSystem.readNow(file.inode, handle: handle, offset: offset, count: count, context: .kernel)
                    .map { $0.map(\.bytes) })
        }
        #expect(readNow(0, 4096) == .declined, "nothing is on disk before the first read")
        #expect(fixture.provider.counters.fetchCalls == 0, "the fast path never starts a download")
        let slow = try await fileSystem.read(
            file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        #expect(slow.bytes == content.slice(0..<4096))
        #expect(readNow(100, 1000) == .value(content.slice(100..<1100)))
        // The last bytes: the async read waits for them; then the fast path serves a short read.
        _ = try await fileSystem.read(file.inode, handle: opened.handle, offset: size - 10, count: 10, context: .kernel)
        #expect(readNow(size - 10, 100) == .value(content.slice((size - 10)..<size)))
        #expect(readNow(size, 100) == .value([]))
        // Refused as `read` refuses them (one core, D-512).
        #expect(readNow(0, 1, handle: FileHandleID(424_242)) == .error(.badHandle))
        #expect(readNow(-1, 1) == .error(.invalidArgument))
        await fileSystem.release(file.inode, handle: opened.handle)
    }
}
