// The port through which access paths (`MOUNTPOINT/.scoped/<token>/…`, docs/SEMANTICS.md) are
// checked. The file system knows no tokens library: the daemon hands in an adapter
// (ProviderFSCommands/Daemon/MountScopedAccess.swift, over AccessTokens' `TokenAuthority`). Without one,
// `.scoped` does not exist.

/// How long the kernel may keep the entries and attributes it was given for paths through a
/// token (D-345). Whatever the answer, opens, reads and getattrs that reach the file system are
/// checked again; this only decides how often a path walk reaches it.
public enum ScopedKernelCaching: Sendable, Equatable {
    /// Not at all: every path walk asks again (a token bound to a process: the kernel's dentries
    /// are shared by every process).
    case never
    /// At most this long: the token's time left.
    case atMost(Duration)
    /// As long as the mount lets the kernel keep plain entries: the token has no deadline.
    case unbounded
}

/// What a valid token gives its caller. The file system keeps it as it came (D-507): the checks
/// of an operation read it, a node made through it keeps its id and scope.
public struct ScopedGrant: Sendable, Equatable {
    /// The raw identifier of the item it grants: the access path must stay inside it.
    public var scope: String
    /// Whether it allows changes through its access path.
    public var writable: Bool
    /// Its public id (for logs, uses and `observeEnds`).
    public var id: String
    /// How long the kernel may keep its entries (`.never` unless the provider announces every
    /// early end of the token through `observeEnds`).
    public var caching: ScopedKernelCaching

    public init(scope: String, writable: Bool, id: String, caching: ScopedKernelCaching = .never) {
        self.scope = scope
        self.writable = writable
        self.id = id
        self.caching = caching
    }
}

/// The answer for a token presented by a caller.
public enum ScopedAccessDecision: Sendable, Equatable {
    /// The token is valid for this caller.
    case allowed(ScopedGrant)
    /// Refused: why, in a sentence (logged and put in the EACCES error's message).
    case denied(reason: String)
    /// The name cannot be a token at all (a probe such as `.providerfs-package` or `.git`): no
    /// guess, so the provider neither logs nor counts it, and `.scoped` answers ENOENT as a
    /// directory without such an entry would (D-394). Why, in a sentence.
    case notAToken(reason: String)

    /// `.allowed` with a grant of these fields.
    public static func allowed(
        scope: String, writable: Bool, id: String, caching: ScopedKernelCaching = .never
    ) -> ScopedAccessDecision {
        .allowed(ScopedGrant(scope: scope, writable: writable, id: id, caching: caching))
    }
}

/// Checks tokens of access paths. The calls are synchronous and short: they run on every
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
    /// Calls `observer` with a token's id (the decision's `id`) when the token ends before the
    /// time its decisions' `caching` allowed: revoked, expired by command, used up, released
    /// (D-346). It may be called on any thread, must not be called with a lock of the provider
    /// held, and must be prompt: the file system then tells the kernel to forget the token's
    /// paths. A provider that never answers a caching other than `.never` need not call it.
    func observeEnds(_ observer: @escaping @Sendable (_ id: String) -> Void)
    /// Whether the token `id` (a decision's `id`) has ended for good (expired, revoked, used up,
    /// or derived from one that did), whoever asks: a handle's writes through it are then dropped
    /// unpublished (D-369). Not whether some caller would be refused (a token bound to a process
    /// refuses the others and has not ended).
    func hasEnded(id: String) -> Bool
}

extension ScopedAccessProvider {
    /// A provider that cannot tell: writes on handles whose token ended are refused (every
    /// write is checked), but what they wrote before is published by the close as usual.
    public func hasEnded(id: String) -> Bool { false }

    /// No announcements: for providers whose decisions all say `.never`.
    public func observeEnds(_ observer: @escaping @Sendable (_ id: String) -> Void) {}
}
