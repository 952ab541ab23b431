// One row of `token list`: everything about a token except the token.

public import Foundation

/// A token as `token list` shows it. Carries no secret.
public struct TokenInfo: Sendable, Hashable, Codable {
    public var id: String
    public var scope: TokenScope
    public var mode: TokenMode
    public var state: TokenState
    public var grantedAt: Date
    /// When it expires by the wall clock now: the current wall-clock time plus `timeLeft`. After
    /// a wall-clock jump this moves with the wall clock; `timeLeft` (monotonic) does not.
    public var expiresAt: Date?
    /// Monotonic time until it expires; nil without a TTL; zero once ended.
    public var timeLeft: Duration?
    public var usesLeft: Int?
    /// Uses in progress: handles opened through a `uses` token and not yet closed (D-315).
    public var openUses: Int = 0
    public var lastUse: Date?
    public var boundPID: Int32?
    /// When it ended (expired, revoked or used up), by the wall clock.
    public var endedAt: Date?
    /// For a derived token (one process's start of a grant, `TokenAuthority.derive`): the id of
    /// the token it was derived from. Nil for a granted token.
    public var parentID: String? = nil
}
