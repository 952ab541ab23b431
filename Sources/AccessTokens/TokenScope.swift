// The item a token grants access to.

/// The scope of a token: the provider item's identifier (opaque, stable across moves and renames:
/// this is what enforcement compares) and the path the item had when the token was granted (for
/// display only; it goes stale when the item moves).
public struct TokenScope: Codable, Sendable, Hashable {
    public var identifier: String
    public var path: String

    public init(identifier: String, path: String) {
        self.identifier = identifier
        self.path = path
    }
}
