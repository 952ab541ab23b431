// Streamed PROPFIND listings (D-478): a Depth 1 answer is parsed as it arrives and its children
// are handed over in batches before its end has come (a proxy holds the end back), byte-exact
// against the served directory, over rclone and Apache; the parser takes a document of 100,000
// responses (a whole one of that size is refused by libxml2), keeps the feeding side waiting
// while its reader is behind, and still refuses a DTD that straddles two chunks.

import Dispatch
import Foundation
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
struct WebDAVStreamedListingTests {
    static let count = 2_000

    /// The name of file `index` in the big collection: some need percent-encoding.
    static func name(_ index: Int) -> String {
        switch index % 4 {
        case 0: String(format: "file-%05d.txt", index)
        case 1: String(format: "a b%%#?-%05d", index)
        case 2: String(format: "ü-%05d", index)
        default: String(format: "plain%05d", index)
        }
    }

    @Test(arguments: DAVServer.allCases) func aListingIsHandedOverBeforeItsAnswerEnds(on server: DAVServer) async throws
    {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-stream")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        mkdir(served + "/many", 0o755)
        mkdir(served + "/many/sub", 0o755)
        for index in 0..<Self.count {
            try write(served + "/many/" + Self.name(index), Array(repeating: UInt8(index % 251), count: index % 97))
        }
        // Nothing changes behind the server's back here: rclone may cache (see the kind).
        let upstream = try WebDAVTestServer(
            root: served, kind: server == .rclone ? .rcloneCachingListings : server.kind)
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        let provider = WebDAVProvider(configuration: WebDAVConfiguration(location: try WebDAVLocation(proxy.url)))

        try proxy.tamper(.holdPropfindEnd)
        let batches = Locked<[[ProviderItem]]>([])
        let finished = Locked(false)
        // Off the cooperative pool: under TSan on two cores, blocking tests have kept the pool
        // busy past the deadline below before the listing's task ever ran (CI, 2026-12-06).
        let listing = Task(executorPreference: BlockingTestExecutor.unbounded) {
            defer { finished.withLock { $0 = true } }
            return try await provider.trackedChildren(of: ItemIdentifier("many")) { batch in
                batches.withLock { $0.append(batch) }
            }
        }
        // Two batches (a reader answers once it has two, D-470) while the proxy holds the end (at
        // most 60 s from when it sends the rest; the listing then finishes, and the test fails).
        let deadline = ContinuousClock.now + .seconds(120)
        while batches.withLock({ $0.count }) < 2, !finished.withLock({ $0 }), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let early = batches.withLock { $0 }
        #expect(early.count >= 2, "batches before the end: \(early.map(\.count))")
        #expect(early.reduce(0) { $0 + $1.count } >= 512)
        #expect(!finished.withLock { $0 }, "the listing ended while its answer's end was held")
        try proxy.tamper(.none)
        let listed = try await listing.value
        #expect(listed.token == nil)

        // The batches together are the listing, in order, each child once.
        let handed = batches.withLock { $0 }.flatMap { $0 }
        #expect(handed.map(\.identifier) == listed.children.map(\.identifier))
        // Byte-exact against the served directory: names, kinds, sizes, identifiers.
        var expected: [String: Int64] = ["sub": -1]
        for index in 0..<Self.count { expected[Self.name(index)] = Int64(index % 97) }
        let got = Dictionary(
            listed.children.map { ($0.name, $0.kind == .directory ? -1 : $0.size) }, uniquingKeysWith: { _, _ in -2 })
        #expect(got.count == listed.children.count, "a child listed twice")
        #expect(got == expected)
        for child in listed.children {
            #expect(child.identifier.rawValue == "many/" + child.name && child.parent == ItemIdentifier("many"))
        }
        // The same items a Depth 0 PROPFIND gives, for a sample.
        for child in listed.children where child.name.hasPrefix("ü-0001") {
            let one = try await provider.item(for: child.identifier)
            // Apache's ETag of a file changed within the last second is weak, strong after (D-422):
            // the same version by the weak comparison.
            func opaque(_ version: ContentVersion) -> Substring {
                version.rawValue.hasPrefix("W/") ? version.rawValue.dropFirst(2) : Substring(version.rawValue)
            }
            #expect(
                one.size == child.size && opaque(one.contentVersion) == opaque(child.contentVersion), "\(child.name)")
        }
    }

    // MARK: The parser alone

    /// A Depth 1 document of `count` responses (rclone's shape).
    static func document(count: Int) -> [UInt8] {
        var text = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><D:multistatus xmlns:D=\"DAV:\">"
        for index in 0..<count {
            text += "<D:response><D:href>/d/f-\(index)</D:href><D:propstat><D:prop><D:resourcetype></D:resourcetype>"
            text += "<D:getcontentlength>\(index)</D:getcontentlength><D:getetag>\"e\(index)\"</D:getetag>"
            text += "<D:getlastmodified>Sun, 06 Dec 2026 08:30:01 GMT</D:getlastmodified></D:prop>"
            text += "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
        }
        return Array((text + "</D:multistatus>").utf8)
    }

    /// 100,000 responses (about 31 MB): every one, in order. Parsed whole in one piece, libxml2
    /// refused a document past about 10 MB.
    @Test func parsesAHundredThousandResponses() throws {
        let document = Self.document(count: 100_000)
        #expect(document.count > 20 << 20)
        let entries = try MultiStatus.parse(document)
        #expect(entries.count == 100_000)
        #expect(entries.enumerated().allSatisfy { $0.element.href == "/d/f-\($0.offset)" })
        #expect(entries.last?.contentLength == 99_999 && entries.last?.etag == "\"e99999\"")
    }

    /// The feeding side waits while the reader is behind: with the reader stopped at its first
    /// response, no more than the pipe's capacity (and what the parser has read ahead) is fed.
    @Test func feedingWaitsWhileTheReaderIsBehind() throws {
        let document = Self.document(count: 20_000)
        let capacity = 64 << 10
        let release = DispatchSemaphore(value: 0)
        let seen = Locked(0)
        let stream = MultiStatusStream(capacity: capacity) { _ in
            if seen.withLock({ count in
                count += 1
                return count == 1
            }) {
                release.wait()
            }
            return true
        }
        let fedAll = Locked(false)
        let feeder = Thread {
            document.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let end = min(bytes.count, offset + 16 << 10)
                    guard stream.feed(UnsafeRawBufferPointer(rebasing: bytes[offset..<end])) else { return }
                    offset = end
                }
            }
            stream.finish(complete: true)
            fedAll.withLock { $0 = true }
        }
        let parsed = Locked<Result<Void, MultiStatusError>?>(nil)
        let parser = Thread {
            parsed.withLock { $0 = Result { () throws(MultiStatusError) in try stream.parse() } }
        }
        feeder.start()
        parser.start()
        // Whatever the feeder can do without the reader, it does in far less than this.
        Thread.sleep(forTimeInterval: 0.3)
        #expect(!fedAll.withLock { $0 })
        #expect(stream.bytesFed <= capacity + 3 * (16 << 10), "\(stream.bytesFed) bytes fed")
        release.signal()
        let deadline = ContinuousClock.now + .seconds(30)
        while parsed.withLock({ $0 == nil }), ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.01) }
        #expect(fedAll.withLock { $0 })
        #expect(seen.withLock { $0 } == 20_000)
        if case .failure(let error) = parsed.withLock({ $0 }) { Issue.record("\(error)") }
    }

    /// A DTD split between two chunks is refused before the parser sees it, whatever the split.
    @Test func aDeclarationSplitBetweenChunksIsRefused() {
        let text = Array(
            """
            <?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">]><D:multistatus xmlns:D="DAV:">\
            <D:response><D:href>&lol;</D:href></D:response></D:multistatus>
            """.utf8)
        let start = 21  // where "<!DOCTYPE" begins
        for split in start...(start + 9) {
            let taken = Locked(0)
            let stream = MultiStatusStream(capacity: .max) { _ in
                taken.withLock { $0 += 1 }
                return true
            }
            let first = text.withUnsafeBytes { stream.feed(UnsafeRawBufferPointer(rebasing: $0[..<split])) }
            let second = first && text.withUnsafeBytes { stream.feed(UnsafeRawBufferPointer(rebasing: $0[split...])) }
            stream.finish(complete: true)
            #expect(!second, "split at \(split)")
            do {
                try stream.parse()
                Issue.record("split at \(split): the document was taken")
            } catch {
                #expect(error.description.contains("DTD"), "split at \(split): \(error)")
            }
            #expect(taken.withLock { $0 } == 0)
        }
    }
}
