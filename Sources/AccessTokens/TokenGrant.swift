// What an allowed check hands to enforcement: never the token itself.

/// The grant behind an allowed token: its public id, scope and mode, and what enforcement needs to
/// decide how long the kernel may keep what it answered (D-345): the time left and whether the
/// token is bound to a process or derived.
public struct TokenGrant: Sendable, Hashable {
    public var id: String
    public var scope: TokenScope
    public var mode: TokenMode
    /// Monotonic time until the token's deadline at the moment of the check; nil without a TTL.
    public var timeLeft: Duration?
    /// The process the token is bound to (`--pid`, every derived token); nil for any process.
    public var boundPID: Int32?
    /// A derived token's parent (it ends with it, D-325); nil for a granted token.
    public var parentID: String?

    public init(
        id: String, scope: TokenScope, mode: TokenMode, timeLeft: Duration? = nil, boundPID: Int32? = nil,
        parentID: String? = nil
    ) {
        self.id = id
        self.scope = scope
        self.mode = mode
        self.timeLeft = timeLeft
        self.boundPID = boundPID
        self.parentID = parentID
    }
}
