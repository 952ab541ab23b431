// The hook through which a publish of a written file takes a short coordination write claim
// (DESIGN.md §4, issue 14). A port like `ReadClaimProvider` (D-215): the mount command's adapter
// (ProviderFSCommands/Daemon/MountWriteClaims.swift) plugs the coordinator in, as `ClaimPorts.writes`;
// without one, publishes take no claim.

/// A granted write claim; handed back on release.
public struct WriteClaimToken: Hashable, Sendable {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
}

/// Grants write claims (writing, no options) for publishes through the mount. Releasing one tells
/// presenters of the item (presentedItemDidChange).
public protocol WriteClaimProvider: Sendable {
    /// Waits (bounded by the claim deadline) for the claim; throws as `acquireReadClaim` does.
    func acquireWriteClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> WriteClaimToken
    /// The claim when it is granted at once; nil otherwise, with nothing taken.
    func acquireWriteClaimNow(_ request: ReadClaimRequest) -> WriteClaimToken?
    /// Ends a claim. Never waits.
    func releaseWriteClaim(_ token: WriteClaimToken)
}
