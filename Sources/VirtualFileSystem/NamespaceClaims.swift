// The hook through which every namespace change of the mount (unlink, rmdir, rename) is
// coordinated (DESIGN.md §4, issue 14 item 5). A port like `ReadClaimProvider` (D-215): this
// module knows no coordinator types; the mount command plugs its coordination server in through
// the adapter (ProviderFSCommands/Daemon/MountCoordination.swift, `MountNamespaceClaims`).
// `NoNamespaceClaims` grants at once and tells no one.

/// A namespace change about to happen, in paths relative to the mount root (no leading "/").
public enum NamespaceChange: Sendable, Equatable {
    /// unlink, rmdir: a forDeleting write claim on the item.
    case deleting(path: String, isDirectory: Bool)
    /// rename: a forMoving write claim on the source and a forReplacing one on the destination
    /// (both forMoving for an exchange, whose destination moves too).
    case moving(from: String, to: String, isDirectory: Bool, exchanging: Bool)
}

/// Who changes what: the change and the requester.
public struct NamespaceClaimRequest: Sendable, Equatable {
    public var change: NamespaceChange
    /// The requesting thread and user (map the thread to its process with /proc/<tid>/status).
    public var context: RequestContext
    public init(change: NamespaceChange, context: RequestContext) {
        self.change = change
        self.context = context
    }
}

/// Granted claims of one change; handed back to `finish`.
public struct NamespaceClaimToken: Hashable, Sendable {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
}

/// Coordinates namespace changes through the mount. `ProviderFileSystem` calls `acquire` before
/// it asks the provider (a granted claim means presenters have accommodated: a deleted item's
/// presenters got accommodatePresentedItemDeletion while it still existed), then `finish` once the
/// provider answered. Throw `.coordinationFailed` (ETIMEDOUT) when the claims cannot be granted
/// before their deadline, or `.materializationRefused` (EDEADLK) for a nested coordination
/// deadlock; the change then does not happen.
public protocol NamespaceClaimProvider: Sendable {
    func acquireNamespaceClaims(_ request: NamespaceClaimRequest) async throws(FileSystemError) -> NamespaceClaimToken
    /// Ends the claims. `happened`: the change was made, so a move is announced inside the claims
    /// first (presenters of the moved items get presentedItemDidMove(to:), presenters of the
    /// directories their subitem messages). Never waits.
    func finishNamespaceChange(_ token: NamespaceClaimToken, happened: Bool)
}

/// Grants every claim at once and tells no one: the default until coordination is wired.
public struct NoNamespaceClaims: NamespaceClaimProvider {
    public init() {}
    public func acquireNamespaceClaims(
        _ request: NamespaceClaimRequest
    ) async throws(FileSystemError) -> NamespaceClaimToken {
        NamespaceClaimToken(rawValue: 0)
    }
    public func finishNamespaceChange(_ token: NamespaceClaimToken, happened: Bool) {}
}
