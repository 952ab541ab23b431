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
            #expect(fixture.authority.check("pfs_nonsense!", caller: me) == .denied(.malformed))
            fixture.clock.advance(by: .milliseconds(60))
        }
        #expect(fixture.authority.auditLog().filter { $0.event == .rateLimited }.isEmpty)
    }

    /// Which names count towards the limit (D-394): 21 checks of the name in a second, then the
    /// real token from the same user is refused unread only if the name counted.
    @Test(
        "only names with the token prefix count as guesses; probes like .providerfs-package never throttle",
        arguments: [
            (".providerfs-package", false), (".git", false), ("Thumbs.db", false), ("", false), ("p", false),
            ("pfs", false), ("PFS_abc", false), ("pfs_", true), ("pfs_nonsense!", true), ("pfs_abc", true),
            ("<foreign>", true), ("<unknown>", true),
        ])
    func whichNamesCount(name: String, counts: Bool) throws {
        let fixture = TokenFixture()
        let other = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        let presented: String
        switch name {
        case "<foreign>": presented = try other.authority.grant(scope: scope, mode: .read).token
        case "<unknown>": presented = "pfs_\(fixture.authority.mountTag)_" + String(repeating: "a", count: 32)
        default: presented = name
        }
        for _ in 0..<21 { _ = fixture.authority.check(presented, caller: me) }
        let real = fixture.authority.check(issued.token, caller: me)
        #expect((real == .denied(.rateLimited)) == counts, "\(name): \(real)")
        #expect(fixture.authority.auditLog().contains { $0.event == .denial } == counts, "\(name)")
    }

    @Test("a flood of probes: never logged, counted or throttled; answered even during a burst of real guesses")
    func probes() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        var pidAsked = 0
        for _ in 0..<1000 {
            #expect(fixture.authority.check(".providerfs-package", caller: me) == .denied(.notAToken))
            // The caller's process is not worked out for a name that is logged nowhere.
            let decision = fixture.authority.check(".git", uid: me.uid) {
                pidAsked += 1
                return me.pid
            }
            #expect(decision == .denied(.notAToken))
            #expect(fixture.authority.recordUse("Thumbs.db", caller: me) == .denied(.notAToken))
        }
        #expect(pidAsked == 0)
        #expect(fixture.authority.auditLog().map(\.event) == [.grant])
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        // Brute force is still limited: 21 well-formed guesses start a burst; a probe during it is
        // still answered for what it is, and does not extend the burst.
        let guess = "pfs_\(fixture.authority.mountTag)_" + String(repeating: "b", count: 32)
        for _ in 0..<21 { #expect(fixture.authority.check(guess, caller: me) == .denied(.unknown)) }
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.rateLimited))
        #expect(fixture.authority.check(".providerfs-package", caller: me) == .denied(.notAToken))
        fixture.clock.advance(by: .milliseconds(900))
        #expect(fixture.authority.check(".providerfs-package", caller: me) == .denied(.notAToken))
        fixture.clock.advance(by: .milliseconds(200))
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        #expect(fixture.authority.auditLog().filter { $0.event == .denial }.count == 21)
    }
}
