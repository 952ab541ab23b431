// Where a WebDAV provider's items live: the server's base URL, and the mapping between item
// identifiers (paths relative to the base, decoded, "/"-separated, "" for the root — the same shape
// as a local directory's) and the percent-encoded URLs and hrefs of the protocol.

import Foundation
public import ProviderModel

/// The base URL of a WebDAV collection, checked: `http` or `https`, a host, no user or password
/// (credentials come from `--user` and a password file or the environment, never from a URL that
/// ends up in `ps`, logs and `status`), no query or fragment. Its path always ends with "/".
public struct WebDAVLocation: Sendable, Hashable, CustomStringConvertible {
    /// `scheme://host[:port]`, as given (lowercased scheme).
    public let origin: String
    /// The base path, percent-encoded as given, starting and ending with "/".
    public let encodedBasePath: String
    /// The base path's components, decoded (hrefs are compared decoded: servers encode differently).
    let baseComponents: [String]

    /// Why a URL is refused; the message is for the user.
    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    public init(_ text: String) throws(Invalid) {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            throw Invalid(
                description:
                    "'\(Self.redacted(text))' is not a URL (percent-encode spaces and other special characters)")
        }
        guard scheme == "http" || scheme == "https" else {
            throw Invalid(description: "'\(Self.redacted(text))' is not an http:// or https:// URL")
        }
        guard let host = components.percentEncodedHost, !host.isEmpty else {
            throw Invalid(description: "'\(Self.redacted(text))' has no host")
        }
        guard components.percentEncodedUser == nil, components.percentEncodedPassword == nil else {
            throw Invalid(
                description:
                    "the URL must not contain a user or password: use --user and --password-file (or PROVIDERFS_WEBDAV_PASSWORD)"
            )
        }
        guard components.percentEncodedQuery == nil, components.percentEncodedFragment == nil else {
            throw Invalid(description: "'\(text)' has a query or fragment; a WebDAV collection URL has neither")
        }
        var path = components.percentEncodedPath
        if path.isEmpty { path = "/" }
        if !path.hasSuffix("/") { path += "/" }
        var decoded: [String] = []
        for component in path.split(separator: "/") {
            guard let name = Self.percentDecoded(String(component)), Self.isName(name) else {
                throw Invalid(description: "'\(text)' has a path that is not valid percent-encoded UTF-8 names")
            }
            decoded.append(name)
        }
        let port = components.port.map { ":\($0)" } ?? ""
        origin = scheme + "://" + host + port
        encodedBasePath = path
        baseComponents = decoded
    }

    /// The base URL.
    public var description: String { origin + encodedBasePath }

    /// The URL of an item: the base, then each component of the identifier percent-encoded.
    /// Collections get a trailing "/" (what servers list them under; some redirect without it).
    public func url(of identifier: ItemIdentifier, collection: Bool = false) -> String {
        if identifier == .root { return description }
        let path = identifier.rawValue.split(separator: "/", omittingEmptySubsequences: false)
            .map { Self.percentEncoded($0) }.joined(separator: "/")
        return description + path + (collection ? "/" : "")
    }

    /// The URL of `name` in `directory`.
    public func url(of name: String, in directory: ItemIdentifier, collection: Bool = false) -> String {
        url(of: Self.identifier(of: name, in: directory), collection: collection)
    }

    /// The identifier of `name` in `directory`.
    public static func identifier(of name: String, in directory: ItemIdentifier) -> ItemIdentifier {
        ItemIdentifier(directory == .root ? name : directory.rawValue + "/" + name)
    }

    /// The identifier an href of a 207 Multi-Status names (an absolute URL or an absolute path,
    /// percent-encoded), or nil when it lies outside the base collection, is not valid
    /// percent-encoded UTF-8, or has a component that no item may have ("", ".", "..", NUL).
    public func identifier(forHref href: String) -> ItemIdentifier? {
        var path = Substring(href.trimmingCharacters(in: .whitespacesAndNewlines))
        if let scheme = path.range(of: "://") {
            // An absolute URL: it must be this server's.
            let rest = path[scheme.upperBound...]
            let slash = rest.firstIndex(of: "/") ?? rest.endIndex
            guard path[..<slash].lowercased() == origin.lowercased() else { return nil }
            path = rest[slash...]
        }
        // An absolute path; "//…" is a reference to another host (RFC 3986 §4.2), and an empty
        // component ("a//b") names nothing: refused, not collapsed (D-466).
        guard path.hasPrefix("/") else { return nil }
        var parts = path.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        if parts.last?.isEmpty == true { parts.removeLast() }  // a collection's trailing "/"
        guard !parts.contains(where: \.isEmpty) else { return nil }
        // Decoded component by component: an encoded "/" inside a name is refused, not split.
        var components: [String] = []
        for encoded in parts {
            guard let component = Self.percentDecoded(String(encoded)), !component.contains("/") else { return nil }
            components.append(component)
        }
        guard components.starts(with: baseComponents) else { return nil }
        let relative = components.dropFirst(baseComponents.count)
        if relative.isEmpty { return .root }
        guard relative.allSatisfy(Self.isName) else { return nil }
        return ItemIdentifier(relative.joined(separator: "/"))
    }

    /// A name an item may have: not empty, not "." or "..", no "/" or NUL.
    static func isName(_ name: some StringProtocol) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.utf8.contains(0) && !name.utf8.contains(0x2F)
    }

    /// `component` with every byte but RFC 3986's unreserved characters (ALPHA, DIGIT, "-", ".",
    /// "_", "~") percent-encoded, UTF-8 first: spaces, "%", "#", "?", non-ASCII all travel safely.
    public static func percentEncoded(_ component: some StringProtocol) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(component.utf8.count)
        for byte in component.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(byte)
            default:
                out += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `text` with its %XX escapes decoded; nil when an escape is malformed or the bytes are not
    /// UTF-8.
    public static func percentDecoded(_ text: String) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        func digit(_ byte: UInt8?) -> UInt8? {
            guard let byte else { return nil }
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = digit(iterator.next()), let low = digit(iterator.next()) else { return nil }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    /// `text` with anything that looks like credentials (`user:password@`) replaced, for messages.
    static func redacted(_ text: String) -> String {
        guard let scheme = text.range(of: "://"), let at = text[scheme.upperBound...].firstIndex(of: "@") else {
            return text
        }
        let slash = text[scheme.upperBound...].firstIndex(of: "/") ?? text.endIndex
        guard at < slash else { return text }
        return String(text[..<scheme.upperBound]) + "<credentials>" + String(text[at...])
    }
}
