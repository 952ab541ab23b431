import AccessTokens
import Foundation
import TestSupport
import Testing

@Suite("Token bad input")
struct TokenBadInputTests {
    /// Limits that never throttle, so each input is judged on its own.
    static var unthrottled: TokenLimits {
        var limits = TokenLimits()
        limits.deniedPerWindow = Int.max
        return limits
    }

    @Test("not a token, malformed, truncated, foreign, long, non-ASCII and empty: each denied with its reason")
    func reasons() throws {
        let fixture = TokenFixture(limits: Self.unthrottled)
        let other = TokenFixture(limits: Self.unthrottled)
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        let token = issued.token
        let authority = fixture.authority
        let tag = authority.mountTag
        // Without the prefix `pfs_`: not a token at all (D-394), neither logged nor counted.
        #expect(authority.check("", caller: me) == .denied(.notAToken))
        #expect(authority.check("hello", caller: me) == .denied(.notAToken))
        #expect(authority.check("PFS_" + token.dropFirst(4), caller: me) == .denied(.notAToken))
        #expect(authority.check(token.uppercased(), caller: me) == .denied(.notAToken))
        #expect(authority.check(" " + token, caller: me) == .denied(.notAToken))
        #expect(authority.check(String(repeating: "a", count: 1 << 20), caller: me) == .denied(.notAToken))
        for length in [1, 3] {
            #expect(authority.check(String(token.prefix(length)), caller: me) == .denied(.notAToken), "\(length)")
        }
        #expect(authority.auditLog().map(\.event) == [.grant])
        #expect(authority.check(token + "a", caller: me) == .denied(.malformed))
        #expect(authority.check(token + "/", caller: me) == .denied(.malformed))
        #expect(authority.check(String(token.dropLast()) + "1", caller: me) == .denied(.malformed))
        #expect(authority.check(String(token.dropLast()) + "é", caller: me) == .denied(.malformed))
        #expect(
            authority.check("pfs_" + tag + "_" + String(repeating: "😀", count: 8), caller: me) == .denied(.malformed))
        #expect(authority.check(token + String(repeating: "a", count: 100_000), caller: me) == .denied(.malformed))
        #expect(authority.check(String(token.dropLast()) + "\u{0}", caller: me) == .denied(.malformed))
        for length in [4, 6, 12, 13, 20, 44] {
            #expect(authority.check(String(token.prefix(length)), caller: me) == .denied(.truncated), "\(length)")
        }
        let foreign = try other.authority.grant(scope: scope, mode: .read).token
        #expect(other.authority.mountTag != tag)
        #expect(authority.check(foreign, caller: me) == .denied(.foreignMount))
        #expect(authority.check(String(foreign.prefix(20)), caller: me) == .denied(.foreignMount))
        #expect(authority.check(String(foreign.prefix(12)), caller: me) == .denied(.foreignMount))
        // This mount's shape, never granted: one character changed.
        let last = token.last == "a" ? "b" : "a"
        #expect(authority.check(String(token.dropLast()) + last, caller: me) == .denied(.unknown))
        // The real one still works, and every denial is in the log with its reason.
        #expect(authority.check(token, caller: me).grant != nil)
        let reasons = authority.auditLog().compactMap(\.reason)
        #expect(reasons.count == 17)
        #expect(Set(reasons) == [.malformed, .truncated, .foreignMount, .unknown])
    }

    @Test("a fuzz of 20,000 random strings and mutations of a real token never grants access")
    func fuzz() throws {
        let fixture = TokenFixture(limits: Self.unthrottled)
        let issued = try fixture.authority.grant(scope: scope, mode: .readWrite)
        let token = Array(issued.token.utf8)
        let seed = SeededRandom.seedFromEnvironment()
        var random = SeededRandom(seed: seed)
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567_pfs".utf8) + [0, 0x2F, 0xC3, 0xA9, 0xFF]
        var denied = 0
        for round in 0..<20_000 {
            var bytes: [UInt8]
            switch round % 4 {
            case 0:
                bytes = (0..<Int.random(in: 0...64, using: &random)).map { _ in alphabet.randomElement(using: &random)!
                }
            case 1:
                bytes = token
                let index = Int.random(in: 0..<bytes.count, using: &random)
                var replacement = alphabet.randomElement(using: &random)!
                while replacement == bytes[index] { replacement = alphabet.randomElement(using: &random)! }
                bytes[index] = replacement
            case 2:
                bytes = Array("pfs_\(fixture.authority.mountTag)_".utf8)
                bytes += (0..<32).map { _ in alphabet[Int.random(in: 0..<32, using: &random)] }
            default:
                bytes = (0..<Int.random(in: 0...200, using: &random)).map { _ in
                    UInt8.random(in: 0...255, using: &random)
                }
            }
            let text = String(decoding: bytes, as: UTF8.self)
            if text == issued.token { continue }
            if fixture.authority.check(text, caller: me).grant == nil { denied += 1 }
        }
        #expect(denied == 20_000, "seed \(seed) (PROVIDERFS_TEST_SEED replays it)")
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
    }
}
