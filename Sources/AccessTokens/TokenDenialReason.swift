// Why a presented token gives no access. Every denial has exactly one of these.

/// The reason a check refused a token, in the order the check finds them.
public enum TokenDenialReason: String, Codable, Sendable, Hashable, CaseIterable {
    /// Too many denials for this user in the last second: refused without looking the token up.
    case rateLimited
    /// A name that cannot be a token at all: it does not start with the prefix `pfs_` (empty,
    /// `.git`, `.providerfs-package`, `Thumbs.db`, an uppercase `PFS_…`). It can never grant
    /// access, so it is no guess: not counted, not logged, not throttled, and an access path
    /// answers ENOENT for it as a directory without the entry would (D-394).
    case notAToken
    /// Starts with `pfs_` but is not a token of this format (too long, non-ASCII, wrong characters).
    case malformed
    /// The start of a token of this mount, cut short.
    case truncated
    /// A well-formed token of another mount.
    case foreignMount
    /// Well-formed, this mount's, but never granted (or forgotten long after it ended).
    case unknown
    case expired
    case revoked
    /// A `uses` token whose last use was taken: no more opens (D-315).
    case usedUp
    /// A token bound to another process.
    case wrongProcess
    /// A token bound to this pid, but the process now holding the pid started later: the pid was
    /// reused after the bound process ended.
    case processReused

    /// One sentence for a person.
    public var explanation: String {
        switch self {
        case .rateLimited:
            "refused without being checked: this user presented too many unknown or malformed tokens "
                + "(guesses) within a second; access paths work again a second after the guesses stop"
        case .notAToken: "not an access token (tokens start with pfs_)"
        case .malformed: "a malformed token: it starts with pfs_ but is not an access token"
        case .truncated: "the token is incomplete (cut short)"
        case .foreignMount: "the token belongs to another mount"
        case .unknown: "no such token was granted on this mount"
        case .expired: "the token has expired"
        case .revoked: "the token was revoked"
        case .usedUp: "the token's uses are used up"
        case .wrongProcess: "the token is bound to another process"
        case .processReused: "the token's process has ended and its pid was reused"
        }
    }
}
