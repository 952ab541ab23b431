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

/// A claim a caller holds, remembered in a task-local so nested coordination can be recognised.
struct HeldClaim: Sendable, Hashable {
    var endpoint: ObjectIdentifier
    var local: UInt64
    /// The socket of the connection that holds the claim; nil for an in-process endpoint.
    var descriptor: Int32?
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
        }
        let local: UInt64
        let endpoint: any CoordinationEndpoint
        let progress: Locked<Progress>
        let onResult: @Sendable (Ticket, Result<[String], CoordinationError>) -> Void

        init(
            local: UInt64, endpoint: any CoordinationEndpoint, holdsDemand: Bool,
            onResult: @escaping @Sendable (Ticket, Result<[String], CoordinationError>) -> Void
        ) {
            self.local = local
            self.endpoint = endpoint
            self.progress = Locked(Progress(holdsDemand: holdsDemand))
            self.onResult = onResult
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
        waitsOnThread: Bool = false,
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
            let ticket = Ticket(local: local, endpoint: endpoint, holdsDemand: !waitsOnThread, onResult: onResult)
            state.tickets[local] = ticket
            return ticket
        }
        // A claim nobody waits for on a thread needs the endpoint to keep reading for its answer.
        if !waitsOnThread { endpoint.changeReaderDemand(by: 1) }
        endpoint.submit(
            local: ticket.local, purpose: purpose, intents: intents, heldByCaller: held,
            waitTimeout: deadlines.claimWaitNanoseconds, presenterTimeout: deadlines.presenterAnswerNanoseconds)
        return ticket
    }

    /// Ends a granted claim.
    func release(_ ticket: Ticket) {
        ticket.endpoint.release(local: ticket.local)
    }

    /// Stops waiting for a claim: its result becomes `.cancelled` now, whatever the server does; a
    /// grant that arrives later is released at once.
    func cancel(_ ticket: Ticket) {
        let (cancelled, addDemand) = ticket.progress.withLock { progress -> (Bool, Bool) in
            guard progress.state == .waiting else { return (false, false) }
            progress.state = .cancelledLocally
            // The waiting thread stops reading now; someone must still read the server's answer
            // (a grant that raced with the cancel must be released).
            let add = !progress.holdsDemand
            progress.holdsDemand = true
            return (true, add)
        }
        guard cancelled else { return }
        if addDemand { ticket.endpoint.changeReaderDemand(by: 1) }
        ticket.endpoint.cancel(local: ticket.local)
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
        guard let ticket = state.withLock({ $0.tickets.removeValue(forKey: local) }) else { return }
        let (deliver, demand) = ticket.progress.withLock(Self.finish)
        if deliver { ticket.onResult(ticket, .success(paths)) } else { ticket.endpoint.release(local: local) }
        if demand { ticket.endpoint.changeReaderDemand(by: -1) }
    }

    func failed(local: UInt64, error: CoordinationError) {
        guard let ticket = state.withLock({ $0.tickets.removeValue(forKey: local) }) else { return }
        let (deliver, demand) = ticket.progress.withLock(Self.finish)
        if deliver { ticket.onResult(ticket, .failure(error)) }
        if demand { ticket.endpoint.changeReaderDemand(by: -1) }
    }

    /// A server connection broke: its waiting claims fail with `.connectionLost`, and its
    /// presenters are registered again (with a new server, started if needed) in the background.
    func endpointLost(_ endpoint: any CoordinationEndpoint) {
        let (tickets, presenters) = state.withLock { state -> ([Ticket], [(UInt64, any FilePresenter)]) in
            let tickets = state.tickets.values.filter { $0.endpoint === endpoint }
            for ticket in tickets { state.tickets[ticket.local] = nil }
            var presenters: [(UInt64, any FilePresenter)] = []
            for (local, entry) in state.presenters where entry.endpoint === endpoint {
                state.presenters[local]?.endpoint = nil
                state.presenters[local]?.reacquirers.removeAll()
                presenters.append((local, entry.presenter))
            }
            return (tickets, presenters)
        }
        for ticket in tickets {
            let (deliver, demand) = ticket.progress.withLock(Self.finish)
            if demand { ticket.endpoint.changeReaderDemand(by: -1) }
            if deliver {
                ticket.onResult(
                    ticket,
                    .failure(CoordinationError(.connectionLost, "The connection to the coordination server was lost.")))
            }
        }
        guard !presenters.isEmpty else { return }
        DispatchQueue.global().async {
            for (local, presenter) in presenters {
                self.register(local: local, presenter: presenter, purpose: self.purpose(for: presenter))
            }
        }
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
