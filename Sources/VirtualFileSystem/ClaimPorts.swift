// The coordination ports of a file system, all passed at its construction (D-430): opens take
// read claims, write opens and publishes write claims, unlink/rmdir/rename namespace claims, and
// an eviction through `user.providerfs.pin` asks presenters with a forEvicting claim.
// The mount command plugs in the coordination server's adapters (ProviderFSCommands'
// MountReadClaims, MountNamespaceClaims); tests plug in doubles; the defaults grant at once.

/// The claim providers a `ProviderFileSystem` goes through.
public struct ClaimPorts: Sendable {
    /// Every open for reading (and the scoped fast paths) takes a read claim here.
    public var reads: any ReadClaimProvider
    /// Write opens and publishes take a write claim here; nil: they take none.
    public var writes: (any WriteClaimProvider)?
    /// unlink, rmdir and rename are coordinated here before the provider is asked.
    public var namespace: any NamespaceClaimProvider
    /// Evictions the file system makes itself (setting `user.providerfs.pin` to `unpinned`) ask the
    /// item's presenters here first; nil: they ask nobody.
    public var evictions: (any EvictionClaimProvider)?

    public init(
        reads: any ReadClaimProvider = NoReadClaims(), writes: (any WriteClaimProvider)? = nil,
        namespace: any NamespaceClaimProvider = NoNamespaceClaims(), evictions: (any EvictionClaimProvider)? = nil
    ) {
        self.reads = reads
        self.writes = writes
        self.namespace = namespace
        self.evictions = evictions
    }

    /// One provider for reads and writes (the mount's claims adapter is both).
    public init(
        readsAndWrites: any ReadClaimProvider & WriteClaimProvider,
        namespace: any NamespaceClaimProvider = NoNamespaceClaims(), evictions: (any EvictionClaimProvider)? = nil
    ) {
        self.init(reads: readsAndWrites, writes: readsAndWrites, namespace: namespace, evictions: evictions)
    }
}

/// Asks an item's presenters before its local content is evicted: a forEvicting write claim
/// (Apple's accommodatePresentedItemEviction; D-431). The mount command's adapter is
/// MountEvictionClaims.
public protocol EvictionClaimProvider: Sendable {
    /// Runs `body` inside the claim on `relativePath` (relative to the mount root), taken for the
    /// process `pid`. Throws, without running `body`, when a presenter refused or the claim could
    /// not be had in time.
    func evictingClaim<T: Sendable>(
        _ relativePath: String, pid: Int32, _ body: () async -> T
    ) async throws(FileSystemError) -> T
}
