// Deferred replies: a FUSE callback registers its request here, starts a Task, and returns. The
// Task answers through `complete`, which takes the entry out of the table first, so a request is
// answered exactly once even when shutdown or an interrupt races with the reply.
//
// `shutdown` must run before `fuse_session_destroy`: a `fuse_req_t` points into the session, so a
// reply after destroy would be a use-after-free (reference/swift-fuse-notes.md §2, pitfall 7).

import CFuse3
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// A libfuse request handle that may be answered from any thread, exactly once.
struct FUSERequest: @unchecked Sendable {
    // Safe: libfuse documents that fuse_reply_* may be called from any thread; the exactly-once
    // rule is enforced by `PendingReplies` (the only code that hands a request to a reply).
    let raw: fuse_req_t
}

/// The table of requests that have not been answered yet.
final class PendingReplies: Sendable {
    private struct Entry {
        var request: FUSERequest
        var task: Task<Void, Never>?
        var interrupted = false
    }

    private struct State {
        var nextID: UInt = 1
        var entries: [UInt: Entry] = [:]
        /// Replies being sent right now (taken out of `entries`, reply call not returned yet).
        var replying = 0
        var closed = false
    }

    private let state = Locked(State())

    /// Registers a request; nil when the session is shutting down (the caller replies at once).
    func register(_ request: FUSERequest) -> UInt? {
        state.withLock { state in
            guard !state.closed else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.entries[id] = Entry(request: request)
            return id
        }
    }

    /// Remembers the task answering `id`, so an interrupt or shutdown can cancel it. If the kernel
    /// already interrupted the request, the task is cancelled at once.
    func attach(_ id: UInt, task: Task<Void, Never>) {
        let cancelNow = state.withLock { state -> Bool in
            guard state.entries[id] != nil else { return false }
            state.entries[id]!.task = task
            return state.entries[id]!.interrupted
        }
        if cancelNow { task.cancel() }
    }

    /// The kernel sent FUSE_INTERRUPT for `id`: cancel its task (the file system decides whether
    /// to stop early and answer EINTR, or to finish).
    func interrupt(_ id: UInt) {
        let task = state.withLock { state -> Task<Void, Never>? in
            guard state.entries[id] != nil else { return nil }
            state.entries[id]!.interrupted = true
            return state.entries[id]!.task
        }
        task?.cancel()
    }

    /// Whether `id` is still waiting for its answer.
    func isWaiting(_ id: UInt) -> Bool { state.withLock { $0.entries[id] != nil } }

    /// Answers `id` with `reply` unless it was already answered (by shutdown). The reply runs
    /// outside the lock.
    func complete(_ id: UInt, _ reply: (FUSERequest) -> Void) {
        let entry = state.withLock { state -> Entry? in
            guard let entry = state.entries.removeValue(forKey: id) else { return nil }
            state.replying += 1
            return entry
        }
        guard let entry else { return }
        reply(entry.request)
        state.withLock { $0.replying -= 1 }
    }

    /// Number of requests still waiting for an answer.
    var count: Int { state.withLock { $0.entries.count } }

    /// Closes the table: cancels every task, answers every waiting request with `error`, and
    /// waits until replies already being sent have returned. Returns how many were answered here.
    func shutdown(error: Int32) -> Int {
        let leftovers = state.withLock { state -> [Entry] in
            state.closed = true
            let entries = Array(state.entries.values)
            state.entries.removeAll()
            return entries
        }
        for entry in leftovers {
            entry.task?.cancel()
            _ = fuse_reply_err(entry.request.raw, error)
        }
        // Replies in flight finish in microseconds; a short poll is enough and keeps no lock held.
        while state.withLock({ $0.replying }) > 0 {
            usleep(1000)
        }
        return leftovers.count
    }
}
