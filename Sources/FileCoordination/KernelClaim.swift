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

    /// The purpose of every claim the mount takes for kernel callers: plain processes through the
    /// mount do not coordinate with each other (their reads pin versions, their writes share one
    /// staging copy, the kernel orders their namespace changes), only with coordinating clients
    /// (rules 4–6; D-399).
    static let purpose = "providerfs.mount"

    /// Submits a claim; returns its number, for `cancel`.
    @discardableResult
    func submit(
        _ intent: ClaimIntent, pid: Int32, ancestry: () -> [Int32], deadline: UInt64,
        completion: @escaping @Sendable (Result<KernelClaim, CoordinationError>) -> Void
    ) -> UInt64 {
        let local = waiting.withLock { state -> UInt64 in
            let local = state.next
            state.next += 1
            state.table[local] = completion
            return local
        }
        host.submit(request(local, intent, pid: pid, waitDeadline: host.now &+ deadline), ancestry: ancestry)
        return local
    }

    /// Withdraws claim `local` if it still waits: it fails with `.cancelled` (D-400). A granted
    /// claim is left to its holder (the arbiter never cancels one).
    func cancel(_ local: UInt64) {
        guard waiting.withLock({ $0.table[local] != nil }) else { return }
        host.cancel(ClaimID(owner: owner, local: local))
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
            id: ClaimID(owner: owner, local: local), pid: pid, purpose: Self.purpose, intents: [intent],
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
