import FileCoordination
import Foundation
import ProviderFSCommands
import ProviderModel
import SystemSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// One mount's read-claim adapter over an embedded server (never started) whose clock stands
/// still, and a client owner that holds the claims opens must wait for.
final class ReadClaimTwin: ArbiterSink, @unchecked Sendable {
    // Safe: set in init, never changed; `log` is a Locked.
    let server = CoordinationServer(
        socketPath: "/nonexistent/read-claim-twin.sock", host: ArbiterHost(clock: { 1_000_000_000 }))
    let claims: MountReadClaims
    private(set) var owner: UInt64 = 0
    let log = Locked<[String]>([])

    init() {
        claims = MountReadClaims(server: server, mountpoint: "/mnt/twin", deadline: .seconds(60))
        owner = server.host.addOwner(self)
    }

    func granted(_ claim: ClaimID, paths: [String]) { log.withLock { $0.append("granted \(claim)") } }
    func failed(_ claim: ClaimID, error: CoordinationError) { log.withLock { $0.append("failed \(claim)") } }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        log.withLock { $0.append("deliver \(presenter) #\(messageID) \(message)") }
    }

    /// Claims (kernel claims by rank: a refused fast claim uses a number up) and presenters.
    func state() -> [String] {
        let dump = server.host.dump()
        let kernelLocals = dump.claims.filter { $0.id.owner != owner }.map(\.id.local).sorted()
        return dump.claims.map { claim -> String in
            let name =
                claim.id.owner == owner
                ? "client.\(claim.id.local)" : "kernel#\(kernelLocals.firstIndex(of: claim.id.local)!)"
            return "\(name) \(claim.state) pid \(claim.pid) \(claim.intents.map { "\($0.kind) \($0.path)" })"
        }.sorted()
    }

    var kernelClaimCount: Int { server.host.dump().claims.filter { $0.id.owner != owner }.count }

    func hold(_ local: UInt64, _ intent: ClaimIntent, pid: Int32) {
        server.host.submit(
            ClaimRequest(
                id: ClaimID(owner: owner, local: local), pid: pid, purpose: "client", intents: [intent],
                waitDeadline: 61_000_000_000, presenterTimeout: 10_000_000_000))
    }
}

/// `MountReadClaims.acquireReadClaimNow` (the open's fast path) against `acquireReadClaim` on
/// the same state: two adapters over two servers go through the same steps; at each open one
/// asks the fast path first (and falls back, as ProviderFileSystem does), the other takes the
/// slow path only. The fast path must answer exactly when the slow one is granted at once,
/// take nothing when it refuses, and leave the same claims.
@Suite struct MountReadClaimsTwinTests {
    @Test func acquireReadClaimNowGrantsExactlyWhatAcquireReadClaimGrantsAtOnce() async throws {
        let fast = ReadClaimTwin()
        let slow = ReadClaimTwin()
        let twins = [fast, slow]
        var waiting: [(ReadClaimTwin, Task<ReadClaimToken, any Error>)] = []
        var tokens: [(ReadClaimTwin, ReadClaimToken)] = []
        let stranger: Int32 = 0x7fff_fff0  // no such thread: the adapter takes it for a process

        /// One open of `relativePath` by thread `thread`; returns whether it was granted at once.
        func open(_ relativePath: String, thread: Int32) async -> Bool {
            let request = ReadClaimRequest(
                relativePath: relativePath, identifier: ItemIdentifier(relativePath),
                context: RequestContext(threadID: thread, uid: 0, gid: 0))
            let before = fast.state()
            #expect(before == slow.state(), "the twins differ before opening \(relativePath)")
            let kernelBefore = fast.kernelClaimCount
            let heldBefore = fast.claims.heldCount
            let now = fast.claims.acquireReadClaimNow(request)
            if now == nil {
                #expect(fast.state() == before, "a refused fast open changed the claims")
                #expect(fast.claims.heldCount == heldBefore)
                waiting.append((fast, Task { try await fast.claims.acquireReadClaim(request) }))
            }
            waiting.append((slow, Task { try await slow.claims.acquireReadClaim(request) }))
            // The slow open has reached the arbiter once its claim shows (held or waiting).
            for twin in twins {
                let deadline = ContinuousClock.now + .seconds(30)
                while twin.kernelClaimCount == kernelBefore && ContinuousClock.now < deadline {
                    try? await Task.sleep(for: .milliseconds(1))
                }
            }
            let grantedAtOnce = slow.state().contains { $0.hasPrefix("kernel#\(kernelBefore) held") }
            #expect(
                (now != nil) == grantedAtOnce,
                "open of \(relativePath) by \(thread): fast \(now != nil), slow at once \(grantedAtOnce)")
            #expect(fast.state() == slow.state(), "the twins differ after opening \(relativePath)")
            // Presenter messages are delivered on the server's thread, after the grant: each
            // twin's arrive in its own time (one twin's came before the other's once, in CI).
            let delivered = ContinuousClock.now + .seconds(30)
            while fast.log.value != slow.log.value && ContinuousClock.now < delivered {
                try? await Task.sleep(for: .milliseconds(1))
            }
            #expect(fast.log.value == slow.log.value)
            if let now { tokens.append((fast, now)) }
            return now != nil
        }

        let me = getpid()  // the main thread of this process
        #expect(await open("a", thread: me))
        #expect(await open("", thread: stranger), "the mount root")
        // A writer elsewhere makes a stranger's open wait.
        fast.hold(1, ClaimIntent(kind: .write, path: "/mnt/twin/b"), pid: stranger + 1)
        slow.hold(1, ClaimIntent(kind: .write, path: "/mnt/twin/b"), pid: stranger + 1)
        #expect(await !open("b", thread: stranger))
        #expect(await open("c", thread: stranger), "a writer of b does not hold c")
        // A writer that is this process's parent does not block this process's opens.
        for twin in twins { twin.hold(2, ClaimIntent(kind: .write, path: "/mnt/twin/d"), pid: getppid()) }
        #expect(await open("d", thread: me))
        #expect(await !open("d", thread: stranger))
        // A presenter is asked to relinquish before a read.
        for twin in twins {
            twin.server.host.addPresenter(
                PresenterRegistration(
                    id: PresenterID(owner: twin.owner, local: 1), pid: 4242, purpose: "presenter", path: "/mnt/twin/p"))
        }
        #expect(await !open("p", thread: stranger))

        // Let everything waiting through, then end every claim in both twins.
        for twin in twins {
            twin.server.host.release(ClaimID(owner: twin.owner, local: 1))
            twin.server.host.release(ClaimID(owner: twin.owner, local: 2))
            twin.server.host.removePresenter(PresenterID(owner: twin.owner, local: 1))
        }
        for (twin, task) in waiting { tokens.append((twin, try await task.value)) }
        #expect(fast.claims.heldCount == slow.claims.heldCount)
        #expect(fast.state() == slow.state())
        for (twin, token) in tokens { twin.claims.releaseReadClaim(token) }
        for twin in twins {
            #expect(twin.claims.heldCount == 0)
            #expect(twin.server.host.isIdle)
        }
    }
}
