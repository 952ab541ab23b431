import AccessTokens
import Foundation
import Testing

@Suite("Token grants")
struct TokenGrantTests {
    @Test("a grant returns a path-safe token of this mount and a 12-hex-digit id; the list shows no token")
    func grantShape() throws {
        let fixture = TokenFixture()
        let issued = try fixture.authority.grant(scope: scope, mode: .read, ttl: .seconds(60))
        let token = issued.token
        #expect(token.hasPrefix("pfs_" + fixture.authority.mountTag + "_"))
        #expect(token.utf8.count == 45)
        #expect(token.utf8.allSatisfy { ($0 >= 97 && $0 <= 122) || ($0 >= 50 && $0 <= 55) || $0 == 95 })
        #expect(issued.id.count == 12 && issued.id.allSatisfy(\.isHexDigit))
        #expect(!token.contains(issued.id))
        #expect(!"\(issued)".contains(token.suffix(32)))
        let rows = fixture.authority.list()
        #expect(rows.count == 1)
        let row = try #require(rows.first)
        #expect(row.id == issued.id && row.scope == scope && row.mode == .read && row.state == .live)
        #expect(row.timeLeft == .seconds(60))
        #expect(row.expiresAt == fixture.wall.now.addingTimeInterval(60))
        let json = String(decoding: try JSONEncoder().encode(rows), as: UTF8.self)
        #expect(!json.contains(String(token.suffix(32))))
        let log = String(decoding: try JSONEncoder().encode(fixture.authority.auditLog()), as: UTF8.self)
        #expect(!log.contains(String(token.suffix(32))))
    }

    @Test("two grants never share a token or an id")
    func distinct() throws {
        let fixture = TokenFixture()
        var tokens: Set<String> = []
        var ids: Set<String> = []
        for _ in 0..<500 {
            let issued = try fixture.authority.grant(scope: scope, mode: .read)
            tokens.insert(issued.token)
            ids.insert(issued.id)
        }
        #expect(tokens.count == 500 && ids.count == 500)
    }

    @Test("zero, negative and absurd TTLs, zero or negative uses, bad pids: clear errors, nothing granted")
    func badGrants() {
        let fixture = TokenFixture()
        let authority = fixture.authority
        #expect(throws: TokenGrantError.nonPositiveTTL(.zero)) {
            try authority.grant(scope: scope, mode: .read, ttl: .zero)
        }
        #expect(throws: TokenGrantError.nonPositiveTTL(.seconds(-5))) {
            try authority.grant(scope: scope, mode: .read, ttl: .seconds(-5))
        }
        let year = Duration.seconds(365 * 24 * 3600)
        #expect(throws: TokenGrantError.ttlTooLong(year + .seconds(1), maximum: year)) {
            try authority.grant(scope: scope, mode: .read, ttl: year + .seconds(1))
        }
        #expect(throws: TokenGrantError.ttlTooLong(.seconds(Int64.max), maximum: year)) {
            try authority.grant(scope: scope, mode: .read, ttl: .seconds(Int64.max))
        }
        #expect(throws: TokenGrantError.nonPositiveUses(0)) { try authority.grant(scope: scope, mode: .read, uses: 0) }
        #expect(throws: TokenGrantError.nonPositiveUses(-1)) {
            try authority.grant(scope: scope, mode: .read, uses: -1)
        }
        #expect(throws: TokenGrantError.invalidPID(0)) { try authority.grant(scope: scope, mode: .read, pid: 0) }
        #expect(throws: TokenGrantError.invalidPID(-3)) { try authority.grant(scope: scope, mode: .read, pid: -3) }
        #expect(throws: TokenGrantError.noSuchProcess(777)) { try authority.grant(scope: scope, mode: .read, pid: 777) }
        #expect(throws: TokenGrantError.emptyIdentifier) {
            try authority.grant(scope: TokenScope(identifier: "", path: "x"), mode: .read)
        }
        #expect("\(TokenGrantError.nonPositiveTTL(.zero))".contains("longer than zero"))
        #expect("\(TokenGrantError.nonPositiveUses(0))".contains("at least 1"))
        #expect(authority.list(includeEnded: true).isEmpty)
        #expect(authority.auditLog().isEmpty)
        // The longest TTL allowed is granted.
        #expect(throws: Never.self) { try authority.grant(scope: scope, mode: .read, ttl: year) }
    }
}
