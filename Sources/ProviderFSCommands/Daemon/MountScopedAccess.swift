// Access paths through the mount (issue 12): the VirtualFileSystem's `ScopedAccessProvider` port
// over the daemon's `TokenAuthority` (docs/TOKENS.md). The file system passes the FUSE caller's
// thread id; tokens bound to a process compare process ids, so the thread is mapped to its
// thread group (its process) here, when the answer needs it (D-344).

package import AccessTokens
import SystemSupport
package import VirtualFileSystem

/// `ScopedAccessProvider` over a mount's `TokenAuthority`.
package struct MountScopedAccess: ScopedAccessProvider {
    package let authority: TokenAuthority
    /// Maps a thread id to its process id (tests substitute one).
    let processOfThread: @Sendable (Int32) -> Int32?

    package init(
        authority: TokenAuthority,
        processOfThread: @escaping @Sendable (Int32) -> Int32? = { ProcessInfoFiles.threadGroup(ofThread: $0) }
    ) {
        self.authority = authority
        self.processOfThread = processOfThread
    }

    /// The caller as the authority knows callers. A thread whose process cannot be found (it
    /// ended) keeps its thread id, which a pid-bound token then refuses.
    package func caller(_ context: RequestContext) -> TokenCaller {
        TokenCaller(pid: processOfThread(context.threadID) ?? context.threadID, uid: context.uid)
    }

    /// The process is looked up only when the authority needs it (a pid-bound token, a denial):
    /// lookups, getattrs and reads through a token bound to no process read no /proc (D-344).
    package func check(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        Self.decision(
            authority.check(token, uid: context.uid) { processOfThread(context.threadID) ?? context.threadID })
    }

    package func recordUse(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        Self.decision(authority.recordUse(token, caller: caller(context)))
    }

    package func endUse(id: String) {
        authority.endUse(id: id)
    }

    package func returnUse(id: String) {
        authority.returnUse(id: id)
    }

    package func hasEnded(id: String) -> Bool {
        authority.hasEnded(id: id)
    }

    /// The authority announces every end (D-346).
    package func observeEnds(_ observer: @escaping @Sendable (String) -> Void) {
        authority.observeEnds(observer)
    }

    /// How long the kernel may keep a token's paths (D-345): never for a token bound to a process
    /// (a derived token is too), the time left for one with a deadline, else as long as plain
    /// paths. Every other end is announced through `observeEnds`.
    package static func caching(of grant: TokenGrant) -> ScopedKernelCaching {
        if grant.boundPID != nil || grant.parentID != nil { return .never }
        return grant.timeLeft.map { .atMost($0) } ?? .unbounded
    }

    package static func decision(_ decision: TokenDecision) -> ScopedAccessDecision {
        switch decision {
        case .allowed(let grant):
            .allowed(
                scope: grant.scope.identifier, writable: grant.mode.allows(.readWrite), id: grant.id,
                caching: caching(of: grant))
        case .denied(.notAToken):
            .notAToken(reason: TokenDenialReason.notAToken.explanation)
        case .denied(let reason):
            .denied(reason: reason.explanation)
        }
    }
}
