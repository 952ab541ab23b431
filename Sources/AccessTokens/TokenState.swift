// Where a token is in its life.

/// A token is live until it expires, is revoked, or its last use has ended (its handle closed,
/// D-315); then it stays ended.
public enum TokenState: String, Codable, Sendable, Hashable {
    case live
    case expired
    case revoked
    case usedUp
}
