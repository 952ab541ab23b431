// Coordination across machines (issue 26 item 4, D-451): a write claim through a WebDAV mount also
// takes the server's exclusive write lock on the item (LOCK, `Timeout: Second-N`), so that a
// writer on another machine — another mount of the same server, with its own cache, runtime
// directory and coordinator — waits for it (polling the lock with backoff, bounded by the claim
// deadline) or fails with ETIMEDOUT, as a local claim that is not granted in time does. The lock
// is refreshed while held, kept until the item's upload is done (the other writer must read what
// this one wrote), then UNLOCKed; a crashed holder's lock lapses after its timeout. A server of
// DAV class 1 (no LOCK) gets no cross-machine exclusion, and `status` says so.

import Diagnostics
package import FileCoordination
import Foundation
package import ProviderCache
import ProviderModel
import SystemSupport
package import VirtualFileSystem
package import WebDAVProvider

/// The server locks a WebDAV mount holds for its writers.
package final class MountRemoteLocks: Sendable {
    let provider: WebDAVProvider
    /// How long a lock lives at the server without a refresh (`--lock-timeout`).
    let timeout: Duration
    /// Shown to other clients as the lock's owner.
    let owner: String
    let logger = Logger(label: "webdav-locks")
    /// The mount's cache (set once it is built): which items the server has, pending uploads.
    private let cache = Locked<ProviderCache?>(nil)
    /// Whether the server locks (its DAV class), found once.
    private let classCheck: Task<Result<Bool, ProviderError>, Never>
    /// `classCheck`'s answer once it came (nil before, or when it failed).
    private let locksKnown: Locked<Bool?>
    private let refresher = Locked<Task<Void, Never>?>(nil)

    private struct Entry {
        /// Write claims of this mount on the item that hold the lock.
        var holders = 0
        /// The lock is this mount's at the server.
        var held = false
        /// LOCK requests (and their waits) or the UNLOCK under way; others wait for it.
        var busy: Task<Void, Never>?
    }
    private let entries = Locked<[ItemIdentifier: Entry]>([:])

    /// The default lock timeout: a crashed machine's locks lapse after it.
    package static let defaultTimeout: Duration = .seconds(30)

    package init(provider: WebDAVProvider, timeout: Duration = defaultTimeout, owner: String) {
        self.provider = provider
        self.timeout = timeout
        self.owner = owner
        let known = Locked<Bool?>(nil)
        locksKnown = known
        classCheck = Task {
            do {
                let locks = try await provider.complianceClasses().contains("2")
                known.withLock { $0 = locks }
                return .success(locks)
            } catch {
                return .failure(ProviderError.from(error))
            }
        }
    }

    /// Starts the refresher once the cache exists.
    package func start(cache: ProviderCache) {
        self.cache.withLock { $0 = cache }
        let task = Task { [self] in await refreshLoop() }
        refresher.withLock { $0 = task }
    }

    /// Stops refreshing and ends every lock still held (an unmount).
    package func stop() async {
        let task = refresher.withLock { $0 }
        task?.cancel()
        await task?.value
        let held = entries.withLock { entries in
            defer { entries.removeAll() }
            return entries.filter { $0.value.held }.map(\.key)
        }
        for identifier in held { await provider.unlock(identifier) }
    }

    /// Whether the server takes locks (nil: not known yet, or asking it failed).
    package var serverLocks: Bool? {
        get async {
            switch await classCheck.value {
            case .success(let locks): locks
            case .failure: nil
            }
        }
    }

    /// `serverLocks` without waiting: false only once the server said it is class 1.
    var serverLocksNow: Bool? { locksKnown.withLock { $0 } }

    /// One line for `status`.
    package func statusLine() async -> String {
        switch await classCheck.value {
        case .success(true):
            let held = entries.withLock { $0.values.filter(\.held).count }
            return "WebDAV locks (DAV class 2): writes exclude other machines; timeout \(timeout), \(held) held"
        case .success(false):
            return "none: the server is DAV class 1 (no LOCK); writes on other machines are not excluded"
        case .failure(let error):
            return "unknown: OPTIONS failed (\(error.message)); writes take no server lock"
        }
    }

    // MARK: Acquire and release

    /// Whether a write claim on `identifier` takes a server lock: the server locks, and the
    /// item is a file the server has (not one created through the mount and not uploaded yet: a
    /// LOCK of an unmapped name makes an empty file at some servers).
    func wantsLock(_ identifier: ItemIdentifier) async -> Bool {
        guard await serverLocks == true, let cache = cache.withLock({ $0 }),
            cache.catalog.knownItem(identifier)?.kind == .file
        else { return false }
        return cache.status(of: identifier)?.upload?.creates != true
    }

    /// Takes (or joins) the server lock on the item, waiting while another client holds it,
    /// until `deadline`: then `.coordinationFailed` (ETIMEDOUT). A server that cannot be asked
    /// (unreachable, an error) does not hold the write back: it goes on without the lock (the
    /// upload's version check still keeps a conflict copy, D-417), said in the log.
    func acquire(
        _ identifier: ItemIdentifier, path: String, deadline: ContinuousClock.Instant
    ) async throws(FileSystemError) {
        while true {
            enum Step {
                case joined
                case wait(Task<Void, Never>)
                case lock(Task<Void, Never>, Locked<FileSystemError?>)
            }
            // One LOCK (or UNLOCK) of an item at a time from this mount: two at once would find
            // each other's lock (423) and wait for themselves.
            let step = entries.withLock { entries -> Step in
                var entry = entries[identifier] ?? Entry()
                if let busy = entry.busy { return .wait(busy) }
                if entry.held {
                    entry.holders += 1
                    entries[identifier] = entry
                    return .joined
                }
                let failure = Locked<FileSystemError?>(nil)
                // Records its outcome before it ends, so that whoever waits for it sees it.
                let task = Task { [self] in
                    do throws(FileSystemError) {
                        try await lockWaiting(identifier, path: path, deadline: deadline)
                    } catch {
                        failure.withLock { $0 = error }
                    }
                    let held = provider.holdsLock(on: identifier)
                    self.entries.withLock { entries in
                        var entry = entries[identifier] ?? Entry()
                        entry.busy = nil
                        if held {
                            entry.held = true
                            entry.holders += 1
                        }
                        entries[identifier] = entry.held || entry.holders > 0 ? entry : nil
                    }
                }
                entry.busy = task
                entries[identifier] = entry
                return .lock(task, failure)
            }
            switch step {
            case .joined:
                return
            case .wait(let busy):
                await busy.value
                if Task.isCancelled {
                    throw FileSystemError(.interrupted, "the open of \(path) was interrupted while waiting for a lock")
                }
            case .lock(let task, let failure):
                await task.value
                if let error = failure.withLock({ $0 }) { throw error }
                return
            }
        }
    }

    /// The longest wait between two LOCK attempts of a waiting writer, and how long a mount that
    /// just unlocked an item waits before it locks it again (D-451).
    static let maximumBackoff = Duration.milliseconds(200)
    static let grace = Duration.milliseconds(250)

    /// LOCK, and while another client holds it, again after 50 ms, 100 ms, … (at most
    /// `maximumBackoff`) until `deadline`.
    private func lockWaiting(
        _ identifier: ItemIdentifier, path: String, deadline: ContinuousClock.Instant
    ) async throws(FileSystemError) {
        var backoff = Duration.milliseconds(50)
        let started = ContinuousClock.now
        while true {
            let result: WebDAVLockResult
            do { result = try await provider.lock(identifier, timeout: timeout, owner: owner) } catch {
                logger.warning(
                    "cannot lock \(path) at the server, writing without the lock: \(ProviderError.from(error).message)")
                return
            }
            if result == .acquired {
                if ContinuousClock.now - started > .milliseconds(200) {
                    logger.info("\(path): locked at the server after waiting \(ContinuousClock.now - started)")
                }
                return
            }
            if Task.isCancelled {
                throw FileSystemError(.interrupted, "the open of \(path) was interrupted while waiting for a lock")
            }
            guard ContinuousClock.now + backoff < deadline else {
                throw FileSystemError(
                    .coordinationFailed,
                    "\(path) is locked at the server by another client (another machine's writer) "
                        + "and was not unlocked within the claim deadline")
            }
            try? await Task.sleep(for: backoff)
            backoff = min(backoff * 2, Self.maximumBackoff)
        }
    }

    /// A write claim that held the lock ended: the last one unlocks, once the item's upload is
    /// no longer pending (another machine's writer must read what was written here).
    func release(_ identifier: ItemIdentifier) {
        entries.withLock { entries in
            guard var entry = entries[identifier], entry.held, entry.holders > 0 else { return }
            entry.holders -= 1
            if entry.holders == 0 && entry.busy == nil {
                entry.busy = Task { [self] in await unlockAfterUpload(identifier) }
            }
            entries[identifier] = entry
        }
    }

    private func unlockAfterUpload(_ identifier: ItemIdentifier) async {
        let cache = self.cache.withLock { $0 }
        let start = ContinuousClock.now
        // The publish came before the claim ended (D-399): its upload is queued by now.
        // A failed attempt is retried (phase `error`): the lock is kept for it, within bounds.
        while cache?.writes.uploadRecord(of: identifier)?.isPending == true, ContinuousClock.now - start < timeout * 4,
            !Task.isCancelled
        {
            try? await Task.sleep(for: .milliseconds(20))
        }
        // Whoever wants the lock meanwhile waits for this task (`busy`): nobody joins it.
        await provider.unlock(identifier)
        // Fairness: this mount's next writer of the item waits a moment, so that another
        // machine's writer, asking every `maximumBackoff` at most, can get in between.
        try? await Task.sleep(for: Self.grace)
        entries.withLock { $0[identifier] = nil }
    }

    /// Refreshes every held lock each third of the timeout.
    private func refreshLoop() async {
        while !Task.isCancelled {
            do { try await Task.sleep(for: timeout / 3) } catch { return }
            let held = entries.withLock { $0.filter { $0.value.held }.map(\.key) }
            for identifier in held where provider.holdsLock(on: identifier) {
                do {
                    if try await provider.lock(identifier, timeout: timeout, owner: owner) == .lost {
                        logger.warning("the server lock on \(identifier) was lost (it lapsed or was removed)")
                    }
                } catch {
                    logger.warning(
                        "cannot refresh the server lock on \(identifier): \(ProviderError.from(error).message)")
                }
            }
        }
    }
}

/// Write claims through a WebDAV mount: the local claim (`base`), then the server lock
/// (`MountRemoteLocks`), both within the claim deadline; released in the other order.
package final class RemoteLockingWriteClaims: WriteClaimProvider {
    let base: any WriteClaimProvider
    let locks: MountRemoteLocks
    let deadline: Duration
    private let locked = Locked<[WriteClaimToken: ItemIdentifier]>([:])

    package init(base: any WriteClaimProvider, locks: MountRemoteLocks, deadline: Duration) {
        self.base = base
        self.locks = locks
        self.deadline = deadline
    }

    package func acquireWriteClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> WriteClaimToken {
        let deadline = ContinuousClock.now + self.deadline
        let token: WriteClaimToken
        if let now = base.acquireWriteClaimNow(request) {
            token = now
        } else {
            token = try await base.acquireWriteClaim(request)
        }
        guard await locks.wantsLock(request.identifier) else { return token }
        do {
            try await locks.acquire(request.identifier, path: request.relativePath, deadline: deadline)
        } catch {
            base.releaseWriteClaim(token)
            throw error
        }
        locked.withLock { $0[token] = request.identifier }
        return token
    }

    /// At once only at a server known not to lock: taking its lock is a request.
    package func acquireWriteClaimNow(_ request: ReadClaimRequest) -> WriteClaimToken? {
        locks.serverLocksNow == false ? base.acquireWriteClaimNow(request) : nil
    }

    package func releaseWriteClaim(_ token: WriteClaimToken) {
        base.releaseWriteClaim(token)
        if let identifier = locked.withLock({ $0.removeValue(forKey: token) }) { locks.release(identifier) }
    }
}

/// The claims of coordination clients (`providerfs coordinate --write`, the Swift API) through a
/// WebDAV mount's coordination server take the server's lock on each file they write, for as
/// long as the claim is held (D-451): a read-modify-write inside one claim excludes the other
/// machine from its read to its write. Paths outside the mount take nothing.
package final class MountRemoteLockGate: ClaimGate {
    let locks: MountRemoteLocks
    let mountpoint: String
    private let taken = Locked<(next: UInt64, held: [UInt64: [ItemIdentifier]])>((1, [:]))

    package init(locks: MountRemoteLocks, mountpoint: String) {
        self.locks = locks
        self.mountpoint = mountpoint
    }

    package func acquire(writing paths: [String], until deadline: UInt64) async throws(CoordinationError) -> UInt64? {
        let prefix = mountpoint + "/"
        let relatives = Set(paths.filter { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }).sorted()
        let now = monotonicNanoseconds()
        let until = ContinuousClock.now + .nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0))
        var identifiers: [ItemIdentifier] = []
        // In path order, so that two claims of several files never wait on each other crosswise.
        for relative in relatives {
            let identifier = ItemIdentifier(relative)
            guard await locks.wantsLock(identifier) else { continue }
            do { try await locks.acquire(identifier, path: relative, deadline: until) } catch {
                for held in identifiers { locks.release(held) }
                throw CoordinationError(.timedOut, error.message)
            }
            identifiers.append(identifier)
        }
        guard !identifiers.isEmpty else { return nil }
        return taken.withLock { taken in
            defer { taken.next += 1 }
            taken.held[taken.next] = identifiers
            return taken.next
        }
    }

    package func release(_ token: UInt64) {
        for identifier in taken.withLock({ $0.held.removeValue(forKey: token) }) ?? [] { locks.release(identifier) }
    }
}
