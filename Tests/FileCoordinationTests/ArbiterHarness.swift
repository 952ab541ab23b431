import FileCoordination
import Testing

/// Drives the pure arbiter with an explicit clock and records what it asked for.
struct ArbiterHarness {
    var arbiter = Arbiter()
    /// Monotonic nanoseconds; tests move it forward by hand.
    var now: UInt64 = 1_000_000_000
    var nextLocal: UInt64 = 1
    var granted: [ClaimID: [String]] = [:]
    var failed: [ClaimID: CoordinationError] = [:]
    var deliveries: [(presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?)] = []
    var nextPresenter: UInt64 = 1

    static let second: UInt64 = 1_000_000_000

    @discardableResult
    mutating func claim(
        _ intents: [ClaimIntent], purpose: String, pid: Int32 = 100, owner: UInt64 = 1, held: [ClaimID] = [],
        actingFor: [Int32] = [], wait: UInt64 = 30 * second, presenterTimeout: UInt64 = 5 * second
    ) -> ClaimID {
        let id = ClaimID(owner: owner, local: nextLocal)
        nextLocal += 1
        let request = ClaimRequest(
            id: id, pid: pid, purpose: purpose, intents: intents, heldByCaller: held, actingForPids: actingFor,
            waitDeadline: now + wait, presenterTimeout: presenterTimeout)
        // Every claim of every arbiter test also checks the immediate form (D-229) against the
        // ordinary one, on a copy of the arbiter: it grants exactly when submit grants at once
        // with nothing else to do, and then leaves the same state; otherwise it changes nothing.
        var probe = arbiter
        let before = arbiter.snapshot(now: now)
        let immediate = probe.grantIfImmediate(request, now: now)
        let actions = arbiter.submit(request, now: now)
        var grantedAtOnce = false
        if actions.count == 1, case .grant(let granted, _) = actions[0], granted == id { grantedAtOnce = true }
        #expect(immediate == grantedAtOnce, "grantIfImmediate and submit disagree on \(id) \(intents)")
        #expect(probe.snapshot(now: now) == (immediate ? arbiter.snapshot(now: now) : before))
        apply(actions)
        return id
    }

    mutating func release(_ id: ClaimID) {
        granted[id] = nil
        apply(arbiter.release(id, now: now))
    }

    mutating func cancel(_ id: ClaimID) { apply(arbiter.cancel(id, now: now)) }

    @discardableResult
    mutating func present(
        _ path: String, purpose: String = "presenter", pid: Int32 = 200, owner: UInt64 = 9, isDirectory: Bool = false,
        packageRoot: String? = nil, methods: PresenterMethods = .all, identity: ItemIdentity? = nil
    ) -> PresenterID {
        let id = PresenterID(owner: owner, local: nextPresenter)
        nextPresenter += 1
        arbiter.addPresenter(
            PresenterRegistration(
                id: id, pid: pid, purpose: purpose, path: path, identity: identity, isDirectory: isDirectory,
                packageRoot: packageRoot, methods: methods))
        return id
    }

    /// Answers every outstanding message to `presenter` (optionally with an error).
    mutating func answerAll(_ presenter: PresenterID, error: String? = nil) {
        var answered = Set<UInt64>()
        while let next = deliveries.first(where: {
            $0.presenter == presenter && $0.messageID != 0 && !answered.contains($0.messageID)
        }) {
            answered.insert(next.messageID)
            apply(arbiter.reply(messageID: next.messageID, error: error, now: now))
        }
    }

    mutating func advance(by nanoseconds: UInt64) {
        now += nanoseconds
        apply(arbiter.tick(now: now))
    }

    mutating func apply(_ actions: [ArbiterAction]) {
        for action in actions {
            switch action {
            case .grant(let id, let paths): granted[id] = paths
            case .fail(let id, let error): failed[id] = error
            case .deliver(let presenter, let messageID, let message, let claim):
                deliveries.append((presenter, messageID, message, claim))
            }
        }
    }

    func isGranted(_ id: ClaimID) -> Bool { granted[id] != nil }

    func messages(to presenter: PresenterID) -> [PresenterMessage] {
        deliveries.filter { $0.presenter == presenter }.map(\.message)
    }

    mutating func clearDeliveries() { deliveries.removeAll() }
}

func read(
    _ path: String, _ options: ReadingOptions = [], directory: Bool = false, package: String? = nil
)
    -> ClaimIntent
{
    ClaimIntent(kind: .read, path: path, readingOptions: options, isDirectory: directory, packageRoot: package)
}

func write(
    _ path: String, _ options: WritingOptions = [], directory: Bool = false, package: String? = nil
)
    -> ClaimIntent
{
    ClaimIntent(kind: .write, path: path, writingOptions: options, isDirectory: directory, packageRoot: package)
}
