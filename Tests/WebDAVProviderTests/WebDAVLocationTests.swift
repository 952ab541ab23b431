// Base URLs, percent-encoding of names, and hrefs back to identifiers.

import ProviderModel
import Testing
import WebDAVProvider

@Suite("WebDAVLocation")
struct WebDAVLocationTests {
    func refusal(_ url: String) -> String? {
        do {
            _ = try WebDAVLocation(url)
            return nil
        } catch {
            return error.description
        }
    }

    @Test func checksBaseURLs() throws {
        #expect(try WebDAVLocation("http://127.0.0.1:8080").description == "http://127.0.0.1:8080/")
        #expect(try WebDAVLocation("HTTPS://example.com/dav").description == "https://example.com/dav/")
        #expect(try WebDAVLocation("http://h/my%20files/").description == "http://h/my%20files/")
        #expect(refusal("ftp://h/")?.contains("http://") == true)
        #expect(refusal("http:///path") != nil)
        #expect(refusal("not a url") != nil)
        #expect(refusal("http://h/a?x=1")?.contains("query") == true)
        #expect(refusal("http://h/a#top")?.contains("fragment") == true)
        // Credentials in the URL are refused, and the message does not repeat them.
        let message = refusal("http://alice:s3cret@h/dav/")
        #expect(message?.contains("--password-file") == true)
        #expect(message?.contains("s3cret") == false)
    }

    @Test func percentEncodesEveryReservedByte() throws {
        #expect(WebDAVLocation.percentEncoded("a b%c#d?e") == "a%20b%25c%23d%3Fe")
        #expect(WebDAVLocation.percentEncoded("ü") == "%C3%BC")
        #expect(WebDAVLocation.percentEncoded("A-z_0.9~") == "A-z_0.9~")
        #expect(WebDAVLocation.percentEncoded("+&;=@:") == "%2B%26%3B%3D%40%3A")
        let location = try WebDAVLocation("http://h:1/dav/")
        #expect(location.url(of: ItemIdentifier("dir/a b#?.txt")) == "http://h:1/dav/dir/a%20b%23%3F.txt")
        #expect(location.url(of: ItemIdentifier("dir"), collection: true) == "http://h:1/dav/dir/")
        #expect(location.url(of: .root) == "http://h:1/dav/")
        // NFC and NFD forms stay distinct bytes (no normalization either way).
        #expect(
            WebDAVLocation.percentEncoded("\u{E9}") == "%C3%A9"
                && WebDAVLocation.percentEncoded("e\u{301}") == "e%CC%81")
    }

    @Test func mapsHrefsBackToIdentifiers() throws {
        let location = try WebDAVLocation("http://h:1/my%20dav/")
        #expect(location.identifier(forHref: "/my%20dav/") == .root)
        #expect(location.identifier(forHref: "/my dav") == .root)
        #expect(location.identifier(forHref: "/my%20dav/a%20b%25.txt") == ItemIdentifier("a b%.txt"))
        #expect(location.identifier(forHref: "http://h:1/my%20dav/d/%C3%BC/") == ItemIdentifier("d/ü"))
        #expect(location.identifier(forHref: "http://other:1/my%20dav/x") == nil, "another server")
        #expect(location.identifier(forHref: "/elsewhere/x") == nil, "outside the base")
        #expect(location.identifier(forHref: "/my%20dav/a/../b") == nil)
        #expect(location.identifier(forHref: "/my%20dav/a%2Fb") == nil, "an encoded slash is no name")
        #expect(location.identifier(forHref: "/my%20dav/a%00b") == nil)
        #expect(location.identifier(forHref: "/my%20dav/%ZZ") == nil)
        #expect(location.identifier(forHref: "/my%20dav/%FF") == nil, "not UTF-8")
        // D-466: "//host/…" names another host; an empty component names nothing.
        #expect(location.identifier(forHref: "//my%20dav/x") == nil, "a network-path reference")
        #expect(location.identifier(forHref: "/my%20dav//x") == nil)
        #expect(location.identifier(forHref: "/my%20dav/d//x") == nil)
        #expect(location.identifier(forHref: "/my%20dav/%2e%2e/x") == nil, "an encoded ..")
        // Round trip of awkward names.
        for name in ["a b", "100%", "#1", "why?", "ünïcødé", "e\u{301}", "semi;colon", "plus+sign"] {
            let url = location.url(of: ItemIdentifier("d/" + name))
            let path = String(url.dropFirst("http://h:1".count))
            #expect(location.identifier(forHref: path) == ItemIdentifier("d/" + name), "\(name)")
        }
    }
}
