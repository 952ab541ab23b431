// One line of the audit log (`token log`): grants, uses, denials, expiries, revocations.

public import Foundation

/// An event of the audit log. Carries ids, never tokens.
public struct TokenAuditEntry: Codable, Sendable, Hashable {
    public enum Event: String, Codable, Sendable, Hashable {
        case grant
        /// An open through the token (`recordUse`).
        case use
        case denial
        case expiry
        case revocation
        /// A use given back: the open it was taken for failed after the token allowed it.
        case useReturned
        /// A `uses` token's last use ended (the handle of its last open was closed).
        case usedUp
        /// One entry per burst of refused guesses from one user: `count` checks refused unread.
        case rateLimited
        /// The token store could not be read or written (`detail` says what happened).
        case storeProblem
    }

    /// Increasing for the life of the mount, across restarts.
    public var sequence: UInt64
    /// Wall-clock time of the event.
    public var time: Date
    public var event: Event
    public var tokenID: String?
    public var uid: UInt32?
    public var pid: Int32?
    public var reason: TokenDenialReason?
    public var count: Int?
    public var detail: String?
}
