// The arbiter behind a lock, with a timer for its deadlines and a sink per owner for the actions it
// returns. Both the coordination server (one owner per connection) and in-process domains use it.

import Dispatch
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Receives the arbiter's actions for one owner. Called after the host's lock is dropped, on the
/// thread that caused the action (a submit, a reply, the deadline timer).
package protocol ArbiterSink: AnyObject, Sendable {
    /// The claim is granted; `paths` are the intents' current paths.
    func granted(_ claim: ClaimID, paths: [String])
    /// The claim will not be granted.
    func failed(_ claim: ClaimID, error: CoordinationError)
    /// A message for one of this owner's presenters.
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?)
}

/// Monotonic nanoseconds (CLOCK_MONOTONIC).
package func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// An `Arbiter` shared by threads: every call locks, runs the state machine, unlocks, then
/// performs the returned actions through the owners' sinks.
package final class ArbiterHost: @unchecked Sendable {
    // Safe: `state` is a Locked; `timer` is a DispatchSource, thread-safe to schedule and cancel
    // (Dispatch does not mark the protocol Sendable); the rest is immutable.
    struct State {
        var arbiter = Arbiter()
        var sinks: [UInt64: any ArbiterSink] = [:]
        var nextOwner: UInt64 = 1
        var timerDeadline: UInt64?
    }

    private let state = Locked(State())
    private let clock: @Sendable () -> UInt64
    private let timerQueue = DispatchQueue(label: "providerfs.arbiter.deadlines")
    private let timer: any DispatchSourceTimer

    /// A host reading time from `clock` (monotonic nanoseconds).
    package init(clock: @escaping @Sendable () -> UInt64 = monotonicNanoseconds) {
        self.clock = clock
        timer = DispatchSource.makeTimerSource(queue: timerQueue)
        timer.schedule(deadline: .distantFuture)
        timer.setEventHandler { [weak self] in self?.timerFired() }
        timer.resume()
    }

    deinit {
        timer.cancel()
    }

    /// The host's current time.
    package var now: UInt64 { clock() }

    /// Registers an owner and the sink that receives its actions; returns the owner number.
    package func addOwner(_ sink: any ArbiterSink) -> UInt64 {
        state.withLock { state in
            let owner = state.nextOwner
            state.nextOwner += 1
            state.sinks[owner] = sink
            return owner
        }
    }

    /// Removes an owner: its claims are released and its presenters removed at once.
    package func removeOwner(_ owner: UInt64) {
        perform { arbiter, now in arbiter.ownerGone(owner, now: now) }
        state.withLock { _ = $0.sinks.removeValue(forKey: owner) }
    }

    /// The claims of `owner` are for process `pid` from now on (D-406).
    package func holdFor(_ owner: UInt64, pid: Int32) {
        perform { arbiter, now in arbiter.holdFor(owner, pid: pid, now: now) }
    }

    /// Submits a claim.
    package func submit(_ request: ClaimRequest) {
        perform { arbiter, now in arbiter.submit(request, now: now) }
    }

    /// Submits a claim whose `actingForPids` (the caller's ancestry, read from /proc) is worked out
    /// only when some claim is held or waiting: they are only consulted against granted claims, and
    /// with none at submission the claim is granted at once. Checked under the arbiter's lock, so
    /// no claim can slip in between. A mount open usually finds no claims and skips six /proc reads.
    package func submit(_ request: ClaimRequest, ancestry: () -> [Int32]) {
        perform { arbiter, now in
            var request = request
            if arbiter.claimCount > 0 { request.actingForPids = ancestry() }
            return arbiter.submit(request, now: now)
        }
    }

    /// Grants `request` if nothing makes it wait (`Arbiter.grantIfImmediate`) and returns true;
    /// otherwise changes nothing and returns false. No sink hears of the grant: the caller knows.
    /// `ancestry` as in `submit(_:ancestry:)`, and not even then for a read among reads only
    /// (many files open for reading, no writer: a read claim granted at once never waits, so
    /// whom it acts for cannot matter; that saves a /proc read per ancestor on every open).
    package func grantIfImmediate(_ request: ClaimRequest, ancestry: () -> [Int32]) -> Bool {
        let now = clock()
        return state.withLock { state in
            var request = request
            if state.arbiter.claimCount > 0 && !state.arbiter.isReadAmongReads(request) {
                request.actingForPids = ancestry()
            }
            return state.arbiter.grantIfImmediate(request, now: now)
        }
    }

    /// Releases a granted claim (or abandons a waiting one).
    package func release(_ claim: ClaimID) {
        perform { arbiter, now in arbiter.release(claim, now: now) }
    }

    /// Cancels a waiting claim (it fails with `.cancelled`) or releases a granted one.
    package func cancel(_ claim: ClaimID) {
        perform { arbiter, now in arbiter.cancel(claim, now: now) }
    }

    /// Starts a grace period awaiting `holders` for `duration` nanoseconds (D-402).
    package func beginGrace(awaiting holders: Set<ClaimHolder>, for duration: UInt64) {
        perform { arbiter, now in
            arbiter.beginGrace(awaiting: holders, until: now &+ duration, now: now)
            return []
        }
    }

    /// `holder` re-establishes the claims it held under the previous server (D-402).
    package func reclaim(_ requests: [ClaimRequest], from holder: ClaimHolder) {
        perform { arbiter, now in arbiter.reclaim(requests, from: holder, now: now) }
    }

    /// Holders of the grace period that will not reclaim (their process is gone).
    package func holdersGone(_ holders: Set<ClaimHolder>) {
        perform { arbiter, now in arbiter.holdersGone(holders, now: now) }
    }

    /// The holders the grace period still awaits (empty outside one).
    package var awaitedHolders: Set<ClaimHolder> { state.withLock { $0.arbiter.awaitedHolders } }

    /// Registers a presenter.
    package func addPresenter(_ presenter: PresenterRegistration) {
        state.withLock { $0.arbiter.addPresenter(presenter) }
    }

    /// Removes a presenter.
    package func removePresenter(_ presenter: PresenterID) {
        perform { arbiter, now in arbiter.removePresenter(presenter, now: now) }
    }

    /// A presenter's answer.
    package func reply(messageID: UInt64, error: String?, from owner: UInt64? = nil) {
        perform { arbiter, now in arbiter.reply(messageID: messageID, error: error, from: owner, now: now) }
    }

    /// `item(at:didMoveTo:)`.
    package func itemMoved(from: String, to: String, purpose: String) {
        perform { arbiter, now in arbiter.itemMoved(from: from, to: to, purpose: purpose, now: now) }
    }

    /// A version event (`FileCoordinator.item(at:didChangeVersion:…)`).
    package func versionChanged(path: String, change: VersionChange, version: String, versionName: String) {
        perform { arbiter, _ in
            arbiter.versionChanged(path: path, change: change, version: version, versionName: versionName)
        }
    }

    /// The provider changed the item at `path` (`Arbiter.itemChanged`).
    package func providerChanged(path: String) {
        perform { arbiter, _ in arbiter.itemChanged(path: path) }
    }

    /// The provider deleted the item at `path` (`Arbiter.itemDeleted`).
    package func providerDeleted(path: String) {
        perform { arbiter, _ in arbiter.itemDeleted(path: path) }
    }

    /// The provider moved the item at `from` to `to`: `itemMoved` with a purpose no presenter has.
    package func providerMoved(from: String, to: String) {
        itemMoved(from: from, to: to, purpose: Arbiter.providerPurpose)
    }

    /// Whether any presenter is registered.
    package var hasPresenters: Bool { state.withLock { $0.arbiter.presenterCount > 0 } }

    /// Whether a presenter would hear of a change at `path` (`Arbiter.isPresented(near:)`).
    package func isPresented(near path: String) -> Bool {
        state.withLock { $0.arbiter.isPresented(near: path) }
    }

    /// The claim dump: claims, presenters and recent events.
    package func dump() -> (
        claims: [ClaimSnapshot], presenters: [PresenterSnapshot], events: [ArbiterEvent], now: UInt64
    ) {
        let now = clock()
        return state.withLock { state in
            (state.arbiter.snapshot(now: now), state.arbiter.presenterSnapshot(), state.arbiter.events, now)
        }
    }

    /// Whether nothing is held, waiting or presented.
    package var isIdle: Bool {
        state.withLock { $0.arbiter.claimCount == 0 && $0.arbiter.presenterCount == 0 }
    }

    private func timerFired() {
        state.withLock { $0.timerDeadline = nil }
        perform { arbiter, now in arbiter.tick(now: now) }
    }

    /// Runs one state-machine step under the lock, then performs its actions without it.
    @inline(__always)
    func perform(_ step: (inout Arbiter, UInt64) -> [ArbiterAction]) {
        let now = clock()
        // The sink of the first action is returned on its own: most steps have one action (a
        // grant) or none, and need no array of sinks.
        let (actions, firstSink, otherSinks, rearm) = state.withLock {
            state -> ([ArbiterAction], (any ArbiterSink)?, [any ArbiterSink], UInt64?) in
            let actions = step(&state.arbiter, now)
            var rearm: UInt64?
            if let next = state.arbiter.nextDeadline, next < (state.timerDeadline ?? .max) {
                state.timerDeadline = next
                rearm = next
            }
            guard let first = actions.first else { return (actions, nil, [], rearm) }
            func sink(_ action: ArbiterAction) -> any ArbiterSink {
                switch action {
                case .grant(let claim, _), .fail(let claim, _): return state.sinks[claim.owner] ?? NullSink.shared
                case .deliver(let presenter, _, _, _): return state.sinks[presenter.owner] ?? NullSink.shared
                }
            }
            return (actions, sink(first), actions.count > 1 ? actions.dropFirst().map(sink) : [], rearm)
        }
        if let rearm {
            let delay = rearm > now ? rearm - now : 0
            timer.schedule(deadline: .now() + .nanoseconds(Int(min(delay, UInt64(Int.max)))))
        }
        guard let firstSink else { return }
        for (index, action) in actions.enumerated() {
            let sink = index == 0 ? firstSink : otherSinks[index - 1]
            switch action {
            case .grant(let claim, let paths): sink.granted(claim, paths: paths)
            case .fail(let claim, let error): sink.failed(claim, error: error)
            case .deliver(let presenter, let messageID, let message, let claim):
                sink.deliver(presenter, messageID: messageID, message: message, claim: claim)
            }
        }
    }
}

/// Drops actions for owners that are gone.
final class NullSink: ArbiterSink {
    static let shared = NullSink()
    func granted(_ claim: ClaimID, paths: [String]) {}
    func failed(_ claim: ClaimID, error: CoordinationError) {}
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {}
}
