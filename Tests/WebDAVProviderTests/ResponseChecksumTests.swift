// The checksum headers of a GET's answer (D-495): each read by its grammar, what a fetch may be
// verified with, and seeded fuzzing of the readers against an oracle that shares none of their
// code (regular expressions of the grammars, Foundation's base64 decoder) in the manner of
// HTTPHeaderFuzzTests (D-490).
//
// Replay: PROVIDERFS_TEST_SEED=<seed> swift test --filter ResponseChecksumTests

import CryptoSupport
import Foundation
import ProviderModel
import TestSupport
import Testing

@testable import WebDAVProvider

@Suite struct ResponseChecksumTests {
    let seed = SeededRandom.seedFromEnvironment()
    let rounds = environmentInteger("PROVIDERFS_FUZZ_ROUNDS", default: 3000)
    var replay: String { "replay: PROVIDERFS_TEST_SEED=\(seed)" }

    static let body = Array(#"{"hello": "world"}"#.utf8)
    static func base64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }
    static func sha256(_ bytes: [UInt8]) -> ContentChecksum {
        ContentChecksum(.sha256, digest: Digest.hash(.sha256, bytes))
    }

    /// RFC 9530 §B's own example (`{"hello": "world"}`), parameters, several algorithms, unknown
    /// and mis-sized members skipped, anything else outside RFC 8941 refused as a whole.
    @Test func contentDigestIsAnRFC8941Dictionary() {
        let example = "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        #expect(ResponseChecksum.structuredDigests(example) == [Self.sha256(Self.body)])
        let sha512 = ContentChecksum(.sha512, digest: Digest.hash(.sha512, Self.body))
        let both = "sha-512=:\(Self.base64(sha512.digest)):;a=1;b=?0,\t\(example) ,  crc32c=:AAAAAA==:, unixsum=30637"
        #expect(ResponseChecksum.structuredDigests(both) == [sha512, Self.sha256(Self.body)])
        // Other items and inner lists are members too.
        #expect(
            ResponseChecksum.structuredDigests(
                #"a=(1 "x" tok), b="s\"q", c=-1.5, d=@1659578233, e=%"f%c3%bc", "#
                    + example) == [Self.sha256(Self.body)])
        // A digest of the wrong length drops its key; a repeated key: the last value counts.
        #expect(ResponseChecksum.structuredDigests("sha-256=:AAAA:") == [])
        #expect(ResponseChecksum.structuredDigests("sha-256=:AAAA:, " + example) == [Self.sha256(Self.body)])
        #expect(ResponseChecksum.structuredDigests(example + ", sha-256=:AAAA:") == [])
        for broken in [
            "SHA-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:",  // keys are lowercase
            example + ",", "," + example, example + " x", "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE:",
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            "sha-256=\"unterminated", "sha-256=1234567890123456",
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyW xBf7kbu9DBPE=:",
            "a=(1 2", "a=?2", "a=1.2345",
        ] {
            #expect(ResponseChecksum.structuredDigests(broken) == nil, "\(broken)")
        }
    }

    @Test func digestOCChecksumAndContentMD5AreReadStrictly() {
        let md5 = ContentChecksum(.md5, digest: Digest.hash(.md5, Self.body))
        let sha1 = ContentChecksum(.sha1, digest: Digest.hash(.sha1, Self.body))
        let adler = ContentChecksum(.adler32, digest: Digest.hash(.adler32, Self.body))
        // RFC 3230: case-insensitive names, base64, empty list elements, unknown algorithms skipped.
        #expect(
            ResponseChecksum.instanceDigests(
                "MD5=\(Self.base64(md5.digest)), UNIXsum=30637,, sha=\(Self.base64(sha1.digest))")
                == [md5, sha1])
        #expect(ResponseChecksum.instanceDigests("MD5=\(hexString(md5.digest))") == [])  // hex is not base64
        for broken in ["MD5", "=abc", "MD5=", "MD 5=abc", "MD5=a b"] {
            #expect(ResponseChecksum.instanceDigests(broken) == nil, "\(broken)")
        }
        // ownCloud: NAME:hex, either case, several separated by one space.
        let oc =
            "SHA1:\(hexString(sha1.digest)) md5:\(hexString(md5.digest).uppercased()) ADLER32:\(hexString(adler.digest))"
        #expect(ResponseChecksum.ownCloudChecksums(oc) == [sha1, md5, adler])
        #expect(ResponseChecksum.ownCloudChecksums("SHA3-256:00") == nil)  // not a name of letters and digits
        #expect(ResponseChecksum.ownCloudChecksums("CRC32:0011aabb") == [])
        for broken in ["SHA1:", "SHA1:xyz", "SHA1:abc", ":00", "SHA1 abcd", "SHA1:00  MD5:00", " SHA1:00"] {
            #expect(ResponseChecksum.ownCloudChecksums(broken) == nil, "\(broken)")
        }
        #expect(ResponseChecksum.contentMD5(Self.base64(md5.digest)) == md5)
        for broken in ["", Self.base64(md5.digest) + " ", String(Self.base64(md5.digest).dropLast(2)), "short"] {
            #expect(ResponseChecksum.contentMD5(broken) == nil, "\(broken)")
        }
    }

    /// A body checksum is used when the body is exactly the range; a file checksum only when the
    /// range is the whole file; none past the limit or under a content coding; the strongest of several.
    @Test func aFetchIsVerifiedOnlyWithAChecksumOfExactlyItsBytes() {
        let digest = "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        let file = "SHA1:" + String(repeating: "ab", count: 20)
        func usable(
            _ status: Int, _ headers: [String: String], _ range: Range<Int64>, limit: Int64 = 100
        )
            -> String?
        {
            ResponseChecksum.usable(status: status, headers: headers, range: range, limit: limit).map {
                "\($0.header) \($0.checksum.algorithm)"
            }
        }
        let part = ["content-range": "bytes 10-19/50", "content-digest": digest, "oc-checksum": file]
        #expect(usable(206, part, 10..<20) == "content-digest sha256")
        #expect(usable(206, part, 10..<20, limit: 9) == nil)
        #expect(usable(206, part, 10..<21) == nil)  // the body is not the range asked for
        #expect(usable(206, part.filter { $0.key != "content-digest" }, 10..<20) == nil)  // a part: no file checksum
        let whole = ["content-range": "bytes 0-49/50", "oc-checksum": file, "content-md5": "AAAAAAAAAAAAAAAAAAAAAA=="]
        #expect(usable(206, whole, 0..<50) == "oc-checksum sha1")
        #expect(usable(206, whole.merging(["content-range": "bytes 0-49/*"]) { $1 }, 0..<50) == nil)
        #expect(usable(206, whole.merging(["content-encoding": "gzip"]) { $1 }, 0..<50) == nil)
        #expect(
            usable(200, ["content-length": "50", "content-md5": "AAAAAAAAAAAAAAAAAAAAAA=="], 0..<50)
                == "content-md5 md5")
        #expect(usable(200, ["content-length": "50", "oc-checksum": file], 10..<50) == nil)  // Range ignored
        #expect(usable(200, ["oc-checksum": file], 0..<50) == nil)  // no length: not known to be the range
        #expect(usable(404, ["content-length": "50", "oc-checksum": file], 0..<50) == nil)
    }

    // MARK: Fuzzing

    static let keys = ["sha-256", "sha-512", "md5", "sha", "crc32c", "adler", "x"]

    /// A random Content-Digest value of the simple form (members `key=:base64:` with parameters).
    static func structuredValue(_ random: inout SeededRandom) -> String {
        (0..<Int.random(in: 1...3, using: &random)).map { _ in
            let key = keys.randomElement(using: &random)!
            let length = [16, 20, 32, 64, 4, 3].randomElement(using: &random)!
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            let parameter = Bool.random(using: &random) ? ";p=1" : ""
            return "\(key)=:\(base64(bytes)):\(parameter)"
        }.joined(separator: [", ", ",", ",\t"].randomElement(using: &random)!)
    }

    static let structuredOracleAlgorithms: [String: ContentChecksum.Algorithm] = [
        "sha-256": .sha256, "sha-512": .sha512, "md5": .md5, "sha": .sha1,
    ]

    /// The oracle for values of the simple form: a regular expression of it, Foundation's base64,
    /// the last value of a key counting. Nil: not of the simple form (the oracle does not judge it).
    static func oracleStructured(_ value: String) -> [ContentChecksum]? {
        let member = #"([a-z*][a-z0-9_.*-]*)=:([A-Za-z0-9+/=]*):(?:;[a-z*][a-z0-9_.*-]*(?:=[0-9]{1,15})?)*"#
        guard HTTPHeaderFuzzTests.groups(" *\(member)(?:[ \t]*,[ \t]*\(member))*[ \t]*", value) != nil else {
            return nil
        }
        let expression = try! NSRegularExpression(pattern: member)
        var found: [String: ContentChecksum?] = [:]
        var order: [String] = []
        for match in expression.matches(in: value, range: NSRange(value.startIndex..., in: value)) {
            let key = String(value[Range(match.range(at: 1), in: value)!])
            let encoded = String(value[Range(match.range(at: 2), in: value)!])
            // A Byte Sequence that is not base64 fails the whole field (RFC 8941 §4.2.7).
            guard let decoded = oracleBase64(encoded) else { return nil }
            guard let algorithm = structuredOracleAlgorithms[key] else { continue }
            if !order.contains(key) { order.append(key) }
            found[key] = decoded.count == algorithm.digestLength ? ContentChecksum(algorithm, digest: decoded) : nil
        }
        return order.compactMap { found[$0] ?? nil }
    }

    /// RFC 4648 §4 base64: its grammar as a regular expression, decoded by Foundation.
    static func oracleBase64(_ text: String) -> [UInt8]? {
        guard HTTPHeaderFuzzTests.groups("(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?", text) != nil
        else { return nil }
        return text.isEmpty ? [] : Data(base64Encoded: text).map { [UInt8]($0) }
    }

    @Test func structuredDigestsAgreeWithTheOracle() {
        var random = SeededRandom(seed: seed)
        var judged = 0
        for _ in 0..<rounds {
            let valid = Self.structuredValue(&random)
            for value in [valid, HTTPHeaderFuzzTests.mutated(valid, &random)] {
                let parsed = ResponseChecksum.structuredDigests(value)
                if let expected = Self.oracleStructured(value) {
                    judged += 1
                    #expect(parsed == expected, "Content-Digest '\(value.debugDescription)'; \(replay)")
                }
                // Whatever the form, a digest read is one the value states, as Foundation decodes it.
                let sequences = try! NSRegularExpression(pattern: ":([A-Za-z0-9+/=]*):").matches(
                    in: value, range: NSRange(value.startIndex..., in: value)
                ).compactMap { Self.oracleBase64(String(value[Range($0.range(at: 1), in: value)!])) }
                for checksum in parsed ?? [] {
                    #expect(
                        sequences.contains(checksum.digest),
                        "Content-Digest '\(value.debugDescription)' gave \(checksum); \(replay)")
                }
            }
        }
        #expect(judged >= rounds, "the grammar's own values are judged; \(replay)")
    }

    @Test func ownCloudChecksumsAndContentMD5AgreeWithTheOracle() {
        var random = SeededRandom(seed: seed)
        let names = ["SHA1": ContentChecksum.Algorithm.sha1, "MD5": .md5, "ADLER32": .adler32, "SHA256": .sha256]
        let oracleNames = names.merging(["SHA512": .sha512], uniquingKeysWith: { $1 })
        var accepted = 0
        for _ in 0..<rounds {
            let entries = (0..<Int.random(in: 1...3, using: &random)).map { _ -> String in
                let name = (Array(names.keys) + ["CRC32"]).randomElement(using: &random)!
                let length = names[name]?.digestLength ?? 4
                let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
                return "\(Bool.random(using: &random) ? name : name.lowercased()):\(hexString(bytes))"
            }
            let valid = entries.joined(separator: " ")
            for value in [valid, HTTPHeaderFuzzTests.mutated(valid, &random)] {
                let parsed = ResponseChecksum.ownCloudChecksums(value)
                var expected: [ContentChecksum]?
                if HTTPHeaderFuzzTests.groups(
                    "[A-Za-z0-9]+:(?:[0-9A-Fa-f]{2})+(?: [A-Za-z0-9]+:(?:[0-9A-Fa-f]{2})+)*", value)
                    != nil
                {
                    expected = value.split(separator: " ").compactMap { entry in
                        let parts = entry.split(separator: ":")
                        guard let algorithm = oracleNames[parts[0].uppercased()] else { return nil }
                        let digits = Array(parts[1])
                        let bytes = stride(from: 0, to: digits.count, by: 2).map {
                            UInt8(String(digits[$0..<$0 + 2]), radix: 16)!
                        }
                        return bytes.count == algorithm.digestLength ? ContentChecksum(algorithm, digest: bytes) : nil
                    }
                }
                #expect(parsed == expected, "OC-Checksum '\(value.debugDescription)'; \(replay)")
                if parsed != nil { accepted += 1 }
            }
            let md5 = (0..<16).map { _ in UInt8.random(in: 0...255, using: &random) }
            for value in [Self.base64(md5), HTTPHeaderFuzzTests.mutated(Self.base64(md5), &random)] {
                let expected = Self.oracleBase64(value).flatMap {
                    $0.count == 16 ? ContentChecksum(.md5, digest: $0) : nil
                }
                #expect(
                    ResponseChecksum.contentMD5(value) == expected, "Content-MD5 '\(value.debugDescription)'; \(replay)"
                )
            }
        }
        #expect(accepted >= rounds, "the grammar's own values are accepted; \(replay)")
    }
}
