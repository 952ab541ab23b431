// The client core: claim tickets waiting for grants, the process's presenter registry, and the
// delivery of presenter messages on each presenter's queue. Claims go to an endpoint: the
// in-process arbiter (`ArbiterHost`) or a coordination server reached over a Unix socket.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Hears that a granted claim could not be re-established after its server died (D-402).
protocol ClaimLossListener: AnyObject, Sendable {
    func claimLost(_ error: CoordinationError)
}

/// A claim a caller holds, remembered in a task-local so nested coordination can be recognised.
struct HeldClaim: Sendable {
    var endpoint: ObjectIdentifier
    var local: UInt64
    /// The socket of the connection that holds the claim; nil for an in-process endpoint.
    var descriptor: Int32?
    /// The claim, to say whom it is for (D-406).
    var ticket: CoordinationDomain.Ticket
}

enum CoordinationContext {
    /// Claims held by the current task or thread (inside accessors).
    @TaskLocal static var held: [HeldClaim] = []
}

/// A set of coordinators and presenters that share one arbiter: `.shared` talks to the
/// coordination servers (the standalone one, or a mount's embedded one for paths under a
/// ProviderFS mount); `CoordinationDomain(host:)` keeps everything in this process.
package final class CoordinationDomain: Sendable {
    final class Ticket: Sendable {
        enum State {
            case waiting
            case done
            case cancelledLocally
        }
        struct Progress {
            var state = State.waiting
            /// Whether this ticket holds one unit of reader demand until the server's final answer.
            var holdsDemand = false
            /// Where the claim lives now: a claim resubmitted or reclaimed after a server died
            /// moves to the new server's endpoint (D-402).
            var endpoint: any CoordinationEndpoint
            /// The granted paths (a reclaim names the items where they are now).
            var paths: [String] = []
            /// The connection the server chain knows as this granted claim's holder: the one that
            /// granted it, or the one a reclaim was granted on (D-402).
            var voucher: ClaimHolder?
            /// The process the claim is for when not this one (pid, start time; D-406): told
            /// again to the server a reclaim goes to.
            var heldFor: (pid: Int32, startTime: UInt64)?
        }
        let local: UInt64
        let intents: [ClaimIntent]
        let purpose: String
        let heldByCaller: [UInt64]
        let presenterTimeout: UInt64
        /// When waiting ends (monotonic nanoseconds); a resubmitted claim keeps it.
        let waitDeadline: UInt64
        let progress: Locked<Progress>
        let onResult: @Sendable (Ticket, Result<[String], CoordinationError>) -> Void
        /// Told when the granted claim could not be re-established after its server died.
        let onLost: (any ClaimLossListener)?

        /// Where the claim lives now.
        var endpoint: any CoordinationEndpoint { progress.withLock { $0.endpoint } }

        init(
            local: UInt64, endpoint: any CoordinationEndpoint, holdsDemand: Bool, intents: [ClaimIntent],
            purpose: String, heldByCaller: [UInt64], deadlines: CoordinationDeadlines,
            onResult: @escaping @Sendable (Ticket, Result<[String], CoordinationError>) -> Void,
            onLost: (any ClaimLossListener)?
        ) {
            self.local = local
            self.intents = intents
            self.purpose = purpose
            self.heldByCaller = heldByCaller
            self.presenterTimeout = deadlines.presenterAnswerNanoseconds
            self.waitDeadline = monotonicNanoseconds() &+ deadlines.claimWaitNanoseconds
            self.progress = Locked(Progress(holdsDemand: holdsDemand, endpoint: endpoint))
            self.onResult = onResult
            self.onLost = onLost
        }
    }

    struct PresenterEntry {
        var presenter: any FilePresenter
        var endpoint: (any CoordinationEndpoint)?
        var reacquirers: [ClaimID: @Sendable () -> Void] = [:]
    }

    struct State {
        var nextLocal: UInt64 = 1
        var tickets: [UInt64: Ticket] = [:]
        /// Granted claims not yet released: what to reclaim if their server dies (D-402).
        var held: [UInt64: Ticket] = [:]
        /// Held claims whose reclaim a new server has not answered yet.
        var reclaiming: [UInt64: Ticket] = [:]
        var presenters: [UInt64: PresenterEntry] = [:]
        var presenterLocals: [ObjectIdentifier: UInt64] = [:]
        var purposes: [ObjectIdentifier: String] = [:]
    }

    private let state = Locked(State())
    private let resolveEndpoint: @Sendable (String) throws(CoordinationError) -> any CoordinationEndpoint

    /// The domain of the coordination servers (cross-process). Paths under a ProviderFS mount go
    /// to that mount's server, the rest to the standalone `providerfs coordinator`, started on
    /// demand.
    package static let shared: CoordinationDomain = {
        let router = EndpointRouter()
        let domain = CoordinationDomain { path throws(CoordinationError) in try router.endpoint(for: path) }
        router.delegate = domain.delegate
        return domain
    }()

    /// An in-process domain over `host` (no server, no other process).
    package convenience init(host: ArbiterHost) {
        let box = DelegateBox()
        let endpoint = LocalEndpoint(host: host, delegate: box)
        self.init(box: box) { _ throws(CoordinationError) in endpoint }
    }

    /// A domain whose claims and presenters all go to the server at `socketPath` (no routing, no
    /// on-demand start): e.g. a mount's embedded server, or a server a test started.
    package convenience init(socketPath: String) {
        let box = DelegateBox()
        let link = Locked<ServerLink?>(nil)
        self.init(box: box) { _ throws(CoordinationError) in
            if let current = link.withLock({ $0 }), !current.isDead {
                if !current.peerHungUp() { return current }
                current.markDead()
            }
            let fresh: ServerLink
            do { fresh = try ServerLink.connect(socketPath: socketPath, delegate: box) } catch {
                throw CoordinationError(
                    .serverUnavailable, "Cannot reach the coordination server at \(socketPath): \(error).")
            }
            return link.withLock { current in
                if let existing = current, !existing.isDead {
                    fresh.markDead()
                    return existing
                }
                current = fresh
                return fresh
            }
        }
    }

    private convenience init(
        resolve: @escaping @Sendable (String) throws(CoordinationError) -> any CoordinationEndpoint
    ) {
        self.init(box: DelegateBox(), resolve: resolve)
    }

    private init(
        box: DelegateBox, resolve: @escaping @Sendable (String) throws(CoordinationError) -> any CoordinationEndpoint
    ) {
        self.resolveEndpoint = resolve
        self.delegateBoxStorage = box
        box.domain = self
    }

    private let delegateBoxStorage: DelegateBox
    var delegate: DelegateBox { delegateBoxStorage }

    // MARK: Claims

    /// Submits a claim; `onResult` runs once, with the granted paths or the error.
    func acquire(
        _ intents: [ClaimIntent], purpose: String, deadlines: CoordinationDeadlines, blocksCaller: Bool = true,
        waitsOnThread: Bool = false, onLost: (any ClaimLossListener)? = nil,
        onResult: @escaping @Sendable (Ticket, Result<[String], CoordinationError>) -> Void
    ) throws(CoordinationError) -> Ticket {
        let endpoint = try resolveEndpoint(intents[0].path)
        for intent in intents.dropFirst() where try resolveEndpoint(intent.path) !== endpoint {
            throw CoordinationError(
                .invalidRequest, "Items served by different coordination servers cannot be claimed together.")
        }
        let identifier = ObjectIdentifier(endpoint)
        // Only a wait that blocks its caller can deadlock with the caller's own claims; a callback
        // form (coordinate(with:queue:)) started inside an accessor simply runs later.
        let held = blocksCaller ? CoordinationContext.held.filter { $0.endpoint == identifier }.map(\.local) : []
        let ticket = state.withLock { state in
            let local = state.nextLocal
            state.nextLocal += 1
            let ticket = Ticket(
                local: local, endpoint: endpoint, holdsDemand: !waitsOnThread, intents: intents, purpose: purpose,
                heldByCaller: held, deadlines: deadlines, onResult: onResult, onLost: onLost)
            state.tickets[local] = ticket
            return ticket
        }
        // A claim nobody waits for on a thread needs the endpoint to keep reading for its answer.
        if !waitsOnThread { endpoint.changeReaderDemand(by: 1) }
        endpoint.submit(
            local: ticket.local, purpose: purpose, intents: intents, heldByCaller: held,
            waitTimeout: deadlines.claimWaitNanoseconds, presenterTimeout: deadlines.presenterAnswerNanoseconds)
        // The connection may have broken before the ticket was listed, and its loss then moved
        // nothing: move it now (D-402). Moving twice is harmless (only from the lost endpoint).
        if endpoint.isLost { endpointLost(endpoint) }
        return ticket
    }

    /// Ends a granted claim. Read under the domain's lock, so a reclaim (sent under it) reaches
    /// the new server before this release does, or the claim is not reclaimed at all.
    func release(_ ticket: Ticket) {
        let endpoint = state.withLock { state -> any CoordinationEndpoint in
            state.held[ticket.local] = nil
            return ticket.endpoint
        }
        endpoint.release(local: ticket.local)
    }

    /// Stops waiting for a claim: its result becomes `.cancelled` now, whatever the server does; a
    /// grant that arrives later is released at once.
    func cancel(_ ticket: Ticket) {
        // Under the domain's lock, as `release`: a resubmission to a new server comes before it.
        let (cancelled, addDemand, endpoint) = state.withLock { _ in
            ticket.progress.withLock { progress -> (Bool, Bool, any CoordinationEndpoint) in
                guard progress.state == .waiting else { return (false, false, progress.endpoint) }
                progress.state = .cancelledLocally
                // The waiting thread stops reading now; someone must still read the server's answer
                // (a grant that raced with the cancel must be released).
                let add = !progress.holdsDemand
                progress.holdsDemand = true
                return (true, add, progress.endpoint)
            }
        }
        guard cancelled else { return }
        if addDemand { endpoint.changeReaderDemand(by: 1) }
        endpoint.cancel(local: ticket.local)
        ticket.onResult(ticket, .failure(CoordinationError(.cancelled, "The coordination was cancelled.")))
    }

    /// The server's final answer for a ticket: whether to deliver it (the ticket still waited),
    /// and whether the ticket held reader demand (to give back).
    private static func finish(_ progress: inout Ticket.Progress) -> (deliver: Bool, demand: Bool) {
        defer { progress.holdsDemand = false }
        guard progress.state == .waiting else { return (false, progress.holdsDemand) }
        progress.state = .done
        return (true, progress.holdsDemand)
    }

    func granted(local: UInt64, paths: [String]) {
        let found = state.withLock { state -> (Ticket, reclaimed: Bool)? in
            if let ticket = state.tickets.removeValue(forKey: local) {
                state.held[local] = ticket
                return (ticket, false)
            }
            return state.reclaiming.removeValue(forKey: local).map { ($0, true) }
        }
        guard let (ticket, reclaimed) = found else { return }
        if reclaimed {
            // Re-established (D-402): the new connection now vouches for it.
            let endpoint = ticket.progress.withLock { progress -> any CoordinationEndpoint in
                progress.voucher = progress.endpoint.holderKey
                return progress.endpoint
            }
            endpoint.changeReaderDemand(by: -1)
            return
        }
        let (deliver, demand) = ticket.progress.withLock { progress -> (Bool, Bool) in
            progress.paths = paths
            progress.voucher = progress.endpoint.holderKey
            return Self.finish(&progress)
        }
        if deliver {
            ticket.onResult(ticket, .success(paths))
        } else {
            release(ticket)
        }
        if demand { ticket.endpoint.changeReaderDemand(by: -1) }
    }

    func failed(local: UInt64, error: CoordinationError) {
        let found = state.withLock { state -> (Ticket, reclaim: Bool, stillHeld: Bool)? in
            if let ticket = state.tickets.removeValue(forKey: local) { return (ticket, false, false) }
            guard let ticket = state.reclaiming.removeValue(forKey: local) else { return nil }
            return (ticket, true, state.held.removeValue(forKey: local) != nil)
        }
        guard let (ticket, reclaim, stillHeld) = found else { return }
        if reclaim {
            ticket.endpoint.changeReaderDemand(by: -1)
            if stillHeld { ticket.onLost?.claimLost(error) }  // released meanwhile: nobody to tell
            return
        }
        let (deliver, demand) = ticket.progress.withLock(Self.finish)
        if deliver { ticket.onResult(ticket, .failure(error)) }
        if demand { ticket.endpoint.changeReaderDemand(by: -1) }
    }

    /// How long claims of a dead server wait for a server to reach, before waiting claims fail
    /// with `.connectionLost` and held ones are lost (D-402).
    static let reconnectWindow: UInt64 = 10_000_000_000

    /// A server connection broke. Its presenters are registered again; its waiting claims are
    /// resubmitted, keeping their deadline, and its granted claims reclaimed from the new server
    /// (started if needed) in the background (D-402). Claims that cannot be are failed or
    /// reported lost.
    func endpointLost(_ endpoint: any CoordinationEndpoint) {
        // On another thread: the endpoint may report its loss from a send made under this
        // domain's lock (a reclaim).
        DispatchQueue.global().async { self.moveClaims(from: endpoint) }
    }

    private func moveClaims(from endpoint: any CoordinationEndpoint) {
        let (waiting, held, presenters) = state.withLock {
            state -> ([Ticket], [Ticket], [(UInt64, any FilePresenter)]) in
            let waiting = state.tickets.values.filter { $0.endpoint === endpoint }.sorted { $0.local < $1.local }
            let held = state.held.values.filter { $0.endpoint === endpoint }.sorted { $0.local < $1.local }
            var presenters: [(UInt64, any FilePresenter)] = []
            for (local, entry) in state.presenters where entry.endpoint === endpoint {
                state.presenters[local]?.endpoint = nil
                state.presenters[local]?.reacquirers.removeAll()
                presenters.append((local, entry.presenter))
            }
            return (waiting, held, presenters)
        }
        if !waiting.isEmpty || !held.isEmpty { recover(from: endpoint, waiting: waiting, held: held) }
        for (local, presenter) in presenters {
            register(local: local, presenter: presenter, purpose: purpose(for: presenter))
        }
    }

    /// Moves the claims of a dead endpoint to a new one: reclaims first, then resubmissions.
    private func recover(from lost: any CoordinationEndpoint, waiting: [Ticket], held: [Ticket]) {
        let path = (held.first ?? waiting[0]).intents[0].path
        let giveUp = monotonicNanoseconds() &+ Self.reconnectWindow
        var target: (any CoordinationEndpoint)?
        var problem = "no coordination server could be reached"
        while target == nil {
            do {
                // The next server on the same socket (a path may route elsewhere for a moment:
                // under a mount being mounted again, to the standalone server).
                let candidate = try resolveEndpoint(path)
                if candidate !== lost && candidate.address == lost.address { target = candidate }
            } catch {
                problem = error.message
            }
            if target != nil || monotonicNanoseconds() >= giveUp { break }
            usleep(20_000)
        }
        guard let target else {
            let seconds = Double(Self.reconnectWindow) / 1e9
            let (waitingNow, lostNow) = state.withLock { state -> ([Ticket], [Ticket]) in
                let lostNow = state.held.values.filter { $0.endpoint === lost }.sorted { $0.local < $1.local }
                for ticket in lostNow { state.held[ticket.local] = nil }
                return (state.tickets.values.filter { $0.endpoint === lost }, lostNow)
            }
            for ticket in waitingNow {
                failed(
                    local: ticket.local,
                    error: CoordinationError(
                        .connectionLost,
                        "The connection to the coordination server was lost and no server answered within \(seconds)s: "
                            + "\(problem)."))
            }
            for ticket in lostNow {
                ticket.onLost?.claimLost(
                    CoordinationError(
                        .claimLost,
                        "The claim on \(ticket.intents[0].path) was lost: its coordination server died and no server "
                            + "answered within \(seconds)s (\(problem))."))
            }
            return
        }
        let now = monotonicNanoseconds()
        let expired = state.withLock { state -> [Ticket] in
            var groups: [ClaimHolder: [ReclaimedClaim]] = [:]
            var order: [ClaimHolder] = []
            var heldFor: (pid: Int32, startTime: UInt64)?
            // Listed again under the lock: what is on the lost endpoint now (a grant read just
            // before the loss may have moved a waiting claim to the held ones meanwhile).
            let held = state.held.values.filter { $0.endpoint === lost }.sorted { $0.local < $1.local }
            let waiting = state.tickets.values.filter { $0.endpoint === lost }.sorted { $0.local < $1.local }
            for ticket in held {
                let (voucher, paths) = ticket.progress.withLock { progress -> (ClaimHolder?, [String]) in
                    guard progress.endpoint === lost else { return (nil, []) }
                    progress.endpoint = target
                    if let named = progress.heldFor { heldFor = named }
                    return (progress.voucher, progress.paths)
                }
                guard let voucher else { continue }
                var intents = ticket.intents
                for index in intents.indices where index < paths.count { intents[index].path = paths[index] }
                if groups[voucher] == nil { order.append(voucher) }
                groups[voucher, default: []].append(
                    ReclaimedClaim(
                        local: ticket.local, purpose: ticket.purpose, presenterTimeout: ticket.presenterTimeout,
                        intents: intents))
                state.reclaiming[ticket.local] = ticket
                target.changeReaderDemand(by: 1)  // the answer comes while the accessor runs
            }
            // The connection's claims are for that process again, the reclaimed ones included (D-406).
            if let heldFor { target.holdFor(pid: heldFor.pid, startTime: heldFor.startTime) }
            for voucher in order { target.reclaim(previous: voucher, claims: groups[voucher]!) }
            var expired: [Ticket] = []
            for ticket in waiting {
                let moved = ticket.progress.withLock { progress -> Bool in
                    guard progress.state == .waiting, progress.endpoint === lost else { return false }
                    progress.endpoint = target
                    progress.holdsDemand = true
                    return true
                }
                guard moved else { continue }
                target.changeReaderDemand(by: 1)
                guard ticket.waitDeadline > now else {
                    expired.append(ticket)
                    continue
                }
                target.submit(
                    local: ticket.local, purpose: ticket.purpose, intents: ticket.intents,
                    heldByCaller: ticket.heldByCaller, waitTimeout: ticket.waitDeadline - now,
                    presenterTimeout: ticket.presenterTimeout)
            }
            return expired
        }
        if target.isLost {
            // It died before the claims were on it, so its own loss may have found none of
            // them: move them again.
            moveClaims(from: target)
        }
        for ticket in expired {
            failed(
                local: ticket.local,
                error: CoordinationError(
                    .timedOut,
                    "The claim on \(ticket.intents[0].path) was not granted before its deadline (its coordination "
                        + "server died meanwhile)."))
        }
    }

    /// A thread whose claim's endpoint died waits here for the claim's result from wherever it
    /// was resubmitted: at most until its deadline plus the reconnection window; then it stops.
    func awaitAfterLoss(_ ticket: Ticket, _ waiter: Waiter) -> Result<[String], CoordinationError> {
        let now = monotonicNanoseconds()
        let limit = (ticket.waitDeadline > now ? ticket.waitDeadline - now : 0) &+ Self.reconnectWindow &+ 5_000_000_000
        if let result = waiter.wait(milliseconds: Int(min(limit / 1_000_000, UInt64(Int32.max)))) { return result }
        cancel(ticket)
        if case .success(let paths)? = waiter.peek() { return .success(paths) }
        return .failure(CoordinationError(.connectionLost, "The connection to the coordination server was lost."))
    }

    /// Announces a version event.
    func versionChanged(
        path: String, change: VersionChange, version: String, versionName: String
    )
        throws(CoordinationError)
    {
        try resolveEndpoint(path).versionChanged(path: path, change: change, version: version, versionName: versionName)
    }

    /// Announces a move made inside a write accessor (rules 35–40).
    func itemMoved(from: String, to: String, purpose: String) throws(CoordinationError) {
        let endpoint = try resolveEndpoint(from)
        endpoint.itemMoved(from: from, to: to, purpose: purpose)
        let destination = try resolveEndpoint(to)
        if destination !== endpoint { destination.itemMoved(from: from, to: to, purpose: purpose) }
    }

    // MARK: Presenters

    /// The purpose shared by every coordinator created with `presenter` (rule 6).
    func purpose(for presenter: any FilePresenter) -> String {
        state.withLock { state in
            let key = ObjectIdentifier(presenter)
            if let purpose = state.purposes[key] { return purpose }
            let purpose = UUID().uuidString
            state.purposes[key] = purpose
            return purpose
        }
    }

    /// Registers `presenter` (kept alive until removed, rule 68). A presenter with a nil URL is
    /// registered with the arbiter once a coordinator created with it finishes (rule 46).
    package func addFilePresenter(_ presenter: any FilePresenter) {
        let key = ObjectIdentifier(presenter)
        let purpose = self.purpose(for: presenter)
        let local: UInt64? = state.withLock { state in
            guard state.presenterLocals[key] == nil else { return nil }
            let local = state.nextLocal
            state.nextLocal += 1
            state.presenterLocals[key] = local
            state.presenters[local] = PresenterEntry(presenter: presenter)
            return local
        }
        guard let local else { return }
        register(local: local, presenter: presenter, purpose: purpose)
    }

    private func register(local: UInt64, presenter: any FilePresenter, purpose: String) {
        guard let url = presenter.presentedItemURL, let path = try? ItemResolver.validatedPath(url),
            let item = try? ItemResolver.resolve(path), let endpoint = try? resolveEndpoint(item.path)
        else { return }
        let registered = state.withLock { state -> Bool in
            guard state.presenters[local] != nil, state.presenters[local]?.endpoint == nil else { return false }
            state.presenters[local]?.endpoint = endpoint
            return true
        }
        if registered {
            endpoint.addPresenter(
                local: local, purpose: purpose, item: item, methods: presenter.implementedPresenterMethods)
        }
    }

    /// Registers a presenter whose URL was nil when it was added, once it has one (rule 46).
    func refreshPresenter(_ presenter: any FilePresenter) {
        let key = ObjectIdentifier(presenter)
        guard let local = state.withLock({ $0.presenterLocals[key] }) else { return }
        register(local: local, presenter: presenter, purpose: purpose(for: presenter))
    }

    /// Unregisters `presenter`; doing so for one never added does nothing (rule 66).
    package func removeFilePresenter(_ presenter: any FilePresenter) {
        let key = ObjectIdentifier(presenter)
        let removed = state.withLock { state -> (UInt64, PresenterEntry)? in
            guard let local = state.presenterLocals.removeValue(forKey: key),
                let entry = state.presenters.removeValue(forKey: local)
            else { return nil }
            return (local, entry)
        }
        guard let (local, entry) = removed else { return }
        entry.endpoint?.removePresenter(local: local)
    }

    /// This process's presenters in this domain (rule 67).
    package var filePresenters: [any FilePresenter] {
        state.withLock { state in
            state.presenters.sorted { $0.key < $1.key }.map(\.value.presenter)
        }
    }

    func deliver(presenter local: UInt64, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        let found = state.withLock {
            state -> (any FilePresenter, (any CoordinationEndpoint)?, (@Sendable () -> Void)?)? in
            guard let entry = state.presenters[local] else { return nil }
            var reacquirer: (@Sendable () -> Void)?
            if message == .reacquire, let claim {
                reacquirer = state.presenters[local]?.reacquirers.removeValue(forKey: claim)
            }
            return (entry.presenter, entry.endpoint, reacquirer)
        }
        guard let (presenter, endpoint, reacquirer) = found else {
            // The presenter is gone here; answer so the claim does not wait for its deadline.
            return
        }
        let answer: @Sendable ((any Error)?) -> Void = { error in
            guard messageID != 0 else { return }
            endpoint?.reply(messageID: messageID, error: error.map { "\($0)" })
        }
        let queue = presenter.presentedItemOperationQueue
        switch message {
        case .relinquishToReader, .relinquishToWriter:
            let store: @Sendable ((@Sendable () -> Void)?) -> Void = { [weak self] reacquirer in
                if let reacquirer, let claim, let self {
                    self.state.withLock { $0.presenters[local]?.reacquirers[claim] = reacquirer }
                }
                answer(nil)
            }
            queue.addOperation {
                if message == .relinquishToReader {
                    presenter.relinquishPresentedItem(toReader: store)
                } else {
                    presenter.relinquishPresentedItem(toWriter: store)
                }
            }
        case .savePresentedItemChanges:
            queue.addOperation { presenter.savePresentedItemChanges(completionHandler: answer) }
        case .accommodateDeletion:
            queue.addOperation { presenter.accommodatePresentedItemDeletion(completionHandler: answer) }
        case .accommodateSubitemDeletion(let path):
            queue.addOperation {
                presenter.accommodatePresentedSubitemDeletion(
                    at: URL(fileURLWithPath: path), completionHandler: answer)
            }
        case .accommodateEviction:
            queue.addOperation { presenter.accommodatePresentedItemEviction(completionHandler: answer) }
        case .reacquire:
            if let reacquirer { queue.addOperation { reacquirer() } }
        case .didChange:
            queue.addOperation { presenter.presentedItemDidChange() }
        case .subitemDidChange(let path):
            queue.addOperation { presenter.presentedSubitemDidChange(at: URL(fileURLWithPath: path)) }
        case .didMove(let path):
            queue.addOperation { presenter.presentedItemDidMove(to: URL(fileURLWithPath: path)) }
        case .subitemDidMove(let from, let to):
            queue.addOperation {
                presenter.presentedSubitem(at: URL(fileURLWithPath: from), didMoveTo: URL(fileURLWithPath: to))
            }
        case .versionChanged(let change, let item, let versionPath, let name):
            let version = FileVersion(url: URL(fileURLWithPath: versionPath), name: name)
            let own = presenter.presentedItemURL.map { $0.path == item } ?? false
            queue.addOperation {
                let url = URL(fileURLWithPath: item)
                switch (change, own) {
                case (.gained, true): presenter.presentedItemDidGain(version)
                case (.lost, true): presenter.presentedItemDidLose(version)
                case (.resolved, true): presenter.presentedItemDidResolveConflict(version)
                case (.gained, false): presenter.presentedSubitem(at: url, didGain: version)
                case (.lost, false): presenter.presentedSubitem(at: url, didLose: version)
                case (.resolved, false): presenter.presentedSubitem(at: url, didResolve: version)
                }
            }
        }
    }
}
