import SystemSupport

/// Work that runs on after its caller was answered (a listing's save to the store, D-486):
/// counted while it runs, so that a shutdown can wait until none is left.
final class PendingWork: Sendable {
    private let state = Locked<(running: Int, waiters: [CheckedContinuation<Void, Never>])>((0, []))

    func begin() { state.withLock { $0.running += 1 } }

    func end() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.running -= 1
            guard state.running == 0 else { return [] }
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once nothing counted runs.
    func drained() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.running == 0 { return true }
                state.waiters.append(waiter)
                return false
            }
            if now { waiter.resume() }
        }
    }
}
