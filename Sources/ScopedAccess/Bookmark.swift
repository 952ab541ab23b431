// Bookmarks (Apple: `URL.bookmarkData(options: .withSecurityScope…)` and
// `URL(resolvingBookmarkData:options:relativeTo:bookmarkDataIsStale:)`): persistent data naming an
// item of a mount by its provider identity, found again after a move or rename.
//
// Format, version 1 (docs/SCOPED-ACCESS.md "Bookmark format"):
//   "PFSB"  version (1 byte, 1)  fields…  CRC-32 (4 bytes, big-endian, of every byte before it)
//   field: tag (1 byte), length (4 bytes big-endian, at most 65,536), that many bytes of UTF-8.
// Tags: 1 mount point, 2 path from the mount root, 3 identifier, 4 fingerprint, 5 kind, 6 the
// grant's token, 7 path inside the token's directory. 1, 2, 3 and 5 are required; 6 and 7 come
// together. A tag of 128 or more is skipped (a later version's optional field); any other
// unknown tag, a repeated tag, a bad length or checksum is an error. Parsing never traps.

public import Foundation

struct Bookmark: Equatable, Sendable {
    static let magic = Array("PFSB".utf8)
    static let version: UInt8 = 1
    static let maximumFieldLength = 65_536
    static let maximumSize = 1 << 20

    enum Tag: UInt8, CaseIterable {
        case mountpoint = 1
        case path = 2
        case identifier = 3
        case fingerprint = 4
        case kind = 5
        case token = 6
        case scopedPath = 7
    }

    var mountpoint: String
    /// Relative to the mount root when the bookmark was made.
    var path: String
    var identifier: String
    var fingerprint: String?
    var kind: String
    /// The grant's token: a bookmark of an access path carries it, as Apple's security-scoped
    /// bookmarks carry their sandbox extension. Keep bookmark data like the token: mode 0600.
    var token: String?
    /// Inside the token's directory when the bookmark was made.
    var scopedPath: String?

    func encoded() -> Data {
        var bytes = Self.magic + [Self.version]
        func put(_ tag: Tag, _ value: String?) {
            guard let value else { return }
            let utf8 = Array(value.utf8)
            let length = UInt32(utf8.count)
            bytes += [tag.rawValue, UInt8(length >> 24), UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF)]
            bytes += [UInt8(length & 0xFF)] + utf8
        }
        put(.mountpoint, mountpoint)
        put(.path, path)
        put(.identifier, identifier)
        put(.fingerprint, fingerprint)
        put(.kind, kind)
        put(.token, token)
        put(.scopedPath, scopedPath)
        let crc = CRC32.checksum(bytes)
        bytes += [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)]
        return Data(bytes)
    }

    static func decode(_ data: Data) throws(ScopedAccessError) -> Bookmark {
        func invalid(_ reason: String) -> ScopedAccessError { .invalidBookmark(reason: reason) }
        guard data.count <= maximumSize else { throw invalid("\(data.count) bytes is more than a bookmark holds") }
        let bytes = [UInt8](data)
        guard bytes.count >= magic.count + 1 + 4 else { throw invalid("\(bytes.count) bytes is too short") }
        guard Array(bytes[0..<magic.count]) == magic else { throw invalid("it does not start with PFSB") }
        let version = bytes[magic.count]
        guard version == Self.version else {
            throw invalid("format version \(version); this library reads version \(Self.version)")
        }
        let body = bytes.count - 4
        let stored =
            UInt32(bytes[body]) << 24 | UInt32(bytes[body + 1]) << 16 | UInt32(bytes[body + 2]) << 8
            | UInt32(bytes[body + 3])
        guard CRC32.checksum(bytes[0..<body]) == stored else { throw invalid("its checksum does not match (damaged)") }
        var fields: [UInt8: String] = [:]
        var offset = magic.count + 1
        while offset < body {
            guard body - offset >= 5 else { throw invalid("a field is cut short at byte \(offset)") }
            let tag = bytes[offset]
            let length =
                Int(bytes[offset + 1]) << 24 | Int(bytes[offset + 2]) << 16 | Int(bytes[offset + 3]) << 8
                | Int(bytes[offset + 4])
            offset += 5
            guard length <= maximumFieldLength else { throw invalid("field \(tag) claims \(length) bytes") }
            guard body - offset >= length else { throw invalid("field \(tag) runs past the end") }
            let value = bytes[offset..<(offset + length)]
            offset += length
            if tag >= 128 { continue }
            guard Tag(rawValue: tag) != nil else { throw invalid("unknown field \(tag) (a newer version?)") }
            guard fields[tag] == nil else { throw invalid("field \(tag) appears twice") }
            guard let text = String(validating: value, as: UTF8.self), !text.utf8.contains(0) else {
                throw invalid("field \(tag) is not text")
            }
            fields[tag] = text
        }
        func required(_ tag: Tag) throws(ScopedAccessError) -> String {
            guard let value = fields[tag.rawValue] else { throw invalid("field \(tag) is missing") }
            return value
        }
        let bookmark = Bookmark(
            mountpoint: try required(.mountpoint), path: try required(.path), identifier: try required(.identifier),
            fingerprint: fields[Tag.fingerprint.rawValue], kind: try required(.kind),
            token: fields[Tag.token.rawValue], scopedPath: fields[Tag.scopedPath.rawValue])
        guard bookmark.mountpoint.hasPrefix("/") else { throw invalid("its mount point is not an absolute path") }
        guard (bookmark.token == nil) == (bookmark.scopedPath == nil) else {
            throw invalid("it has a token without its path inside, or the other way round")
        }
        for part in [bookmark.path, bookmark.scopedPath ?? ""] {
            guard !part.hasPrefix("/"), !part.split(separator: "/").contains("..") else {
                throw invalid("a path in it climbs out of the mount")
            }
        }
        if let token = bookmark.token, token.isEmpty || token.contains("/") {
            throw invalid("its token is not a path component")
        }
        return bookmark
    }
}

/// CRC-32 (IEEE 802.3, reflected, as zlib): detects damage to bookmark data. Not security.
enum CRC32 {
    static let table: [UInt32] = (0..<256).map { index -> UInt32 in
        var value = UInt32(index)
        for _ in 0..<8 { value = value & 1 == 1 ? 0xEDB8_8320 ^ (value >> 1) : value >> 1 }
        return value
    }

    static func checksum<Bytes: Sequence>(_ bytes: Bytes) -> UInt32 where Bytes.Element == UInt8 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        return crc ^ 0xFFFF_FFFF
    }
}

extension SecurityScopedURL {
    /// Apple: `URL.bookmarkData(options: .withSecurityScope, …)`. Data that resolves back to
    /// this item later, in this or another process, after it moved or was renamed in the
    /// provider. A bookmark of an access path carries the grant's token (resolution needs it,
    /// and works only while the grant lasts): store it like a secret (a file of mode 0600). A
    /// bookmark of a plain mount path carries none. Paths outside any ProviderFS mount are
    /// refused (`.notInMount`).
    public func bookmarkData() throws(ScopedAccessError) -> Data {
        guard let mountpoint else { throw .notInMount(path: inside) }
        let identity = try registry.backend.identify(mountpoint: mountpoint, token: token, path: inside)
        return Bookmark(
            mountpoint: mountpoint, path: identity.path, identifier: identity.identifier,
            fingerprint: identity.fingerprint, kind: identity.kind, token: token,
            scopedPath: token == nil ? nil : identity.scopedPath ?? inside
        ).encoded()
    }

    /// Apple: `URL(resolvingBookmarkData:options: .withSecurityScope, relativeTo: nil,
    /// bookmarkDataIsStale:)`. The URL of the bookmarked item now: the grant's access path to it
    /// (not started: call `startAccessingSecurityScopedResource()`), or its plain mount path.
    /// `bookmarkDataIsStale` is true when the item moved or was renamed since the bookmark was
    /// made: make a new bookmark and store it instead (the old one keeps resolving while the item
    /// can be found). Throws `.itemGone`, `.accessEnded` (the grant expired or was revoked),
    /// `.mountUnavailable`, or `.invalidBookmark` for data that is not a bookmark.
    public init(resolvingBookmarkData data: Data, bookmarkDataIsStale: inout Bool) throws(ScopedAccessError) {
        try self.init(resolvingBookmarkData: data, bookmarkDataIsStale: &bookmarkDataIsStale, registry: .shared)
    }

    package init(
        resolvingBookmarkData data: Data, bookmarkDataIsStale: inout Bool, registry: ScopedAccessRegistry
    ) throws(ScopedAccessError) {
        let bookmark = try Bookmark.decode(data)
        let found = try registry.backend.resolve(
            mountpoint: bookmark.mountpoint, token: bookmark.token, identifier: bookmark.identifier,
            fingerprint: bookmark.fingerprint, path: bookmark.path)
        bookmarkDataIsStale =
            found.identifier != bookmark.identifier || found.path != bookmark.path
            || (bookmark.token != nil && found.scopedPath != bookmark.scopedPath)
        if let token = bookmark.token {
            self.init(
                mountpoint: bookmark.mountpoint, token: token, inside: found.scopedPath ?? "", registry: registry)
        } else {
            self.init(mountpoint: bookmark.mountpoint, token: nil, inside: found.path, registry: registry)
        }
    }
}
