// The 207 Multi-Status parser: real server answers, namespaces, per-propstat statuses, and
// hostile or malformed documents, each refused with a reason (never a crash, never expansion).

import Foundation
import ProviderModel
import Testing
import WebDAVProvider

@Suite("MultiStatus")
struct MultiStatusTests {
    /// What `rclone serve webdav` answers to a Depth 1 PROPFIND (trimmed).
    static let rcloneListing = """
        <?xml version="1.0" encoding="UTF-8"?><D:multistatus xmlns:D="DAV:"><D:response><D:href>/</D:href>\
        <D:propstat><D:prop><D:resourcetype><D:collection xmlns:D="DAV:"/></D:resourcetype><D:displayname></D:displayname>\
        <D:getlastmodified>Sun, 06 Dec 2026 08:30:01 GMT</D:getlastmodified></D:prop><D:status>HTTP/1.1 200 OK</D:status>\
        </D:propstat></D:response><D:response><D:href>/a%20b.txt</D:href><D:propstat><D:prop>\
        <D:getcontenttype>text/plain; charset=utf-8</D:getcontenttype><D:resourcetype></D:resourcetype>\
        <D:getlastmodified>Sun, 06 Dec 2026 08:30:01 GMT</D:getlastmodified><D:getetag>"18ee9ce35d3dfe726"</D:getetag>\
        <D:getcontentlength>6</D:getcontentlength></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>\
        <D:response><D:href>/d/</D:href><D:propstat><D:prop><D:resourcetype><D:collection xmlns:D="DAV:"/></D:resourcetype>\
        </D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>
        """

    func parse(
        _ text: String, limits: MultiStatusLimits = MultiStatusLimits()
    ) throws(MultiStatusError)
        -> [MultiStatusEntry]
    {
        try MultiStatus.parse(Array(text.utf8), limits: limits)
    }

    func refusal(_ text: String, limits: MultiStatusLimits = MultiStatusLimits()) -> String? {
        do {
            _ = try parse(text, limits: limits)
            return nil
        } catch {
            return error.description
        }
    }

    @Test func readsAnRcloneListing() throws {
        let entries = try parse(Self.rcloneListing)
        #expect(entries.map(\.href) == ["/", "/a%20b.txt", "/d/"])
        #expect(entries.map(\.isCollection) == [true, false, true])
        #expect(entries[1].contentLength == 6)
        #expect(entries[1].etag == "\"18ee9ce35d3dfe726\"")
        // 2026-12-06 08:30:01 UTC.
        #expect(entries[1].lastModified == 1_796_545_801)
        #expect(entries[2].etag == nil && entries[2].lastModified == nil)
    }

    @Test func matchesByNamespaceNotByPrefix() throws {
        // Apache's style (default namespace and lp1: prefixes), and a foreign getetag that must be ignored.
        let text = """
            <?xml version="1.0" encoding="utf-8"?>
            <multistatus xmlns="DAV:" xmlns:x="urn:other"><response><href>http://h/dav/f</href>
            <propstat><prop><getetag>"strong"</getetag><x:getetag>"foreign"</x:getetag>
            <getcontentlength>12</getcontentlength><resourcetype/></prop><status>HTTP/1.1 200 OK</status></propstat>
            </response></multistatus>
            """
        let entries = try parse(text)
        #expect(entries.count == 1)
        #expect(entries[0].etag == "\"strong\"")
        #expect(entries[0].contentLength == 12)
        #expect(!entries[0].isCollection)
        // The same document in another namespace is no multistatus at all.
        #expect(refusal(text.replacingOccurrences(of: "xmlns=\"DAV:\"", with: "xmlns=\"urn:notdav\"")) != nil)
    }

    /// `getctag` (CalendarServer's namespace) and `oc:checksums` (ownCloud's) are read by namespace,
    /// whatever the prefix, only from a 200 propstat (D-518, D-519); values outside OC-Checksum's
    /// grammar, unknown algorithms, wrong digest lengths and values over 1 KiB are ignored.
    @Test func readsGetctagAndOwnCloudChecksumsByNamespace() throws {
        let sha1 = String(repeating: "ab", count: 20)
        let md5 = String(repeating: "0f", count: 16)
        let text = """
            <d:multistatus xmlns:d="DAV:" xmlns:c="http://calendarserver.org/ns/" xmlns:o="http://owncloud.org/ns" \
            xmlns:x="urn:other"><d:response><d:href>/dir/</d:href><d:propstat><d:prop><d:resourcetype><d:collection/>\
            </d:resourcetype><c:getctag>"c1"</c:getctag></d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat>\
            </d:response><d:response><d:href>/dir/f</d:href><d:propstat><d:prop><o:checksums>\
            <o:checksum>SHA1:\(sha1) MD5:\(md5) ADLER32:0000abcd CRC32:deadbeef</o:checksum></o:checksums>\
            <x:getctag>"foreign"</x:getctag></d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response>\
            <d:response><d:href>/dir/g</d:href><d:propstat><d:prop><o:checksums><o:checksum>SHA1:xyz</o:checksum>\
            <o:checksum>MD5:\(sha1)</o:checksum><o:checksum>SHA1:\(sha1) garbage</o:checksum>\
            <o:checksum>SHA1:\(sha1)\(String(repeating: " ", count: 1000))MD5:\(md5)</o:checksum></o:checksums>\
            <x:checksums><x:checksum>SHA1:\(sha1)</x:checksum></x:checksums></d:prop>\
            <d:status>HTTP/1.1 200 OK</d:status></d:propstat><d:propstat><d:prop><c:getctag>"lost"</c:getctag>\
            <o:checksums><o:checksum>MD5:\(md5)</o:checksum></o:checksums></d:prop>\
            <d:status>HTTP/1.1 404 Not Found</d:status></d:propstat></d:response>\
            <d:response><d:href>/dir/h/</d:href><d:propstat><d:prop><c:getctag>\(String(repeating: "x", count: 2000))\
            </c:getctag></d:prop><d:status>HTTP/1.1 200 OK</d:status></d:propstat></d:response></d:multistatus>
            """
        let entries = try parse(text)
        #expect(entries.map(\.ctag) == ["\"c1\"", nil, nil, nil])
        let bytes = { (hex: String) in
            stride(from: 0, to: hex.count, by: 2).map {
                UInt8(hex.dropFirst($0).prefix(2), radix: 16)!
            }
        }
        #expect(
            entries[1].checksums == [
                ContentChecksum(.sha1, digest: bytes(sha1)), ContentChecksum(.md5, digest: bytes(md5)),
                ContentChecksum(.adler32, digest: [0, 0, 0xAB, 0xCD]),
            ])
        #expect(entries[2].checksums.isEmpty, "\(entries[2].checksums)")
        #expect(entries[0].checksums.isEmpty && entries[3].checksums.isEmpty)
    }

    @Test func propertiesOfAFailedPropstatAreIgnored() throws {
        let text = """
            <D:multistatus xmlns:D="DAV:"><D:response><D:href>/f</D:href>
            <D:propstat><D:prop><D:getcontentlength>5</D:getcontentlength></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat>
            <D:propstat><D:prop><D:getetag>"nope"</D:getetag><D:resourcetype><D:collection/></D:resourcetype></D:prop>
            <D:status>HTTP/1.1 404 Not Found</D:status></D:propstat></D:response>
            <D:response><D:href>/gone</D:href><D:status>HTTP/1.1 404 Not Found</D:status></D:response>
            <D:response><D:status>HTTP/1.1 200 OK</D:status></D:response></D:multistatus>
            """
        let entries = try parse(text)
        #expect(entries.count == 2, "a response without href is skipped")
        #expect(entries[0].contentLength == 5 && entries[0].etag == nil && !entries[0].isCollection)
        #expect(entries[0].status == nil)
        #expect(entries[1].href == "/gone" && entries[1].status == 404)
    }

    @Test func refusesEntityExpansion() {
        let laughs = """
            <?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;">
            <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
            <D:multistatus xmlns:D="DAV:"><D:response><D:href>&lol3;</D:href></D:response></D:multistatus>
            """
        #expect(refusal(laughs)?.contains("DTD") == true)
        // Lower case and an external entity: refused the same way, nothing fetched.
        let external = """
            <!doctype d [<!entity x SYSTEM "file:///etc/passwd">]><D:multistatus xmlns:D="DAV:"><D:response>
            <D:href>&x;</D:href></D:response></D:multistatus>
            """
        #expect(refusal(external)?.contains("DTD") == true)
    }

    @Test func refusesDeepNestingLargeDocumentsAndLongValues() {
        let deep =
            "<D:multistatus xmlns:D=\"DAV:\">" + String(repeating: "<D:a>", count: 10_000)
            + String(repeating: "</D:a>", count: 10_000) + "</D:multistatus>"
        #expect(refusal(deep)?.contains("nests deeper") == true)
        var small = MultiStatusLimits()
        small.maximumBytes = 500
        #expect(refusal(Self.rcloneListing, limits: small)?.contains("over the limit") == true)
        let long =
            "<D:multistatus xmlns:D=\"DAV:\"><D:response><D:href>/" + String(repeating: "x", count: 20_000)
            + "</D:href></D:response></D:multistatus>"
        #expect(refusal(long)?.contains("longer than") == true)
        var few = MultiStatusLimits()
        few.maximumElements = 10
        #expect(refusal(Self.rcloneListing, limits: few)?.contains("more than 10 elements") == true)
    }

    @Test func refusesMalformedAndForeignDocuments() {
        for text in [
            "",
            "<D:multistatus xmlns:D=\"DAV:\"><D:response><D:href>/a</D:href>",  // cut short
            "<D:multistatus xmlns:D=\"DAV:\"><D:response></D:multistatus>",  // mismatched
            "<html><body><h1>502 Bad Gateway</h1></body></html>",  // an HTML error page
            "<?xml version=\"1.0\"?><D:error xmlns:D=\"DAV:\"/>",
            "not xml at all \u{0}\u{1}",
        ] {
            #expect(refusal(text) != nil, "\(text): \(String(describing: try? parse(text)))")
        }
    }

    /// Random mutations of a real listing: every one parses or is refused, none crashes or hangs.
    @Test func survivesMutatedDocuments() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func random(_ bound: Int) -> Int {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return Int(state % UInt64(bound))
        }
        let original = Array(Self.rcloneListing.utf8)
        let alphabet = Array("<>/&;\"'=:!?[]DAV x\u{0}%".utf8)
        var parsed = 0
        for _ in 0..<2000 {
            var bytes = original
            for _ in 0..<(1 + random(4)) {
                switch random(3) {
                case 0: bytes[random(bytes.count)] = alphabet[random(alphabet.count)]
                case 1: bytes.remove(at: random(bytes.count))
                default: bytes.insert(alphabet[random(alphabet.count)], at: random(bytes.count))
                }
            }
            if (try? MultiStatus.parse(bytes)) != nil { parsed += 1 }
        }
        // Some mutations hit text and still parse; most break the XML. Both kinds occurred.
        #expect(parsed > 0 && parsed < 2000)
    }

    @Test func readsHTTPDates() {
        #expect(MultiStatus.httpDate("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
        #expect(MultiStatus.httpDate("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
        #expect(MultiStatus.httpDate("Tue, 29 Feb 2028 23:59:59 GMT") == 1_835_481_599)
        #expect(MultiStatus.httpDate("Sun, 06 Nov 1994 08:49:37 PST") == nil)
        #expect(MultiStatus.httpDate("Sunday, 06-Nov-94 08:49:37 GMT") == nil)
        #expect(MultiStatus.httpDate("Sun, 06 Foo 1994 08:49:37 GMT") == nil)
        #expect(MultiStatus.httpDate("Sun, 06 Nov 1994 25:49:37 GMT") == nil)
    }
}
