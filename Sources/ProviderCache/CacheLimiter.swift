// The cache's limits (issue 27, D-432): `maximumSize` of stored content, `minimumFree` on the
// cache's file system, `maximumAge` since an item's content was last used. Content that is clean,
// closed and not downloading is evicted, least recently used first, through the same eviction as
// `providerfs evict` (which refuses what only this machine has). Checked as downloads store bytes
// (every `CacheOptions.limitCheckBytes`), when content is given back while the cache is over a
// limit, and every `limitCheckPeriod`; one check at a time. So the stored content exceeds
// `maximumSize` by at most what is in use at that moment (open or downloading): over the limit,
// every other evictable item goes first. When what cannot
// be evicted (writes not uploaded yet, pinned content: D-445) fills a limit by itself, new
// downloads are refused with ENOSPC (`blockedReason`, which says which) until a check finds room.

import Diagnostics
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What the cache's limits are and did (`providerfs status`).
public struct CacheLimitsStatus: Sendable, Equatable {
    public var maximumSize: Int64?
    public var minimumFree: Int64?
    public var maximumAge: Duration?
    /// Bytes of stored content at the last check.
    public var storedBytes: Int64
    /// Items evicted by the limits since the mount started, and the disk bytes they had.
    public var evictions: Int
    public var evictedBytes: Int64
    /// Why new downloads are refused (ENOSPC), nil when they are not.
    public var blockedReason: String?
}

final class CacheLimiter: Sendable {
    private struct State {
        var unchecked: Int64 = 0
        var running = false
        var again = false
        var over = false
        var stored: Int64 = 0
        var evictions = 0
        var evictedBytes: Int64 = 0
        var blocked: String?
        var stopped = false
        var periodic: Task<Void, Never>?
        /// Checks asked for while one ran: they return when the run that covers them ends.
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Locked(State())
    private let options: CacheOptions
    private let content: ContentStore
    private let timeline: Timeline
    private let logger: Logger
    private let directory: String
    private let freeSpace: FreeSpace
    /// The mount's start: an item not used in this session counts as last used then.
    private let started: Duration
    /// How an item is evicted (the cache's `evict`, set once the cache exists); nil result: it
    /// is gone.
    private let evictor = Locked<(@Sendable (ItemIdentifier) async -> ProviderCache.Eviction?)?>(nil)

    init(options: CacheOptions, content: ContentStore, environment: CacheEnvironment, directory: String) {
        self.options = options
        self.content = content
        self.timeline = environment.timeline
        self.logger = environment.logger
        self.directory = directory
        self.freeSpace = environment.freeSpace
        self.started = environment.timeline.now
    }

    func setEvict(_ evict: @escaping @Sendable (ItemIdentifier) async -> ProviderCache.Eviction?) {
        evictor.withLock { $0 = evict }
    }

    private func evict(_ identifier: ItemIdentifier) async -> ProviderCache.Eviction? {
        guard let evict = evictor.withLock({ $0 }) else { return nil }
        return await evict(identifier)
    }

    /// Starts the periodic check (and runs one now).
    func start() {
        let period = options.limitCheckPeriod
        let timeline = self.timeline
        let task = Task { [weak self] in
            while !Task.isCancelled {
                await self?.check()
                do { try await timeline.sleep(for: period) } catch { return }
            }
        }
        state.withLock { $0.periodic = task }
    }

    func stop() {
        let task = state.withLock { state -> Task<Void, Never>? in
            state.stopped = true
            defer { state.periodic = nil }
            return state.periodic
        }
        task?.cancel()
    }

    /// A download stored `bytes`: a check once `limitCheckBytes` have come since the last one.
    func stored(_ bytes: Int64) {
        let due = state.withLock { state -> Bool in
            state.unchecked += bytes
            return state.unchecked >= options.limitCheckBytes
        }
        if due { Task { await self.check() } }
    }

    /// Content was given back: while the cache is over a limit, it may be evictable now.
    func released() {
        if state.withLock({ $0.over || $0.blocked != nil }) { Task { await self.check() } }
    }

    /// Why new downloads are refused now, if they are.
    var blockedReason: String? { state.withLock { $0.blocked } }

    var status: CacheLimitsStatus {
        state.withLock { state in
            CacheLimitsStatus(
                maximumSize: options.maximumSize, minimumFree: options.minimumFree, maximumAge: options.maximumAge,
                storedBytes: state.stored, evictions: state.evictions, evictedBytes: state.evictedBytes,
                blockedReason: state.blocked)
        }
    }

    /// Checks the limits and evicts what they need. A check asked for while one runs makes it run
    /// once more, and returns when that run ends.
    func check() async {
        enum Start {
            case run, none, wait
        }
        let start = state.withLock { state -> Start in
            if state.stopped { return .none }
            if state.running {
                state.again = true
                return .wait
            }
            state.running = true
            state.unchecked = 0
            return .run
        }
        switch start {
        case .none: return
        case .wait:
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let ended = state.withLock { state -> Bool in
                    guard state.running else { return true }
                    state.waiters.append(continuation)
                    return false
                }
                if ended { continuation.resume() }
            }
            return
        case .run: break
        }
        while true {
            let covered = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                defer { state.waiters = [] }
                return state.waiters
            }
            await trim()
            for waiter in covered { waiter.resume() }
            let (again, waiting) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
                if state.again && !state.stopped {
                    state.again = false
                    state.unchecked = 0
                    return (true, [])
                }
                state.running = false
                defer { state.waiters = [] }
                return (false, state.waiters)
            }
            for waiter in waiting { waiter.resume() }
            if !again { return }
        }
    }

    /// Free bytes on the cache's file system (nil when it cannot be asked).
    private func free() -> Int64? {
        let descriptor = SystemCalls.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { SystemCalls.close(descriptor) }
        return freeSpace(descriptor)
    }

    private func trim() async {
        let now = timeline.now
        let contents = content.storedContent()
        var total = contents.reduce(Int64(0)) { $0 + $1.bytes }
        var free = options.minimumFree == nil ? nil : self.free()
        let inUse = contents.filter(\.inUse).reduce(Int64(0)) { $0 + $1.bytes }
        // Least recently used first; not used in this session: oldest, the smaller file number
        // order of the store does not matter here.
        let candidates = contents.filter { !$0.inUse }.sorted {
            ($0.lastUse ?? .zero - .seconds(1)) < ($1.lastUse ?? .zero - .seconds(1))
        }
        var evicted = 0
        var evictedBytes: Int64 = 0
        var kept: Int64 = 0
        var pinned: Int64 = 0
        for candidate in candidates {
            let tooOld = options.maximumAge.map { now - (candidate.lastUse ?? started) >= $0 } ?? false
            let overSize = options.maximumSize.map { total > $0 } ?? false
            let lowOnSpace = options.minimumFree.map { minimum in free.map { $0 < minimum } ?? false } ?? false
            guard tooOld || overSize || lowOnSpace else { continue }
            switch await evict(candidate.identifier) {
            case .evicted(let freed):
                total -= candidate.bytes
                if let current = free { free = current + freed }
                evicted += 1
                evictedBytes += freed
            case .alreadyPlaceholder:
                total -= candidate.bytes
            case .refused(.pinned):
                kept += candidate.bytes
                pinned += candidate.bytes
            case .refused, nil:
                kept += candidate.bytes
            }
        }
        // Over a limit with nothing left to evict: what is in use may exceed it (it is given
        // back later), but when what cannot be evicted fills it by itself, new downloads are
        // refused rather than filling the disk.
        var blocked: String?
        // Pinned content (D-445) is kept like writes not uploaded; the reason names both parts.
        let why =
            pinned == 0
            ? "changes not uploaded yet"
            : pinned >= total - inUse
                ? "pinned" : "\(pinned) bytes pinned, the rest changes not uploaded yet"
        if let maximum = options.maximumSize, total - inUse > maximum {
            blocked =
                "the cache holds \(total - inUse) bytes that cannot be evicted (\(why)), "
                + "over its limit of \(maximum) bytes (--cache-max-size)"
        } else if let minimum = options.minimumFree, let free, free < minimum, inUse == 0 {
            blocked =
                "the cache's file system has \(free) bytes free, less than --cache-min-free \(minimum), "
                + "and nothing in the cache can be evicted" + (pinned > 0 ? " (\(pinned) bytes pinned)" : "")
        }
        let over =
            (options.maximumSize.map { total > $0 } ?? false)
            || (options.minimumFree.map { minimum in free.map { $0 < minimum } ?? false } ?? false)
        let previouslyBlocked = state.withLock { state -> String? in
            defer {
                state.stored = total
                state.evictions += evicted
                state.evictedBytes += evictedBytes
                state.blocked = blocked
                state.over = over
            }
            return state.blocked
        }
        if evicted > 0 {
            logger.info("cache limits: evicted \(evicted) item(s), \(evictedBytes) bytes; \(total) bytes stored")
        }
        if let blocked, previouslyBlocked == nil { logger.warning("new downloads are refused: \(blocked)") }
        if blocked == nil, previouslyBlocked != nil { logger.info("new downloads are allowed again") }
    }
}
