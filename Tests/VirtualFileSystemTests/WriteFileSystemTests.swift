// Content writes through the file system's operations, without the kernel (issue 14): create,
// open with O_TRUNC / O_RDWR, write, read through a write handle, truncate, fsync, flush and
// release, what a reader that opened before sees, and EROFS when the mount is not writable, over
// an InMemoryProvider (its `upload` replaces with a check of the base version, creates exclusively).

import Foundation
import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// The bytes one read of `handle` returns (from memory or from the descriptor it names).
func readBytes(
    _ fs: ProviderFileSystem, _ inode: InodeNumber, _ handle: FileHandleID, count: Int = 1 << 20
)
    async throws -> [UInt8]
{
    let data = try await fs.read(inode, handle: handle, offset: 0, count: count, context: .kernel)
    switch data.source {
    case .memory(let buffer): return buffer.withUnsafeBytes { Array($0.prefix(data.count)) }
    case .file(let descriptor, let offset, _):
        var result = [UInt8](repeating: 0, count: data.count)
        let got = result.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, data.count, off_t(offset)) }
        return Array(result.prefix(max(0, got)))
    }
}

private func readFile(_ fs: ProviderFileSystem, _ inode: InodeNumber) async throws -> [UInt8] {
    let opened = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
    defer { Task { await fs.release(inode, handle: opened.handle) } }
    return try await readBytes(fs, inode, opened.handle)
}

private func waitForUpload(_ provider: InMemoryProvider, _ path: String, _ expected: [UInt8]) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < deadline {
        if provider.content(of: path)?.0 == .bytes(expected) { return true }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return false
}

@Suite struct WriteFileSystemTests {
    func makeFileSystem(_ fixture: VFSFixture, _ provider: InMemoryProvider) throws -> ProviderFileSystem {
        try fixture.makeFileSystem(provider: provider)
    }

    static func writable() -> FileSystemOptions {
        var options = VFSFixture.defaultOptions()
        options.writable = true
        return options
    }

    @Test func createWriteCloseReadBack() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        let fs = try makeFileSystem(fixture, provider)
        #expect(fs.isWritable)
        let (entry, opened) = try await fs.create(
            parent: .root, name: "new.txt", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY | O_CREAT),
            context: .kernel)
        let inode = entry.attributes.inode
        #expect(provider.content(of: "new.txt")?.0 == .bytes([]))
        #expect(
            try await fs.write(inode, handle: opened.handle, offset: 0, data: Array("hello".utf8), context: .kernel)
                == 5)
        #expect(try await fs.getAttributes(inode, context: .kernel).size == 5)
        try await fs.flush(inode, handle: opened.handle, context: .kernel)
        await fs.release(inode, handle: opened.handle)
        let back = try await readFile(fs, inode)
        #expect(
            back == Array("hello".utf8),
            "\(back) \(String(describing: fs.cache.catalog.knownItem(ItemIdentifier("new.txt")))) \(String(describing: fs.cache.writes.uploadRecord(of: ItemIdentifier("new.txt"))))"
        )
        #expect(await waitForUpload(provider, "new.txt", Array("hello".utf8)))
        // A second create of the name is EEXIST (the provider's `.create` is exclusive).
        await #expect(throws: FileSystemError.self) {
            _ = try await fs.create(
                parent: .root, name: "new.txt", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY),
                context: .kernel)
        }
        await fs.shutdown()
    }

    /// D-387: `writeNow` (the FUSE thread's write) is `write`'s twin: the same random writes into
    /// two files, one through `writeNow` wherever it answers, publish the same bytes and sizes;
    /// it declines past the first MiB, for a staging file published since its last change (a
    /// copy-back first), and for a handle that is not a writer.
    @Test func writeNowAgreesWithWrite() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        let fs = try makeFileSystem(fixture, provider)
        var random = SeededRandom(seed: SeededRandom.seedFromEnvironment())
        let flags = OpenFlags(rawValue: O_RDWR | O_CREAT)
        let (fastEntry, fast) = try await fs.create(
            parent: .root, name: "fast", permissions: 0o644, flags: flags, context: .kernel)
        let (slowEntry, slow) = try await fs.create(
            parent: .root, name: "slow", permissions: 0o644, flags: flags, context: .kernel)
        let (fastInode, slowInode) = (fastEntry.attributes.inode, slowEntry.attributes.inode)
        var answered = 0
        var declined = 0
        for step in 0..<200 {
            let offset = Int64(random.next() % (step % 20 == 19 ? 3 << 20 : 900 << 10))
            let data = (0..<Int(random.next() % 70_000)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            if step % 37 == 36 {
                // An fsync publishes by moving the staging file: the next write copies it back.
                try await fs.fsync(fastInode, handle: fast.handle, dataOnly: false, context: .kernel)
                try await fs.fsync(slowInode, handle: slow.handle, dataOnly: false, context: .kernel)
                #expect(
                    fs.writeNow(fastInode, handle: fast.handle, offset: 0, data: [1], context: .kernel) == nil,
                    "a published staging file is written after its copy-back, on the pool")
            }
            switch fs.writeNow(fastInode, handle: fast.handle, offset: offset, data: data, context: .kernel) {
            case .success(let count)?:
                #expect(count == data.count)
                #expect(offset + Int64(data.count) <= 1 << 20)
                answered += 1
            case .failure(let error)?:
                Issue.record("writeNow failed: \(error)")
            case nil:
                declined += 1
                _ = try await fs.write(fastInode, handle: fast.handle, offset: offset, data: data, context: .kernel)
            }
            _ = try await fs.write(slowInode, handle: slow.handle, offset: offset, data: data, context: .kernel)
            #expect(
                try await fs.getAttributes(fastInode, context: .kernel).size
                    == (try await fs.getAttributes(slowInode, context: .kernel).size))
        }
        #expect(answered > 0 && declined > 0, "answered \(answered), declined \(declined)")
        // A handle that is not open: EBADF, as `write` answers (one core, D-512).
        let unknown = fs.writeNow(fastInode, handle: FileHandleID(999_999), offset: 0, data: [1], context: .kernel)
        guard case .failure(let error)? = unknown else {
            Issue.record("writeNow of a handle that is not open: \(String(describing: unknown))")
            return
        }
        #expect(error.code == .badHandle)
        // releaseNow: declined while the release would publish; after the flush that published,
        // it releases here what `release` would (nothing left to publish).
        #expect(fs.releaseNow(fastInode, handle: fast.handle) == nil, "the last close publishes: async")
        for (inode, opened) in [(fastInode, fast), (slowInode, slow)] {
            try await fs.flush(inode, handle: opened.handle, context: .kernel)
        }
        if case .success? = fs.releaseNow(fastInode, handle: fast.handle) {
        } else {
            Issue.record("releaseNow declined a release that publishes nothing")
        }
        await fs.release(slowInode, handle: slow.handle)
        #expect(fs.cache.writes.writerCount(of: ItemIdentifier("fast")) == 0)
        #expect(fs.cache.writes.staging(of: ItemIdentifier("fast")) == nil)
        let fastBytes = try await readBytes(
            fs, fastInode, try await fs.open(fastInode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel).handle,
            count: 4 << 20)
        let slowBytes = try await readBytes(
            fs, slowInode, try await fs.open(slowInode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel).handle,
            count: 4 << 20)
        #expect(fastBytes.count == slowBytes.count && fastBytes == slowBytes)
        await fs.shutdown()
    }

    @Test func allocateExtendsWithZerosOrKeepsTheSize() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes(Array("abc".utf8)))
        let fs = try makeFileSystem(fixture, provider)
        let inode = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        let writer = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDWR), context: .kernel)
        try await fs.allocate(inode, handle: writer.handle, offset: 2, length: 6, keepSize: false, context: .kernel)
        #expect(try await fs.getAttributes(inode, context: .kernel).size == 8)
        try await fs.allocate(
            inode, handle: writer.handle, offset: 0, length: 1 << 20, keepSize: true, context: .kernel)
        #expect(try await fs.getAttributes(inode, context: .kernel).size == 8, "keep-size reserves space only")
        for (offset, length) in [(Int64(-1), Int64(1)), (0, 0), (0, -5)] {
            await #expect(throws: FileSystemError.self) {
                try await fs.allocate(
                    inode, handle: writer.handle, offset: offset, length: length, keepSize: false, context: .kernel)
            }
        }
        try await fs.flush(inode, handle: writer.handle, context: .kernel)
        await fs.release(inode, handle: writer.handle)
        #expect(try await readFile(fs, inode) == Array("abc".utf8) + [UInt8](repeating: 0, count: 5))
        #expect(await waitForUpload(provider, "f", Array("abc".utf8) + [UInt8](repeating: 0, count: 5)))
        // A handle open for reading only: EBADF, as fallocate(2) answers.
        let reader = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        do {
            try await fs.allocate(inode, handle: reader.handle, offset: 0, length: 1, keepSize: false, context: .kernel)
            Issue.record("fallocate through a read handle was allowed")
        } catch {
            #expect(error.errno == .badFileDescriptor)
        }
        await fs.release(inode, handle: reader.handle)
        await fs.shutdown()
    }

    @Test func truncatingOpenReadWriteHandleAndReaderBefore() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes(Array("0123456789".utf8)))
        let fs = try makeFileSystem(fixture, provider)
        let inode = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        let reader = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        #expect(try await readBytes(fs, inode, reader.handle, count: 2) == Array("01".utf8))
        let writer = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDWR | O_TRUNC), context: .kernel)
        #expect(writer.directIO)
        _ = try await fs.write(inode, handle: writer.handle, offset: 0, data: Array("abc".utf8), context: .kernel)
        #expect(try await readBytes(fs, inode, writer.handle) == Array("abc".utf8))
        // Not published yet: a new open reads the old version.
        #expect(try await readFile(fs, inode) == Array("0123456789".utf8))
        try await fs.fsync(inode, handle: writer.handle, dataOnly: false, context: .kernel)
        #expect(try await readFile(fs, inode) == Array("abc".utf8))
        // ftruncate through the handle, then the last close publishes.
        _ = try await fs.setAttributes(
            inode, changes: AttributeChanges(size: 5), handle: writer.handle, context: .kernel)
        try await fs.flush(inode, handle: writer.handle, context: .kernel)
        await fs.release(inode, handle: writer.handle)
        #expect(try await readFile(fs, inode) == Array("abc".utf8) + [0, 0])
        // The reader that opened first still reads the first version to its end.
        #expect(try await readBytes(fs, inode, reader.handle) == Array("0123456789".utf8))
        await fs.release(inode, handle: reader.handle)
        #expect(
            await waitForUpload(provider, "f", Array("abc".utf8) + [0, 0]),
            "\(String(describing: provider.content(of: "f"))) \(String(describing: fs.cache.writes.uploadRecord(of: ItemIdentifier("f"))))"
        )
        // truncate(2) with no handle publishes at once.
        _ = try await fs.setAttributes(inode, changes: AttributeChanges(size: 1), handle: nil, context: .kernel)
        #expect(try await readFile(fs, inode) == Array("a".utf8))
        #expect(await waitForUpload(provider, "f", Array("a".utf8)))
        let deadline = ContinuousClock.now + .seconds(10)
        while try await xattr(fs, inode, ProviderFileSystem.AttributeName.state) != "materialized",
            ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(try await xattr(fs, inode, ProviderFileSystem.AttributeName.state) == "materialized")
        await fs.shutdown()
    }

    /// A flush from another process (a child closing an inherited copy of the descriptor at exec
    /// or in posix_spawn) publishes nothing: the opener may be half-way through its writes
    /// (D-364). The opener's flush publishes, and so does the release.
    @Test func onlyTheOpenersFlushPublishes() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes(Array("old".utf8)))
        let fs = try makeFileSystem(fixture, provider)
        let inode = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        let ours = RequestContext(threadID: getpid(), uid: getuid(), gid: getgid())
        // Process 1 (init) stands for a child that inherited the descriptor.
        let other = RequestContext(threadID: 1, uid: getuid(), gid: getgid())
        let writer = try await fs.open(inode, flags: OpenFlags(rawValue: O_WRONLY), context: ours)
        _ = try await fs.write(inode, handle: writer.handle, offset: 0, data: Array("ha".utf8), context: ours)
        try await fs.flush(inode, handle: writer.handle, context: other)
        #expect(try await readFile(fs, inode) == Array("old".utf8), "a flush by another process published")
        try await fs.flush(inode, handle: writer.handle, context: ours)
        #expect(try await readFile(fs, inode) == Array("had".utf8))
        _ = try await fs.write(inode, handle: writer.handle, offset: 3, data: Array("!".utf8), context: ours)
        try await fs.flush(inode, handle: writer.handle, context: other)
        #expect(try await readFile(fs, inode) == Array("had".utf8))
        // The last close was another process's: the release publishes.
        await fs.release(inode, handle: writer.handle)
        #expect(try await readFile(fs, inode) == Array("had!".utf8))
        #expect(await waitForUpload(provider, "f", Array("had!".utf8)))
        await fs.shutdown()
    }

    @Test func notWritableIsEROFS() async throws {
        let fixture = try VFSFixture()
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes(Array("x".utf8)))
        let fs = try makeFileSystem(fixture, provider)
        let inode = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        do {
            _ = try await fs.open(inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
            Issue.record("open for writing succeeded")
        } catch {
            #expect(error.errno == .readOnlyFileSystem)
        }
        await fs.shutdown()
    }
}
