// The hook through which every open-for-read of the mount takes a coordination read claim
// (DESIGN.md §4). A port (D-215): this module knows no coordinator types and does not depend on
// FileCoordination; the mount command plugs the coordinator in through its adapter
// (ProviderFSCommands/Daemon/MountCoordination.swift, `MountReadClaims`). `NoReadClaims` grants at once.

public import ProviderModel

/// Who wants to read what: the item's path relative to the mount root and the requester.
public struct ReadClaimRequest: Sendable, Equatable {
    /// Path relative to the mount root, no leading "/" ("" is the root).
    public var relativePath: String
    public var identifier: ItemIdentifier
    /// The requesting thread and user (map the thread to its process with /proc/<tid>/status).
    public var context: RequestContext
    public init(relativePath: String, identifier: ItemIdentifier, context: RequestContext) {
        self.relativePath = relativePath
        self.identifier = identifier
        self.context = context
    }
}

/// A granted read claim; handed back on release.
public struct ReadClaimToken: Hashable, Sendable {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
}

/// Grants read claims for opens through the mount. `ProviderFileSystem` calls `acquireReadClaim`
/// in `open` before it pins a content version (so a writer holding a write claim publishes first)
/// and `releaseReadClaim` in `release`. Throw `.coordinationFailed` (ETIMEDOUT) when the claim
/// cannot be granted before its deadline, or `.materializationRefused` (EDEADLK) for a nested
/// coordination deadlock; the open then fails with that error.
public protocol ReadClaimProvider: Sendable {
    func acquireReadClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> ReadClaimToken
    /// The claim when it is granted at once; nil when it would have to wait (or fail), with
    /// nothing taken: the caller then uses `acquireReadClaim`. Never waits (a FUSE thread asks,
    /// D-229). The default grants nothing this way.
    func acquireReadClaimNow(_ request: ReadClaimRequest) -> ReadClaimToken?
    /// Ends a claim. Never waits.
    func releaseReadClaim(_ token: ReadClaimToken)
}

extension ReadClaimProvider {
    public func acquireReadClaimNow(_ request: ReadClaimRequest) -> ReadClaimToken? { nil }
}

/// Grants every claim at once and remembers nothing: the default until coordination is wired.
public struct NoReadClaims: ReadClaimProvider {
    public init() {}
    public func acquireReadClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> ReadClaimToken {
        ReadClaimToken(rawValue: 0)
    }
    public func acquireReadClaimNow(_ request: ReadClaimRequest) -> ReadClaimToken? { ReadClaimToken(rawValue: 0) }
    public func releaseReadClaim(_ token: ReadClaimToken) {}
}
