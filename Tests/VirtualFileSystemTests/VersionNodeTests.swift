// One kernel node per version on a writable mount (D-435), through the file system's operations
// with a stand-in for the kernel (`setKernelInvalidation`): a read handle caches on a node that
// holds its version alone; a writer of that node gets ESTALE and the name a new node with the same
// serial number; the old node shows its version to its readers; without a kernel nothing changes.

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

@Suite struct VersionNodeTests {
    static func writable() -> FileSystemOptions {
        var options = VFSFixture.defaultOptions()
        options.writable = true
        return options
    }

    static let readOnly = OpenFlags(rawValue: O_RDONLY)
    static let truncating = OpenFlags(rawValue: O_WRONLY | O_TRUNC)

    /// Reads the whole file through a handle of its own, so that it is all in the cache.
    func download(_ fs: ProviderFileSystem, _ inode: InodeNumber) async throws {
        let handle = try await fs.open(inode, flags: Self.readOnly, context: .kernel).handle
        _ = try await readBytes(fs, inode, handle)
        await fs.release(inode, handle: handle)
    }

    /// The error code of `operation`, nil when it succeeded.
    func failure<T>(_ operation: () async throws(FileSystemError) -> T) async -> FileSystemError.Code? {
        do throws(FileSystemError) {
            _ = try await operation()
            return nil
        } catch {
            return error.code
        }
    }

    @Test func aWriterOfACachingNodeGetsANewNodeAndTheReaderKeepsItsVersion() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        let old = Array("the old version".utf8)
        provider.putFile("f", .bytes(old))
        let fs = try fixture.makeFileSystem(provider: provider)
        let told = Locked<[KernelInvalidation]>([])
        fs.setKernelInvalidation { batch in told.withLock { $0 += batch } }
        defer { fs.setKernelInvalidation(nil) }

        let first = try await fs.lookup(parent: .root, name: "f", context: .kernel)
        let node = first.attributes.inode
        // Not all here yet: direct I/O, which follows a download faster than the page cache.
        let cold = try await fs.open(node, flags: Self.readOnly, context: .kernel)
        #expect(cold.directIO)
        _ = try await readBytes(fs, node, cold.handle)
        await fs.release(node, handle: cold.handle)
        let reader = try await fs.open(node, flags: Self.readOnly, context: .kernel)
        #expect(!reader.directIO && reader.keepCache, "a reader of a node of its version alone uses the page cache")
        #expect(try await readBytes(fs, node, reader.handle) == old)

        // A writer of that node: ESTALE (the kernel looks the name up again), and the kernel is
        // told to forget the name.
        #expect(
            await failure { () throws(FileSystemError) in
                try await fs.open(node, flags: Self.truncating, context: .kernel)
            } == .stale)
        #expect(told.withLock { $0.contains(.entry(parent: .root, name: "f")) })
        let second = try await fs.lookup(parent: .root, name: "f", context: .kernel)
        let newNode = second.attributes.inode
        #expect(newNode != node)
        #expect(second.attributes.serialNumber == first.attributes.serialNumber, "one st_ino for every version")
        let writer = try await fs.open(newNode, flags: Self.truncating, context: .kernel)
        #expect(writer.directIO)
        let new = Array("new".utf8)
        #expect(try await fs.write(newNode, handle: writer.handle, offset: 0, data: new, context: .kernel) == 3)
        try await fs.flush(newNode, handle: writer.handle, context: .kernel)
        await fs.release(newNode, handle: writer.handle)

        // The old node shows its readers' version (its size, no name left) and reads it.
        let oldShown = try await fs.getAttributes(node, context: .kernel)
        #expect(oldShown.size == Int64(old.count))
        #expect(oldShown.linkCount == 0)
        #expect(oldShown.serialNumber == first.attributes.serialNumber)
        #expect(try await readBytes(fs, node, reader.handle) == old)
        #expect(try await fs.getAttributes(newNode, context: .kernel).size == 3)

        // The writer's node held a writer's pages: a reader of the new version gets a node of
        // its own, which it caches.
        #expect(
            await failure { () throws(FileSystemError) in
                try await fs.open(newNode, flags: Self.readOnly, context: .kernel)
            } == .stale)
        let third = try await fs.lookup(parent: .root, name: "f", context: .kernel)
        #expect(third.attributes.inode != newNode && third.attributes.inode != node)
        let newReader = try await fs.open(third.attributes.inode, flags: Self.readOnly, context: .kernel)
        #expect(!newReader.directIO && newReader.keepCache, "a published version is all in the cache")
        #expect(try await readBytes(fs, third.attributes.inode, newReader.handle) == new)
        // Another reader of the same version shares that node's pages.
        let again = try await fs.open(third.attributes.inode, flags: Self.readOnly, context: .kernel)
        #expect(!again.directIO && again.keepCache)
        await fs.release(third.attributes.inode, handle: again.handle)
        await fs.release(third.attributes.inode, handle: newReader.handle)
        await fs.release(node, handle: reader.handle)
        await fs.shutdown()
    }

    /// A link(2) or truncate(2) of a caching node: ESTALE the same way; a writer already open
    /// makes new readers of the node uncached instead (its pages may be the writer's).
    @Test func linksTruncatesAndReadersBesideAWriter() async throws {
        let fixture = try VFSFixture(options: Self.writable())
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes(Array("0123456789".utf8)))
        let fs = try fixture.makeFileSystem(provider: provider)
        fs.setKernelInvalidation { _ in }
        defer { fs.setKernelInvalidation(nil) }
        let node = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        try await download(fs, node)
        let reader = try await fs.open(node, flags: Self.readOnly, context: .kernel)
        #expect(!reader.directIO)
        var size = AttributeChanges()
        size.size = 4
        #expect(
            await failure { () throws(FileSystemError) in
                try await fs.setAttributes(node, changes: size, handle: nil, context: .kernel)
            } == .stale)
        // Retired: a link of the old node is ESTALE too (the kernel retries with the name's node).
        #expect(
            await failure { () throws(FileSystemError) in
                try await fs.makeHardLink(node, newParent: .root, newName: "g", context: .kernel)
            } != nil)
        let current = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
        #expect(current != node)
        #expect(try await fs.setAttributes(current, changes: size, handle: nil, context: .kernel).size == 4)
        #expect(try await readBytes(fs, node, reader.handle) == Array("0123456789".utf8))

        // A writer open on the current node: a reader beside it is direct I/O, on the same node.
        let writer = try await fs.open(current, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        let beside = try await fs.open(current, flags: Self.readOnly, context: .kernel)
        #expect(beside.directIO)
        await fs.release(current, handle: beside.handle)
        await fs.release(current, handle: writer.handle)
        await fs.release(node, handle: reader.handle)
        await fs.shutdown()
    }

    /// Without a kernel to retry (a caller of the API), or with `versionNodes` off, every handle
    /// of a writable mount is direct I/O on the node it has (D-363).
    @Test func withoutAKernelOrWithVersionNodesOffHandlesAreDirect() async throws {
        for kernel in [false, true] {
            var options = Self.writable()
            options.versionNodes = !kernel
            let fixture = try VFSFixture(options: options)
            let provider = InMemoryProvider()
            provider.putFile("f", .bytes(Array("abc".utf8)))
            let fs = try fixture.makeFileSystem(provider: provider)
            if kernel { fs.setKernelInvalidation { _ in } }
            let node = try await fs.lookup(parent: .root, name: "f", context: .kernel).attributes.inode
            try await download(fs, node)
            let reader = try await fs.open(node, flags: Self.readOnly, context: .kernel)
            #expect(reader.directIO)
            let writer = try await fs.open(node, flags: Self.truncating, context: .kernel)
            await fs.release(node, handle: writer.handle)
            await fs.release(node, handle: reader.handle)
            if kernel { fs.setKernelInvalidation(nil) }
            await fs.shutdown()
        }
    }
}
