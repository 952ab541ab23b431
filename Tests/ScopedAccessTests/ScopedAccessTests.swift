import Foundation
import Testing

@testable import ScopedAccess

/// The daemon's side, recorded: derives hand out numbered tokens, releases are counted.
final class FakeBackend: ScopedAccessBackend, @unchecked Sendable {
    // Only touched under the registry's lock (start and stop are serialized) or after.
    var derived: [String] = []
    var released: [String] = []
    var refuse: ScopedAccessError?
    var resolution: ItemIdentityReply?

    func derive(mountpoint: String, token: String) throws(ScopedAccessError) -> DerivedToken {
        if let refuse { throw refuse }
        derived.append(token)
        return DerivedToken(token: "child\(derived.count)", id: "id\(derived.count)")
    }

    func release(mountpoint: String, token: String) throws(ScopedAccessError) { released.append(token) }

    func identify(mountpoint: String, token: String?, path: String) throws(ScopedAccessError) -> ItemIdentityReply {
        ItemIdentityReply(
            identifier: "docs/" + path, fingerprint: "i42", kind: "file", name: path, path: "docs/" + path,
            scopedPath: token == nil ? nil : path, foundBy: nil)
    }

    func resolve(
        mountpoint: String, token: String?, identifier: String, fingerprint: String?, path: String
    ) throws(ScopedAccessError) -> ItemIdentityReply {
        guard let resolution else { throw .itemGone(reason: "test") }
        return resolution
    }
}

@Suite("ScopedAccess: start and stop are reference-counted per process")
struct ScopedAccessRefcountTests {
    let backend = FakeBackend()
    var registry: ScopedAccessRegistry { ScopedAccessRegistry(backend: backend) }

    @Test("start, start, stop keeps access; the last stop releases the derived token; one more stop does nothing")
    func nesting() {
        let registry = self.registry
        let url = SecurityScopedURL(mountpoint: "/mnt", token: "grant", inside: "a.txt", registry: registry)
        #expect(url.path == "/mnt/.scoped/grant/a.txt")
        #expect(url.startAccessingSecurityScopedResource())
        #expect(url.startAccessingSecurityScopedResource())
        #expect(backend.derived == ["grant"])
        #expect(url.path == "/mnt/.scoped/child1/a.txt" && url.isAccessing)
        url.stopAccessingSecurityScopedResource()
        #expect(url.isAccessing && backend.released.isEmpty)
        url.stopAccessingSecurityScopedResource()
        #expect(!url.isAccessing && backend.released == ["child1"])
        // The path keeps naming the ended token: a read through it fails, it does not fall back.
        #expect(url.path == "/mnt/.scoped/child1/a.txt")
        url.stopAccessingSecurityScopedResource()
        #expect(backend.released == ["child1"])
        #expect(url.startAccessingSecurityScopedResource())
        #expect(url.path == "/mnt/.scoped/child2/a.txt")
        url.stopAccessingSecurityScopedResource()
        #expect(backend.released == ["child1", "child2"])
    }

    @Test("URLs of one grant share the count (a folder's children too); other grants do not")
    func sharing() {
        let registry = self.registry
        let folder = SecurityScopedURL(mountpoint: "/mnt", token: "grant", inside: "", registry: registry)
        let child = folder.appending(component: "b.txt")
        let another = SecurityScopedURL(mountpoint: "/mnt", token: "other", inside: "", registry: registry)
        #expect(child.path == "/mnt/.scoped/grant/b.txt")
        #expect(folder.startAccessingSecurityScopedResource())
        #expect(child.startAccessingSecurityScopedResource())
        #expect(child.path == "/mnt/.scoped/child1/b.txt" && folder.path == "/mnt/.scoped/child1")
        #expect(!another.isAccessing)
        folder.stopAccessingSecurityScopedResource()
        #expect(child.isAccessing)
        child.stopAccessingSecurityScopedResource()
        #expect(backend.derived == ["grant"] && backend.released == ["child1"])
    }

    @Test("start is false without scope and for a refused grant, with the reason; nothing is counted")
    func refusals() {
        let registry = self.registry
        let plain = SecurityScopedURL(mountpoint: "/mnt", token: nil, inside: "docs/a.txt", registry: registry)
        #expect(!plain.startAccessingSecurityScopedResource())
        #expect(plain.lastError == .noScope(path: "/mnt/docs/a.txt"))
        #expect(!plain.hasSecurityScope && plain.path == "/mnt/docs/a.txt")
        plain.stopAccessingSecurityScopedResource()
        let local = SecurityScopedURL(path: "/definitely/not/a/mount/file.txt", registry: registry)
        #expect(!local.startAccessingSecurityScopedResource() && local.mountpoint == nil)
        #expect(throws: ScopedAccessError.notInMount(path: "/definitely/not/a/mount/file.txt")) {
            try local.bookmarkData()
        }

        backend.refuse = .accessEnded(reason: "the token was revoked")
        let revoked = SecurityScopedURL(mountpoint: "/mnt", token: "gone", inside: "", registry: registry)
        #expect(!revoked.startAccessingSecurityScopedResource())
        #expect(revoked.lastError == .accessEnded(reason: "the token was revoked"))
        #expect(!revoked.isAccessing)
        #expect(throws: ScopedAccessError.accessEnded(reason: "the token was revoked")) { try revoked.startAccessing() }
        revoked.stopAccessingSecurityScopedResource()
        #expect(backend.released.isEmpty)
    }

    @Test("withAccess stops on every exit path, a throw included")
    func withAccess() {
        let registry = self.registry
        let url = SecurityScopedURL(mountpoint: "/mnt", token: "grant", inside: "a", registry: registry)
        struct Failure: Error {}
        #expect(throws: Failure.self) { try url.withAccess { () throws(Failure) in throw Failure() } }
        #expect(!url.isAccessing && backend.released == ["child1"])
        #expect((try? url.withAccess { url.path }) == "/mnt/.scoped/child2/a")
        #expect(!url.isAccessing)
    }

    @Test("the description does not show the token")
    func description() {
        let url = SecurityScopedURL(
            mountpoint: "/mnt", token: "pfs_abcdefgh_0123456789abcdefghijklmnopqrstuv", inside: "a.txt",
            registry: registry)
        #expect(!url.description.contains("0123456789abcdefghij"))
        #expect(url.description.hasPrefix("/mnt/.scoped/pfs_abcdefgh") && url.description.hasSuffix("/a.txt"))
    }
}

@Suite("ScopedAccess: bookmark data")
struct BookmarkCodecTests {
    let sample = Bookmark(
        mountpoint: "/home/me/mnt", path: "docs/report.txt", identifier: "docs/report.txt", fingerprint: "i1234",
        kind: "file", token: "pfs_abcdefgh_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", scopedPath: "report.txt")

    @Test("round trip, with and without the optional fields")
    func roundTrip() throws {
        #expect(try Bookmark.decode(sample.encoded()) == sample)
        let plain = Bookmark(mountpoint: "/m", path: "", identifier: "", kind: "directory")
        #expect(try Bookmark.decode(plain.encoded()) == plain)
        let data = sample.encoded()
        #expect(Array(data.prefix(5)) == Array("PFSB".utf8) + [1])
    }

    @Test("every truncation and every single-bit flip is refused with a clear error, never a crash")
    func damage() {
        let bytes = [UInt8](sample.encoded())
        for length in 0..<bytes.count {
            #expect(throws: ScopedAccessError.self) { try Bookmark.decode(Data(bytes[0..<length])) }
        }
        for index in bytes.indices {
            for bit in 0..<8 {
                var flipped = bytes
                flipped[index] ^= 1 << bit
                do {
                    _ = try Bookmark.decode(Data(flipped))
                    Issue.record("a flip of bit \(bit) of byte \(index) was read as a bookmark")
                } catch {
                    guard case .invalidBookmark(let reason) = error else {
                        Issue.record("\(error)")
                        continue
                    }
                    #expect(!reason.isEmpty)
                }
            }
        }
    }

    /// `body` with a valid checksum appended (so that the field checks, not the checksum, answer).
    func sealed(_ body: [UInt8]) -> Data {
        let crc = CRC32.checksum(body)
        return Data(body + [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)])
    }

    func field(_ tag: UInt8, _ text: String) -> [UInt8] {
        let utf8 = Array(text.utf8)
        let count = UInt32(utf8.count)
        return [tag, UInt8(count >> 24), UInt8((count >> 16) & 0xFF), UInt8((count >> 8) & 0xFF), UInt8(count & 0xFF)]
            + utf8
    }

    func reason(_ data: Data) -> String? {
        do {
            _ = try Bookmark.decode(data)
            return nil
        } catch {
            guard case .invalidBookmark(let reason) = error else { return "\(error)" }
            return reason
        }
    }

    @Test("wrong version, huge lengths, unknown, repeated and missing fields, bad text, climbing paths")
    func structure() {
        let head = Array("PFSB".utf8) + [1]
        let required = field(1, "/m") + field(2, "a") + field(3, "a") + field(5, "file")
        #expect(reason(sealed(head + required)) == nil)
        #expect(reason(sealed(Array("PFSB".utf8) + [2] + required))?.contains("version 2") == true)
        #expect(reason(sealed(head + required + [9, 0xFF, 0xFF, 0xFF, 0xFF]))?.contains("claims") == true)
        #expect(reason(sealed(head + required + [9, 0, 0, 1, 0]))?.contains("past the end") == true)
        #expect(reason(sealed(head + required + field(9, "x")))?.contains("unknown field 9") == true)
        #expect(reason(sealed(head + required + field(200, "later version"))) == nil)
        #expect(reason(sealed(head + required + field(3, "b")))?.contains("twice") == true)
        #expect(reason(sealed(head + field(1, "/m") + field(2, "a") + field(5, "file")))?.contains("missing") == true)
        #expect(reason(sealed(head + required + [4, 0, 0, 0, 2, 0xC3, 0x28]))?.contains("not text") == true)
        #expect(
            reason(sealed(head + field(1, "/m") + field(2, "../x") + field(3, "a") + field(5, "f")))?.contains("climbs")
                == true)
        #expect(reason(sealed(head + required + field(6, "pfs_x")))?.contains("token") == true)
        #expect(reason(Data(repeating: 0x41, count: (1 << 20) + 1))?.contains("more than") == true)
        #expect(reason(Data())?.contains("too short") == true)
    }

    @Test("random data is refused, never a crash (seeded)")
    func randomData() {
        var generator = SystemRandomNumberGenerator()
        var state: UInt64 = 0x5eed
        for round in 0..<2000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let length = Int(state >> 53) % 300
            var bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if round % 2 == 0, bytes.count >= 5 { bytes.replaceSubrange(0..<5, with: Array("PFSB".utf8) + [1]) }
            #expect(reason(Data(bytes)) != nil)
        }
    }

    @Test("resolution reports stale when the item moved, and keeps the grant's token")
    func staleness() throws {
        let backend = FakeBackend()
        let registry = ScopedAccessRegistry(backend: backend)
        let url = SecurityScopedURL(mountpoint: "/mnt", token: "grant", inside: "a.txt", registry: registry)
        let data = try url.bookmarkData()
        backend.resolution = ItemIdentityReply(
            identifier: "docs/a.txt", fingerprint: "i42", kind: "file", name: "a.txt", path: "docs/a.txt",
            scopedPath: "a.txt", foundBy: "identifier")
        var stale = true
        var resolved = try SecurityScopedURL(
            resolvingBookmarkData: data, bookmarkDataIsStale: &stale, registry: registry)
        #expect(!stale && resolved == url)
        backend.resolution = ItemIdentityReply(
            identifier: "docs/b.txt", fingerprint: "i42", kind: "file", name: "b.txt", path: "docs/b.txt",
            scopedPath: "b.txt", foundBy: "fingerprint")
        resolved = try SecurityScopedURL(resolvingBookmarkData: data, bookmarkDataIsStale: &stale, registry: registry)
        #expect(stale && resolved.path == "/mnt/.scoped/grant/b.txt" && resolved.hasSecurityScope)
        backend.resolution = nil
        #expect(throws: ScopedAccessError.itemGone(reason: "test")) {
            try SecurityScopedURL(resolvingBookmarkData: data, bookmarkDataIsStale: &stale, registry: registry)
        }
    }
}
