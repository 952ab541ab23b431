// The arbiter: one pure state machine deciding which claims are granted, which wait, and which
// presenter messages go out. It performs no I/O and reads no clock: every method takes `now`
// (monotonic nanoseconds) and returns the actions to perform once the caller has dropped its lock
// (DESIGN.md §3). Rule numbers refer to reference/apple-coordination-spec.md §7.

#if canImport(Glibc)
import Glibc  // memcmp only
#elseif canImport(Musl)
import Musl
#endif

/// The arbiter state machine. Not thread-safe by itself: `ArbiterHost` keeps it behind a lock.
package struct Arbiter: Sendable {
    enum Phase: Sendable {
        /// Behind a conflicting claim.
        case queued
        /// Not blocked; presenter answers pending.
        case messaging
        /// Presenters answered; granted as soon as nothing conflicts.
        case messaged
        case granted
    }

    struct Pending: Sendable {
        var presenter: PresenterID
        var purpose: String
        var message: PresenterMessage
        var deadline: UInt64
    }

    struct Claim: Sendable {
        var request: ClaimRequest
        var sequence: UInt64
        var phase: Phase = .queued
        var submitted: UInt64
        var pending: [UInt64: Pending] = [:]
        var followUps: [PresenterID: [PresenterMessage]] = [:]
        var relinquished: [PresenterID] = []
        var events: [String] = []
        /// Made inside an accessor: by a caller that holds claims of this arbiter (`heldByCaller`),
        /// or for a process that, itself or an ancestor, holds a granted claim (a kernel caller
        /// reading inside its own coordinated access). It waits only for granted claims: a writer
        /// queued behind the caller's own claim would otherwise deadlock them (D-102).
        var isNested: Bool { !request.heldByCaller.isEmpty || insideOwnClaim }
        var insideOwnClaim = false
    }

    private(set) var claims: [ClaimID: Claim] = [:]
    /// How many of `claims` are granted: when all are, nothing waits and there is nothing to
    /// schedule or time out (the common case, checked without visiting every claim).
    private var grantedCount = 0
    /// How many live claims have a write intent. A claim of reads only can be kept waiting by
    /// these alone (read/read never conflicts, rules 1 and 10): with none, a new read claim is
    /// granted without looking at the others — a mount holds a read claim per open file.
    private var writerCount = 0

    /// Whether `request` could only meet other reads: no write claim is held or waiting and it
    /// writes nothing. Then nothing can block it, and the processes it acts for do not matter.
    package func isReadAmongReads(_ request: ClaimRequest) -> Bool {
        writerCount == 0 && !request.hasWrite
    }
    /// Where a claim's possible blockers are, once there are many claims (D-127): nil below
    /// `indexThreshold` live claims, where a scan is cheaper than keeping an index.
    private var conflictIndex: ConflictIndex?
    /// Live claims from which the index is kept. Debug builds index from the first claim, so
    /// every test exercises it and checks it against the scan.
    #if DEBUG
    static let indexThreshold = 1
    #else
    static let indexThreshold = 32
    #endif
    /// Arrival order of live claims (FIFO, rule 16).
    private var order: [ClaimID] = []
    private(set) var presenters: [PresenterID: PresenterRegistration] = [:]
    private var messageOwner: [UInt64: ClaimID] = [:]
    private var nextSequence: UInt64 = 1
    private var nextMessage: UInt64 = 1
    /// The grace period after a server restart (D-402): while set, only reclaims of the holders
    /// still awaited are granted; every other claim waits.
    private var grace: (deadline: UInt64, awaited: Set<ClaimHolder>)?
    /// The last events (bounded), for the claim dump.
    package private(set) var events: [ArbiterEvent] = []
    /// How many events are kept.
    package static let eventLimit = 100

    /// An empty arbiter.
    package init() {}

    /// Number of live claims (granted or waiting).
    package var claimCount: Int { claims.count }
    /// Number of registered presenters.
    package var presenterCount: Int { presenters.count }

    // MARK: Claims

    /// Adds a claim. It is granted at once when nothing conflicts and no presenter must be asked.
    package mutating func submit(_ request: ClaimRequest, now: UInt64) -> [ArbiterAction] {
        submit(request, now: now, onlyIfImmediate: false) ?? []
    }

    /// Grants `request` if it can be granted at once: nothing blocks it, no presenter has to be
    /// asked, no eviction refused. Otherwise leaves everything as it was and returns false; the
    /// caller then submits it the ordinary way (and so waits, messages or fails there).
    package mutating func grantIfImmediate(_ request: ClaimRequest, now: UInt64) -> Bool {
        submit(request, now: now, onlyIfImmediate: true) != nil
    }

    private mutating func submit(_ request: ClaimRequest, now: UInt64, onlyIfImmediate: Bool) -> [ArbiterAction]? {
        if request.intents.isEmpty {
            if onlyIfImmediate { return nil }
            return [.fail(request.id, CoordinationError(.invalidRequest, "A claim needs at least one item."))]
        }
        if claims[request.id] != nil {
            if onlyIfImmediate { return nil }
            return [.fail(request.id, CoordinationError(.invalidRequest, "Claim \(request.id) is already in use."))]
        }
        var claim = Claim(request: request, sequence: nextSequence, submitted: now)
        if !request.actingForPids.isEmpty { claim.insideOwnClaim = holdsGrantedClaim(anyOf: request.actingForPids) }
        if onlyIfImmediate {
            guard grace == nil, !(claim.isNested && deadlockingHeldClaim(for: claim) != nil),
                blocker(for: claim) == nil,
                messagePlan(for: request).isEmpty, evictionRefuser(for: request) == nil
            else { return nil }
            nextSequence += 1
            return grantAtOnce(claim)
        }
        nextSequence += 1
        if claim.isNested, let held = deadlockingHeldClaim(for: claim) {
            let heldClaim = claims[held]!
            let text =
                "Nested coordination would deadlock: the claim on \(request.intents[0].path) would wait for claim "
                + "\(held) on \(heldClaim.request.intents[0].path), which the same caller holds; use the same "
                + "coordinator, or one call with both items."
            return [.fail(request.id, CoordinationError(.wouldDeadlock, text))]
        }
        if request.waitDeadline <= now, grace != nil || blocker(for: claim) != nil {
            return [.fail(request.id, timeoutError(claim))]
        }
        claim.phase = .queued
        if grace == nil && blocker(for: claim) == nil && messagePlan(for: request).isEmpty
            && evictionRefuser(for: request) == nil
        {
            // Fast path (uncontended, nobody to ask): granted without a second look-up.
            return grantAtOnce(claim)
        }
        claims[request.id] = claim
        order.append(request.id)
        if request.hasWrite { writerCount += 1 }
        indexInsert(request)
        var actions: [ArbiterAction] = []
        advance(request.id, now: now, into: &actions)
        return actions
    }

    /// Records `claim`, which nothing blocks and nobody must be asked about, as granted.
    private mutating func grantAtOnce(_ claim: Claim) -> [ArbiterAction] {
        let request = claim.request
        var claim = claim
        claim.phase = .granted
        markGranted(request.pid)
        claims[request.id] = consume claim
        order.append(request.id)
        if request.hasWrite { writerCount += 1 }
        indexInsert(request)
        return [.grant(request.id, paths: request.intents.map(\.path))]
    }

    /// Ends a granted claim (or abandons a waiting one): presenters get their reacquirer and, after
    /// a write, didChange (rules 31, 41); waiting claims are re-examined.
    package mutating func release(_ id: ClaimID, now: UInt64) -> [ArbiterAction] {
        guard let claim = claims.removeValue(forKey: id) else { return [] }
        var actions: [ArbiterAction] = []
        forget(claim)
        finish(claim, succeeded: claim.phase == .granted, into: &actions)
        schedule(now: now, into: &actions)
        return actions
    }

    /// Stops waiting for a claim (rule 53): it fails with `.cancelled`. A claim already granted is
    /// left alone: the grant may be in flight to a client that will release it (rule 54).
    package mutating func cancel(_ id: ClaimID, now: UInt64) -> [ArbiterAction] {
        guard let claim = claims[id], claim.phase != .granted else { return [] }
        var actions: [ArbiterAction] = [
            .fail(id, CoordinationError(.cancelled, "The coordination was cancelled."))
        ]
        remove(id)
        finish(claim, succeeded: false, into: &actions)
        schedule(now: now, into: &actions)
        return actions
    }

    // MARK: Presenters

    /// Registers a presenter. It gets messages for claims that start messaging from now on.
    package mutating func addPresenter(_ presenter: PresenterRegistration) {
        presenters[presenter.id] = presenter
    }

    /// Removes a presenter; answers it still owes count as given (rule 66: unknown ids are ignored).
    package mutating func removePresenter(_ id: PresenterID, now: UInt64) -> [ArbiterAction] {
        guard presenters.removeValue(forKey: id) != nil else { return [] }
        var actions: [ArbiterAction] = []
        let owed = messageOwner.filter { claims[$0.value]?.pending[$0.key]?.presenter == id }
        for (message, claimID) in owed.sorted(by: { $0.key < $1.key }) {
            answer(message, claim: claimID, error: nil, now: now, into: &actions, event: nil)
        }
        schedule(now: now, into: &actions)
        return actions
    }

    /// A presenter answered message `messageID`; a non-nil error fails the claim (rule 25). With
    /// `owner`, only an answer from the owner of the asked presenter counts (a server passes the
    /// connection, so one client cannot answer for another's presenter).
    package mutating func reply(
        messageID: UInt64, error: String?, from owner: UInt64? = nil, now: UInt64
    )
        -> [ArbiterAction]
    {
        guard let claimID = messageOwner[messageID] else { return [] }
        if let owner, claims[claimID]?.pending[messageID]?.presenter.owner != owner { return [] }
        var actions: [ArbiterAction] = []
        answer(messageID, claim: claimID, error: error, now: now, into: &actions, event: nil)
        schedule(now: now, into: &actions)
        return actions
    }

    /// Everything of one owner goes: its claims are released, its presenters removed (a dead or
    /// disconnected client).
    package mutating func ownerGone(_ owner: UInt64, now: UInt64) -> [ArbiterAction] {
        var actions: [ArbiterAction] = []
        for id in order where id.owner == owner {
            guard let claim = claims[id] else { continue }
            remove(id)
            finish(claim, succeeded: claim.phase == .granted, into: &actions)
        }
        for id in presenters.keys.filter({ $0.owner == owner }).sorted(by: { $0.local < $1.local }) {
            actions += removePresenter(id, now: now)
        }
        schedule(now: now, into: &actions)
        return actions
    }

    /// The claims of `owner`, granted and waiting, are now for process `pid` (D-406: the command
    /// `providerfs coordinate` runs): a kernel caller whose ancestry includes `pid` passes them as
    /// its own (D-126), and claims that waited only for them go ahead.
    package mutating func holdFor(_ owner: UInt64, pid: Int32, now: UInt64) -> [ArbiterAction] {
        var changed = false
        for id in order where id.owner == owner {
            guard let index = claims.index(forKey: id), claims.values[index].request.pid != pid else { continue }
            if claims.values[index].phase == .granted {
                conflictIndex?.ungranted(claims.values[index].request.pid)
                conflictIndex?.granted(pid)
            }
            claims.values[index].request.pid = pid
            changed = true
        }
        guard changed else { return [] }
        // A kernel caller that came before this, under `pid`, waits for the claim as for a
        // stranger's: it now waits inside its own claim (nested, D-126) and is let through.
        for index in claims.indices where claims.values[index].phase != .granted {
            let acting = claims.values[index].request.actingForPids
            if !acting.isEmpty && !claims.values[index].insideOwnClaim {
                claims.values[index].insideOwnClaim = holdsGrantedClaim(anyOf: acting)
            }
        }
        var actions: [ArbiterAction] = []
        schedule(now: now, into: &actions)
        return actions
    }

    /// `item(at: from, didMoveTo: to)` by the holder of `by`: presenters of the item and of
    /// everything inside it learn their new URL (rules 35–36), presenters of containing
    /// directories get subitemDidMove (rule 37), and waiting claims follow the item except
    /// `.forReplacing` ones (rules 39–40). Same paths do nothing (rule 38).
    package mutating func itemMoved(from: String, to: String, purpose: String, now: UInt64) -> [ArbiterAction] {
        guard from != to else { return [] }
        var actions: [ArbiterAction] = []
        for id in presenters.keys.sorted(by: { ($0.owner, $0.local) < ($1.owner, $1.local) }) {
            guard var presenter = presenters[id] else { continue }
            if let moved = Arbiter.rebase(presenter.path, from: from, to: to) {
                presenter.path = moved
                presenters[id] = presenter
                if presenter.purpose != purpose && presenter.methods.contains(.didMove) {
                    actions.append(.deliver(id, messageID: 0, message: .didMove(to: moved), claim: nil))
                }
            } else if Arbiter.isAncestor(presenter.path, of: from) && presenter.purpose != purpose {
                if presenter.methods.contains(.subitemDidMove) {
                    actions.append(
                        .deliver(id, messageID: 0, message: .subitemDidMove(from: from, to: to), claim: nil))
                } else if presenter.packageRoot != nil && presenter.methods.contains(.didChange) {
                    actions.append(.deliver(id, messageID: 0, message: .didChange, claim: nil))
                }
            }
        }
        for id in order {
            guard var claim = claims[id] else { continue }
            let before = claim.request
            var changed = false
            for index in claim.request.intents.indices {
                let intent = claim.request.intents[index]
                if intent.kind == .write && intent.writingOptions.contains(.forReplacing) { continue }
                if let moved = Arbiter.rebase(intent.path, from: from, to: to) {
                    claim.request.intents[index].path = moved
                    if let root = intent.packageRoot, let movedRoot = Arbiter.rebase(root, from: from, to: to) {
                        claim.request.intents[index].packageRoot = movedRoot
                    }
                    changed = true
                }
            }
            if changed {
                conflictIndex?.remove(before)
                conflictIndex?.insert(claim.request)
                claims[id] = claim
            }
        }
        schedule(now: now, into: &actions)
        return actions
    }

    /// A version of the item at `path` changed: presenters of the item and of containing
    /// directories hear about it — including the writer's own presenter (rule 27).
    package func versionChanged(
        path: String, change: VersionChange, version: String, versionName: String
    )
        -> [ArbiterAction]
    {
        var actions: [ArbiterAction] = []
        for presenter in presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) })
        where presenter.methods.contains(.versionEvents) {
            guard presenter.path == path || Arbiter.isAncestor(presenter.path, of: path) else { continue }
            actions.append(
                .deliver(
                    presenter.id, messageID: 0,
                    message: .versionChanged(change: change, item: path, version: version, versionName: versionName),
                    claim: nil))
        }
        return actions
    }

    // MARK: Provider changes

    /// The purpose of what the provider did: no presenter has it, so every presenter hears.
    package static let providerPurpose = "providerfs.provider"

    /// The provider changed the item at `path` (new content or attributes, or a new item under
    /// that name), seen by the mount that serves it: presenters hear what a completed coordinated
    /// write of it sends (`finish`): didChange to the item's presenters, subitemDidChange (a
    /// package presenter without it: didChange) to presenters of directories above. No claim is
    /// involved: the change already happened where no claim could stop it.
    package func itemChanged(path: String) -> [ArbiterAction] {
        if presenters.isEmpty { return [] }
        var actions: [ArbiterAction] = []
        for presenter in presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) }) {
            if presenter.path == path {
                if presenter.methods.contains(.didChange) {
                    actions.append(.deliver(presenter.id, messageID: 0, message: .didChange, claim: nil))
                }
            } else if Arbiter.isAncestor(presenter.path, of: path) {
                if presenter.methods.contains(.subitemDidChange) {
                    actions.append(
                        .deliver(presenter.id, messageID: 0, message: .subitemDidChange(at: path), claim: nil))
                } else if presenter.packageRoot != nil && presenter.methods.contains(.didChange) {
                    actions.append(.deliver(presenter.id, messageID: 0, message: .didChange, claim: nil))
                }
            }
        }
        return actions
    }

    /// The provider deleted the item at `path`: what a coordinated delete asks before it is
    /// granted, told after the fact (message number 0: no answer is awaited, none could stop
    /// it): accommodateDeletion to presenters of the item and of everything inside it,
    /// accommodateSubitemDeletion(at:) to presenters of directories above (one without it:
    /// subitemDidChange(at:)). Presenters stay registered, as after a coordinated delete.
    package func itemDeleted(path: String) -> [ArbiterAction] {
        if presenters.isEmpty { return [] }
        var actions: [ArbiterAction] = []
        for presenter in presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) }) {
            if presenter.path == path || Arbiter.isAncestor(path, of: presenter.path) {
                if presenter.methods.contains(.accommodateDeletion) {
                    actions.append(.deliver(presenter.id, messageID: 0, message: .accommodateDeletion, claim: nil))
                }
            } else if Arbiter.isAncestor(presenter.path, of: path) {
                if presenter.methods.contains(.accommodateSubitemDeletion) {
                    actions.append(
                        .deliver(
                            presenter.id, messageID: 0, message: .accommodateSubitemDeletion(at: path), claim: nil))
                } else if presenter.methods.contains(.subitemDidChange) {
                    actions.append(
                        .deliver(presenter.id, messageID: 0, message: .subitemDidChange(at: path), claim: nil))
                }
            }
        }
        return actions
    }

    /// Whether a presenter would hear of a change at `path`: one presents it, an item inside it,
    /// or a directory above it. Cheap with no presenter (the mount asks before refreshing an item
    /// the provider reported changed).
    package func isPresented(near path: String) -> Bool {
        if presenters.isEmpty { return false }
        return presenters.values.contains {
            $0.path == path || Arbiter.isAncestor($0.path, of: path) || Arbiter.isAncestor(path, of: $0.path)
        }
    }

    // MARK: Grace period and reclaims (D-402)

    /// Whether the arbiter is in a grace period: claims wait, reclaims are granted.
    package var inGrace: Bool { grace != nil }

    /// The holders of the grace period not yet heard from (empty outside one).
    package var awaitedHolders: Set<ClaimHolder> { grace?.awaited ?? [] }

    /// Starts a grace period after a server restart: until every holder in `holders` has
    /// reclaimed or is gone, or until `deadline`, no claim is granted except the reclaims of those
    /// holders (the NFSv4 model): a new claim that would conflict with a claim granted before the
    /// restart waits instead of taking its place. With no holder there is nothing to wait for.
    package mutating func beginGrace(awaiting holders: Set<ClaimHolder>, until deadline: UInt64, now: UInt64) {
        guard !holders.isEmpty, deadline > now else { return }
        grace = (deadline, holders)
        record(
            ArbiterEvent(
                time: now, claim: nil,
                text: "Grace period: the previous server died holding claims; awaiting \(holders.count) holder(s) "
                    + "for up to \(Double(deadline - now) / 1e9)s."))
    }

    /// `holder` re-establishes the claims it held under the previous server. Each is granted
    /// (no presenter is asked again: they were asked before the first grant) when the grace period
    /// awaits `holder` and no claim already re-established conflicts with it; otherwise it fails
    /// with `.claimLost`. A holder reclaims once: afterwards it is no longer awaited, and the grace
    /// period ends when nobody is.
    package mutating func reclaim(_ requests: [ClaimRequest], from holder: ClaimHolder, now: UInt64) -> [ArbiterAction]
    {
        var actions: [ArbiterAction] = []
        let awaited = grace?.awaited.contains(holder) == true
        for request in requests {
            if request.intents.isEmpty || claims[request.id] != nil {
                actions.append(
                    .fail(request.id, CoordinationError(.invalidRequest, "Claim \(request.id) cannot be reclaimed.")))
                continue
            }
            guard awaited else {
                let why =
                    grace == nil
                    ? "the coordination server restarted without a grace period, or its grace period is over"
                    : "the new coordination server was not told that this client held claims"
                actions.append(
                    .fail(
                        request.id,
                        CoordinationError(
                            .claimLost,
                            "The claim on \(request.intents[0].path) could not be re-established after the coordination "
                                + "server restarted: \(why).")))
                continue
            }
            let rival = order.first { id in
                guard let other = claims[id], other.phase == .granted else { return false }
                return other.request.purpose != request.purpose && Arbiter.conflicts(other.request, request)
            }
            if let rival, let other = claims[rival] {
                actions.append(
                    .fail(
                        request.id,
                        CoordinationError(
                            .claimLost,
                            "The claim on \(request.intents[0].path) could not be re-established after the coordination "
                                + "server restarted: claim \(rival) of pid \(other.request.pid) holds it.")))
                continue
            }
            nextSequence += 1
            actions += grantAtOnce(Claim(request: request, sequence: nextSequence - 1, submitted: now))
        }
        if awaited { holdersGone([holder], now: now, into: &actions) }
        return actions
    }

    /// Holders that will not reclaim (their process is gone): no longer awaited.
    package mutating func holdersGone(_ holders: Set<ClaimHolder>, now: UInt64) -> [ArbiterAction] {
        var actions: [ArbiterAction] = []
        holdersGone(holders, now: now, into: &actions)
        return actions
    }

    private mutating func holdersGone(_ holders: Set<ClaimHolder>, now: UInt64, into actions: inout [ArbiterAction]) {
        guard var current = grace else { return }
        current.awaited.subtract(holders)
        grace = current
        if current.awaited.isEmpty {
            endGrace("Grace period over: every holder reclaimed or is gone.", now: now)
            schedule(now: now, into: &actions)
        }
    }

    private mutating func endGrace(_ text: String, now: UInt64) {
        grace = nil
        record(ArbiterEvent(time: now, claim: nil, text: text))
    }

    // MARK: Time

    /// The earliest deadline (claim wait or presenter answer), if any: call `tick` then.
    package var nextDeadline: UInt64? {
        if grantedCount == claims.count { return grace?.deadline }
        var earliest: UInt64? = grace?.deadline
        for claim in claims.values where claim.phase != .granted {
            earliest = min(earliest ?? .max, claim.request.waitDeadline)
            for pending in claim.pending.values { earliest = min(earliest ?? .max, pending.deadline) }
        }
        return earliest
    }

    /// Applies every deadline that has passed: waiting claims fail with `.timedOut`, silent
    /// presenters count as having answered and the event is recorded.
    package mutating func tick(now: UInt64) -> [ArbiterAction] {
        var actions: [ArbiterAction] = []
        if let grace, grace.deadline <= now {
            let missing = grace.awaited.sorted { ($0.server, $0.owner) < ($1.server, $1.owner) }
            let names = missing.map(\.description).joined(separator: ", ")
            endGrace(
                "Grace period over: \(missing.count) holder(s) did not reclaim in time (\(names)); their claims are lost.",
                now: now)
        }
        for id in order {
            guard let claim = claims[id], claim.phase != .granted else { continue }
            for (message, pending) in claim.pending.sorted(by: { $0.key < $1.key }) where pending.deadline <= now {
                let waited = Double(claim.request.presenterTimeout) / 1e9
                let presenterPid = presenters[pending.presenter]?.pid ?? 0
                let text =
                    "Presenter \(pending.presenter) (pid \(presenterPid)) did not answer \(pending.message.name) "
                    + "within \(waited)s; treated as answered."
                answer(message, claim: id, error: nil, now: now, into: &actions, event: text)
            }
        }
        for id in order {
            guard let claim = claims[id], claim.phase != .granted, claim.request.waitDeadline <= now else { continue }
            actions.append(.fail(id, timeoutError(claim)))
            remove(id)
            finish(claim, succeeded: false, into: &actions)
        }
        schedule(now: now, into: &actions)
        return actions
    }

    // MARK: Dump

    /// Every live claim, in arrival order.
    package func snapshot(now: UInt64) -> [ClaimSnapshot] {
        order.compactMap { id in
            guard let claim = claims[id] else { return nil }
            let state: String
            switch claim.phase {
            case .granted: state = "held"
            case .messaging, .messaged: state = "messaging"
            case .queued: state = "waiting"
            }
            return ClaimSnapshot(
                state: state, id: id, pid: claim.request.pid, purpose: claim.request.purpose,
                intents: claim.request.intents, age: now >= claim.submitted ? now - claim.submitted : 0,
                events: claim.events)
        }
    }

    /// Every registered presenter.
    package func presenterSnapshot() -> [PresenterSnapshot] {
        presenters.values.sorted { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) }.map {
            PresenterSnapshot(id: $0.id, pid: $0.pid, path: $0.path)
        }
    }

    // MARK: Conflicts

    /// True when `a` and `b` cannot be granted at the same time to different purposes (§7.1).
    package static func conflicts(_ a: ClaimIntent, _ b: ClaimIntent) -> Bool {
        if a.kind == .read && b.kind == .read { return false }  // rules 1, 10
        let pathA = a.conflictPath
        let pathB = b.conflictPath
        if pathA == pathB { return true }  // rules 2, 3, 8, 9
        if a.packageRoot == nil && b.packageRoot == nil, let identity = a.identity, identity == b.identity {
            return true
        }
        if isAncestor(pathA, of: pathB) { return a.coversSubtree }  // rules 11, 12, 14
        if isAncestor(pathB, of: pathA) { return b.coversSubtree }  // rules 10, 12, 13
        return false
    }

    static func conflicts(_ a: ClaimRequest, _ b: ClaimRequest) -> Bool {
        for x in a.intents {
            for y in b.intents where conflicts(x, y) { return true }
        }
        return false
    }

    /// True when `descendant` is strictly inside directory `ancestor`.
    package static func isAncestor(_ ancestor: String, of descendant: String) -> Bool {
        guard descendant.utf8.count > ancestor.utf8.count else { return false }
        // Over the bytes (`withUTF8` makes them contiguous in the rare case they are not): a claim
        // is checked against many others.
        var ancestor = ancestor
        var descendant = descendant
        return ancestor.withUTF8 { a in
            descendant.withUTF8 { d in
                if a.isEmpty { return d[0] == UInt8(ascii: "/") }
                guard memcmp(d.baseAddress!, a.baseAddress!, a.count) == 0 else { return false }
                return a[a.count - 1] == UInt8(ascii: "/") || d[a.count] == UInt8(ascii: "/")
            }
        }
    }

    /// `path` with prefix `from` replaced by `to`, or nil when `path` is not `from` or inside it.
    static func rebase(_ path: String, from: String, to: String) -> String? {
        if path == from { return to }
        guard isAncestor(from, of: path) else { return nil }
        return to + String(path.dropFirst(from.count))
    }

    /// Whether `other` keeps `claim` waiting.
    private func blocks(_ other: Claim, _ claim: Claim) -> Bool {
        if other.request.id == claim.request.id { return false }
        let granted = other.phase == .granted
        if !granted {
            // FIFO: only earlier queued claims count, and never for a nested claim (it would wait
            // behind a claim that waits for the caller's own claim).
            if claim.isNested || other.sequence > claim.sequence { return false }
            // Rule 28: a claim waiting for this purpose's presenter to answer does not block it.
            if other.pending.values.contains(where: { $0.purpose == claim.request.purpose }) { return false }
        }
        if other.request.purpose == claim.request.purpose { return false }  // rules 4–6
        if granted && claim.request.actingForPids.contains(other.request.pid) { return false }
        return Arbiter.conflicts(other.request, claim.request)
    }

    /// The earliest claim (FIFO order) that keeps `claim` waiting, if any.
    private func blocker(for claim: Claim) -> ClaimID? {
        if writerCount == 0 && !claim.request.hasWrite { return nil }  // reads only, among reads only
        if let conflictIndex, let candidates = conflictIndex.candidates(for: claim.request) {
            var earliest: (id: ClaimID, sequence: UInt64)?
            for id in candidates where id != claim.request.id {
                guard let index = claims.index(forKey: id) else { continue }
                let sequence = claims.values[index].sequence
                if sequence < (earliest?.sequence ?? .max), blocks(claims.values[index], claim) {
                    earliest = (id, sequence)
                }
            }
            assert(earliest?.id == scannedBlocker(for: claim), "the conflict index missed or invented a blocker")
            return earliest?.id
        }
        return scannedBlocker(for: claim)
    }

    /// The earliest blocker, found by looking at every live claim.
    private func scannedBlocker(for claim: Claim) -> ClaimID? {
        for id in order where id != claim.request.id {
            // Read in place (no copy of the claim).
            if let index = claims.index(forKey: id), blocks(claims.values[index], claim) { return id }
        }
        return nil
    }

    /// Adds a new claim to the index, building the index when the claims reach the threshold.
    private mutating func indexInsert(_ request: ClaimRequest) {
        if conflictIndex != nil {
            conflictIndex?.insert(request)
        } else if claims.count >= Self.indexThreshold {
            var index = ConflictIndex()
            for claim in claims.values {
                index.insert(claim.request)
                if claim.phase == .granted { index.granted(claim.request.pid) }
            }
            conflictIndex = index
        }
    }

    /// Counts a claim that has just been granted (before `indexInsert` for a new claim).
    private mutating func markGranted(_ pid: Int32) {
        grantedCount += 1
        conflictIndex?.granted(pid)
    }

    /// Whether one of `pids` holds a granted claim (a kernel caller inside its own access, D-126).
    private func holdsGrantedClaim(anyOf pids: [Int32]) -> Bool {
        func scan() -> Bool { claims.values.contains { $0.phase == .granted && pids.contains($0.request.pid) } }
        guard let conflictIndex else { return scan() }
        let found = pids.contains { conflictIndex.holdsGrantedClaim($0) }
        assert(found == scan(), "the conflict index lost track of granted claims")
        return found
    }

    private func deadlockingHeldClaim(for claim: Claim) -> ClaimID? {
        for held in claim.request.heldByCaller {
            guard let other = claims[held], other.phase == .granted else { continue }
            if other.request.purpose != claim.request.purpose && Arbiter.conflicts(other.request, claim.request) {
                return held
            }
        }
        return nil
    }

    private func timeoutError(_ claim: Claim) -> CoordinationError {
        var text = "The claim on \(claim.request.intents[0].path) was not granted before its deadline"
        if grace != nil {
            text +=
                " (the coordination server restarted and is waiting for the claims held before to be re-established)"
        } else if let blocking = blocker(for: claim), let other = claims[blocking] {
            text += " (it waits for claim \(blocking) of pid \(other.request.pid))"
        } else if !claim.pending.isEmpty {
            text += " (presenters have not answered)"
        }
        return CoordinationError(.timedOut, text + ".")
    }

    // MARK: Scheduling

    /// Re-examines waiting claims in FIFO order.
    private mutating func schedule(now: UInt64, into actions: inout [ArbiterAction]) {
        assert(grantedCount == claims.values.count(where: { $0.phase == .granted }))
        assert(writerCount == claims.values.count(where: { $0.request.hasWrite }))
        if grantedCount == claims.count { return }  // nothing waits
        var index = 0
        while index < order.count {
            let id = order[index]
            index += 1
            guard let claim = claims[id], claim.phase == .queued || claim.phase == .messaged else { continue }
            advance(id, now: now, into: &actions)
            if claims[id] == nil { index -= 1 }  // failed (rule 34) and removed from `order`
        }
    }

    /// Moves one claim forward if nothing blocks it: start messaging, or grant.
    private mutating func advance(_ id: ClaimID, now: UInt64, into actions: inout [ArbiterAction]) {
        guard grace == nil, var claim = claims[id], blocker(for: claim) == nil else { return }
        if claim.phase == .queued {
            if let refuser = evictionRefuser(for: claim.request) {
                // Rule 34: a presenter that cannot accommodate an eviction vetoes it.
                let registration = presenters[refuser]!
                let text =
                    "Presenter \(refuser) (pid \(registration.pid)) of \(registration.path) does not implement "
                    + "accommodatePresentedItemEviction, so the item cannot be evicted."
                actions.append(.fail(id, CoordinationError(.presenterFailed, text)))
                remove(id)
                finish(claim, succeeded: false, into: &actions)
                return
            }
            let plan = messagePlan(for: claim.request)
            if !plan.isEmpty {
                claim.phase = .messaging
                for (presenter, messages) in plan {
                    guard let registration = presenters[presenter] else { continue }
                    var queue = messages
                    let first = queue.removeFirst()
                    if first == .relinquishToReader || first == .relinquishToWriter {
                        claim.relinquished.append(presenter)
                    }
                    let number = nextMessage
                    nextMessage += 1
                    claim.pending[number] = Pending(
                        presenter: presenter, purpose: registration.purpose, message: first,
                        deadline: now &+ claim.request.presenterTimeout)
                    messageOwner[number] = id
                    if !queue.isEmpty { claim.followUps[presenter] = queue }
                    actions.append(.deliver(presenter, messageID: number, message: first, claim: id))
                }
                claims[id] = claim
                return
            }
        } else if claim.phase == .messaging {
            return
        }
        claim.phase = .granted
        markGranted(claim.request.pid)
        actions.append(.grant(id, paths: claim.request.intents.map(\.path)))
        claims[id] = consume claim
    }

    private mutating func answer(
        _ message: UInt64, claim id: ClaimID, error: String?, now: UInt64, into actions: inout [ArbiterAction],
        event: String?
    ) {
        messageOwner[message] = nil
        guard var claim = claims[id], let pending = claim.pending.removeValue(forKey: message) else { return }
        if let event {
            claim.events.append(event)
            record(ArbiterEvent(time: now, claim: id, text: event))
        }
        var error = error
        if error == nil, pending.message == .accommodateEviction, presenters[pending.presenter] != nil {
            // Rule 34: accommodating an eviction means removing the presenter first; an answer (or a
            // missed deadline) from a presenter still registered fails the eviction.
            error =
                event == nil
                ? "it answered without removing itself (removeFilePresenter must come first)"
                : "it did not answer in time"
        }
        if let error {
            claims[id] = claim
            let pid = presenters[pending.presenter]?.pid ?? 0
            actions.append(
                .fail(
                    id,
                    CoordinationError(
                        .presenterFailed,
                        "Presenter \(pending.presenter) (pid \(pid)) refused \(pending.message.name): \(error)")))
            remove(id)
            finish(claim, succeeded: false, into: &actions)
            return
        }
        if var queue = claim.followUps[pending.presenter], !queue.isEmpty, presenters[pending.presenter] != nil {
            let next = queue.removeFirst()
            claim.followUps[pending.presenter] = queue.isEmpty ? nil : queue
            let number = nextMessage
            nextMessage += 1
            claim.pending[number] = Pending(
                presenter: pending.presenter, purpose: pending.purpose, message: next,
                deadline: now &+ claim.request.presenterTimeout)
            messageOwner[number] = id
            actions.append(.deliver(pending.presenter, messageID: number, message: next, claim: id))
        } else {
            claim.followUps[pending.presenter] = nil
        }
        if claim.pending.isEmpty && claim.phase == .messaging { claim.phase = .messaged }
        claims[id] = claim
    }

    private mutating func remove(_ id: ClaimID) {
        guard let claim = claims.removeValue(forKey: id) else { return }
        forget(claim)
    }

    /// Drops what refers to a claim already taken out of `claims`.
    private mutating func forget(_ claim: Claim) {
        if claim.phase == .granted {
            grantedCount -= 1
            conflictIndex?.ungranted(claim.request.pid)
        }
        if claim.request.hasWrite { writerCount -= 1 }
        conflictIndex?.remove(claim.request)
        if conflictIndex != nil && claims.count < Self.indexThreshold / 2 { conflictIndex = nil }
        for message in claim.pending.keys { messageOwner[message] = nil }
        // The most recent claim is the likeliest to end first when uncontended: search from the end.
        if let index = order.lastIndex(of: claim.request.id) { order.remove(at: index) }
    }

    /// Messages after a claim ends: reacquirers, then (after a completed write) didChange.
    private func finish(_ claim: Claim, succeeded: Bool, into actions: inout [ArbiterAction]) {
        if presenters.isEmpty { return }  // nobody to tell (the common, uncontended case)
        for presenter in claim.relinquished where presenters[presenter] != nil {
            actions.append(.deliver(presenter, messageID: 0, message: .reacquire, claim: claim.request.id))
        }
        guard succeeded else { return }
        // A move brings no change (rules 35-37, 41): the destination of a move (`.forReplacing`
        // beside a `.forMoving` intent) tells nobody, since the moved item's presenters, now at
        // that path, heard didMove and directories subitemDidMove. Alone, a `.forReplacing` write
        // (Save As over a file) tells the directories above, not the replaced item's presenters,
        // who were asked to accommodate its deletion (rule 22) before.
        let moving = claim.request.intents.contains { $0.kind == .write && $0.writingOptions.contains(.forMoving) }
        for intent in claim.request.intents where intent.kind == .write {
            if !intent.writingOptions.isDisjoint(with: [.forDeleting, .forMoving, .forEvicting, .preparing]) {
                continue
            }
            let replacing = intent.writingOptions.contains(.forReplacing)
            if replacing && moving { continue }
            for presenter in presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) })
            where presenter.purpose != claim.request.purpose {
                if Arbiter.sameItem(presenter, intent) {
                    if !replacing && presenter.methods.contains(.didChange) {
                        actions.append(.deliver(presenter.id, messageID: 0, message: .didChange, claim: nil))
                    }
                } else if Arbiter.isAncestor(presenter.path, of: intent.path) {
                    if presenter.methods.contains(.subitemDidChange) {
                        actions.append(
                            .deliver(
                                presenter.id, messageID: 0, message: .subitemDidChange(at: intent.path), claim: nil))
                    } else if presenter.packageRoot != nil && presenter.methods.contains(.didChange) {
                        actions.append(.deliver(presenter.id, messageID: 0, message: .didChange, claim: nil))
                    }
                }
            }
        }
    }

    static func sameItem(_ presenter: PresenterRegistration, _ intent: ClaimIntent) -> Bool {
        if presenter.path == intent.path { return true }
        if let identity = presenter.identity, identity == intent.identity { return true }
        return false
    }

    /// Who must be asked what before `request` is granted (§7.2), per presenter in send order.
    func messagePlan(for request: ClaimRequest) -> [(PresenterID, [PresenterMessage])] {
        if presenters.isEmpty { return [] }
        var plan: [(PresenterID, [PresenterMessage])] = []
        for presenter in presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) })
        where presenter.purpose != request.purpose {  // rule 26
            var relinquish: PresenterMessage?
            var rest: [PresenterMessage] = []
            func add(_ message: PresenterMessage) {
                if !rest.contains(message) { rest.append(message) }
            }
            for intent in request.intents {
                let same = Arbiter.sameItem(presenter, intent)
                let inside = Arbiter.isAncestor(intent.path, of: presenter.path)
                if intent.isPreparing {
                    // Rule 33: presenters of the item and of everything inside it, no relinquish.
                    guard same || inside else { continue }
                    switch intent.kind {
                    case .read:
                        if !intent.readingOptions.contains(.withoutChanges) { add(.savePresentedItemChanges) }
                    case .write:
                        if intent.writingOptions.contains(.forMerging) { add(.savePresentedItemChanges) }
                        if intent.writingOptions.contains(.forDeleting) { add(.accommodateDeletion) }
                    }
                    continue
                }
                if intent.kind == .write && intent.writingOptions.contains(.forEvicting) {
                    // Rule 34: only the eviction message; the presenter removes itself.
                    if same || inside { add(.accommodateEviction) }
                    continue
                }
                // A presenter of a directory that is (inside) the package enclosing the item: rule 19.
                let enclosingPackage =
                    !same && Arbiter.isAncestor(presenter.path, of: intent.path)
                    && intent.packageRoot.map { $0 == presenter.path || Arbiter.isAncestor($0, of: presenter.path) }
                        == true
                switch intent.kind {
                case .read:
                    guard same || enclosingPackage else { continue }
                    if relinquish == nil { relinquish = .relinquishToReader }  // rule 17
                    if !intent.readingOptions.contains(.withoutChanges) { add(.savePresentedItemChanges) }  // rule 18
                case .write:
                    let deleting = !intent.writingOptions.isDisjoint(with: .deletingOptions)
                    let merging = intent.writingOptions.contains(.forMerging)
                    if same {
                        relinquish = .relinquishToWriter  // rule 20
                        if merging { add(.savePresentedItemChanges) }  // rule 24
                        if deleting { add(.accommodateDeletion) }  // rule 22
                    } else if enclosingPackage {
                        relinquish = .relinquishToWriter  // rules 19, 20, 23
                        if merging { add(.savePresentedItemChanges) }
                        if deleting { add(.accommodateSubitemDeletion(at: intent.path)) }  // rule 22
                    } else if inside && intent.coversSubtree {
                        relinquish = .relinquishToWriter  // rule 21
                        if deleting { add(.accommodateDeletion) }  // rule 22
                    }
                }
            }
            var messages: [PresenterMessage] = []
            if let relinquish { messages.append(relinquish) }
            messages += rest
            messages = messages.filter { presenter.methods.contains($0.method) }  // rule 32
            if !messages.isEmpty { plan.append((presenter.id, messages)) }
        }
        return plan
    }

    /// The first presenter (other purpose) of an item an eviction covers that does not implement
    /// `accommodatePresentedItemEviction` (rule 34).
    func evictionRefuser(for request: ClaimRequest) -> PresenterID? {
        if presenters.isEmpty { return nil }
        let evicting = request.intents.filter { $0.kind == .write && $0.writingOptions.contains(.forEvicting) }
        if evicting.isEmpty { return nil }
        return presenters.values.sorted(by: { ($0.id.owner, $0.id.local) < ($1.id.owner, $1.id.local) }).first {
            presenter in
            presenter.purpose != request.purpose && !presenter.methods.contains(.accommodateEviction)
                && evicting.contains {
                    Arbiter.sameItem(presenter, $0) || Arbiter.isAncestor($0.path, of: presenter.path)
                }
        }?.id
    }

    private mutating func record(_ event: ArbiterEvent) {
        events.append(event)
        if events.count > Arbiter.eventLimit { events.removeFirst(events.count - Arbiter.eventLimit) }
    }
}

/// The claims that could conflict with a claim, by what a conflict needs (`Arbiter.conflicts`):
/// the same item path (or package), the same device+inode, or an ancestor whose claim covers its
/// subtree. A claim that covers its own subtree may conflict with anything inside: no candidates,
/// the arbiter scans (such claims are rare: deleting or moving a directory).
struct ConflictIndex {
    private var byPath: [String: [ClaimID]] = [:]
    private var byIdentity: [ItemIdentity: [ClaimID]] = [:]
    /// Claims with an intent that covers its subtree: candidates for everything (they may be an
    /// ancestor of anything).
    private var subtree: Set<ClaimID> = []
    /// Granted claims per process (D-126 asks whether a kernel caller's ancestry holds one).
    private var grantedPerPid: [Int32: Int] = [:]

    mutating func granted(_ pid: Int32) { grantedPerPid[pid, default: 0] += 1 }

    mutating func ungranted(_ pid: Int32) {
        guard let count = grantedPerPid[pid] else { return }
        grantedPerPid[pid] = count > 1 ? count - 1 : nil
    }

    func holdsGrantedClaim(_ pid: Int32) -> Bool { grantedPerPid[pid] != nil }

    mutating func insert(_ request: ClaimRequest) {
        for intent in request.intents {
            byPath[intent.conflictPath, default: []].append(request.id)
            if intent.packageRoot == nil, let identity = intent.identity {
                byIdentity[identity, default: []].append(request.id)
            }
            if intent.coversSubtree { subtree.insert(request.id) }
        }
    }

    mutating func remove(_ request: ClaimRequest) {
        for intent in request.intents {
            Self.remove(request.id, at: intent.conflictPath, from: &byPath)
            if intent.packageRoot == nil, let identity = intent.identity {
                Self.remove(request.id, at: identity, from: &byIdentity)
            }
        }
        subtree.remove(request.id)
    }

    private static func remove<Key: Hashable>(_ id: ClaimID, at key: Key, from table: inout [Key: [ClaimID]]) {
        guard var ids = table[key], let position = ids.firstIndex(of: id) else { return }
        ids.remove(at: position)
        table[key] = ids.isEmpty ? nil : ids
    }

    /// Every claim that could conflict with `request`, or nil when only a scan can tell.
    func candidates(for request: ClaimRequest) -> Set<ClaimID>? {
        if request.intents.contains(where: \.coversSubtree) { return nil }
        var found = subtree
        for intent in request.intents {
            found.formUnion(byPath[intent.conflictPath] ?? [])
            if let identity = intent.identity { found.formUnion(byIdentity[identity] ?? []) }
        }
        return found
    }
}
