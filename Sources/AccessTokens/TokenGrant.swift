// What an allowed check hands to enforcement: never the token itself.

/// The grant behind an allowed token: its public id, scope and mode.
public struct TokenGrant: Sendable, Hashable {
    public var id: String
    public var scope: TokenScope
    public var mode: TokenMode

    public init(id: String, scope: TokenScope, mode: TokenMode) {
        self.id = id
        self.scope = scope
        self.mode = mode
    }
}
