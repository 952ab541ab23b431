// `TokenAuthority.observeEnds` (D-346): every end is announced once, by id, outside the lock, and
// an allowed check carries the time left and the process binding (D-345).

import AccessTokens
import SystemSupport
import TestSupport
import Testing

@Suite("Token end announcements")
struct TokenEndAnnouncementTests {
    /// The ids announced so far, in order. The observer calls back into the authority, which
    /// would deadlock if it were called with the lock held.
    func record(_ authority: TokenAuthority) -> Locked<[String]> {
        let ended = Locked<[String]>([])
        authority.observeEnds { id in
            _ = authority.info(id: id)
            ended.withLock { $0.append(id) }
        }
        return ended
    }

    @Test("revoke, expire, the last use's end, a noticed TTL, a release and a parent's end are each announced once")
    func everyEndOnce() throws {
        let fixture = TokenFixture()
        fixture.processes.set(me.pid, startedAt: 5)
        let ended = record(fixture.authority)
        let revoked = try fixture.authority.grant(scope: scope, mode: .read)
        let expired = try fixture.authority.grant(scope: scope, mode: .read)
        let once = try fixture.authority.grant(scope: scope, mode: .read, uses: 1)
        let short = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(1))
        let parent = try fixture.authority.grant(scope: scope, mode: .read)
        #expect(ended.value.isEmpty)

        try fixture.authority.revoke(id: revoked.id)
        #expect(ended.value == [revoked.id])
        try fixture.authority.expire(id: expired.id)
        #expect(ended.value == [revoked.id, expired.id])
        #expect(fixture.authority.recordUse(once.token, caller: me).grant != nil)
        #expect(ended.value.count == 2, "a use held is no end")
        fixture.authority.endUse(id: once.id)
        #expect(ended.value.last == once.id)
        fixture.clock.advance(by: .seconds(1))
        #expect(fixture.authority.check(short.token, caller: me) == .denied(.expired))
        #expect(ended.value.last == short.id)

        let released = try fixture.authority.derive(from: parent.token, by: me)
        try fixture.authority.release(released.token, by: me)
        #expect(ended.value.last == released.id)
        let child = try fixture.authority.derive(from: parent.token, by: me)
        try fixture.authority.revoke(id: parent.id)
        #expect(Array(ended.value.suffix(2)) == [parent.id, child.id])
        // Nothing twice, nothing more.
        _ = fixture.authority.list(includeEnded: true)
        #expect(fixture.authority.check(revoked.token, caller: me) == .denied(.revoked))
        #expect(ended.value == [revoked.id, expired.id, once.id, short.id, released.id, parent.id, child.id])
    }

    @Test("an allowed check carries the time left, the bound process and the parent")
    func grantCarriesTimeLeft() throws {
        let fixture = TokenFixture()
        fixture.processes.set(me.pid, startedAt: 5)
        let timed = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(10))
        fixture.clock.advance(by: .seconds(4))
        let grant = try #require(fixture.authority.check(timed.token, uid: me.uid) { me.pid }.grant)
        #expect(grant.timeLeft == .seconds(6) && grant.boundPID == nil && grant.parentID == nil)
        let bound = try fixture.authority.grant(scope: scope, mode: .read, pid: me.pid)
        let boundGrant = try #require(fixture.authority.check(bound.token, caller: me).grant)
        #expect(boundGrant.timeLeft == nil && boundGrant.boundPID == me.pid)
        let child = try fixture.authority.derive(from: timed.token, by: me)
        let childGrant = try #require(fixture.authority.check(child.token, caller: me).grant)
        #expect(childGrant.timeLeft == .seconds(6) && childGrant.boundPID == me.pid && childGrant.parentID == timed.id)
    }
}
