import AccessTokens
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Token persistence")
struct TokenPersistenceTests {
    static func fileText(_ path: String) -> String {
        (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }

    static func mode(_ path: String) -> mode_t {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_mode & 0o777 : 0
    }

    @Test("tokens, uses, revocations and the audit log survive a restart; files are 0600 and hold no token")
    func restart() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = TokenFixture(directory: directory.path)
        let reader = try first.authority.grant(scope: scope, mode: .read, ttl: .seconds(600), uses: 3)
        let writer = try first.authority.grant(
            scope: TokenScope(identifier: "dir-1", path: "Projects"), mode: .readWrite)
        let revoked = try first.authority.grant(scope: scope, mode: .read)
        #expect(first.authority.recordUse(reader.token, caller: me).grant != nil)
        try first.authority.revoke(id: revoked.id)
        #expect(first.authority.check("pfs_nonsense!", caller: me) == .denied(.malformed))
        let logBefore = first.authority.auditLog()

        let files = ["tokens.db", "tokens.db-wal", "tokens-audit.jsonl"].map { directory.path + "/" + $0 }
        for file in files {
            #expect(Self.mode(file) == 0o600, "\(file)")
            let bytes = (try? readFile(file)) ?? []
            #expect(!bytes.isEmpty, "\(file)")
            for token in [reader.token, writer.token, revoked.token] {
                #expect(!String(decoding: bytes, as: UTF8.self).contains(String(token.suffix(32))))
            }
        }

        first.clock.advance(by: .seconds(100))
        first.wall.jump(by: 100)
        let second = first.restarted(directory: directory.path)
        #expect(second.authority.mountTag == first.authority.mountTag)
        #expect(second.authority.check(reader.token, caller: me).grant?.id == reader.id)
        #expect(second.authority.check(writer.token, caller: me).grant?.mode == .readWrite)
        #expect(second.authority.check(revoked.token, caller: me) == .denied(.revoked))
        let row = try #require(second.authority.info(id: reader.id))
        #expect(row.usesLeft == 2)
        #expect(row.timeLeft == .seconds(500))
        #expect(second.authority.auditLog().prefix(logBefore.count).map(\.sequence) == logBefore.map(\.sequence))
        #expect(second.authority.auditLog().last!.sequence > logBefore.last!.sequence)
    }

    @Test("a revoke and an expire by command are saved by themselves: a restart right after finds them ended")
    func endingsSavedAtOnce() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = TokenFixture(directory: directory.path)
        let revoked = try first.authority.grant(scope: scope, mode: .read)
        let expired = try first.authority.grant(scope: scope, mode: .read, ttl: .seconds(600))
        // No other call of the authority between the end and the restart: no other write.
        try first.authority.revoke(id: revoked.id)
        let second = first.restarted(directory: directory.path)
        #expect(second.authority.check(revoked.token, caller: me) == .denied(.revoked))
        #expect(second.authority.info(id: revoked.id)?.state == .revoked)
        try second.authority.expire(id: expired.id)
        let third = second.restarted(directory: directory.path)
        #expect(third.authority.check(expired.token, caller: me) == .denied(.expired))
        #expect(third.authority.info(id: expired.id)?.state == .expired)
    }

    @Test("expiry across a restart continues from the wall clock but never extends")
    func expiryAcrossRestart() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = TokenFixture(directory: directory.path)
        let issued = try first.authority.grant(scope: scope, mode: .read, ttl: .seconds(60))
        // Down for 20 s by the wall clock: 40 s left.
        first.wall.jump(by: 20)
        var later = first.restarted(directory: directory.path)
        #expect(later.authority.info(id: issued.id)?.timeLeft == .seconds(40))
        // The wall clock set back an hour while down: still no more than what was left at the
        // last save (the grant's 60 s: the restart above changed nothing, so it saved nothing).
        first.wall.jump(by: -3600)
        later = first.restarted(directory: directory.path)
        #expect(later.authority.info(id: issued.id)?.timeLeft == .seconds(60))
        // Once a save records less time left, a clock set back cannot give it back.
        later.clock.advance(by: .seconds(50))
        try later.authority.revoke(id: try later.authority.grant(scope: scope, mode: .read).id)
        first.wall.jump(by: -3600)
        let again = first.restarted(directory: directory.path)
        #expect(again.authority.info(id: issued.id)?.timeLeft == .seconds(10))
        // Down past the deadline: expired at once, and logged.
        first.wall.jump(by: 7200 + 3600)
        let last = first.restarted(directory: directory.path)
        #expect(last.authority.check(issued.token, caller: me) == .denied(.expired))
        #expect(last.authority.auditLog().contains { $0.event == .expiry && $0.tokenID == issued.id })
    }

    @Test("an expiry noticed is saved: after a restart it is still expired, and logged once")
    func expirySaved() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = TokenFixture(directory: directory.path)
        let issued = try first.authority.grant(scope: scope, mode: .read, ttl: .seconds(10))
        first.clock.advance(by: .seconds(10))
        #expect(first.authority.list().isEmpty)
        // The wall clock set back: the saved state, not the deadline, says it ended.
        first.wall.jump(by: -3600)
        let second = first.restarted(directory: directory.path)
        #expect(second.authority.info(id: issued.id)?.state == .expired)
        #expect(second.authority.check(issued.token, caller: me) == .denied(.expired))
        #expect(second.authority.auditLog().filter { $0.event == .expiry }.count == 1)
    }

    // A damaged tokens.db or tokens.json: TokenStoreTests.

    @Test("a damaged audit line is skipped and reported once, not fatal")
    func damagedAuditLine() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let first = TokenFixture(directory: directory.path)
        _ = try first.authority.grant(scope: scope, mode: .read)
        // A damaged audit line is skipped, not fatal.
        let audit = directory.path + "/tokens-audit.jsonl"
        let handle = try #require(FileHandle(forWritingAtPath: audit))
        handle.seekToEndOfFile()
        handle.write(Data("{\"sequence\": \"cut".utf8))
        handle.closeFile()
        let restarted = first.restarted(directory: directory.path)
        #expect(
            restarted.authority.auditLog().filter { $0.detail?.contains("unreadable audit lines") == true }.count == 1)
        // Reported once: the file was rewritten without the cut line.
        let again = first.restarted(directory: directory.path)
        #expect(again.authority.auditLog().filter { $0.detail?.contains("unreadable audit lines") == true }.count == 1)
    }

    @Test("the audit log stays bounded in memory and on disk")
    func boundedAudit() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var limits = TokenLimits()
        limits.auditEntries = 50
        limits.deniedPerWindow = Int.max
        let fixture = TokenFixture(directory: directory.path, limits: limits)
        for _ in 0..<500 { _ = fixture.authority.check("pfs_x", caller: me) }
        let log = fixture.authority.auditLog()
        #expect(log.count == 50)
        #expect(log.last?.sequence == 500)
        // Whatever the flusher thread has not appended yet is, before the file is read (D-347).
        fixture.authority.flushAuditLog()
        let lines = Self.fileText(directory.path + "/tokens-audit.jsonl").split(separator: "\n").count
        #expect(lines <= 100 && lines >= 50)
        let restarted = fixture.restarted(directory: directory.path, limits: limits)
        #expect(restarted.authority.auditLog().map(\.sequence) == log.map(\.sequence))
    }
}
