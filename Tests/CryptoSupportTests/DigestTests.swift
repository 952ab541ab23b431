// The digests a server may state for content (D-495): libcrypto's, and Adler-32 written here,
// checked against known answers (FIPS 180, RFC 1321, zlib's adler32 for the Adler-32 values).

import CryptoSupport
import Testing

@Suite("Digests of server checksums")
struct DigestTests {
    @Test("known answers of each kind")
    func knownAnswers() {
        let abc = Array("abc".utf8)
        #expect(hexString(Digest.hash(.sha256, abc)) == hexString(SHA256.hash(abc)))
        #expect(hexString(Digest.hash(.md5, abc)) == "900150983cd24fb0d6963f7d28e17f72")
        #expect(hexString(Digest.hash(.sha1, abc)) == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(
            hexString(Digest.hash(.sha512, abc))
                == "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
                + "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f")
        #expect(hexString(Digest.hash(.adler32, Array("Wikipedia".utf8))) == "11e60398")
        #expect(hexString(Digest.hash(.adler32, [])) == "00000001")
        // Past zlib's NMAX (5552 bytes) and with every byte 0xFF: the sums are reduced in time.
        #expect(hexString(Digest.hash(.adler32, [UInt8](repeating: 0xFF, count: 1 << 20))) == "8e88ef11")
        for kind in Digest.Kind.allCases { #expect(Digest.hash(kind, abc).count == kind.length) }
    }

    @Test("feeding in pieces gives the digest of the whole")
    func pieces() {
        let bytes = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        #expect(hexString(Digest.hash(.adler32, bytes)) == "4cf597af")
        for kind in Digest.Kind.allCases {
            var digest = Digest(kind)
            var index = 0
            var step = 1
            while index < bytes.count {
                let end = min(bytes.count, index + step)
                digest.update(Array(bytes[index..<end]))
                index = end
                step = step * 3 + 1
            }
            #expect(digest.finalize() == Digest.hash(kind, bytes), "\(kind)")
        }
    }
}
