// The port through which access paths (`MOUNTPOINT/.scoped/<token>/…`, docs/SEMANTICS.md) are
// checked. The file system knows no tokens library: the daemon hands in an adapter
// (ProviderFSCommands/MountScopedAccess.swift, over AccessTokens' `TokenAuthority`). Without one,
// `.scoped` does not exist.

/// The answer for a token presented by a caller.
public enum ScopedAccessDecision: Sendable, Equatable {
    /// The token is valid for this caller: the raw identifier of the item it grants (the access
    /// path must stay inside it), whether it allows writing, and its public id (for logs).
    case allowed(scope: String, writable: Bool, id: String)
    /// Refused: why, in a sentence (logged and put in the EACCES error's message).
    case denied(reason: String)
}

/// Checks tokens of access paths. Both calls are synchronous and short: they run on every
/// lookup, getattr, readdir and read through an access path, also on the FUSE thread.
public protocol ScopedAccessProvider: Sendable {
    /// Whether `token` is valid for the caller of `context` now (takes no use).
    func check(_ token: String, context: RequestContext) -> ScopedAccessDecision
    /// `check`, and if allowed takes one use (every open through an access path). The use lasts
    /// until `endUse` with the decision's id.
    func recordUse(_ token: String, context: RequestContext) -> ScopedAccessDecision
    /// A use `recordUse` allowed has ended: its handle was released, or the open failed after
    /// the use was taken. Called exactly once per allowed use (D-315).
    func endUse(id: String)
    /// A use `recordUse` allowed is given back: the open failed after it (it opened nothing).
    /// Instead of `endUse`.
    func returnUse(id: String)
}
