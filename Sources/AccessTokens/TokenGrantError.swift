// Why a grant was refused: each with a message a person can act on.

/// A grant that was not made. Nothing is granted when one of these is thrown.
public enum TokenGrantError: Error, Sendable, Equatable, CustomStringConvertible {
    case emptyIdentifier
    case nonPositiveTTL(Duration)
    case ttlTooLong(Duration, maximum: Duration)
    case nonPositiveUses(Int)
    case invalidPID(Int32)
    /// The process to bind the token to does not exist (its start time cannot be read).
    case noSuchProcess(Int32)
    /// The grant could not be stored, so it would not survive a restart: it was withdrawn.
    case storeFailed(String)

    public var description: String {
        switch self {
        case .emptyIdentifier: "the item to grant access to has no identifier"
        case .nonPositiveTTL(let ttl): "a TTL must be longer than zero (got \(ttl))"
        case .ttlTooLong(let ttl, let maximum): "a TTL of \(ttl) is longer than the maximum of \(maximum)"
        case .nonPositiveUses(let uses): "uses must be at least 1 (got \(uses))"
        case .invalidPID(let pid): "\(pid) is not a process id"
        case .noSuchProcess(let pid): "no process \(pid) is running"
        case .storeFailed(let why): "the token could not be stored, so none was granted: \(why)"
        }
    }
}
