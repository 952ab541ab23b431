import SystemSupport

/// A FIFO async mutual-exclusion gate: at most one holder at a time, waiters resumed in order.
///
/// Used to serialize range-map saves of one content entry, so an older snapshot can never be
/// committed after a newer one (a download's periodic save, the batched save and the shutdown
/// save may otherwise overlap).
final class AsyncGate: Sendable {
    private let state = Locked<(busy: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let enteredNow = state.withLock { state -> Bool in
                if state.busy {
                    state.waiters.append(continuation)
                    return false
                }
                state.busy = true
                return true
            }
            if enteredNow { continuation.resume() }
        }
    }

    /// Enters when the gate is open now; false (not entered) when someone holds it.
    func tryAcquire() -> Bool {
        state.withLock { state -> Bool in
            if state.busy { return false }
            state.busy = true
            return true
        }
    }

    /// Hands the gate to the next waiter (which stays busy), or opens it.
    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.busy = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
