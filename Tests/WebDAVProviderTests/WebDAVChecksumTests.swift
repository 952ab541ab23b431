// Checksums a server states, verified (issue 26; D-495). Neither rclone nor Apache's mod_dav sends
// RFC 9530 digests or OC-Checksum (checked: rclone 1.60 sends none even when asked), so a proxy
// in front of `rclone serve webdav` adds them, true or false, and can flip a byte of the body on
// the way (`WebDAVTestServer.Tampering`); Apache with `ContentDigest On` is a real server that
// does state one: Content-MD5 of the whole file, on a 206 of a part too. Through a ProviderCache:
// a true checksum serves the bytes, a false one fails the read with `.corrupt` (EIO, docs/
// SEMANTICS.md) with nothing present and the failure recorded (what `status` shows), and a read
// once the server is right again gets every byte; a part is verified by its Content-Digest,
// never against a whole file's checksum; a file above the limit is neither asked for checksums
// nor held for one (its first bytes come while the proxy still holds the rest of the body).

import CryptoSupport
import ProviderCache
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing

@testable import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

/// A server (rclone, or Apache with `ContentDigest On`) behind the tampering proxy, a provider
/// whose checksum limit is 1 MiB, and a cache over it. Stopped by PID and removed at the end.
private final class ChecksumServer {
    let scratch: String
    let upstream: WebDAVTestServer
    let proxy: WebDAVTestServer
    private(set) var provider: WebDAVProvider
    private(set) var cache: ProviderCache
    /// The cache's metadata in `<cache>/metadata.sqlite`, as the daemon keeps it (else in memory).
    let persistent: Bool
    let options: CacheOptions

    static let small = pattern(count: 300 << 10, seed: 41)
    static let big = pattern(count: 3 << 20, seed: 42)
    static let limit: Int64 = 1 << 20

    init(apache: Bool = false, backgroundCompletion: Bool = true, persistent: Bool = false) throws {
        self.persistent = persistent
        scratch = try makeTemporaryDirectory(prefix: "webdav-checksum")
        let served = scratch + "/served"
        mkdir(served, 0o755)
        try write(served + "/small.bin", Self.small)
        try write(served + "/big.bin", Self.big)
        do {
            upstream =
                apache
                ? try WebDAVTestServer(root: served, kind: .apache, apacheDirectives: "ContentDigest On")
                : try WebDAVTestServer(root: served, kind: .rclone(user: nil, password: nil))
            proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: upstream.url))
        } catch {
            removeTreeWithinFileSystem(scratch)
            throw error
        }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        configuration.requestTimeout = .seconds(10)
        configuration.stallTimeout = .seconds(70)
        configuration.checksumLimit = Self.limit
        provider = WebDAVProvider(configuration: configuration)
        var options = CacheOptions()
        options.chunkSize = 64 << 10
        options.firstChunkSize = 64 << 10
        options.readAheadWindow = 64 << 10
        options.backgroundCompletion = backgroundCompletion
        options.retryDelay = .zero
        options.listingRefreshAhead = nil
        options.stallTimeout = .seconds(70)
        self.options = options
        cache = try Self.makeCache(provider, scratch + "/cache", options, persistent: persistent)
    }

    private static func makeCache(
        _ provider: WebDAVProvider, _ directory: String, _ options: CacheOptions, persistent: Bool
    ) throws -> ProviderCache {
        mkdir(directory, 0o700)
        let store: any MetadataStore =
            persistent ? try SQLiteMetadataStore(path: directory + "/metadata.sqlite") : InMemoryMetadataStore()
        return try ProviderCache(provider: provider, directory: directory, store: store, options: options)
    }

    /// What a daemon restart makes of it: the cache shut down, then a new provider and a new
    /// cache over the same cache directory (and, `persistent`, the same metadata database).
    func restart() async throws {
        await cache.shutdown()
        provider = WebDAVProvider(configuration: provider.configuration)
        cache = try Self.makeCache(provider, scratch + "/cache", options, persistent: persistent)
    }

    func stop() async {
        await cache.shutdown()
        proxy.stop()
        upstream.stop()
        removeTreeWithinFileSystem(scratch)
    }

    func item(_ name: String) async throws -> ProviderItem {
        try await cache.catalog.item(ItemIdentifier(name), maximumAge: .zero)
    }

    /// Reads `count` bytes at `offset` through the cache: the bytes or the cache's error, and the
    /// entry's state after it.
    func read(
        _ item: ProviderItem, offset: Int64, count: Int
    ) async throws -> (
        Result<[UInt8], CacheError>, ContentProgress, ByteRanges
    ) {
        let entry = try await cache.pinContent(of: item)
        defer { cache.content.unpin(entry) }
        let result: Result<[UInt8], CacheError>
        do {
            result = .success(bytes(of: try await entry.read(offset: offset, count: count)))
        } catch {
            result = .failure(error)
        }
        return (result, entry.progress, entry.presentRanges)
    }

    /// The GETs the proxy passed on since the last call.
    func gets(after seen: inout Int) -> [String] {
        let log = proxy.requestLog().filter { $0.hasPrefix("GET ") }
        defer { seen = log.count }
        return Array(log.dropFirst(seen))
    }
}

@Suite(.enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVChecksumTests {
    fileprivate func withServer(
        apache: Bool = false, backgroundCompletion: Bool = true, persistent: Bool = false,
        _ body: (ChecksumServer) async throws -> Void
    ) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let server = try ChecksumServer(
            apache: apache, backgroundCompletion: backgroundCompletion, persistent: persistent)
        do {
            try await body(server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    /// The checksum each mode states for the small file fetched whole.
    static func expected(_ mode: WebDAVTestServer.Tampering) -> (header: String, checksum: ContentChecksum) {
        switch mode {
        case .ocChecksum: ("oc-checksum", ContentChecksum(.sha1, digest: Digest.hash(.sha1, ChecksumServer.small)))
        case .reprDigest:
            ("repr-digest", ContentChecksum(.sha512, digest: Digest.hash(.sha512, ChecksumServer.small)))
        default: ("content-digest", ContentChecksum(.sha256, digest: Digest.hash(.sha256, ChecksumServer.small)))
        }
    }

    /// A true checksum: the provider's stream of the whole small file is `.checksummed` with it
    /// (asked for with Want-Content-Digest / Want-Repr-Digest), and the cache serves the bytes.
    @Test(arguments: [WebDAVTestServer.Tampering.contentDigest, .ocChecksum, .reprDigest])
    func aTrueChecksumVerifiesTheWholeSmallFile(mode: WebDAVTestServer.Tampering) async throws {
        try await withServer { server in
            try server.proxy.tamper(mode)
            let item = try await server.item("small.bin")
            var seen = 0
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            let (header, checksum) = Self.expected(mode)
            #expect(stream.capabilities.contains(.checksummed))
            #expect(stream.checksumAlgorithm == checksum.algorithm)
            #expect((stream as? WebDAVContentStream)?.checksumHeader == header)
            var received: [UInt8] = []
            while let chunk = try await stream.next(maximumLength: 1 << 20) { received += chunk }
            stream.close()
            #expect(received == ChecksumServer.small)
            #expect(stream.checksum == checksum)
            let asked = server.gets(after: &seen)
            #expect(asked.count == 1 && asked[0].contains("want-content=sha-256=10"), "\(asked)")
            #expect(asked.first?.contains("want-repr=sha-256=10") == true, "\(asked)")

            let (result, progress, _) = try await server.read(item, offset: 0, count: Int(item.size))
            #expect((try? result.get()) == ChecksumServer.small)
            #expect(progress.lastError == nil)
        }
    }

    /// A false checksum (the true one, a byte flipped on the way): the read fails with
    /// `.corrupt` (EIO), no byte of the file is present, the failure is recorded with where it
    /// happened (what `status` and `user.providerfs.error` show); once the server answers right
    /// again, a new read gets every byte.
    @Test(arguments: [
        WebDAVTestServer.Tampering.contentDigestFlipped, .ocChecksumFlipped, .reprDigestFlipped,
    ])
    func aFalseChecksumIsEIOWithNothingPresent(mode: WebDAVTestServer.Tampering) async throws {
        try await withServer { server in
            let item = try await server.item("small.bin")
            try server.proxy.tamper(mode)
            let (failed, progress, present) = try await server.read(item, offset: 0, count: 1000)
            if case .failure(let error) = failed {
                #expect(error.code == .corrupt, "\(error)")
            } else {
                Issue.record("a read of bytes that do not match their checksum succeeded")
            }
            #expect(present.isEmpty, "\(present)")
            #expect(progress.present == 0)
            #expect(progress.lastError?.code == .corrupt)
            #expect(progress.lastError?.offset == 0)
            #expect(progress.lastError?.message.contains("do not match their checksum") == true)

            try server.proxy.tamper(.none)
            let (result, after, _) = try await server.read(item, offset: 0, count: Int(item.size))
            #expect((try? result.get()) == ChecksumServer.small)
            #expect(after.present == item.size)
        }
    }

    /// Ranges only: a part of a large file is verified by its Content-Digest (a flipped byte:
    /// `.corrupt`), and never against a whole file's checksum (a true OC-Checksum on a part: the
    /// bytes served, not a false mismatch); checksums that are not of their grammars are ignored.
    @Test func aPartIsVerifiedByItsContentDigestOnly() async throws {
        try await withServer(backgroundCompletion: false) { server in
            let item = try await server.item("big.bin")
            var seen = 0
            let offset: Int64 = 1_500_000
            try server.proxy.tamper(.contentDigestFlipped)
            let (failed, _, present) = try await server.read(item, offset: offset, count: 1000)
            if case .failure(let error) = failed {
                #expect(error.code == .corrupt, "\(error)")
            } else {
                Issue.record("a part whose bytes do not match their Content-Digest was served")
            }
            #expect(present.isEmpty)
            let asked = server.gets(after: &seen)
            #expect(asked.first?.contains("range=bytes=1500000-") == true, "\(asked)")
            #expect(asked.first?.contains("want-content=sha-256=10") == true, "\(asked)")
            #expect(asked.first?.contains("want-repr=-") == true, "\(asked)")

            try server.proxy.tamper(.contentDigest)
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: offset..<(offset + 1000))
            #expect(stream.capabilities.contains(.checksummed))
            stream.close()
            let (good, _, _) = try await server.read(item, offset: offset, count: 1000)
            #expect((try? good.get()) == Array(ChecksumServer.big[Int(offset)..<Int(offset) + 1000]))

            for (index, mode) in [WebDAVTestServer.Tampering.ocChecksum, .reprDigest, .malformedChecksums].enumerated()
            {
                try server.proxy.tamper(mode)
                let at = offset + 200_000 * Int64(index + 1)
                let part = try await server.provider.fetchContents(
                    of: item.identifier, version: item.contentVersion, range: at..<(at + 1000))
                #expect(!part.capabilities.contains(.checksummed), "\(mode)")
                part.close()
                let (result, _, _) = try await server.read(item, offset: at, count: 1000)
                #expect((try? result.get()) == Array(ChecksumServer.big[Int(at)..<Int(at) + 1000]), "\(mode)")
            }
        }
    }

    /// The limit: the small file with a false OC-Checksum is refused, while the large one (3 MiB,
    /// above the 1 MiB limit) is fetched without asking for checksums and its first bytes are
    /// served while the proxy still holds all of its body after the first 64 KiB: time to first
    /// byte is never a whole-file fetch. (Its false checksum is not verified: docs/WEBDAV.md.)
    @Test func aFileAboveTheLimitIsNotHeldForItsChecksum() async throws {
        try await withServer { server in
            let small = try await server.item("small.bin")
            let big = try await server.item("big.bin")
            var seen = 0
            try server.proxy.tamper(.ocChecksumFlipped)
            let (refused, _, _) = try await server.read(small, offset: 0, count: 1000)
            #expect(code(refused) == .corrupt)
            _ = server.gets(after: &seen)

            try server.proxy.tamper(.ocChecksumFlippedHeld)
            // The read returns while the proxy holds all of the body after its first 64 KiB (it
            // does until the mode changes below): it did not wait for the rest.
            let (head, _, _) = try await server.read(big, offset: 0, count: 1000)
            #expect((try? head.get()) == Array(ChecksumServer.big[0..<1000]))
            let asked = server.gets(after: &seen)
            #expect(asked.first?.contains("range=bytes=0-3145727 want-content=- want-repr=-") == true, "\(asked)")
            try server.proxy.tamper(.none)
            let (rest, _, _) = try await server.read(big, offset: 3_000_000, count: 1000)
            #expect((try? rest.get()) == Array(ChecksumServer.big[3_000_000..<3_001_000]))
        }
    }

    /// Apache with `ContentDigest On` states Content-MD5 of the whole file, on a 206 of a part
    /// too (measured): a fetch of the whole small file is verified with it (a byte flipped on the
    /// way: `.corrupt`; then the true bytes), a part is served without it.
    @Test func apacheContentMD5VerifiesWholeFiles() async throws {
        try await withServer(apache: true) { server in
            let item = try await server.item("small.bin")
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            #expect(stream.capabilities.contains(.checksummed))
            #expect((stream as? WebDAVContentStream)?.checksumHeader == "content-md5")
            var received: [UInt8] = []
            while let chunk = try await stream.next(maximumLength: 1 << 20) { received += chunk }
            stream.close()
            #expect(stream.checksum == ContentChecksum(.md5, digest: Digest.hash(.md5, ChecksumServer.small)))

            let part = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 100..<1100)
            #expect(!part.capabilities.contains(.checksummed))
            var partBytes: [UInt8] = []
            while let chunk = try await part.next(maximumLength: 1 << 20) { partBytes += chunk }
            part.close()
            #expect(partBytes == Array(ChecksumServer.small[100..<1100]))

            try server.proxy.tamper(.flipByte)
            let (failed, progress, present) = try await server.read(item, offset: 0, count: 1000)
            #expect(code(failed) == .corrupt)
            #expect(present.isEmpty)
            #expect(progress.lastError?.code == .corrupt)
            try server.proxy.tamper(.none)
            let (result, _, _) = try await server.read(item, offset: 0, count: Int(item.size))
            #expect((try? result.get()) == ChecksumServer.small)
        }
    }

    /// `oc:checksums` from a PROPFIND (D-519): a whole-file fetch whose GET states no checksum is
    /// verified against the file's listed one. A wrong one is `.corrupt` (EIO, as a GET header's)
    /// with nothing present; listed again right, the bytes are served. Not used: for a part, for
    /// a file above the limit, or when the GET states its own (the header wins).
    @Test func listedChecksumsVerifyAWholeFileWhoseGetStatesNone() async throws {
        try await withServer { server in
            try server.proxy.tamper(.ocChecksumsWrong)
            let item = try await server.item("small.bin")
            let (failed, progress, present) = try await server.read(item, offset: 0, count: 1000)
            #expect(code(failed) == .corrupt, "\(failed)")
            #expect(present.isEmpty, "\(present)")
            #expect(progress.present == 0)
            #expect(progress.lastError?.code == .corrupt)
            #expect(progress.lastError?.message.contains("do not match their checksum") == true)

            let part = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 1000..<2000)
            #expect(!part.capabilities.contains(.checksummed))
            #expect(try await readAll(part) == Array(ChecksumServer.small[1000..<2000]))
            let big = try await server.item("big.bin")
            let above = try await server.provider.fetchContents(
                of: big.identifier, version: big.contentVersion, range: 0..<big.size)
            #expect(!above.capabilities.contains(.checksummed))
            above.close()
            try server.proxy.tamper(.ocChecksumsWrongWithContentDigest)
            let stated = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            #expect((stated as? WebDAVContentStream)?.checksumHeader == "content-digest")
            #expect(try await readAll(stated) == ChecksumServer.small)

            try server.proxy.tamper(.ocChecksums)
            let relisted = try await server.item("small.bin")
            #expect(relisted.contentVersion == item.contentVersion)
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            #expect((stream as? WebDAVContentStream)?.checksumHeader == "oc:checksums")
            #expect(stream.checksumAlgorithm == .sha1)
            #expect(try await readAll(stream) == ChecksumServer.small)
            #expect(stream.checksum == ContentChecksum(.sha1, digest: Digest.hash(.sha1, ChecksumServer.small)))
            let (result, after, _) = try await server.read(relisted, offset: 0, count: Int(item.size))
            #expect((try? result.get()) == ChecksumServer.small)
            #expect(after.present == item.size)
        }
    }

    /// D-526: listed checksums are stored with the item in the catalog's database, so after a
    /// restart (a new provider and cache over the same cache directory, nothing listed again) a
    /// whole-file GET that states no checksum is still verified by them: a byte flipped on the way
    /// is EIO (`.corrupt`) with nothing cached; once the bytes are right they are served. A
    /// listing of another version (none listed) drops them from the database.
    @Test func listedChecksumsOutliveARestart() async throws {
        try await withServer(persistent: true) { server in
            try server.proxy.tamper(.ocChecksums)
            let listed = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            let item = try #require(listed.first { $0.name == "small.bin" })
            #expect(item.statedChecksums?.checksums.contains { $0.algorithm == .sha1 } == true)

            try await server.restart()
            try server.proxy.tamper(.flipByte)
            let seen = server.proxy.requestLog().count
            let stored = try await server.cache.catalog.item(item.identifier, maximumAge: nil)
            #expect(stored.statedChecksums == item.statedChecksums)
            let (failed, progress, present) = try await server.read(stored, offset: 0, count: 1000)
            #expect(code(failed) == .corrupt, "\(failed)")
            #expect(present.isEmpty, "\(present)")
            #expect(progress.present == 0)
            #expect(progress.lastError?.message.contains("do not match their checksum") == true)
            // Verified by what was stored: nothing was listed or looked up again.
            let log = server.proxy.requestLog().dropFirst(seen)
            #expect(!log.contains { $0.hasPrefix("PROPFIND ") }, "\(Array(log))")
            #expect(log.contains { $0.hasPrefix("GET /small.bin ") }, "\(Array(log))")

            try server.proxy.tamper(.none)
            let (result, after, _) = try await server.read(stored, offset: 0, count: Int(stored.size))
            #expect((try? result.get()) == ChecksumServer.small)
            #expect(after.present == stored.size)

            // Another version, listed with none: none stored, none after the next restart.
            try write(server.scratch + "/served/small.bin", ChecksumServer.small + [1, 2, 3])
            let relisted = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            #expect(relisted.first { $0.name == "small.bin" }?.statedChecksums == nil)
            try await server.restart()
            #expect(try await server.cache.catalog.item(item.identifier, maximumAge: nil).statedChecksums == nil)
        }
    }

    /// Listed checksums that are not of the grammar, of unknown algorithms, of the wrong length,
    /// over 1 KiB, beside garbage or in another namespace (all of them false) are ignored: the
    /// listing works, and the file is served unverified.
    @Test func hostileListedChecksumsAreIgnored() async throws {
        try await withServer { server in
            try server.proxy.tamper(.ocChecksumsHostile)
            let listed = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            let item = try #require(listed.first { $0.name == "small.bin" })
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            #expect(!stream.capabilities.contains(.checksummed))
            stream.close()
            let (result, progress, _) = try await server.read(item, offset: 0, count: Int(item.size))
            #expect((try? result.get()) == ChecksumServer.small)
            #expect(progress.lastError == nil)
        }
    }
}

private func code(_ result: Result<[UInt8], CacheError>) -> CacheError.Code? {
    if case .failure(let error) = result { return error.code }
    return nil
}
