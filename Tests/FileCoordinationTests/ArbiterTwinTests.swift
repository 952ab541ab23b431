import FileCoordination
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One embedded server (never started: kernel claims are taken in-process) over a host whose
/// clock stands still, with one client owner whose grants, failures and presenter messages are
/// logged in order.
final class KernelClaimTwin: ArbiterSink, @unchecked Sendable {
    // Safe: `server` and `owner` are set in init and never changed; the rest is Locked.
    let server: CoordinationServer
    private(set) var owner: UInt64 = 0
    /// Grants, failures and deliveries to the client owner, in order.
    let log = Locked<[String]>([])
    /// Kernel claims by step number, as they are granted (at once or later, by a release).
    let kernelClaims = Locked<[Int: KernelClaim]>([:])

    init() {
        server = CoordinationServer(
            socketPath: "/nonexistent/fast-path-twin.sock", host: ArbiterHost(clock: { 1_000_000_000 }))
        owner = server.host.addOwner(self)
    }

    func granted(_ claim: ClaimID, paths: [String]) { log.withLock { $0.append("granted \(claim) \(paths)") } }
    func failed(_ claim: ClaimID, error: CoordinationError) {
        log.withLock { $0.append("failed \(claim) \(error.code)") }
    }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        log.withLock { $0.append("deliver \(presenter) #\(messageID) \(message)") }
    }

    /// The claim dump without what differs between two hosts that took the same claims by
    /// different paths: a kernel claim's number (a refused `claimNow` uses one up), so kernel
    /// claims are named by their rank, and ages (the clock stands still anyway).
    func state() -> [String] {
        let dump = server.host.dump()
        let kernelLocals = dump.claims.filter { $0.id.owner != owner }.map(\.id.local).sorted()
        let claims = dump.claims.map { claim -> String in
            let name =
                claim.id.owner == owner
                ? "client.\(claim.id.local)" : "kernel#\(kernelLocals.firstIndex(of: claim.id.local)!)"
            return "\(name) \(claim.state) pid \(claim.pid) \(claim.purpose) \(claim.intents) \(claim.events)"
        }
        return claims.sorted() + dump.presenters.map { "presenter \($0.id) \($0.pid) \($0.path)" }.sorted()
            + dump.events.map(\.text)
    }
}

/// Every immediate answer of `CoordinationServer.claimNow` (and so `ArbiterHost.grantIfImmediate`
/// and `KernelClaimOwner.claimNow`) is checked against the slow path on the same state: two
/// servers go through the same steps; at each kernel claim, the fast twin asks `claimNow` (and,
/// when it says nil, takes the claim with `claim` as the mount does), the slow twin only ever
/// uses `claim`. `claimNow` must grant exactly when `claim` is granted before it returns, change
/// nothing when it refuses, and both twins must end every step in the same state with the same
/// messages sent.
struct FastPathTwins {
    let fast = KernelClaimTwin()
    let slow = KernelClaimTwin()
    var step = 0
    var nextClientLocal: UInt64 = 1
    var nextPresenter: UInt64 = 1
    /// Answered presenter messages (same numbers in both twins while they agree).
    var answered = Set<UInt64>()
    /// Put before every failure message (the seed of a random walk).
    var label = ""

    var twins: [KernelClaimTwin] { [fast, slow] }

    /// A client claim (a `FileCoordinator` of another process, say), submitted to both twins.
    @discardableResult
    mutating func client(_ intents: [ClaimIntent], pid: Int32, purpose: String = "client") -> UInt64 {
        let local = nextClientLocal
        nextClientLocal += 1
        for twin in twins {
            twin.server.host.submit(
                ClaimRequest(
                    id: ClaimID(owner: twin.owner, local: local), pid: pid, purpose: purpose, intents: intents,
                    waitDeadline: 1_000_000_000 + 60_000_000_000, presenterTimeout: 10_000_000_000))
        }
        return local
    }

    mutating func releaseClient(_ local: UInt64) {
        for twin in twins { twin.server.host.release(ClaimID(owner: twin.owner, local: local)) }
    }

    @discardableResult
    mutating func present(_ path: String, pid: Int32 = 4242, methods: PresenterMethods = .all) -> UInt64 {
        let local = nextPresenter
        nextPresenter += 1
        for twin in twins {
            twin.server.host.addPresenter(
                PresenterRegistration(
                    id: PresenterID(owner: twin.owner, local: local), pid: pid, purpose: "presenter", path: path,
                    methods: methods))
        }
        return local
    }

    mutating func removePresenter(_ local: UInt64) {
        for twin in twins { twin.server.host.removePresenter(PresenterID(owner: twin.owner, local: local)) }
    }

    /// Answers the oldest presenter message not answered yet, in both twins; false when none.
    @discardableResult
    mutating func answerOldest() -> Bool {
        let ids = fast.log.value.compactMap { line -> UInt64? in
            guard line.hasPrefix("deliver"), let hash = line.firstIndex(of: "#") else { return nil }
            return UInt64(line[line.index(after: hash)...].prefix { $0.isNumber })
        }
        guard let id = ids.first(where: { $0 != 0 && !answered.contains($0) }) else { return false }
        answered.insert(id)
        for twin in twins { twin.server.host.reply(messageID: id, error: nil) }
        return true
    }

    /// A kernel caller's claim, fast path checked against the slow one. Returns the step number
    /// (for `releaseKernel`) and whether it was granted at once.
    @discardableResult
    mutating func kernel(
        _ path: String, _ kind: AccessKind, pid: Int32 = getpid(), writingOptions: WritingOptions = [],
        isDirectory: Bool = false, sourceLocation: SourceLocation = #_sourceLocation
    ) -> (step: Int, immediate: Bool) {
        step += 1
        let step = self.step
        let stateBefore = fast.state()
        let logBefore = fast.log.value
        #expect(
            stateBefore == slow.state(), "\(label)the twins differ before step \(step)", sourceLocation: sourceLocation)

        // Fast twin: claimNow, then claim when it refuses (as the mount does).
        let now = fast.server.claimNow(
            path, kind: kind, writingOptions: writingOptions, isDirectory: isDirectory, onBehalfOf: pid)
        if let now {
            fast.kernelClaims.withLock { $0[step] = now }
        } else {
            #expect(
                fast.state() == stateBefore, "\(label)a refused claimNow changed the state",
                sourceLocation: sourceLocation)
            #expect(
                fast.log.value == logBefore, "\(label)a refused claimNow sent something", sourceLocation: sourceLocation
            )
            fast.server.claim(
                path, kind: kind, writingOptions: writingOptions, isDirectory: isDirectory, onBehalfOf: pid,
                deadline: .seconds(60)
            ) { [fast] result in
                if case .success(let claim) = result { fast.kernelClaims.withLock { $0[step] = claim } }
            }
        }

        // Slow twin: claim only; granted at once when the grant arrives before claim returns.
        let returned = Locked(false)
        let grantedAtOnce = Locked(false)
        slow.server.claim(
            path, kind: kind, writingOptions: writingOptions, isDirectory: isDirectory, onBehalfOf: pid,
            deadline: .seconds(60)
        ) { [slow] result in
            if case .success(let claim) = result {
                slow.kernelClaims.withLock { $0[step] = claim }
                if !returned.value { grantedAtOnce.withLock { $0 = true } }
            }
        }
        returned.withLock { $0 = true }

        let fastAnswer = now != nil ? "granted" : "refused"
        let slowAnswer = grantedAtOnce.value ? "grants it at once" : "does not"
        #expect(
            (now != nil) == grantedAtOnce.value,
            "\(label)step \(step): claimNow \(fastAnswer) \(kind) \(path) for pid \(pid), the slow path \(slowAnswer)",
            sourceLocation: sourceLocation)
        #expect(
            fast.state() == slow.state(), "\(label)the twins differ after step \(step)", sourceLocation: sourceLocation)
        #expect(
            fast.log.value == slow.log.value, "\(label)the twins sent different messages",
            sourceLocation: sourceLocation)
        return (step, now != nil)
    }

    /// Ends a kernel claim in both twins (a claim still waiting is left alone: nil).
    @discardableResult
    mutating func releaseKernel(_ step: Int) -> Bool {
        let claims = twins.map { twin in twin.kernelClaims.withLock { $0.removeValue(forKey: step) } }
        #expect((claims[0] == nil) == (claims[1] == nil), "\(label)kernel claim \(step) granted in one twin only")
        for claim in claims { claim?.release() }
        return claims[0] != nil
    }

    /// The kernel claims granted so far (step numbers), in the fast twin.
    var grantedKernelSteps: [Int] { fast.kernelClaims.value.keys.sorted() }

    func finish(sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(fast.state() == slow.state(), sourceLocation: sourceLocation)
        #expect(fast.log.value == slow.log.value, sourceLocation: sourceLocation)
        #expect(
            Set(fast.kernelClaims.value.keys) == Set(slow.kernelClaims.value.keys), sourceLocation: sourceLocation)
    }
}

@Suite struct ArbiterTwinTests {
    /// Reads among reads, a writer, the caller's own (ancestor's) claim, a stranger, a presenter,
    /// a directory being deleted: every case where the fast path may or may not grant.
    @Test func claimNowGrantsExactlyWhatClaimGrantsAtOnce() {
        var twins = FastPathTwins()
        let stranger: Int32 = 0x7fff_fff0  // no such process (ancestry: itself only)
        let otherStranger: Int32 = 0x7fff_fff1
        // Nothing held: granted at once.
        let first = twins.kernel("/m/a", .read)
        #expect(first.immediate)
        // Reads among reads.
        let second = twins.kernel("/m/a", .read, pid: stranger)
        #expect(second.immediate)
        // A client reader does not block a kernel read; a kernel write waits for readers.
        let reader = twins.client([read("/m/a")], pid: otherStranger)
        #expect(twins.kernel("/m/a", .read).immediate)
        let kernelWrite = twins.kernel("/m/a", .write, pid: stranger)
        #expect(!kernelWrite.immediate)
        twins.releaseClient(reader)
        twins.releaseKernel(first.step)
        twins.releaseKernel(second.step)
        twins.releaseKernel(3)
        #expect(twins.grantedKernelSteps == [kernelWrite.step], "the write was granted once the reads ended")
        twins.releaseKernel(kernelWrite.step)
        // A writer held by this process's parent: its child's reads go through (it coordinates
        // with itself); a stranger's read waits.
        let parentWrite = twins.client([write("/m/b")], pid: getppid())
        let own = twins.kernel("/m/b", .read)
        #expect(own.immediate)
        let other = twins.kernel("/m/b", .read, pid: stranger)
        #expect(!other.immediate)
        twins.releaseClient(parentWrite)
        twins.releaseKernel(own.step)
        twins.releaseKernel(other.step)
        // Deleting a directory blocks claims inside it, and claims inside block its deletion.
        let deletion = twins.client([write("/m/d", .forDeleting, directory: true)], pid: otherStranger)
        let inside = twins.kernel("/m/d/f", .read, pid: stranger)
        #expect(!inside.immediate)
        twins.releaseClient(deletion)
        twins.releaseKernel(inside.step)
        let insideAgain = twins.kernel("/m/d/f", .read, pid: stranger)
        #expect(insideAgain.immediate)
        let laterDeletion = twins.client([write("/m/d", .forDeleting, directory: true)], pid: otherStranger)
        #expect(twins.fast.state().contains { $0.hasPrefix("client.\(laterDeletion) waiting") })
        twins.releaseKernel(insideAgain.step)
        #expect(twins.fast.state().contains { $0.hasPrefix("client.\(laterDeletion) held") })
        twins.releaseClient(laterDeletion)
        // A presenter must be asked before a read (relinquish to reader): not immediate; one that
        // implements nothing needs no message: immediate.
        let presenter = twins.present("/m/p")
        let presented = twins.kernel("/m/p", .read, pid: stranger)
        #expect(!presented.immediate)
        while twins.answerOldest() {}
        twins.releaseKernel(presented.step)
        twins.removePresenter(presenter)
        twins.present("/m/q", methods: [])
        #expect(twins.kernel("/m/q", .read, pid: stranger).immediate)
        twins.finish()
    }

    /// A seeded random walk of client claims, presenters, answers and kernel claims on a few
    /// related paths; every kernel claim is a fast/slow comparison. The seed comes from
    /// PROVIDERFS_TEST_SEED when set and is in every failure message.
    @Test func seededRandomStepsKeepTheTwinsEqual() {
        let seed = ProcessInfo.processInfo.environment["PROVIDERFS_TEST_SEED"].flatMap { UInt64($0) } ?? 0x5eed_f057
        var random = SeededRandom(seed: seed)
        var twins = FastPathTwins()
        twins.label = "seed \(seed): "
        let paths = ["/m", "/m/a", "/m/a/f", "/m/a/g", "/m/b"]
        let pids: [Int32] = [getpid(), getppid(), 0x7fff_fff0, 0x7fff_fff1]
        var clients: [UInt64] = []
        var presenters: [UInt64] = []
        var kernelSteps: [Int] = []
        var answers = (immediate: 0, refused: 0)
        for _ in 0..<400 {
            let path = paths[Int(random.next() % UInt64(paths.count))]
            let pid = pids[Int(random.next() % UInt64(pids.count))]
            let isDirectory = path == "/m" || path == "/m/a"
            switch random.next() % 10 {
            case 0, 1:
                let intent: ClaimIntent
                switch random.next() % 4 {
                case 0: intent = read(path, directory: isDirectory)
                case 1: intent = write(path, directory: isDirectory)
                case 2: intent = write(path, .forDeleting, directory: isDirectory)
                default: intent = read(path, .withoutChanges, directory: isDirectory)
                }
                clients.append(twins.client([intent], pid: pid, purpose: "client\(random.next() % 3)"))
            case 2:
                if !clients.isEmpty {
                    twins.releaseClient(clients.remove(at: Int(random.next() % UInt64(clients.count))))
                }
            case 3:
                if random.next() % 3 == 0 {
                    presenters.append(
                        twins.present(path, methods: random.next() % 2 == 0 ? .all : [.didChange, .didMove]))
                } else if !presenters.isEmpty {
                    twins.removePresenter(presenters.remove(at: Int(random.next() % UInt64(presenters.count))))
                }
            case 4:
                twins.answerOldest()
            case 5, 6, 7:
                let kind: AccessKind = random.next() % 3 == 0 ? .write : .read
                let result = twins.kernel(path, kind, pid: pid, isDirectory: isDirectory)
                kernelSteps.append(result.step)
                if result.immediate { answers.immediate += 1 } else { answers.refused += 1 }
            default:
                if !kernelSteps.isEmpty {
                    let index = Int(random.next() % UInt64(kernelSteps.count))
                    if twins.releaseKernel(kernelSteps[index]) { kernelSteps.remove(at: index) }
                }
            }
        }
        twins.finish()
        #expect(answers.immediate > 20 && answers.refused > 20, "both answers are exercised: \(answers)")
    }
}
