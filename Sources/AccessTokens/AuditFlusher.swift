// The thread that appends deferred audit entries (D-347): the entries of uses that change nothing
// but the log are appended a moment after they were logged, in batches, off the FUSE thread that
// answered the open or release. A thread of its own, not a dispatch queue or a task: under load
// the global queues and the cooperative pool can be starved for seconds, and the log must still
// reach the file within about `delay`.

import Dispatch
import Foundation
import SystemSupport

/// Runs `flush` on a dedicated thread within `delay` of each `request`, batching the requests
/// that come in the meantime. `stop` ends the thread after one last flush; the thread holds the
/// flusher, never the owner of `flush` (which captures its owner weakly).
final class AuditFlusher: Sendable {
    private struct Flags {
        var requested = false
        var stopping = false
        var started = false
    }

    let delay: Duration
    private let flags = Locked(Flags())
    /// Signalled by the first `request` after a flush, and by `stop`.
    private let wake = DispatchSemaphore(value: 0)
    /// Flushes the thread has run (tests).
    private let flushes = Locked(0)

    init(delay: Duration) {
        self.delay = delay
    }

    /// Starts the thread; `flush` runs on it. Once.
    func start(name: String = "providerfs.tokens.audit", flush: @escaping @Sendable () -> Void) {
        let start = flags.withLock { flags -> Bool in
            defer { flags.started = true }
            return !flags.started && !flags.stopping
        }
        guard start else { return }
        let thread = Thread { [self] in run(flush) }
        thread.name = name
        thread.start()
    }

    /// Asks for a flush within `delay`. False when the thread is not running (not started, or
    /// stopped): the caller flushes itself.
    @discardableResult
    func request() -> Bool {
        let (running, signal) = flags.withLock { flags -> (Bool, Bool) in
            guard flags.started, !flags.stopping else { return (false, false) }
            defer { flags.requested = true }
            return (true, !flags.requested)
        }
        if signal { wake.signal() }
        return running
    }

    /// Ends the thread after a last flush (without waiting for it). Requests then return false.
    func stop() {
        let signal = flags.withLock { flags -> Bool in
            defer { flags.stopping = true }
            return flags.started && !flags.stopping
        }
        if signal { wake.signal() }
    }

    var isRunning: Bool { flags.withLock { $0.started && !$0.stopping } }
    var flushCount: Int { flushes.value }

    private func run(_ flush: @Sendable () -> Void) {
        let nanoseconds = Int(TokenAuthority.nanoseconds(delay))
        while true {
            wake.wait()
            // Let the entries of the next `delay` join this batch; only `stop` signals meanwhile.
            if !flags.withLock({ $0.stopping }) {
                _ = wake.wait(timeout: .now() + .nanoseconds(nanoseconds))
            }
            let stopping = flags.withLock { flags -> Bool in
                flags.requested = false
                return flags.stopping
            }
            flush()
            flushes.withLock { $0 += 1 }
            if stopping { return }
        }
    }
}
