// The text form of a token: `pfs_<mount tag>_<secret>`, lowercase base32 (RFC 4648 alphabet,
// no padding), so it is safe in a path component and a URL. The mount tag (8 characters, 40
// random bits kept with the mount's tokens) tells this mount's tokens from another's; the secret
// is 160 bits from libcrypto's generator. Only encoding lives here: the randomness and the
// hashing are libcrypto's (CryptoSupport).

import CryptoSupport

struct TokenFormat: Sendable {
    static let prefix = Array("pfs_".utf8)
    static let tagLength = 8
    static let secretBytes = 20
    static let secretLength = 32  // 20 bytes = 160 bits = 32 base32 characters
    static let length = prefix.count + tagLength + 1 + secretLength
    static let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567".utf8)

    /// This mount's tag, 8 base32 characters.
    let tag: [UInt8]

    init(tag: [UInt8]) {
        precondition(tag.count == Self.tagLength && tag.allSatisfy(Self.isBase32))
        self.tag = tag
    }

    /// A fresh random mount tag (40 bits).
    static func randomTag() -> [UInt8] { base32(randomBytes(5)) }

    /// A new token of this mount: 160 secret bits.
    func newToken() -> String {
        let text = Self.prefix + tag + [UInt8(ascii: "_")] + Self.base32(randomBytes(Self.secretBytes))
        return String(decoding: text, as: UTF8.self)
    }

    enum Parsed: Equatable {
        case token([UInt8])
        case denied(TokenDenialReason)
    }

    /// Classifies `text` without looking anything up: this mount's well-formed token (its
    /// bytes), or why not: `notAToken` without the prefix `pfs_`, else `malformed`, `truncated`
    /// or `foreignMount`. Never reads more than `length + 1` bytes of the input.
    func parse(_ text: String) -> Parsed {
        // Not starting with the whole prefix, it cannot be a token: no guess (D-394).
        guard text.utf8.starts(with: Self.prefix) else { return .denied(.notAToken) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.length)
        for byte in text.utf8 {
            bytes.append(byte)
            if bytes.count > Self.length { return .denied(.malformed) }
        }
        // The prefix, then the tag, then "_", then the secret; a valid start of each part that
        // ends early is truncated, anything else is malformed.
        let tagStart = Self.prefix.count
        let separator = tagStart + Self.tagLength
        for (index, byte) in bytes.enumerated() {
            let fits: Bool
            if index < tagStart {
                fits = byte == Self.prefix[index]
            } else if index == separator {
                fits = byte == UInt8(ascii: "_")
            } else {
                fits = Self.isBase32(byte)
            }
            if !fits { return .denied(.malformed) }
        }
        if bytes.count >= separator, Array(bytes[tagStart..<separator]) != tag { return .denied(.foreignMount) }
        if bytes.count < Self.length {
            // A complete tag of another mount is foreign (above); a cut-short tag that does not
            // start like ours cannot be told apart from another mount's, and is truncated too.
            return .denied(.truncated)
        }
        return .token(bytes)
    }

    static func isBase32(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "2")...UInt8(ascii: "7")).contains(byte)
    }

    /// Lowercase base32 without padding.
    static func base32(_ bytes: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count * 8 + 4) / 5)
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                output.append(alphabet[Int((buffer >> UInt32(bits)) & 31)])
            }
        }
        if bits > 0 { output.append(alphabet[Int((buffer << UInt32(5 - bits)) & 31)]) }
        return output
    }
}
