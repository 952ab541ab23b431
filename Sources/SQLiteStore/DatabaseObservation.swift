import Dispatch
import SystemSupport

/// A registered observer; `cancel()` stops further notifications.
public struct DatabaseObservation: Sendable {
    let identifier: UInt64
    let registry: ObserverRegistry

    /// Stops notifications. A notification already being delivered may still finish.
    public func cancel() {
        registry.remove(identifier)
    }
}

/// The observers of one store and the serial queue that tells them about commits.
final class ObserverRegistry: Sendable {
    typealias Handler = @Sendable (Set<String>) -> Void

    private struct Entry {
        var tables: Set<String>?
        var handler: Handler
    }

    private struct State {
        var nextIdentifier: UInt64 = 1
        var entries: [UInt64: Entry] = [:]
    }

    private let state = Locked(State())
    private let queue = DispatchQueue(label: "SQLiteStore.observers")
    /// Marks `queue`, so `drain` can tell it is being called from a handler.
    private let queueKey = DispatchSpecificKey<Bool>()

    init() {
        queue.setSpecific(key: queueKey, value: true)
    }

    func add(tables: Set<String>?, _ handler: @escaping Handler) -> DatabaseObservation {
        let identifier = state.withLock { state in
            defer { state.nextIdentifier += 1 }
            state.entries[state.nextIdentifier] = Entry(tables: tables, handler: handler)
            return state.nextIdentifier
        }
        return DatabaseObservation(identifier: identifier, registry: self)
    }

    func remove(_ identifier: UInt64) {
        state.withLock { _ = $0.entries.removeValue(forKey: identifier) }
    }

    /// Called on the writer queue right after COMMIT, so notifications are queued in commit order.
    func notify(_ changed: Set<String>) {
        // Observers registered after this commit must not hear about it: take the list now.
        let registered = state.withLock { $0.entries.keys.sorted() }
        guard !registered.isEmpty else { return }
        queue.async {
            for identifier in registered {
                // Look each one up again at delivery time, so a cancelled observer is not called.
                guard let entry = self.state.withLock({ $0.entries[identifier] }) else { continue }
                if entry.tables.map({ !$0.isDisjoint(with: changed) }) ?? true {
                    entry.handler(changed)
                }
            }
        }
    }

    func drain() {
        if DispatchQueue.getSpecific(key: queueKey) == true {
            fatalError(
                "SQLiteStore misuse: waitForObservers() was called from inside an observer handler; it would "
                    + "wait for itself forever.")
        }
        queue.sync {}
    }
}
