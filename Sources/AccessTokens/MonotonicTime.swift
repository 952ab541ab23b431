// Monotonic time as a Duration since the authority began, from any `Clock<Duration>`.

/// Elapsed time on an injected clock (ContinuousClock in the daemon, ManualClock in tests).
struct MonotonicTime: Sendable {
    let elapsed: @Sendable () -> Duration

    init(_ clock: any Clock<Duration>) {
        elapsed = Self.make(clock)
    }

    private static func make<C: Clock<Duration>>(_ clock: C) -> @Sendable () -> Duration {
        let origin = clock.now
        return { origin.duration(to: clock.now) }
    }
}
