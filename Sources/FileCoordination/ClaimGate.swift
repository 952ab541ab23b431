// What a client's write claim must also hold before the server grants it (D-451): a mount whose
// provider is shared with other machines (a WebDAV server) takes the server's lock on each file
// the claim writes, so that `providerfs coordinate --write` and the Swift API exclude writers on
// other machines for the whole claim, not only for each write open through the mount. Claims
// taken for kernel callers (the mount's own opens) do not pass here: the mount's write-claim
// adapter takes the lock for them.

/// Takes and ends what a granted write claim needs beyond the arbiter (given to a server at
/// construction: `CoordinationServer(…, claimGate:)`).
package protocol ClaimGate: Sendable {
    /// Takes what a write claim on `paths` (canonical absolute paths) needs, waiting until
    /// `deadline` (monotonic nanoseconds) at most; nil when nothing was taken. Throws the error
    /// the claim then fails with (`.timedOut` when another machine holds a file).
    func acquire(writing paths: [String], until deadline: UInt64) async throws(CoordinationError) -> UInt64?
    /// Ends what `acquire` took.
    func release(_ token: UInt64)
}

/// A client session's claims waiting for, or holding, the gate (ClientSession).
struct GatedClaims: Sendable {
    /// Submitted write claims: their written paths and wait deadline, until granted.
    var submitted: [UInt64: (paths: [String], deadline: UInt64)] = [:]
    /// Granted claims holding the gate: its token.
    var held: [UInt64: UInt64] = [:]
    /// The connection is gone: a gate taken now is ended at once.
    var closed = false
}
