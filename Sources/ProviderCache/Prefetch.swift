// Fetches an open starts ahead of its first read (D-535), while it waits for the provider to
// confirm the version it knows.

public import ProviderModel
import SystemSupport

extension ProviderCache {
    /// Starts fetching `range` of `item`'s version and returns at once (D-535): for an open that
    /// must ask the provider whether the version it knows is still current. The fetch checks
    /// that version itself, so its bytes are never another's; the entry stays pinned until it
    /// ends. Nil when every byte is already here or the item is not a file.
    public func prefetch(_ range: Range<Int64>, of item: ProviderItem) -> Prefetch? {
        guard item.kind == .file, !range.isEmpty, !hasAllContent(of: item) else { return nil }
        let prefetch = Prefetch(version: item.contentVersion, range: range)
        Task {
            do throws(CacheError) {
                let entry = try await pinContent(of: item)
                defer { self.content.unpin(entry) }
                try await entry.ensurePresent(range)
                prefetch.finish(nil)
            } catch {
                prefetch.finish(error)
            }
        }
        return prefetch
    }
}

/// A fetch an open started ahead of its first read (D-535): the read that needs its bytes waits
/// for its end and meets its failure, as if it had made the fetch itself (a fault that strikes
/// "the next download" strikes that reader, not a fetch nobody saw).
public final class Prefetch: Sendable {
    public let version: ContentVersion
    public let range: Range<Int64>
    private struct State {
        var ended = false
        var error: CacheError?
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter: UInt64 = 0
    }
    private let state = Locked(State())

    init(version: ContentVersion, range: Range<Int64>) {
        self.version = version
        self.range = range
    }

    func finish(_ error: CacheError?) {
        let waiters = state.withLock { state in
            state.ended = true
            state.error = error
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Waits until the fetch ended; its error (nil: the bytes are in). A cancelled waiter stops
    /// waiting at once and gets `.cancelled`.
    public func wait() async -> CacheError? {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.ended || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
        return state.withLock { state in
            state.ended ? state.error : CacheError(.cancelled, "read interrupted")
        }
    }
}
