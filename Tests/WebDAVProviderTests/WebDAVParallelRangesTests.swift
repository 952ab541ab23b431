// Several ranges of a large file at once (issue 26; D-513): rclone and Apache behind the tampering
// proxy, which logs each GET's Range and counts the GETs it answers at once. A fetch longer than
// the checksum limit and one part is ranged GETs of consecutive parts (each answered 0.2 s late,
// so that those sent together are seen together), up to `parallelRanges` at once, its bytes exact
// and in order; a fetch the checksum limit covers stays one GET; a file replaced mid-read is
// `.versionChanged` at a part boundary after only the old version's bytes; a server that ignores
// Range (Python's http.server) answers the first part with the whole file, which is then the one
// GET of the fetch.

import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite(.enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVParallelRangesTests {
    static let part: Int64 = 256 << 10
    static let width = 3
    /// 24 parts, more than the checksum limit (4 MiB).
    static let large = pattern(count: 6 << 20, seed: 61)

    /// `kind` behind the tampering proxy, serving `large.bin`, and a provider over the proxy.
    func withServer(
        _ kind: WebDAVTestServer.Kind,
        _ body: (String, WebDAVTestServer, WebDAVProvider) async throws -> Void
    ) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-ranges")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        try write(served + "/large.bin", Self.large)
        let upstream = try WebDAVTestServer(root: served, kind: kind)
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        configuration.parallelRanges = Self.width
        configuration.rangePartSize = Self.part
        configuration.stallTimeout = .seconds(60)
        try await body(served, proxy, WebDAVProvider(configuration: configuration))
    }

    /// The Range headers of the GETs logged (`bytes=first-last`), in order.
    func ranges(_ log: [String]) -> [String] {
        log.compactMap { line in
            line.split(separator: " ").first { $0.hasPrefix("range=") }.map { String($0.dropFirst(6)) }
        }
    }

    func header(_ range: Range<Int64>) -> String { "bytes=\(range.lowerBound)-\(range.upperBound - 1)" }

    @Test(arguments: DAVServer.allCases) func aLargeFetchIsRangedGetsOfItsPartsSeveralAtOnce(
        on server: DAVServer
    ) async throws {
        try await withServer(server.kind) { _, proxy, provider in
            let item = try await provider.item(for: ItemIdentifier("large.bin"))
            try proxy.tamper(.slowGets)
            let all: Range<Int64> = 0..<Int64(Self.large.count)
            let stream = try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: all)
            #expect(try await readAll(stream) == Self.large)
            let parts = stride(from: Int64(0), to: all.upperBound, by: Int(Self.part)).map {
                header($0..<($0 + Self.part))
            }
            let asked = ranges(proxy.requestLog())
            #expect(asked.sorted() == parts.sorted(), "\(asked)")
            #expect(asked.first == parts.first, "the first part is asked for first")
            let most = proxy.mostConcurrentGets()
            #expect(most >= 2 && most <= Self.width, "\(most) GETs at once")

            // A fetch the checksum limit covers is one GET, as before (D-495 verifies its answer).
            let seen = asked.count
            let small: Range<Int64> = 1000..<(1000 + (1 << 20))
            let one = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: small)
            #expect(try await readAll(one) == Array(Self.large[Int(small.lowerBound)..<Int(small.upperBound)]))
            #expect(Array(ranges(proxy.requestLog()).dropFirst(seen)) == [header(small)])
        }
    }

    @Test(arguments: DAVServer.allCases) func aFileReplacedMidReadIsVersionChangedAfterOnlyItsOldBytes(
        on server: DAVServer
    ) async throws {
        try await withServer(server.kind) { served, _, provider in
            let item = try await provider.item(for: ItemIdentifier("large.bin"))
            let stream = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<Int64(Self.large.count))
            defer { stream.close() }
            var received: [UInt8] = []
            while received.count < Int(Self.part), let chunk = try await stream.next(maximumLength: 65536) {
                received += chunk
            }
            #expect(received.count == Int(Self.part))
            // Replaced by a rename (what the server has open keeps its bytes), dated later.
            let replacement = pattern(count: Self.large.count, seed: 62)
            try write(served + "/new.bin", replacement)
            var times = [timespec(tv_sec: time(nil) + 10, tv_nsec: 0), timespec(tv_sec: time(nil) + 10, tv_nsec: 0)]
            #expect(utimensat(AT_FDCWD, served + "/new.bin", &times, 0) == 0)
            #expect(rename(served + "/new.bin", served + "/large.bin") == 0)
            await expectCode(.versionChanged) {
                while let chunk = try await stream.next(maximumLength: 65536) { received += chunk }
            }
            // Parts fetched before the change came whole; nothing of the new version was handed over.
            #expect(received.count % Int(Self.part) == 0 && received.count < Self.large.count, "\(received.count)")
            #expect(received == Array(Self.large.prefix(received.count)))
        }
    }

    @Test func aServerThatIgnoresRangeAnswersTheFirstPartWithTheWholeFetch() async throws {
        try await withServer(.pythonStatic) { served, proxy, provider in
            var info = stat()
            #expect(stat(served + "/large.bin", &info) == 0)
            let version = ContentVersion("lm:\(info.st_mtim.tv_sec);s\(info.st_size)")
            let range: Range<Int64> = 1_000_000..<Int64(Self.large.count)
            let stream = try await provider.fetchContents(
                of: ItemIdentifier("large.bin"), version: version, range: range)
            #expect(try await readAll(stream) == Array(Self.large[1_000_000...]))
            // The first part was asked for; its 200 carried the whole file, so no other GET was made.
            #expect(ranges(proxy.requestLog()) == [header(range.lowerBound..<(range.lowerBound + Self.part))])
        }
    }
}
