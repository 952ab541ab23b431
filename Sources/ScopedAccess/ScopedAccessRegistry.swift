// The per-process reference count of started grants (Apple: start/stop "are nestable on a
// per-process basis"). One entry per grant (mount and token): the first start derives a token
// bound to this process, later starts count, the last stop releases the derived token (the
// daemon ends it before stop returns), an extra stop does nothing.

import SystemSupport

/// The process's started grants. Start and stop of the whole process are serialized (each holds
/// the registry while it asks the daemon: one local round trip, at most the backend's timeout).
package final class ScopedAccessRegistry: Sendable {
    package static let shared = ScopedAccessRegistry(backend: ControlSocketBackend())

    package struct Key: Hashable, Sendable {
        package var mountpoint: String
        package var token: String
    }

    struct Entry {
        var count = 0
        /// The derived token while started.
        var derived: DerivedToken?
        /// The derived token of the last start, kept after the last stop: the URL keeps naming
        /// it, so a read through it after the stop fails (EACCES) instead of falling back.
        var ended: DerivedToken?
        var lastError: ScopedAccessError?
    }

    let backend: any ScopedAccessBackend
    private let entries = Locked<[Key: Entry]>([:])

    package init(backend: any ScopedAccessBackend) {
        self.backend = backend
    }

    /// One start: derives on the first, counts on the others.
    package func start(_ key: Key) throws(ScopedAccessError) {
        let backend = self.backend
        try entries.withLock { (entries) throws(ScopedAccessError) in
            var entry = entries[key] ?? Entry()
            if entry.count > 0 {
                entry.count += 1
                entries[key] = entry
                return
            }
            do throws(ScopedAccessError) {
                entry.derived = try backend.derive(mountpoint: key.mountpoint, token: key.token)
                entry.count = 1
                entry.lastError = nil
                entries[key] = entry
            } catch {
                entry.lastError = error
                entries[key] = entry
                throw error
            }
        }
    }

    /// One stop: the last one releases the derived token before it returns; one too many does
    /// nothing. A release the daemon could not do is kept as `lastError` (the derived token is
    /// bound to this process: it gives no access to any other, and ends with its parent).
    package func stop(_ key: Key) {
        let backend = self.backend
        entries.withLock { entries in
            guard var entry = entries[key], entry.count > 0 else { return }
            entry.count -= 1
            if entry.count == 0, let derived = entry.derived {
                do throws(ScopedAccessError) {
                    try backend.release(mountpoint: key.mountpoint, token: derived.token)
                } catch {
                    entry.lastError = error
                }
                entry.ended = derived
                entry.derived = nil
            }
            entries[key] = entry
        }
    }

    /// How many starts are not yet balanced by a stop.
    package func count(_ key: Key) -> Int { entries.withLock { $0[key]?.count ?? 0 } }

    /// The derived token to name in paths: the live one while started, else the one the last
    /// stop ended; nil before the first start.
    package func derivedToken(_ key: Key) -> DerivedToken? {
        entries.withLock { entries in entries[key].flatMap { $0.derived ?? $0.ended } }
    }

    package func lastError(_ key: Key) -> ScopedAccessError? { entries.withLock { $0[key]?.lastError } }
}
