/// A digest of content bytes as a provider states them (RFC 9530's Content-Digest on an HTTP range
/// response; a WebDAV server's checksum of a whole file; the fault wrapper's digest of the bytes it
/// would have sent unmodified). The cache compares it with the digest of the bytes it received.
public struct ContentChecksum: Sendable, Hashable, CustomStringConvertible {
    public enum Algorithm: String, Sendable, Hashable, Codable {
        case sha256
    }
    public var algorithm: Algorithm
    public var digest: [UInt8]

    public init(_ algorithm: Algorithm, digest: [UInt8]) {
        self.algorithm = algorithm
        self.digest = digest
    }

    /// `sha256:` followed by the digest in lowercase hexadecimal.
    public var description: String {
        let digits = Array("0123456789abcdef")
        return algorithm.rawValue + ":" + String(digest.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xF)]] })
    }
}
