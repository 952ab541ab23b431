// A thread blocked on one claim's result.

import Dispatch
import SystemSupport

/// Blocks one thread until a claim's result arrives. Uncontended, the result is usually there
/// before anyone waits (a local grant is delivered inside `submit`): no semaphore is made then.
final class Waiter: Sendable {
    private struct State {
        var result: Result<[String], CoordinationError>?
        /// Made by the first wait that finds no result; signalled once by `fulfil`.
        var semaphore: DispatchSemaphore?
    }
    private let state = Locked(State())

    func fulfil(_ value: Result<[String], CoordinationError>) {
        let (first, semaphore) = state.withLock { state -> (Bool, DispatchSemaphore?) in
            guard state.result == nil else { return (false, nil) }
            state.result = value
            return (true, state.semaphore)
        }
        if first { semaphore?.signal() }
    }

    /// The semaphore to sleep on, or nil when the result has arrived.
    private func semaphoreIfWaiting() -> DispatchSemaphore? {
        state.withLock { state -> DispatchSemaphore? in
            guard state.result == nil else { return nil }
            if let semaphore = state.semaphore { return semaphore }
            let semaphore = DispatchSemaphore(value: 0)
            state.semaphore = semaphore
            return semaphore
        }
    }

    func wait() -> Result<[String], CoordinationError> {
        if let semaphore = semaphoreIfWaiting() {
            semaphore.wait()
            semaphore.signal()  // keep it signalled: another waiter on this result returns at once
        }
        return state.withLock { $0.result! }
    }

    /// The result if it has arrived.
    func peek() -> Result<[String], CoordinationError>? { state.withLock { $0.result } }

    /// Waits at most `milliseconds` for the result.
    func wait(milliseconds: Int) -> Result<[String], CoordinationError>? {
        if let semaphore = semaphoreIfWaiting(),
            semaphore.wait(timeout: .now() + .milliseconds(milliseconds)) == .success
        {
            semaphore.signal()
        }
        return peek()
    }
}
