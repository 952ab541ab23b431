import LocalProvider
import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The cache over a local source, where downloads are direct transfers.
@Suite("Direct transfers through the cache")
struct DirectTransferCacheTests {
    @Test("a local file read through the cache is byte-exact, and its holes stay holes")
    func exactAndSparse() async throws {
        let source = try TemporaryDirectory(prefix: "providerfs-direct-src")
        defer { source.remove() }
        let cacheDirectory = try TemporaryDirectory(prefix: "providerfs-direct-cache")
        defer { cacheDirectory.remove() }
        // 24 MiB: 3 MiB of data, a 16 MiB hole, 5 MiB of data.
        let size: Int64 = 24 << 20
        let fd = open(source.path + "/f", O_RDWR | O_CREAT, 0o600)
        #expect(ftruncate(fd, off_t(size)) == 0)
        let head = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 11 &+ 3) }
        let tail = (0..<(5 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 17 &+ 5) }
        _ = head.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        _ = tail.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(19 << 20)) }
        close(fd)
        let cache = try ProviderCache(
            provider: LocalDirectoryProvider(root: source.path), directory: cacheDirectory.path,
            store: InMemoryMetadataStore())
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        // A read in the middle of the tail first (reader first), then everything.
        let middle = try await entry.read(offset: 20 << 20, count: 4096)
        #expect(middle.bytes == Array(tail[(1 << 20)..<((1 << 20) + 4096)]))
        var whole: [UInt8] = []
        var offset: Int64 = 0
        while offset < size {
            let data = try await entry.read(offset: offset, count: 1 << 20)
            whole += data.bytes
            offset += Int64(data.count)
        }
        #expect(whole.count == Int(size))
        #expect(byteDifference(whole[0..<(3 << 20)], head) == nil)
        #expect(whole[(3 << 20)..<(19 << 20)].allSatisfy { $0 == 0 })
        #expect(byteDifference(whole[(19 << 20)...], tail) == nil)
        await entry.waitForDownloadForTesting()
        #expect(entry.isMaterialized)
        #expect(entry.allocatedBlocks * 512 < 10 << 20, "the 16 MiB hole stayed a hole")
        // What a FUSE reply sends: the same bytes, straight from a mapping of the cache file.
        let reply = try await entry.read(offset: (19 << 20) + 100, count: 1 << 20)
        guard case .file(_, let at, let owner) = reply.source, let mapped = owner as? any MappedFileRanges else {
            Issue.record("a cached range is a file range whose owner maps the file")
            return
        }
        let pointer = try #require(mapped.mappedBytes(at: at, count: reply.count))
        #expect(
            byteDifference(
                UnsafeRawBufferPointer(start: pointer, count: reply.count), tail[100..<(100 + (1 << 20))]) == nil)
        #expect(mapped.mappedBytes(at: size - 10, count: 20) == nil, "nothing past the end of the file")
        cache.content.unpin(entry)
        await cache.shutdown()
    }

    @Test("a full cache disk reads as ENOSPC (the cache's), not as a provider failure")
    func fullDiskIsNoSpace() async throws {
        guard rootTestsEnabled else { return }
        let source = try TemporaryDirectory(prefix: "providerfs-direct-src")
        defer { source.remove() }
        try source.write("big", [UInt8](repeating: 7, count: 4 << 20))
        let small = try TmpfsMount(size: "1m")
        let cache = try ProviderCache(
            provider: LocalDirectoryProvider(root: source.path), directory: small.path + "/cache",
            store: InMemoryMetadataStore())
        let item = try await cache.catalog.item(ItemIdentifier("big"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        do {
            _ = try await entry.read(offset: (4 << 20) - 4096, count: 4096)
            _ = try await entry.read(offset: 0, count: 4 << 20)
            Issue.record("4 MiB fitted in a 1 MiB cache")
        } catch {
            #expect(error.code == .noSpace, "\(error)")
        }
        cache.content.unpin(entry)
        await cache.shutdown()
    }
}
