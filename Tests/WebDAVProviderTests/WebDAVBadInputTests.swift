// A WebDAV server that answers badly (issue 26, "Bad input"; D-466): `rclone serve webdav` behind
// a proxy that spoils its answers on cue (`WebDAVTestServer.Kind.tampering`): an ETag that
// changes between the PROPFIND and the GET or on every request, an HTML page for a PROPFIND,
// hrefs outside the collection, a Content-Length that lies, a connection closed mid-body,
// oversized and garbage headers. Each is checked at the provider (the error code) and, where the
// catalog or a reader is concerned, through a ProviderCache (its state, the bytes, the code a
// reader gets: `.stale` is ESTALE, `.downloadFailed` and `.io` EIO, docs/SEMANTICS.md's table).

import ProviderCache
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

/// rclone serving a small tree, the tampering proxy in front of it, a provider and a cache over
/// the proxy. Everything is stopped by PID and removed when the test ends.
private final class SpoiledServer {
    let scratch: String
    let served: String
    let upstream: WebDAVTestServer
    let proxy: WebDAVTestServer
    let provider: WebDAVProvider
    let cache: ProviderCache

    static let big = pattern(count: 3 << 20, seed: 23)

    init() throws {
        scratch = try makeTemporaryDirectory(prefix: "webdav-bad")
        served = scratch + "/served"
        mkdir(served, 0o755)
        mkdir(served + "/docs", 0o755)
        mkdir(served + "/docs/nested", 0o755)
        try write(served + "/hello.txt", Array("hello, webdav\n".utf8))
        try write(served + "/docs/note.txt", Array("a note\n".utf8))
        try write(served + "/big.bin", Self.big)
        do {
            upstream = try WebDAVTestServer(root: served, kind: .rclone(user: nil, password: nil))
            proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: upstream.url))
        } catch {
            removeTreeWithinFileSystem(scratch)
            throw error
        }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        configuration.requestTimeout = .seconds(10)
        configuration.stallTimeout = .seconds(10)
        provider = WebDAVProvider(configuration: configuration)
        var options = CacheOptions()
        options.chunkSize = 64 << 10
        options.firstChunkSize = 64 << 10
        options.readAheadWindow = 64 << 10
        options.backgroundCompletion = false
        options.retryDelay = .zero
        options.listingRefreshAhead = nil
        cache = try ProviderCache(
            provider: provider, directory: scratch + "/cache", store: InMemoryMetadataStore(), options: options)
    }

    func stop() async {
        await cache.shutdown()
        proxy.stop()
        upstream.stop()
        removeTreeWithinFileSystem(scratch)
    }

    /// The catalog's names and versions of the root's children, from what it holds (no provider call).
    func catalogState() -> [String: String] {
        var state: [String: String] = [:]
        for (name, identifier) in cache.catalog.cachedChildNames(of: .root) {
            state[name] = cache.catalog.knownItem(identifier).map { "\($0.kind) \($0.size) \($0.contentVersion)" }
        }
        return state
    }

    /// The bytes `count` at `offset` of `item` read through the cache, or the cache's error.
    func read(_ item: ProviderItem, offset: Int64, count: Int) async -> Result<[UInt8], CacheError> {
        do {
            let entry = try await cache.pinContent(of: item)
            defer { cache.content.unpin(entry) }
            return .success(bytes(of: try await entry.read(offset: offset, count: count)))
        } catch {
            return .failure(error)
        }
    }
}

/// The bytes of a cache read (the WebDAV provider suites').
func bytes(of data: ReadData) -> [UInt8] {
    switch data.source {
    case .memory(let buffer):
        return buffer.withUnsafeBytes { Array($0.prefix(data.count)) }
    case .file(let descriptor, let offset, _):
        var result = [UInt8](repeating: 0, count: data.count)
        let got = result.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, data.count, off_t(offset)) }
        return Array(result.prefix(max(0, got)))
    }
}

/// What a failed read gave: its code (nil: it did not fail).
private func code(_ result: Result<[UInt8], CacheError>) -> CacheError.Code? {
    if case .failure(let error) = result { return error.code }
    return nil
}

@Suite(.enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVBadInputTests {
    fileprivate func withSpoiledServer(_ body: (SpoiledServer) async throws -> Void) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let server = try SpoiledServer()
        do {
            try await body(server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    /// The file changed between the PROPFIND and the GET, at a server that ignores If-Match: the
    /// GET's ETag is not the one listed, so the fetch is refused before any byte (`.versionChanged`)
    /// and a reader that already has bytes of the version gets ESTALE for the rest, never bytes of
    /// another version. Once the server agrees with itself again, a new read gets every byte.
    @Test func anETagChangedBeforeTheGetNeverMixesVersions() async throws {
        try await withSpoiledServer { server in
            let item = try await server.cache.catalog.item(ItemIdentifier("big.bin"), maximumAge: .zero)
            let head = await server.read(item, offset: 0, count: 1000)
            #expect((try? head.get()) == Array(SpoiledServer.big[0..<1000]))
            try server.proxy.tamper(.etagChangedOnGet)
            await expectCode(.versionChanged) {
                try await server.provider.fetchContents(
                    of: item.identifier, version: item.contentVersion, range: 2_000_000..<2_001_000)
            }
            let later = await server.read(item, offset: 2_000_000, count: 1000)
            #expect(code(later) == .stale, "\(later)")
            try server.proxy.tamper(.none)
            let now = try await server.cache.catalog.item(item.identifier, maximumAge: .zero)
            let again = await server.read(now, offset: 2_000_000, count: 1000)
            #expect((try? again.get()) == Array(SpoiledServer.big[2_000_000..<2_001_000]))
        }
    }

    /// ETags that change on every request: every listing is a new version and every GET another
    /// one, so a read fails with ESTALE (once per open: no endless download loop), with the
    /// catalog still holding the file.
    @Test func anETagThatChangesOnEveryRequestIsStale() async throws {
        try await withSpoiledServer { server in
            try server.proxy.tamper(.etagPerRequest)
            let first = try await server.provider.item(for: ItemIdentifier("hello.txt"))
            let second = try await server.provider.item(for: ItemIdentifier("hello.txt"))
            #expect(first.contentVersion != second.contentVersion)
            await expectCode(.versionChanged) {
                try await server.provider.fetchContents(
                    of: second.identifier, version: second.contentVersion, range: 0..<5)
            }
            let item = try await server.cache.catalog.item(ItemIdentifier("hello.txt"), maximumAge: .zero)
            let read = await server.read(item, offset: 0, count: 5)
            #expect(code(read) == .stale, "\(read)")
            #expect(server.cache.catalog.knownItem(item.identifier)?.size == 14)
        }
    }

    /// A PROPFIND answered with something else than a whole 207 (an HTML page with 200, a body
    /// cut short, a header too large, a garbage Content-Length): EIO, with a message that says
    /// what came, and the catalog keeps what it had — no child removed, no version changed.
    @Test(arguments: [
        WebDAVTestServer.Tampering.htmlPropfind, .closedMidBody, .hugeHeader, .garbageContentLength,
        .onlyForeignHrefs,
    ])
    func aListingThatIsNotAMultiStatusChangesNothing(_ tampering: WebDAVTestServer.Tampering) async throws {
        try await withSpoiledServer { server in
            let listed = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            #expect(Set(listed.map(\.name)) == ["hello.txt", "docs", "big.bin"])
            let before = server.catalogState()
            try server.proxy.tamper(tampering)
            do {
                _ = try await server.provider.children(of: .root)
                Issue.record("the listing was taken")
            } catch let error as ProviderError {
                #expect(error.code == .io && error.errno == EIO, "\(error)")
                if tampering == .htmlPropfind {
                    #expect(error.message.contains("200 (text/html), not a 207 Multi-Status"), "\(error.message)")
                }
            }
            let error = await #expect(throws: CacheError.self) {
                _ = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            }
            #expect(error?.code == .downloadFailed, "\(String(describing: error))")
            await #expect(throws: CacheError.self) {
                _ = try await server.cache.catalog.item(ItemIdentifier("hello.txt"), maximumAge: .zero)
            }
            #expect(server.catalogState() == before)
            try server.proxy.tamper(.none)
            let again = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            #expect(Set(again.map(\.name)) == ["hello.txt", "docs", "big.bin"])
        }
    }

    /// A 207 with more responses than the server's: hrefs with `..` (plain and percent-encoded),
    /// an encoded "/", another host, a path deeper down. None becomes an item (no identifier
    /// leaves the collection); a Depth 0 answer whose only response names another place is
    /// refused instead of being taken for the item.
    @Test func hrefsOutsideTheCollectionAreNeverItems() async throws {
        try await withSpoiledServer { server in
            try server.proxy.tamper(.foreignHrefs)
            let top = try await server.provider.children(of: .root)
            #expect(Set(top.map(\.identifier.rawValue)) == ["hello.txt", "docs", "big.bin"])
            let docs = try await server.provider.children(of: ItemIdentifier("docs"))
            #expect(Set(docs.map(\.identifier.rawValue)) == ["docs/note.txt", "docs/nested"])
            #expect(try await server.provider.item(for: ItemIdentifier("hello.txt")).size == 14)
            let listed = try await server.cache.catalog.children(of: .root, maximumAge: .zero)
            #expect(Set(listed.map(\.name)) == ["hello.txt", "docs", "big.bin"])
            for item in listed + docs {
                let path = server.cache.catalog.path(of: item.identifier) ?? ""
                #expect(!path.contains("..") && !path.contains("escaped"), "\(path)")
            }
            try server.proxy.tamper(.onlyForeignHrefs)
            await expectCode(.io) { try await server.provider.item(for: ItemIdentifier("hello.txt")) }
            await expectCode(.io) { try await server.provider.child(named: "hello.txt", of: .root) }
        }
    }

    /// GET answers whose length lies or that break off: EIO (`.io` at the provider), and the
    /// bytes handed over before are the file's own, never more than it has there.
    @Test(arguments: [
        WebDAVTestServer.Tampering.longerContentLength, .shorterContentLength, .closedMidBody, .hugeHeader,
        .garbageContentLength,
    ])
    func aGetWhoseLengthLiesIsEIO(_ tampering: WebDAVTestServer.Tampering) async throws {
        try await withSpoiledServer { server in
            let item = try await server.provider.item(for: ItemIdentifier("big.bin"))
            let cached = try await server.cache.catalog.item(item.identifier, maximumAge: .zero)
            try server.proxy.tamper(tampering)
            let range: Range<Int64> = 100_000..<1_100_000
            var received: [UInt8] = []
            var failure: (any Error)?
            do {
                let stream = try await server.provider.fetchContents(
                    of: item.identifier, version: item.contentVersion, range: range)
                defer { stream.close() }
                while let chunk = try await stream.next(maximumLength: 1 << 16) { received += chunk }
            } catch {
                failure = error
            }
            #expect((failure as? ProviderError)?.code == .io, "\(String(describing: failure))")
            #expect((failure as? ProviderError)?.errno == EIO)
            // A Content-Length longer than the body that was sent: every byte of the range came,
            // only the end lies (the stream fails after them).
            let complete = tampering == .longerContentLength
            #expect(
                complete ? received.count == range.count : received.count < range.count,
                "\(received.count) bytes, \(String(describing: failure))")
            #expect(received == Array(SpoiledServer.big[100_000..<100_000 + received.count]) ? true : false)
            // Through the cache: a reader of the file's end, whose last bytes never come, gets EIO
            // after the retry budget (each try asks for what is still missing, and only tries that
            // bring nothing count); the bytes it has are the file's.
            let wanted = (SpoiledServer.big.count - (256 << 10))..<SpoiledServer.big.count
            let read = await server.read(cached, offset: Int64(wanted.lowerBound), count: wanted.count)
            if complete {
                #expect(
                    (try? read.get()) == Array(SpoiledServer.big[wanted]), "\(code(read).map { "\($0)" } ?? "bytes")")
            } else {
                #expect(code(read) == .downloadFailed, "\(read)")
            }
            try server.proxy.tamper(.none)
            let again = await server.read(cached, offset: Int64(wanted.lowerBound), count: wanted.count)
            #expect((try? again.get()) == Array(SpoiledServer.big[wanted]))
        }
    }

    /// A GET answered 200 with a page that names no version (a login portal: HTML, no ETag, no
    /// Last-Modified) is EIO and never the file's bytes (D-515): the provider refuses it, and a
    /// reader through the cache gets EIO with nothing of the page cached; the file reads whole
    /// once the server answers again.
    @Test func aPageThatNamesNoVersionIsNeverTheFile() async throws {
        try await withSpoiledServer { server in
            let item = try await server.provider.item(for: ItemIdentifier("hello.txt"))
            let cached = try await server.cache.catalog.item(item.identifier, maximumAge: .zero)
            try server.proxy.tamper(.htmlGet)
            await expectCode(.io) {
                try await readAll(
                    try await server.provider.fetchContents(
                        of: item.identifier, version: item.contentVersion, range: 0..<14))
            }
            let read = await server.read(cached, offset: 0, count: 14)
            #expect(code(read) == .downloadFailed, "\(read)")
            #expect(server.cache.content.presentBytes(of: cached) == 0)
            try server.proxy.tamper(.none)
            let again = await server.read(cached, offset: 0, count: 14)
            #expect((try? again.get()) == Array("hello, webdav\n".utf8))
        }
    }

    // MARK: Redirects (D-514)

    /// A server that moves every read elsewhere (307, relative Location): listings, stats and
    /// ranged reads follow it, the GET reaching the new place with its Range, and the bytes are
    /// the file's.
    @Test func redirectedReadsAndListingsAreFollowed() async throws {
        try await withSpoiledServer { server in
            try server.proxy.tamper(.redirect)
            let children = try await server.provider.children(of: ItemIdentifier("docs"))
            #expect(Set(children.map(\.name)) == ["note.txt", "nested"])
            let item = try await server.provider.item(for: ItemIdentifier("big.bin"))
            #expect(item.size == Int64(SpoiledServer.big.count))
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 1_000_000..<1_300_000)
            #expect(try await readAll(stream) == Array(SpoiledServer.big[1_000_000..<1_300_000]))
            let gets = server.proxy.requestLog().filter { $0.contains("range=bytes=1000000-1299999") }
            #expect(gets.count == 2, "\(gets)")
            #expect(gets.contains { $0.hasPrefix("GET /big.bin range=") }, "\(gets)")
            #expect(gets.contains { $0.hasPrefix("GET /big.bin?moved range=") }, "\(gets)")
        }
    }

    /// A redirect that leads nowhere is EIO for a read and a listing, never a hang and never
    /// "unreachable" (which would serve cached items as if the server were down): a loop ends
    /// after 5 redirects; a Location of another protocol (here ftp) is not followed at all.
    @Test(arguments: [WebDAVTestServer.Tampering.redirectLoop, .redirectToFTP])
    func aRedirectThatLeadsNowhereIsEIO(_ tampering: WebDAVTestServer.Tampering) async throws {
        try await withSpoiledServer { server in
            let item = try await server.provider.item(for: ItemIdentifier("hello.txt"))
            try server.proxy.tamper(tampering)
            await expectCode(.io) {
                try await server.provider.fetchContents(of: item.identifier, version: item.contentVersion, range: 0..<5)
            }
            await expectCode(.io) { try await server.provider.children(of: ItemIdentifier("docs")) }
            await expectCode(.io) { try await server.provider.item(for: ItemIdentifier("hello.txt")) }
            let loops = server.proxy.requestLog().filter { $0.hasPrefix("GET /hello.txt ") }.count
            // The first GET and 5 redirects (a loop), or the first alone (another protocol).
            #expect(loops == (tampering == .redirectLoop ? 6 : 1))
            try server.proxy.tamper(.none)
            let stream = try await server.provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<5)
            #expect(try await readAll(stream) == Array("hello".utf8))
        }
    }

    /// An https server that sends its client to http is not followed: the request would go in
    /// the clear (D-514).
    @Test func anHTTPSServerRedirectingToHTTPIsRefused() async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-downgrade")
        defer { removeTreeWithinFileSystem(scratch) }
        let made = try ChildProcess.run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", scratch + "/key.pem", "-out",
                scratch + "/cert.pem",
            ])
        #expect(made.status == 0, "\(made.error)")
        mkdir(scratch + "/served", 0o755)
        try write(scratch + "/served/hello.txt", Array("hello, webdav\n".utf8))
        let upstream = try WebDAVTestServer(root: scratch + "/served", kind: .rclone(user: nil, password: nil))
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(
            root: scratch + "/proxy",
            kind: .tamperingTLS(upstream: upstream.url, certificate: scratch + "/cert.pem", key: scratch + "/key.pem"))
        defer { proxy.stop() }
        #expect(proxy.url.hasPrefix("https://"))
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        configuration.caFile = scratch + "/cert.pem"
        configuration.requestTimeout = .seconds(10)
        let provider = WebDAVProvider(configuration: configuration)
        let item = try await provider.item(for: ItemIdentifier("hello.txt"))
        try proxy.tamper(.redirectToHTTP)
        await expectCode(.io) { try await provider.item(for: ItemIdentifier("hello.txt")) }
        await expectCode(.io) {
            try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: 0..<5)
        }
    }
}
