import AccessTokens
import Foundation
import TestSupport
import Testing

@Suite("Token rate limiting")
struct TokenRateLimitTests {
    @Test("a burst of guesses: 20 denials a second pass, then refused unread with one summary entry per burst")
    func burst() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        let guess = "pfs_\(fixture.authority.mountTag)_" + String(repeating: "a", count: 32)
        var reasons: [TokenDenialReason] = []
        for _ in 0..<1000 {
            reasons.append(fixture.authority.check(guess, caller: me).denialReason ?? .malformed)
        }
        // The 21st denial within the window is still answered and logged; it starts the burst.
        #expect(reasons.prefix(21).allSatisfy { $0 == .unknown })
        #expect(reasons.dropFirst(21).allSatisfy { $0 == .rateLimited })
        // Even the real token is refused unread from that user during the burst; other users are not.
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.rateLimited))
        let other = TokenCaller(pid: 5000, uid: 1001)
        #expect(fixture.authority.check(issued.token, caller: other).grant != nil)
        // The burst lasts while guesses keep coming within a second of each other.
        fixture.clock.advance(by: .milliseconds(900))
        #expect(fixture.authority.check(guess, caller: me) == .denied(.rateLimited))
        #expect(fixture.authority.auditLog().filter { $0.event == .rateLimited }.isEmpty)
        fixture.clock.advance(by: .seconds(1))
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        let log = fixture.authority.auditLog()
        #expect(log.filter { $0.event == .denial }.count == 21)
        let summaries = log.filter { $0.event == .rateLimited }
        #expect(summaries.count == 1)
        #expect(summaries.first?.uid == me.uid)
        #expect(summaries.first?.count == 1000 - 21 + 2)
        #expect(log.count < 30)
    }

    @Test("denials of real tokens (expired, revoked) do not count as guesses; slow guessing is never throttled")
    func notGuesses() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        try fixture.authority.revoke(id: issued.id)
        for _ in 0..<100 { #expect(fixture.authority.check(issued.token, caller: me) == .denied(.revoked)) }
        for _ in 0..<100 {
            #expect(fixture.authority.check("nonsense", caller: me) == .denied(.malformed))
            fixture.clock.advance(by: .milliseconds(60))
        }
        #expect(fixture.authority.auditLog().filter { $0.event == .rateLimited }.isEmpty)
    }
}
