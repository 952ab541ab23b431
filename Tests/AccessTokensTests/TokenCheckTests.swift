import AccessTokens
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Token checks")
struct TokenCheckTests {
    @Test("the pid-free check (D-344) ends a token at its deadline, for a handle opened before it too")
    func pidFreeCheckExpiry() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(2))
        // A handle opened before the expiry holds a use; each of its reads asks the pid-free check.
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant?.id == issued.id)
        let pidLookups = Locked(0)
        let pid = {
            pidLookups.withLock { $0 += 1 }
            return me.pid
        }
        fixture.clock.advance(by: .seconds(2) - .nanoseconds(1))
        #expect(fixture.authority.check(issued.token, uid: me.uid, pid: pid).grant?.id == issued.id)
        #expect(pidLookups.value == 0, "answered by the pid-free check: no process looked up")
        fixture.clock.advance(by: .nanoseconds(1))
        #expect(fixture.authority.check(issued.token, uid: me.uid, pid: pid) == .denied(.expired))
        #expect(fixture.authority.check(issued.token, uid: me.uid, pid: pid) == .denied(.expired), "and stays so")
        #expect(fixture.authority.info(id: issued.id)?.state == .expired)
        fixture.authority.endUse(id: issued.id)
        #expect(fixture.authority.check(issued.token, uid: me.uid, pid: pid) == .denied(.expired), "after the close")
    }

    @Test("a valid token is allowed with its grant; it ends exactly at its monotonic deadline")
    func expiry() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .readWrite, ttl: .seconds(2))
        let allowed = fixture.authority.check(issued.token, caller: me)
        #expect(
            allowed
                == .allowed(TokenGrant(id: issued.id, scope: scope, mode: .readWrite, timeLeft: .seconds(2)))
                as TokenDecision)
        fixture.clock.advance(by: .seconds(2) - .nanoseconds(1))
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        fixture.clock.advance(by: .nanoseconds(1))
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.expired))
        let row = try #require(fixture.authority.info(id: issued.id))
        #expect(row.state == .expired && row.timeLeft == .zero)
        #expect(fixture.authority.list().isEmpty)
        let events = fixture.authority.auditLog().map(\.event)
        #expect(events == [.grant, .expiry, .denial])
        #expect(fixture.authority.auditLog().last?.reason == .expired)
    }

    @Test("wall-clock jumps change neither expiry nor time left, only the displayed wall-clock expiry")
    func wallClockJumps() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(60))
        fixture.wall.jump(by: 3600)
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        var row = try #require(fixture.authority.info(id: issued.id))
        #expect(row.timeLeft == .seconds(60))
        #expect(row.expiresAt == fixture.wall.now.addingTimeInterval(60))
        fixture.wall.jump(by: -7200)
        fixture.clock.advance(by: .seconds(59))
        row = try #require(fixture.authority.info(id: issued.id))
        #expect(row.timeLeft == .seconds(1))
        #expect(row.expiresAt == fixture.wall.now.addingTimeInterval(1))
        fixture.clock.advance(by: .seconds(1))
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.expired))
    }

    @Test("revoke and expire end a live token at once; a second time is an error; unknown ids are errors")
    func revokeAndExpire() throws {
        let fixture = TokenFixture()
        let first = try fixture.authority.grant(scope: scope, mode: .read)
        let second = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(600))
        try fixture.authority.revoke(id: first.id)
        try fixture.authority.expire(id: second.id)
        #expect(fixture.authority.check(first.token, caller: me) == .denied(.revoked))
        #expect(fixture.authority.check(second.token, caller: me) == .denied(.expired))
        #expect(throws: TokenCommandError.alreadyEnded(id: first.id, .revoked)) {
            try fixture.authority.revoke(id: first.id)
        }
        #expect(throws: TokenCommandError.alreadyEnded(id: second.id, .expired)) {
            try fixture.authority.expire(id: second.id)
        }
        #expect(throws: TokenCommandError.unknownID("000000000000")) {
            try fixture.authority.revoke(id: "000000000000")
        }
        #expect(fixture.authority.list().isEmpty)
        #expect(
            fixture.authority.list(includeEnded: true).map(\.state).sorted { $0.rawValue < $1.rawValue } == [
                .expired, .revoked,
            ])
        let events = fixture.authority.auditLog().map(\.event)
        #expect(events == [.grant, .grant, .revocation, .expiry, .denial, .denial])
    }

    @Test("uses: each open takes one; after the last, opens are refused and the open handles read on until they end")
    func uses() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, uses: 2)
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        #expect(fixture.authority.info(id: issued.id)?.usesLeft == 2)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        #expect(fixture.authority.info(id: issued.id)?.usesLeft == 1)
        #expect(fixture.authority.info(id: issued.id)?.lastUse == fixture.wall.now)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        // The last use is taken: no more opens, but checks (the open handles' reads) still pass.
        #expect(fixture.authority.recordUse(issued.token, caller: me) == .denied(.usedUp))
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        #expect(fixture.authority.info(id: issued.id)?.state == .live)
        #expect(fixture.authority.info(id: issued.id)?.openUses == 2)
        fixture.authority.endUse(id: issued.id)
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        #expect(fixture.authority.info(id: issued.id)?.state == .live)
        // The last open use ends: the token ends used up, and every check is refused.
        fixture.authority.endUse(id: issued.id)
        #expect(fixture.authority.info(id: issued.id)?.state == .usedUp)
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.usedUp))
        #expect(fixture.authority.recordUse(issued.token, caller: me) == .denied(.usedUp))
        // Further ends (a confused caller) change nothing.
        fixture.authority.endUse(id: issued.id)
        #expect(fixture.authority.info(id: issued.id)?.state == .usedUp)
        let events = fixture.authority.auditLog().map(\.event)
        #expect(events == [.grant, .use, .use, .denial, .usedUp, .denial, .denial])
    }

    @Test("a use given back (the open failed) can be taken again; revoke and expiry end a token with open uses")
    func returnedUsesAndEndings() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, uses: 1)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        fixture.authority.returnUse(id: issued.id)
        #expect(fixture.authority.info(id: issued.id)?.usesLeft == 1)
        #expect(fixture.authority.info(id: issued.id)?.openUses == 0)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        // Revoked while its last use is open: refused at once, the open handle included.
        try fixture.authority.revoke(id: issued.id)
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.revoked))
        fixture.authority.endUse(id: issued.id)
        #expect(fixture.authority.info(id: issued.id)?.state == .revoked)

        let timed = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(2), uses: 1)
        #expect(fixture.authority.recordUse(timed.token, caller: me).grant != nil)
        fixture.clock.advance(by: .seconds(2))
        #expect(fixture.authority.check(timed.token, caller: me) == .denied(.expired))
        fixture.authority.endUse(id: timed.id)
        #expect(fixture.authority.info(id: timed.id)?.state == .expired)
        let events = fixture.authority.auditLog().map(\.event)
        #expect(
            events == [
                .grant, .use, .useReturned, .use, .revocation, .denial, .grant, .use, .expiry, .denial,
            ])
    }

    @Test("concurrent uses of a 100-use token: exactly 100 allowed")
    func concurrentUses() async throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, uses: 100)
        let allowed = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var count = 0
                    for _ in 0..<50 where fixture.authority.recordUse(issued.token, caller: me).grant != nil {
                        count += 1
                    }
                    return count
                }
            }
            return await group.reduce(0, +)
        }
        #expect(allowed == 100)
    }

    @Test("a pid-bound token: only that pid, and only while the process holding it started when granted")
    func boundProcess() throws {
        let fixture = TokenFixture()
        fixture.processes.set(me.pid, startedAt: 1234)
        let issued = try fixture.authority.grant(scope: scope, mode: .read, pid: me.pid)
        #expect(fixture.authority.info(id: issued.id)?.boundPID == me.pid)
        #expect(fixture.authority.check(issued.token, caller: me).grant != nil)
        #expect(
            fixture.authority.check(issued.token, caller: TokenCaller(pid: me.pid + 1, uid: me.uid))
                == .denied(.wrongProcess))
        // The process ends and its pid is reused by a later one.
        fixture.processes.set(me.pid, startedAt: 9999)
        #expect(fixture.authority.check(issued.token, caller: me) == .denied(.processReused))
        fixture.processes.set(me.pid, startedAt: nil)
        #expect(fixture.authority.recordUse(issued.token, caller: me) == .denied(.processReused))
        #expect(fixture.authority.auditLog().compactMap(\.reason) == [.wrongProcess, .processReused, .processReused])
    }

    @Test("a pid-bound token with the real /proc start time: this process is allowed")
    func realProcess() throws {
        let authority = TokenAuthority(storeDirectory: nil, clock: ContinuousClock())
        let issued = try authority.grant(scope: scope, mode: .read, pid: getpid())
        #expect(authority.check(issued.token, caller: TokenCaller(pid: getpid(), uid: getuid())).grant != nil)
        #expect(
            authority.check(issued.token, caller: TokenCaller(pid: getppid(), uid: getuid())) == .denied(.wrongProcess))
    }
}
