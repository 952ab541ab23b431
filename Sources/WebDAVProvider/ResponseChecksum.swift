// Checksums a server states in a GET's answer (D-495), each header read by its grammar (D-490):
// RFC 9530's Content-Digest (the bytes of this answer: valid for a 206) and Repr-Digest (the whole
// representation), both RFC 8941 Dictionaries of Byte Sequences; RFC 3230's Digest (the whole
// instance, base64 values); ownCloud / Nextcloud's OC-Checksum (`SHA1:<hex>`, several separated
// by spaces); Content-MD5 (base64), which Apache's `ContentDigest On` sends with the whole file's
// MD5 even on a 206 of a part (measured), so it is taken as the whole file's. A value outside its
// grammar is ignored as a whole; an algorithm not known here, or a digest of the wrong length, is
// skipped. `ResponseChecksum.usable` picks the one a fetch can be verified with; a whole-file
// answer that states none may be verified against the file's listed `oc:checksums` (D-519).

import ProviderModel

/// One checksum a header states, and what it covers.
struct StatedChecksum: Equatable, Sendable {
    enum Scope: Equatable, Sendable {
        /// The bytes of this response's body (Content-Digest).
        case body
        /// The whole file, whatever part the body is (Repr-Digest, Digest, OC-Checksum, Content-MD5).
        case file
    }
    let checksum: ContentChecksum
    let scope: Scope
    /// The header it came from (lowercase), for messages.
    let header: String
}

enum ResponseChecksum {
    /// Strongest first: the one a fetch is verified with when a server states several.
    static let preference: [ContentChecksum.Algorithm] = [.sha512, .sha256, .sha1, .md5, .adler32]

    /// The checksum a GET's answer lets the bytes of `range` be verified with: nil when `range`
    /// is longer than `limit`, the body is content-coded, or no stated checksum covers exactly
    /// the bytes delivered (a body checksum needs the body to be the range, a file checksum
    /// needs the range to be the whole file). `listed`: the file's checksums from its PROPFIND
    /// answer (`oc:checksums`, D-519), whole-file ones, taken only when the headers state none.
    static func usable(
        status: Int, headers: [String: String], range: Range<Int64>, limit: Int64, listed: [ContentChecksum] = []
    ) -> StatedChecksum? {
        guard Int64(range.count) <= limit, !range.isEmpty else { return nil }
        if let coding = headers["content-encoding"], coding.lowercased() != "identity" { return nil }
        let body: Range<Int64>
        let total: Int64
        switch status {
        case 206:
            guard let span = headers["content-range"].flatMap(ContentRange.init), let length = span.total else {
                return nil
            }
            body = span.first..<(span.last + 1)
            total = length
        case 200:
            guard let text = headers["content-length"], HTTPTransport.isDecimal(text), let length = Int64(text) else {
                return nil
            }
            body = 0..<length
            total = length
        default:
            return nil
        }
        guard body == range else { return nil }
        let wholeFile = range.lowerBound == 0 && range.upperBound == total
        var covering = stated(in: headers).filter { $0.scope == .body || wholeFile }
        if covering.isEmpty, wholeFile {
            covering = listed.map { StatedChecksum(checksum: $0, scope: .file, header: "oc:checksums") }
        }
        for algorithm in preference {
            if let found = covering.first(where: { $0.checksum.algorithm == algorithm }) { return found }
        }
        return nil
    }

    /// Every checksum the headers state (names lowercase), body checksums first.
    static func stated(in headers: [String: String]) -> [StatedChecksum] {
        var found: [StatedChecksum] = []
        func add(_ header: String, _ scope: StatedChecksum.Scope, _ read: (String) -> [ContentChecksum]?) {
            guard let value = headers[header], let checksums = read(value) else { return }
            found += checksums.map { StatedChecksum(checksum: $0, scope: scope, header: header) }
        }
        add("content-digest", .body, structuredDigests)
        add("repr-digest", .file, structuredDigests)
        add("digest", .file, instanceDigests)
        add("oc-checksum", .file, ownCloudChecksums)
        add("content-md5", .file) { contentMD5($0).map { [$0] } }
        return found
    }

    // MARK: RFC 9530 (Content-Digest, Repr-Digest)

    /// RFC 9530's algorithm keys this reads (the deprecated `md5` and `sha` too; `adler`,
    /// `crc32c`, `unixsum` and `unixcksum` are skipped).
    static let structuredAlgorithms: [String: ContentChecksum.Algorithm] = [
        "sha-256": .sha256, "sha-512": .sha512, "sha": .sha1, "md5": .md5,
    ]

    /// The digests of an RFC 9530 field: an RFC 8941 Dictionary whose members of a known
    /// algorithm are Byte Sequences of its digest's length (parameters are allowed and ignored).
    /// Nil when the value is no Dictionary.
    static func structuredDigests(_ value: String) -> [ContentChecksum]? {
        guard let members = StructuredFieldParser.dictionary(value) else { return nil }
        var digests: [String: ContentChecksum] = [:]
        var order: [String] = []
        for (key, member) in members {
            guard let algorithm = structuredAlgorithms[key] else { continue }
            if !order.contains(key) { order.append(key) }
            // A key given twice: the last value counts (RFC 8941 §4.2.2); one that is no digest of the
            // algorithm's length drops the key.
            if case .bytes(let bytes) = member, bytes.count == algorithm.digestLength {
                digests[key] = ContentChecksum(algorithm, digest: bytes)
            } else {
                digests[key] = nil
            }
        }
        return order.compactMap { digests[$0] }
    }

    // MARK: RFC 3230 (Digest)

    /// RFC 3230's algorithm names (case-insensitive) with base64 values (RFC 3230 §4.1.1, RFC 5843).
    static let instanceAlgorithms: [String: ContentChecksum.Algorithm] = [
        "sha-256": .sha256, "sha-512": .sha512, "sha": .sha1, "md5": .md5,
    ]

    /// The digests of a Digest field: `#( token "=" value )`, empty list elements allowed; values
    /// of a known algorithm strict base64 of its digest's length. Nil when the value is no such list.
    static func instanceDigests(_ value: String) -> [ContentChecksum]? {
        var digests: [ContentChecksum] = []
        for element in value.split(separator: ",", omittingEmptySubsequences: false) {
            let trimmed = element.trimmingOWS()
            if trimmed.isEmpty { continue }
            guard let equals = trimmed.firstIndex(of: "=") else { return nil }
            let name = trimmed[..<equals]
            let encoded = trimmed[trimmed.index(after: equals)...]
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenCharacter), !encoded.isEmpty,
                encoded.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
            else { return nil }
            guard let algorithm = instanceAlgorithms[name.lowercased()] else { continue }
            if let bytes = Base64.decode(encoded), bytes.count == algorithm.digestLength {
                digests.append(ContentChecksum(algorithm, digest: bytes))
            }
        }
        return digests
    }

    // MARK: ownCloud (OC-Checksum)

    static let ownCloudAlgorithms: [String: ContentChecksum.Algorithm] = [
        "SHA1": .sha1, "MD5": .md5, "ADLER32": .adler32, "SHA256": .sha256, "SHA512": .sha512,
    ]

    /// The checksums of an OC-Checksum field: `NAME:HEX` entries separated by single spaces (the
    /// form of ownCloud's `oc:checksums` property), names case-insensitive, ADLER32 as 8 hex digits.
    /// Nil when the value is not of that form.
    static func ownCloudChecksums(_ value: String) -> [ContentChecksum]? {
        var checksums: [ContentChecksum] = []
        for entry in value.split(separator: " ", omittingEmptySubsequences: false) {
            guard let colon = entry.firstIndex(of: ":") else { return nil }
            let name = entry[..<colon]
            let digits = entry[entry.index(after: colon)...]
            guard !name.isEmpty, name.utf8.allSatisfy(isAlphanumeric), let bytes = Base16.decode(digits) else {
                return nil
            }
            guard let algorithm = ownCloudAlgorithms[name.uppercased()], bytes.count == algorithm.digestLength else {
                continue
            }
            checksums.append(ContentChecksum(algorithm, digest: bytes))
        }
        return checksums
    }

    // MARK: Content-MD5 (RFC 1864)

    /// Exactly the 24 characters of a 16-byte digest in base64.
    static func contentMD5(_ value: String) -> ContentChecksum? {
        guard value.utf8.count == 24, let bytes = Base64.decode(Substring(value)), bytes.count == 16 else { return nil }
        return ContentChecksum(.md5, digest: bytes)
    }

    /// RFC 9110's tchar.
    static func isTokenCharacter(_ byte: UInt8) -> Bool {
        isAlphanumeric(byte) || "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }

    static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (RFC 9110's OWS).
    fileprivate func trimmingOWS() -> Substring {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text.removeFirst() }
        while let last = text.last, last == " " || last == "\t" { text.removeLast() }
        return text
    }
}

/// Base64 (RFC 4648 §4) read strictly: the alphabet, length a multiple of 4, `=` only as the
/// last one or two characters of the last quantum. Bits past the data in a padded quantum are not checked.
enum Base64 {
    static func decode(_ text: Substring) -> [UInt8]? {
        let characters = Array(text.utf8)
        guard !characters.isEmpty, characters.count % 4 == 0 else { return characters.isEmpty ? [] : nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(characters.count / 4 * 3)
        for start in stride(from: 0, to: characters.count, by: 4) {
            let last = start + 4 == characters.count
            var values: [UInt32] = []
            var padding = 0
            for offset in 0..<4 {
                let character = characters[start + offset]
                if character == UInt8(ascii: "=") {
                    // Only in the last quantum, only at its end, at most two.
                    guard last, offset >= 2 else { return nil }
                    padding += 1
                    continue
                }
                guard padding == 0, let value = sextet(character) else { return nil }
                values.append(value)
            }
            let word = values.enumerated().reduce(UInt32(0)) { $0 | $1.element << (18 - 6 * UInt32($1.offset)) }
            bytes.append(UInt8(word >> 16 & 0xFF))
            if padding < 2 { bytes.append(UInt8(word >> 8 & 0xFF)) }
            if padding < 1 { bytes.append(UInt8(word & 0xFF)) }
        }
        return bytes
    }

    private static func sextet(_ character: UInt8) -> UInt32? {
        switch character {
        case 0x41...0x5A: UInt32(character - 0x41)
        case 0x61...0x7A: UInt32(character - 0x61 + 26)
        case 0x30...0x39: UInt32(character - 0x30 + 52)
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }
}

/// RFC 8941's Dictionary (with RFC 9651's Dates and Display Strings), read by §4.2: enough to
/// find the Byte Sequences in it. Any step outside the grammar makes the whole field nil.
enum StructuredFieldParser {
    /// A member's value as far as the digests care.
    enum Value: Equatable {
        case bytes([UInt8])
        /// Any other item, or an inner list.
        case other
    }

    /// The members in field order (a repeated key appears again); nil when `text` is no Dictionary.
    static func dictionary(_ text: String) -> [(String, Value)]? {
        var parser = Cursor(Array(text.utf8))
        parser.skipSpaces()
        var members: [(String, Value)] = []
        while !parser.atEnd {
            guard let key = parser.key() else { return nil }
            var value = Value.other
            if parser.take(UInt8(ascii: "=")) {
                if parser.peek == UInt8(ascii: "(") {
                    guard parser.innerList() else { return nil }
                } else {
                    guard let item = parser.bareItem() else { return nil }
                    value = item
                }
            }
            guard parser.parameters() else { return nil }
            members.append((key, value))
            parser.skipOWS()
            if parser.atEnd { return members }
            guard parser.take(UInt8(ascii: ",")) else { return nil }
            parser.skipOWS()
            if parser.atEnd { return nil }  // a trailing comma
        }
        return members
    }

    private struct Cursor {
        let bytes: [UInt8]
        var index = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { index >= bytes.count }
        var peek: UInt8? { atEnd ? nil : bytes[index] }

        mutating func take(_ byte: UInt8) -> Bool {
            guard peek == byte else { return false }
            index += 1
            return true
        }

        mutating func skipSpaces() { while peek == 0x20 { index += 1 } }
        mutating func skipOWS() { while peek == 0x20 || peek == 0x09 { index += 1 } }

        static func isLowercaseAlpha(_ byte: UInt8) -> Bool { (0x61...0x7A).contains(byte) }
        static func isDigit(_ byte: UInt8) -> Bool { (0x30...0x39).contains(byte) }
        static func isAlpha(_ byte: UInt8) -> Bool { (0x41...0x5A).contains(byte) || isLowercaseAlpha(byte) }

        /// key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
        mutating func key() -> String? {
            guard let first = peek, Self.isLowercaseAlpha(first) || first == UInt8(ascii: "*") else { return nil }
            let start = index
            while let byte = peek, Self.isLowercaseAlpha(byte) || Self.isDigit(byte) || "_-.*".utf8.contains(byte) {
                index += 1
            }
            return String(decoding: bytes[start..<index], as: UTF8.self)
        }

        /// *( ";" *SP key [ "=" bare-item ] )
        mutating func parameters() -> Bool {
            while take(UInt8(ascii: ";")) {
                skipSpaces()
                guard key() != nil else { return false }
                if take(UInt8(ascii: "=")) { guard bareItem() != nil else { return false } }
            }
            return true
        }

        /// "(" *SP [ item *( 1*SP item ) *SP ] ")" parameters
        mutating func innerList() -> Bool {
            guard take(UInt8(ascii: "(")) else { return false }
            while true {
                skipSpaces()
                if take(UInt8(ascii: ")")) { return parameters() }
                guard bareItem() != nil, parameters() else { return false }
                guard peek == 0x20 || peek == UInt8(ascii: ")") else { return false }
            }
        }

        mutating func bareItem() -> Value? {
            guard let first = peek else { return nil }
            switch first {
            case UInt8(ascii: "-"), 0x30...0x39: return number() ? .other : nil
            case UInt8(ascii: "\""): return string() ? .other : nil
            case UInt8(ascii: ":"): return byteSequence().map { .bytes($0) }
            case UInt8(ascii: "?"):
                index += 1
                return take(UInt8(ascii: "0")) || take(UInt8(ascii: "1")) ? .other : nil
            case UInt8(ascii: "@"):
                index += 1
                return number(integerOnly: true) ? .other : nil
            case UInt8(ascii: "%"): return displayString() ? .other : nil
            case _ where Self.isAlpha(first) || first == UInt8(ascii: "*"): return token() ? .other : nil
            default: return nil
            }
        }

        /// Integer (at most 15 digits) or Decimal (at most 12 integer and 1-3 fraction digits).
        mutating func number(integerOnly: Bool = false) -> Bool {
            _ = take(UInt8(ascii: "-"))
            var integerDigits = 0
            while let byte = peek, Self.isDigit(byte) {
                index += 1
                integerDigits += 1
            }
            guard integerDigits > 0 else { return false }
            guard !integerOnly, take(UInt8(ascii: ".")) else { return integerDigits <= 15 }
            var fractionDigits = 0
            while let byte = peek, Self.isDigit(byte) {
                index += 1
                fractionDigits += 1
            }
            return integerDigits <= 12 && (1...3).contains(fractionDigits)
        }

        /// DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, characters %x20-7E.
        mutating func string() -> Bool {
            index += 1
            while let byte = peek {
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return true
                case UInt8(ascii: "\\"):
                    guard take(UInt8(ascii: "\"")) || take(UInt8(ascii: "\\")) else { return false }
                case 0x20...0x7E: continue
                default: return false
                }
            }
            return false
        }

        /// ( ALPHA / "*" ) *( tchar / ":" / "/" )
        mutating func token() -> Bool {
            index += 1
            while let byte = peek,
                ResponseChecksum.isTokenCharacter(byte) || byte == UInt8(ascii: ":")
                    || byte == UInt8(ascii: "/")
            {
                index += 1
            }
            return true
        }

        /// ":" base64 ":" (padded, RFC 4648 §4).
        mutating func byteSequence() -> [UInt8]? {
            index += 1
            let start = index
            while let byte = peek, byte != UInt8(ascii: ":") { index += 1 }
            guard take(UInt8(ascii: ":")) else { return nil }
            let text = String(decoding: bytes[start..<(index - 1)], as: UTF8.self)
            return Base64.decode(Substring(text))
        }

        /// "%" DQUOTE *( unescaped / "%" 2lowercase-hex ) DQUOTE (RFC 9651).
        mutating func displayString() -> Bool {
            index += 1
            guard take(UInt8(ascii: "\"")) else { return false }
            while let byte = peek {
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return true
                case UInt8(ascii: "%"):
                    for _ in 0..<2 {
                        guard let digit = peek, Self.isDigit(digit) || (0x61...0x66).contains(digit) else {
                            return false
                        }
                        index += 1
                    }
                case 0x20...0x7E: continue
                default: return false
                }
            }
            return false
        }
    }
}
