// Where a token is in its life.

/// A token is live until it expires, is revoked, or its last use is taken; then it stays ended.
public enum TokenState: String, Codable, Sendable, Hashable {
    case live
    case expired
    case revoked
    case usedUp
}
