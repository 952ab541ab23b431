// What a grant returns: the secret once, and the public id to manage it by.

/// A freshly granted token. `token` is the only copy of the secret anywhere (the authority keeps
/// a salted hash): hand it to the user, never log it. `description` shows the id only.
public struct IssuedToken: Sendable, CustomStringConvertible {
    public let token: String
    public let info: TokenInfo

    public var id: String { info.id }
    public var description: String { "token \(info.id)" }
}
