// The coordination ports of a file system, all passed at its construction (D-430): opens take
// read claims, write opens and publishes write claims, unlink/rmdir/rename namespace claims.
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

    public init(
        reads: any ReadClaimProvider = NoReadClaims(), writes: (any WriteClaimProvider)? = nil,
        namespace: any NamespaceClaimProvider = NoNamespaceClaims()
    ) {
        self.reads = reads
        self.writes = writes
        self.namespace = namespace
    }

    /// One provider for reads and writes (the mount's claims adapter is both).
    public init(
        readsAndWrites: any ReadClaimProvider & WriteClaimProvider,
        namespace: any NamespaceClaimProvider = NoNamespaceClaims()
    ) {
        self.init(reads: readsAndWrites, writes: readsAndWrites, namespace: namespace)
    }
}
