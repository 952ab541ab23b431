// A clock that moves only when a test says so: deadlines and TTLs without sleeping.

import SystemSupport

/// A `Clock` whose time advances only through `advance(by:)`. Sleepers wake when time passes
/// their deadline; a cancelled sleeper throws `CancellationError` at once.
public final class ManualClock: Clock, @unchecked Sendable {
    // Safe: all mutable state lives in `state` (a Locked).
    public struct Instant: InstantProtocol, Sendable {
        public var offset: Duration
        public init(offset: Duration) { self.offset = offset }
        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct Sleeper {
        var id: UInt64
        var deadline: Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var sleepers: [Sleeper] = []
        var cancelled: Set<UInt64> = []
        var nextID: UInt64 = 0
    }

    private let state = Locked(State())

    public init() {}

    public var now: Instant { state.withLock { $0.now } }
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// Number of tasks currently sleeping on this clock.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                enum Action { case resume, fail, wait }
                let action = state.withLock { state -> Action in
                    if state.cancelled.remove(id) != nil { return .fail }
                    if deadline <= state.now { return .resume }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return .wait
                }
                switch action {
                case .resume: continuation.resume()
                case .fail: continuation.resume(throwing: CancellationError())
                case .wait: break
                }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                if let index = state.sleepers.firstIndex(where: { $0.id == id }) {
                    return state.sleepers.remove(at: index).continuation
                }
                state.cancelled.insert(id)
                return nil
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Moves time forward and wakes every sleeper whose deadline has passed.
    public func advance(by duration: Duration) {
        let due = state.withLock { state -> [Sleeper] in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// The deadlines of the tasks sleeping on this clock now.
    public var sleeperDeadlines: [Instant] { state.withLock { $0.sleepers.map(\.deadline) } }

    /// Waits (polling, with a real-time limit) until a task sleeps on this clock until exactly
    /// `deadline` (a timer armed at a known instant, whatever else sleeps). False after `limit`.
    public func waitForSleeper(until deadline: Instant, limit: Duration = .seconds(120)) async -> Bool {
        let clock = ContinuousClock()
        let end = clock.now.advanced(by: limit)
        while !sleeperDeadlines.contains(where: { $0 == deadline }) {
            if clock.now >= end { return false }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return true
    }

    /// Waits (polling, with a real-time limit) until at least `count` tasks sleep on this clock.
    /// Returns false if that did not happen within `limit`.
    public func waitForSleepers(atLeast count: Int, limit: Duration = .seconds(30)) async -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: limit)
        while sleeperCount < count {
            if clock.now >= deadline { return false }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return true
    }
}
