/// An injected clock, opened once: elapsed time since the cache started, and sleeping. Wraps any
/// `Clock<Duration>` (ContinuousClock in production, a manual clock in tests) so that instants can
/// be stored and compared without carrying the clock's generic parameter everywhere.
public struct Timeline: Sendable {
    private let elapsed: @Sendable () -> Duration
    private let sleeper: @Sendable (Duration) async throws -> Void

    public init(_ clock: some Clock<Duration>) {
        if let continuous = clock as? ContinuousClock {
            // The production clock, read without generic dispatch: `now` is on every lookup.
            let start = continuous.now
            elapsed = { start.duration(to: ContinuousClock.now) }
        } else {
            let start = clock.now
            elapsed = { start.duration(to: clock.now) }
        }
        sleeper = { duration in try await clock.sleep(for: duration) }
    }

    /// Time since this timeline was made.
    public var now: Duration { elapsed() }

    /// Suspends for `duration` on the clock; throws CancellationError when the task is cancelled.
    public func sleep(for duration: Duration) async throws { try await sleeper(duration) }
}
