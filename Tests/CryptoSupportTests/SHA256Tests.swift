import CryptoSupport
import Testing

@Suite("SHA-256 through libcrypto")
struct SHA256Tests {
    @Test("known answers (FIPS 180-2 examples)")
    func knownAnswers() {
        #expect(hexString(SHA256.hash([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            hexString(SHA256.hash(Array("abc".utf8)))
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test("feeding in pieces gives the digest of the whole")
    func pieces() {
        let bytes = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        var hasher = SHA256()
        var index = 0
        var step = 1
        while index < bytes.count {
            let end = min(bytes.count, index + step)
            hasher.update(Array(bytes[index..<end]))
            index = end
            step = step * 3 + 1
        }
        #expect(hasher.finalize() == SHA256.hash(bytes))
    }

    @Test("constant-time comparison")
    func comparison() {
        #expect(constantTimeEquals([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEquals([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEquals([1, 2], [1, 2, 3]))
        #expect(constantTimeEquals([], []))
    }
}
