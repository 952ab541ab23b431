import AccessTokens
import Foundation
import TestSupport
import Testing

@Suite("Derived tokens (a process's start of a grant)")
struct TokenDerivationTests {
    let app = TokenCaller(pid: 5151, uid: 1000)
    let other = TokenCaller(pid: 6161, uid: 1000)

    func fixture() -> TokenFixture {
        let fixture = TokenFixture()
        fixture.processes.set(5151, startedAt: 77)
        fixture.processes.set(6161, startedAt: 88)
        return fixture
    }

    @Test("a derived token has its parent's scope and mode, is bound to the deriving process, lists its parent")
    func derive() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .readWrite, ttl: .seconds(60))
        fixture.clock.advance(by: .seconds(10))
        let child = try fixture.authority.derive(from: parent.token, by: app)
        #expect(child.token != parent.token && child.id != parent.id)
        #expect(child.info.parentID == parent.id && child.info.boundPID == app.pid)
        #expect(child.info.scope == scope && child.info.mode == .readWrite)
        #expect(child.info.timeLeft == .seconds(50))
        #expect(fixture.authority.check(child.token, caller: app).grant?.scope == scope)
        #expect(fixture.authority.check(child.token, caller: other) == .denied(.wrongProcess))
        fixture.processes.set(5151, startedAt: 99)
        #expect(fixture.authority.check(child.token, caller: app) == .denied(.processReused))
        let rows = fixture.authority.list()
        #expect(rows.map(\.id).sorted() == [parent.id, child.id].sorted())
        let grant = try #require(fixture.authority.auditLog().last { $0.event == .grant })
        #expect(grant.tokenID == child.id && grant.detail?.contains("derived from \(parent.id)") == true)
    }

    @Test("release ends the derived token at once; the parent stays; a second release ends nothing")
    func release() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .read)
        let child = try fixture.authority.derive(from: parent.token, by: app)
        #expect(throws: TokenDerivationError.wrongProcess) { try fixture.authority.release(child.token, by: other) }
        #expect(fixture.authority.check(child.token, caller: app).grant != nil)
        #expect(try fixture.authority.release(child.token, by: app) == child.id)
        #expect(fixture.authority.check(child.token, caller: app) == .denied(.revoked))
        #expect(fixture.authority.check(parent.token, caller: app).grant != nil)
        #expect(try fixture.authority.release(child.token, by: app) == child.id)
        #expect(throws: TokenDerivationError.notDerived) { try fixture.authority.release(parent.token, by: app) }
        #expect(throws: TokenDerivationError.denied(.notAToken)) { try fixture.authority.release("nope", by: app) }
    }

    @Test("a revoked or expired parent ends its derived tokens, each logged")
    func parentEnds() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(30))
        let first = try fixture.authority.derive(from: parent.token, by: app)
        let second = try fixture.authority.derive(from: parent.token, by: other)
        try fixture.authority.revoke(id: parent.id)
        #expect(fixture.authority.check(first.token, caller: app) == .denied(.revoked))
        #expect(fixture.authority.check(second.token, caller: other) == .denied(.revoked))
        let ended = fixture.authority.auditLog().filter { $0.event == .revocation }.compactMap(\.tokenID)
        #expect(Set(ended) == [parent.id, first.id, second.id])

        let timed = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(30))
        let child = try fixture.authority.derive(from: timed.token, by: app)
        fixture.clock.advance(by: .seconds(30))
        #expect(fixture.authority.check(child.token, caller: app) == .denied(.expired))
        #expect(fixture.authority.info(id: timed.id)?.state == .expired)
    }

    @Test("deriving is refused for an ended, unknown or derived token, and takes one use of a --uses parent")
    func refusals() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .read, uses: 2)
        let child = try fixture.authority.derive(from: parent.token, by: app)
        #expect(fixture.authority.info(id: parent.id)?.usesLeft == 1)
        #expect(throws: TokenDerivationError.derivedParent) { try fixture.authority.derive(from: child.token, by: app) }
        let revoked = try fixture.authority.grant(scope: scope, mode: .read)
        try fixture.authority.revoke(id: revoked.id)
        #expect(throws: TokenDerivationError.denied(.revoked)) {
            try fixture.authority.derive(from: revoked.token, by: app)
        }
        #expect(throws: TokenDerivationError.noSuchProcess(7)) {
            try fixture.authority.derive(from: parent.token, by: TokenCaller(pid: 7, uid: 1000))
        }
        let bound = try fixture.authority.grant(scope: scope, mode: .read, pid: 6161)
        #expect(throws: TokenDerivationError.denied(.wrongProcess)) {
            try fixture.authority.derive(from: bound.token, by: app)
        }
    }

    @Test("a derive is an open use of a --uses parent: the parent ends used up when the derived token ends")
    func usesParent() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .read, uses: 1)
        let child = try fixture.authority.derive(from: parent.token, by: app)
        #expect(fixture.authority.info(id: parent.id)?.openUses == 1)
        #expect(throws: TokenDerivationError.denied(.usedUp)) {
            try fixture.authority.derive(from: parent.token, by: other)
        }
        #expect(fixture.authority.info(id: parent.id)?.state == .live)
        try fixture.authority.release(child.token, by: app)
        #expect(fixture.authority.info(id: parent.id)?.state == .usedUp)
        #expect(fixture.authority.check(parent.token, caller: app) == .denied(.usedUp))
    }

    @Test("a derived token whose process ended without a stop is ended at the next derive, and gives its use back")
    func orphans() throws {
        let fixture = fixture()
        let parent = try fixture.authority.grant(scope: scope, mode: .read, uses: 2)
        let orphan = try fixture.authority.derive(from: parent.token, by: other)
        fixture.processes.set(6161, startedAt: nil)
        _ = try fixture.authority.derive(from: parent.token, by: app)
        #expect(fixture.authority.info(id: orphan.id)?.state == .revoked)
        #expect(fixture.authority.info(id: parent.id)?.openUses == 1)
        let entry = try #require(fixture.authority.auditLog().last { $0.tokenID == orphan.id })
        #expect(entry.event == .revocation && entry.detail?.contains("process ended") == true)
    }

    @Test("derived tokens and their parents survive a restart; the parent's end still ends them")
    func persistence() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        fixture.processes.set(5151, startedAt: 77)
        let parent = try fixture.authority.grant(scope: scope, mode: .read)
        let child = try fixture.authority.derive(from: parent.token, by: app)
        let restarted = fixture.restarted(directory: directory.path)
        #expect(restarted.authority.info(id: child.id)?.parentID == parent.id)
        #expect(restarted.authority.check(child.token, caller: app).grant != nil)
        try restarted.authority.revoke(id: parent.id)
        #expect(restarted.authority.check(child.token, caller: app) == .denied(.revoked))
    }
}
