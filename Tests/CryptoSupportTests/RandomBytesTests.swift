import CryptoSupport
import Testing

@Suite("Random bytes through libcrypto")
struct RandomBytesTests {
    @Test("the asked length, different every time, every byte value reachable")
    func lengthAndVariety() {
        #expect(randomBytes(0).isEmpty)
        #expect(randomBytes(1).count == 1)
        #expect(randomBytes(4096).count == 4096)
        let samples = (0..<64).map { _ in randomBytes(16) }
        #expect(Set(samples).count == 64, "two 128-bit draws were equal")
        // 64 KiB of output: every byte value appears (a stuck or short generator would not).
        let many = randomBytes(65536)
        #expect(Set(many).count == 256)
    }
}
