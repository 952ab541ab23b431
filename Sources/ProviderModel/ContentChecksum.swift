/// A digest of content bytes as a provider states them (RFC 9530's Content-Digest on an HTTP range
/// response; a WebDAV server's checksum of a whole file; the fault wrapper's digest of the bytes it
/// would have sent unmodified). The cache compares it with the digest of the bytes it received.
public struct ContentChecksum: Sendable, Hashable, CustomStringConvertible {
    /// The algorithms a digest may be in. MD5, SHA-1 and Adler-32 are what servers send
    /// (Apache's Content-MD5, ownCloud's `OC-Checksum: SHA1:…`): they detect damage on the way,
    /// not an attacker (who could drop the header as well, D-495).
    public enum Algorithm: String, Sendable, Hashable, Codable, CaseIterable {
        case sha256
        case sha512
        case sha1
        case md5
        case adler32

        /// The digest's length in bytes.
        public var digestLength: Int {
            switch self {
            case .sha256: 32
            case .sha512: 64
            case .sha1: 20
            case .md5: 16
            case .adler32: 4
            }
        }
    }
    public var algorithm: Algorithm
    public var digest: [UInt8]

    public init(_ algorithm: Algorithm, digest: [UInt8]) {
        self.algorithm = algorithm
        self.digest = digest
    }

    /// A checksum read back from its `description`; nil when `text` is not one (an unknown
    /// algorithm, a digest of the wrong length or not hexadecimal).
    public init?(description text: Substring) {
        let parts = text.split(separator: ":", maxSplits: 1)
        guard parts.count == 2, let algorithm = Algorithm(rawValue: String(parts[0])),
            let digest = Base16.decode(parts[1]), digest.count == algorithm.digestLength
        else { return nil }
        self.init(algorithm, digest: digest)
    }

    /// The algorithm's name (`sha256:`) followed by the digest in lowercase hexadecimal.
    public var description: String {
        let digits = Array("0123456789abcdef")
        return algorithm.rawValue + ":" + String(digest.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xF)]] })
    }
}

/// Hexadecimal digits, either case, two per byte; nil for anything else (or none).
package enum Base16 {
    package static func decode(_ text: Substring) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard !digits.isEmpty, digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case 0x30...0x39: digit - 0x30
        case 0x41...0x46: digit - 0x41 + 10
        case 0x61...0x66: digit - 0x61 + 10
        default: nil
        }
    }
}
