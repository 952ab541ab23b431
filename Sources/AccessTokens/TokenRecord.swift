// One granted token as the authority keeps it: a salted hash, never the token.

import Foundation

struct TokenRecord: Sendable {
    struct BoundProcess: Sendable, Hashable {
        var pid: Int32
        /// /proc/PID/stat field 22 when the grant was made.
        var startTime: UInt64
    }

    var id: String
    /// SHA-256 of the authority's salt followed by the token's bytes.
    var hash: [UInt8]
    var scope: TokenScope
    var mode: TokenMode
    var grantedAt: Date
    /// Monotonic deadline (time since the authority began); nil without a TTL.
    var deadline: Duration?
    var boundProcess: BoundProcess?
    var usesLeft: Int?
    /// Uses taken and not yet ended (`endUse`): opens whose handles are still open, for a
    /// `uses` token. Not kept across restarts (no handle survives one).
    var openUses = 0
    var lastUse: Date?
    var state: TokenState = .live
    var endedAt: Date?
    /// A derived token's parent (`TokenAuthority.derive`): it ends when the parent ends.
    var parentID: String?

    var indexKey: UInt64 { Self.indexKey(hash) }

    /// The first 8 bytes of a hash: the dictionary key a lookup starts from.
    static func indexKey(_ hash: [UInt8]) -> UInt64 {
        hash.prefix(8).reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// What an allowed check hands to enforcement, with the time left at `now`.
    func grant(now: Duration) -> TokenGrant {
        TokenGrant(
            id: id, scope: scope, mode: mode, timeLeft: deadline.map { max(.zero, $0 - now) },
            boundPID: boundProcess?.pid, parentID: parentID)
    }

    func info(now: Duration, wallNow: Date) -> TokenInfo {
        var timeLeft: Duration?
        var expiresAt: Date?
        if let deadline {
            let left = state == .live ? max(.zero, deadline - now) : .zero
            timeLeft = left
            expiresAt = state == .live ? wallNow.addingTimeInterval(Self.seconds(left)) : endedAt
        }
        return TokenInfo(
            id: id, scope: scope, mode: mode, state: state, grantedAt: grantedAt, expiresAt: expiresAt,
            timeLeft: timeLeft, usesLeft: usesLeft, openUses: openUses, lastUse: lastUse, boundPID: boundProcess?.pid,
            endedAt: endedAt, parentID: parentID)
    }

    static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
