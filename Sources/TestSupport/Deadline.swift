// A wall-clock bound for a test step that must never hang. Swift Testing's `.timeLimit` counts in
// whole minutes and, when it passes, still waits for a body that ignores cancellation; a step
// wrapped in `withDeadline` fails with a message at its deadline and leaves the stuck work
// behind (cancelled), so the test run goes on.

import SystemSupport

/// A step did not finish within its deadline.
public struct DeadlineExceeded: Error, Sendable, CustomStringConvertible {
    public var what: String
    public var limit: Duration
    public var description: String { "\(what) did not finish within \(limit) (a hang)" }
}

/// Runs `body` and returns its result, or throws `DeadlineExceeded` once `limit` of real time has
/// passed without one. At the deadline the body's task is cancelled but not waited for.
public func withDeadline<T: Sendable>(
    _ limit: Duration, _ what: String, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let outcome = OneOutcome<T>()
    let work = Task {
        do {
            outcome.settle(.success(try await body()))
        } catch {
            outcome.settle(.failure(error))
        }
    }
    let timer = Task {
        try? await Task.sleep(for: limit, clock: .continuous)
        outcome.settle(.failure(DeadlineExceeded(what: what, limit: limit)))
    }
    let result = await withTaskCancellationHandler {
        await outcome.wait()
    } onCancel: {
        outcome.settle(.failure(CancellationError()))
    }
    timer.cancel()
    if case .failure = result { work.cancel() }
    return try result.get()
}

/// The first of several results, handed to one waiter.
private final class OneOutcome<T: Sendable>: Sendable {
    private struct State {
        var result: Result<T, any Error>?
        var waiter: CheckedContinuation<Result<T, any Error>, Never>?
    }
    private let state = Locked(State())

    func settle(_ result: Result<T, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<Result<T, any Error>, Never>? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: result)
    }

    func wait() async -> Result<T, any Error> {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Result<T, any Error>? in
                if let result = state.result { return result }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
