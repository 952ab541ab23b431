// Retries of WebDAV requests (D-452): the pure rule, and a provider behind a proxy that answers
// most requests with 503 (`WebDAVTestServer.Kind.busyProxy` in front of `rclone serve webdav`).

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite struct HTTPRetryTests {
    @Test func theRuleAsksAgainOnlyWhenTheServerDidNotAct() {
        let retry = HTTPRetry()
        let busy = HTTPRetry.Outcome.status(503, retryAfter: nil)
        #expect(retry.delay(after: 1, method: "PROPFIND", outcome: busy) == .milliseconds(100))
        #expect(retry.delay(after: 2, method: "MOVE", outcome: .status(502, retryAfter: nil)) == .milliseconds(300))
        #expect(retry.delay(after: 3, method: "GET", outcome: .status(504, retryAfter: nil)) == .milliseconds(900))
        #expect(retry.delay(after: 4, method: "GET", outcome: busy) == nil, "three retries, then the answer")
        #expect(retry.delay(after: 1, method: "GET", outcome: .status(429, retryAfter: "2")) == .seconds(2))
        #expect(retry.delay(after: 1, method: "GET", outcome: .status(503, retryAfter: "3600")) == .seconds(5))
        #expect(retry.delay(after: 2, method: "GET", outcome: .status(503, retryAfter: "0")) == .milliseconds(300))
        #expect(retry.delay(after: 1, method: "GET", outcome: .status(500, retryAfter: nil)) == nil)
        #expect(retry.delay(after: 1, method: "GET", outcome: .status(207, retryAfter: nil)) == nil)
        // No answer: the server may have acted; only idempotent methods are sent again.
        #expect(retry.delay(after: 1, method: "MOVE", outcome: .noAnswer) == nil)
        #expect(retry.delay(after: 1, method: "MKCOL", outcome: .noAnswer) == nil)
        #expect(retry.delay(after: 1, method: "PUT", outcome: .noAnswer) == .milliseconds(100))
        // Not connected: the server saw nothing; once more, soon.
        #expect(retry.delay(after: 1, method: "MKCOL", outcome: .notConnected) == .milliseconds(100))
        #expect(retry.delay(after: 2, method: "GET", outcome: .notConnected) == nil)
        #expect(retry.delay(after: 1, method: "GET", outcome: .other) == nil)
        #expect(HTTPRetry.never.delay(after: 1, method: "GET", outcome: busy) == nil)
    }

    /// Listing, reading and writing through a server that is busy for the first two copies of
    /// each request.
    @Test func aBusyServerIsAskedAgainAndEveryOperationSucceeds() async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-busy")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        let big = pattern(count: 1 << 20, seed: 5)
        try write(served + "/big.bin", big)
        let upstream = try WebDAVTestServer(root: served, kind: .rclone(user: nil, password: nil))
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(
            root: scratch + "/proxy", kind: .busyProxy(upstream: upstream.url, passEvery: 3))
        defer { proxy.stop() }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        let provider = WebDAVProvider(configuration: configuration)
        let top = try await provider.children(of: .root)
        #expect(top.map(\.name) == ["big.bin"])
        let file = try #require(top.first)
        let stream = try await provider.fetchContents(
            of: file.identifier, version: file.contentVersion, range: 0..<Int64(big.count))
        #expect(try await readAll(stream) == big ? true : false)
        let local = scratch + "/new.txt"
        try write(local, Array("written through a busy server\n".utf8))
        let made = try await provider.upload(
            from: local, to: .create(name: "new.txt", in: .root), permissions: nil, modificationTime: nil)
        #expect(made.name == "new.txt")
        #expect(
            FileManager.default.contents(atPath: served + "/new.txt") == Data("written through a busy server\n".utf8))
        #expect(provider.requestsRetried >= 6, "\(provider.requestsRetried)")

        // The same server without retries: the first busy answer is the answer.
        configuration.retry = .never
        await expectCode(.unreachable) { try await WebDAVProvider(configuration: configuration).children(of: .root) }
    }

    /// A server busy for good: the answer after the retries, no sooner than their backoffs.
    @Test func aServerThatStaysBusyFailsAfterItsRetries() async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-busy")
        defer { removeTreeWithinFileSystem(scratch) }
        mkdir(scratch + "/served", 0o755)
        let upstream = try WebDAVTestServer(root: scratch + "/served", kind: .rclone(user: nil, password: nil))
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(
            root: scratch + "/proxy", kind: .busyProxy(upstream: upstream.url, passEvery: 0))
        defer { proxy.stop() }
        let provider = WebDAVProvider(configuration: WebDAVConfiguration(location: try WebDAVLocation(proxy.url)))
        let started = ContinuousClock.now
        await expectCode(.unreachable) { try await provider.children(of: .root) }
        let elapsed = ContinuousClock.now - started
        #expect(provider.requestsRetried == 3)
        #expect(elapsed >= .milliseconds(1300), "the backoffs are 0.1, 0.3 and 0.9 s: \(elapsed)")
    }
}
