// A full cache disk through the file system's operations, without the kernel (issue 23, D-390):
// the errno a writer gets at each step, and the bytes the provider gets once space is back. The
// cache's free space is injected (`ProviderCache.init(freeSpace:)`).

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

@Suite struct FullDiskFileSystemTests {
    /// write → ENOSPC at the write that does not fit (EIO before for what followed); fsync and
    /// close succeed and publish what was written before it; the provider gets exactly those
    /// bytes; once space is freed the next write goes through.
    @Test func aWriterGetsENOSPCAndKeepsWhatItWrote() async throws {
        var options = VFSFixture.defaultOptions()
        options.writable = true
        let fixture = try VFSFixture(options: options)
        let provider = InMemoryProvider()
        let reserve = options.cache.reservedSpace
        let free = Locked<Int64>(1 << 40)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: options.cache, freeSpace: { _ in free.withLock { $0 } })
        let fs = ProviderFileSystem(cache: cache, options: options)
        let (entry, opened) = try await fs.create(
            parent: .root, name: "f", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY | O_CREAT),
            context: .kernel)
        let inode = entry.attributes.inode
        let first = Array(repeating: UInt8(ascii: "a"), count: 4096)
        #expect(try await fs.write(inode, handle: opened.handle, offset: 0, data: first, context: .kernel) == 4096)
        free.withLock { $0 = reserve + 100 }
        for write in [false, true] {
            // `write` and, on the FUSE thread, `writeNow`: the same errno.
            let second = Array(repeating: UInt8(ascii: "b"), count: 4096)
            var errno: Errno?
            if write {
                do {
                    _ = try await fs.write(inode, handle: opened.handle, offset: 4096, data: second, context: .kernel)
                } catch {
                    errno = error.errno
                }
            } else if case .failure(let error)? = fs.writeNow(
                inode, handle: opened.handle, offset: 4096, data: second, context: .kernel)
            {
                errno = error.errno
            }
            #expect(errno == .noSpace)
        }
        try await fs.fsync(inode, handle: opened.handle, dataOnly: false, context: .kernel)
        try await fs.flush(inode, handle: opened.handle, context: .kernel)
        await fs.release(inode, handle: opened.handle)
        #expect(try await fs.getAttributes(inode, context: .kernel).size == 4096)
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("f")))
        #expect(provider.content(of: "f")?.0 == .bytes(first))
        // Space freed: the next writer writes at once.
        free.withLock { $0 = 1 << 40 }
        let again = try await fs.open(inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        #expect(try await fs.write(inode, handle: again.handle, offset: 4096, data: [1], context: .kernel) == 1)
        try await fs.flush(inode, handle: again.handle, context: .kernel)
        await fs.release(inode, handle: again.handle)
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("f")))
        #expect(provider.content(of: "f")?.0 == .bytes(first + [1]))
        await fs.shutdown()
    }
}
