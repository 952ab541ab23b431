// Claims the mount takes in-process on behalf of kernel callers (the fast path of a FUSE open).

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A granted claim taken by the mount for a kernel caller. Release it when the operation ends.
package final class KernelClaim: Sendable {
    let host: ArbiterHost
    let id: ClaimID
    let released = Locked(false)
    /// The path the claim was granted on.
    package let path: String

    init(host: ArbiterHost, id: ClaimID, path: String) {
        self.host = host
        self.id = id
        self.path = path
    }

    /// Ends the claim (idempotent).
    package func release() {
        let first = released.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        if first { host.release(id) }
    }

    deinit { release() }
}

/// The owner of kernel-caller claims in an embedded server.
final class KernelClaimOwner: ArbiterSink, @unchecked Sendable {
    // Safe: `owner` is set once in init; `waiting` is a Locked.
    let host: ArbiterHost
    private(set) var owner: UInt64 = 0
    private let waiting = Locked<
        (next: UInt64, table: [UInt64: @Sendable (Result<KernelClaim, CoordinationError>) -> Void])
    >(
        (1, [:]))

    init(host: ArbiterHost) {
        self.host = host
        owner = host.addOwner(self)
    }

    func submit(
        _ intent: ClaimIntent, pid: Int32, ancestry: () -> [Int32], deadline: UInt64,
        completion: @escaping @Sendable (Result<KernelClaim, CoordinationError>) -> Void
    ) {
        let local = waiting.withLock { state -> UInt64 in
            let local = state.next
            state.next += 1
            state.table[local] = completion
            return local
        }
        host.submit(request(local, intent, pid: pid, waitDeadline: host.now &+ deadline), ancestry: ancestry)
    }

    /// A claim granted at once, or nil (nothing submitted) when it would have to wait.
    func claimNow(_ intent: ClaimIntent, pid: Int32, ancestry: () -> [Int32]) -> KernelClaim? {
        let local = waiting.withLock { state -> UInt64 in
            defer { state.next += 1 }
            return state.next
        }
        let request = request(local, intent, pid: pid, waitDeadline: host.now)
        guard host.grantIfImmediate(request, ancestry: ancestry) else { return nil }
        return KernelClaim(host: host, id: request.id, path: intent.path)
    }

    private func request(_ local: UInt64, _ intent: ClaimIntent, pid: Int32, waitDeadline: UInt64) -> ClaimRequest {
        ClaimRequest(
            id: ClaimID(owner: owner, local: local), pid: pid, purpose: "providerfs.kernel.\(pid)", intents: [intent],
            waitDeadline: waitDeadline, presenterTimeout: CoordinationDeadlines.default.presenterAnswer.nanosecondCount)
    }

    func granted(_ claim: ClaimID, paths: [String]) {
        guard let completion = waiting.withLock({ $0.table.removeValue(forKey: claim.local) }) else { return }
        completion(.success(KernelClaim(host: host, id: claim, path: paths.first ?? "")))
    }

    func failed(_ claim: ClaimID, error: CoordinationError) {
        waiting.withLock { $0.table.removeValue(forKey: claim.local) }?(.failure(error))
    }

    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {}
}

/// `pid`, its parent, grandparent… up to init (from /proc/PID/stat).
package func processAncestry(of pid: Int32) -> [Int32] {
    ProcessInfoFiles.ancestry(of: pid)
}
