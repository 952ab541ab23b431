// `Passthrough.decideNow` (the open fast path's passthrough decision) against `decide` (the async
// open's) on the same state, checked the way the coordinator's `grantIfImmediate` is checked
// against `submit`. No /dev/fuse: the backing-file ioctls are a fake kernel per instance
// (`BackingFiles`), the INIT negotiation and the OPEN replies go through the real read and writev
// hooks (`received`, `send`) into a pipe, and `activateForTesting` turns passthrough back on
// after it was turned off.
//
// Two instances take the same seeded random steps: opens (node, handle, `servedFrom` among a few
// paths or nil), releases, registration failures on and off, passthrough on and off. At each open
// the first asks `decideNow` and falls back to `decide` when it declines (as `Dispatcher.openNow`
// leaves the open to the async path), the second asks only `decide`. A decideNow answer must be
// decide's; decideNow must decline exactly when decide answers a conflict; after every step the
// two instances' bookkeeping, their fake kernels' backing ids and the OPEN replies the kernel
// would read must be equal.
//
// Replay: PROVIDERFS_TEST_SEED=<seed> PROVIDERFS_TWIN_SEQUENCES=1 swift test --filter PassthroughTwinTests
// Size:   PROVIDERFS_TWIN_SEQUENCES (default 8), PROVIDERFS_TWIN_STEPS (default 200).

import Diagnostics
import SystemSupport
import TestSupport
import Testing

@testable import FUSEAdapter

#if canImport(Glibc)
import Glibc
#endif

@Suite("Fast path twins: Passthrough.decideNow is decide")
struct PassthroughTwinTests {
    @Test("decideNow answers what decide answers, declines exactly its conflicts, and leaves the same state")
    func decideNowAgreesWithDecide() async throws {
        let baseSeed = SeededRandom.seedFromEnvironment()
        let sequences = environmentInteger("PROVIDERFS_TWIN_SEQUENCES", default: 8)
        let steps = environmentInteger("PROVIDERFS_TWIN_STEPS", default: 200)
        var compared: [String: Int] = [:]
        for index in 0..<sequences {
            let seed = baseSeed &+ UInt64(index)
            let run = try PassthroughTwinRun(seed: seed)
            let mismatches = await run.execute(steps: steps)
            run.finish()
            for mismatch in mismatches.prefix(5) {
                Issue.record(
                    "\(mismatch)\nseed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed) PROVIDERFS_TWIN_SEQUENCES=1)")
            }
            compared.merge(run.compared, uniquingKeysWith: +)
        }
        for kind in PassthroughTwinRun.kinds {
            #expect(
                compared[kind, default: 0] > 0, "no \(kind) decision was compared: the check is empty (\(compared))")
        }
    }
}

/// The backing-file ioctls of one instance: ids handed out in order, the ones not given back yet,
/// and an errno every registration fails with while `failure` is set.
final class FakeKernel: Sendable {
    private struct State {
        var failure: Int32?
        var nextID: Int32 = 1
        var live: Set<Int32> = []
        var registrations = 0
        var failures = 0
        var errors: [String] = []
    }

    private let state = Locked(State())

    var backing: BackingFiles {
        BackingFiles(
            register: { path, _, simulatedFailure in self.register(path, simulatedFailure: simulatedFailure) },
            close: { backingID, _ in self.close(backingID) })
    }

    var failure: Int32? {
        get { state.withLock { $0.failure } }
        set { state.withLock { $0.failure = newValue } }
    }

    /// Ids registered and not closed; registrations and failed registrations so far; misuse seen.
    var snapshot: (live: Set<Int32>, registrations: Int, failures: Int, errors: [String]) {
        state.withLock { ($0.live, $0.registrations, $0.failures, $0.errors) }
    }

    private func register(_ path: String, simulatedFailure: Int32?) -> Result<Int32, Errno> {
        state.withLock { state in
            if let failure = simulatedFailure ?? state.failure {
                state.failures += 1
                return .failure(Errno(failure))
            }
            let id = state.nextID
            state.nextID += 1
            state.live.insert(id)
            state.registrations += 1
            return .success(id)
        }
    }

    private func close(_ backingID: Int32) -> Errno? {
        state.withLock { state in
            guard state.live.remove(backingID) != nil else {
                state.errors.append("backing id \(backingID) closed but not registered (or closed twice)")
                return .badFileDescriptor
            }
            return nil
        }
    }
}

/// Two `Passthrough` instances kept identical; `now` decides with `decideNow` first, `slow` with
/// `decide` only.
private final class PassthroughTwinRun: @unchecked Sendable {
    // Confined to the test's task: no concurrent access.
    static let paths: [String?] = ["/cache/a", "/cache/b", "/cache/c", nil]
    /// Every kind of decision the check must have compared.
    static let kinds = [
        "daemon before INIT", "daemon", "daemon after a failed registration", "kernel on a new registration",
        "kernel on the node's registration", "conflict",
    ]

    let kernels: [FakeKernel]
    let now: Passthrough
    let slow: Passthrough
    /// Each instance's end of /dev/fuse: the writev hook writes its replies here.
    let pipes: [(read: Int32, write: Int32)]
    var random: SeededRandom
    /// Handles decided (not refused) and not released, the same in both.
    var open: [(node: UInt64, handle: UInt64)] = []
    var nextHandle: UInt64 = 100
    var nextUnique: UInt64 = 1
    var compared: [String: Int] = [:]
    var mismatches: [String] = []

    init(seed: UInt64) throws {
        random = SeededRandom(seed: seed)
        let logger = Logger(label: "passthrough-twin")
        let kernels = [FakeKernel(), FakeKernel()]
        self.kernels = kernels
        // `decide` asks again after a conflict; a zero delay keeps the retries without the wait.
        now = Passthrough(
            requested: true, logger: logger, backing: kernels[0].backing, conflictRetries: 2, conflictRetryDelay: .zero)
        slow = Passthrough(
            requested: true, logger: logger, backing: kernels[1].backing, conflictRetries: 2, conflictRetryDelay: .zero)
        var pipes: [(read: Int32, write: Int32)] = []
        for _ in 0..<2 {
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else { throw Errno.current }
            pipes.append((fds[0], fds[1]))
        }
        self.pipes = pipes
        now.attach(deviceFD: pipes[0].write)
        slow.attach(deviceFD: pipes[1].write)
    }

    func finish() {
        for pipe in pipes {
            close(pipe.read)
            close(pipe.write)
        }
    }

    var instances: [Passthrough] { [now, slow] }

    func pick<T>(_ choices: [T]) -> T { choices[Int(random.next() % UInt64(choices.count))] }

    func execute(steps: Int) async -> [String] {
        for step in 0..<steps {
            let what: String
            switch random.next() % 12 {
            case 0...5: what = await checkOpen(step)
            case 6, 7, 8: what = release()
            case 9:
                let failure = pick([nil, nil, EMFILE, EACCES, EPERM])
                for kernel in kernels { kernel.failure = failure }
                what = "registrations fail with \(failure.map { Errno($0).name } ?? "nothing")"
            case 10: what = toggleAvailability()
            default:
                // A RELEASE of a handle that was never counted (refused, or decided before INIT).
                let handle = nextHandle + 1_000_000
                for instance in instances { instance.released(handle: handle) }
                what = "release of unknown handle \(handle)"
            }
            compareState("step \(step): \(what)")
            if mismatches.count >= 5 { break }
        }
        return mismatches
    }

    func toggleAvailability() -> String {
        let before = now.bookkeeping().availability
        if before == "awaiting INIT" {
            for (index, instance) in instances.enumerated() { negotiate(instance, pipe: pipes[index]) }
            return "INIT negotiated"
        }
        if random.next() % 2 == 0 {
            for instance in instances { instance.activateForTesting() }
            return "passthrough on"
        }
        for instance in instances { instance.disable("turned off by the test") }
        return "passthrough off"
    }

    // MARK: The twin

    func checkOpen(_ step: Int) async -> String {
        let node = 1 + random.next() % 3
        let servedFrom = pick(Self.paths)
        let handle = nextHandle
        nextHandle += 1
        let unique = nextUnique
        nextUnique += 1
        let what = "open of node \(node) as handle \(handle) on \(servedFrom ?? "nil")"
        let availability = slow.bookkeeping().availability
        let slowKernel = kernels[1].snapshot
        for instance in instances { instance.received(openRequest(unique: unique, node: node), count: 48) }

        let immediate = now.decideNow(node: node, handle: handle, servedFrom: servedFrom)
        let first: PassthroughDecision
        if let immediate {
            first = immediate
        } else {
            first = await now.decide(node: node, handle: handle, servedFrom: servedFrom)
        }
        let second = await slow.decide(node: node, handle: handle, servedFrom: servedFrom)

        if let immediate {
            if case .conflict = immediate {
                mismatches.append("step \(step): \(what): decideNow answered \(immediate)")
            }
            if immediate != second {
                mismatches.append("step \(step): \(what): decideNow \(immediate), decide \(second)")
            }
        } else if case .conflict = second {
        } else {
            mismatches.append("step \(step): \(what): decideNow declined, decide answered \(second)")
        }
        if first != second {
            mismatches.append("step \(step): \(what): decide after decideNow declined \(first), decide alone \(second)")
        }

        // The reply the kernel reads: the decided handle, or EBUSY for a refused open.
        let refused: Bool
        if case .conflict = second { refused = true } else { refused = false }
        var replies: [[UInt8]] = []
        for (index, instance) in instances.enumerated() {
            replies.append(
                sendOpenReply(instance, pipe: pipes[index], unique: unique, handle: handle, refused: refused))
            if !refused { instance.replyWritten(handle: handle) }
        }
        if replies[0] != replies[1] {
            mismatches.append("step \(step): \(what): OPEN replies differ: \(replies[0]) and \(replies[1])")
        }
        if let expected = Self.expectedReply(second, handle: handle, refused: refused), replies[1] != expected {
            mismatches.append("step \(step): \(what): OPEN reply \(replies[1]) after \(second), expected \(expected)")
        }

        if !refused { open.append((node, handle)) }
        if immediate != nil || refused {
            let registered = kernels[1].snapshot.registrations > slowKernel.registrations
            let failed = kernels[1].snapshot.failures > slowKernel.failures
            let kind: String
            switch second {
            case .conflict: kind = "conflict"
            case .kernel: kind = registered ? "kernel on a new registration" : "kernel on the node's registration"
            case .daemon:
                kind =
                    availability == "awaiting INIT"
                    ? "daemon before INIT" : failed ? "daemon after a failed registration" : "daemon"
            }
            compared[kind, default: 0] += 1
        }
        return what
    }

    func release() -> String {
        guard !open.isEmpty else { return "no handle to release" }
        let (node, handle) = open.remove(at: Int(random.next() % UInt64(open.count)))
        for instance in instances { instance.released(handle: handle) }
        return "release of handle \(handle) of node \(node)"
    }

    func compareState(_ what: String) {
        let states = instances.map { $0.bookkeeping() }
        if states[0] != states[1] {
            mismatches.append("\(what): decideNow's instance \(states[0])\n  decide's instance \(states[1])")
        }
        let fakes = kernels.map(\.snapshot)
        if fakes[0].live != fakes[1].live || fakes[0].registrations != fakes[1].registrations {
            mismatches.append("\(what): backing ids \(fakes[0]) and \(fakes[1])")
        }
        for (index, fake) in fakes.enumerated() {
            // Every backing id registered and not closed is the one of a node in passthrough mode.
            if fake.live != states[index].backingIDs {
                mismatches.append("\(what): instance \(index) holds ids \(fake.live), nodes name \(states[index])")
            }
            if !states[index].replies.isEmpty {
                mismatches.append("\(what): instance \(index) kept backing ids for sent replies: \(states[index])")
            }
            for error in fake.errors { mismatches.append("\(what): instance \(index): \(error)") }
        }
    }

    // MARK: /dev/fuse through a pipe

    /// struct fuse_in_header of an OPEN request (+ fuse_open_in).
    func openRequest(unique: UInt64, node: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 48)
        bytes.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: 48, toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.opcodeOpen, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: unique, toByteOffset: 8, as: UInt64.self)
            raw.storeBytes(of: node, toByteOffset: 16, as: UInt64.self)
        }
        return bytes
    }

    /// What a successful INIT does: the request offering FUSE_PASSTHROUGH, then libfuse's reply
    /// through the writev hook.
    func negotiate(_ instance: Passthrough, pipe: (read: Int32, write: Int32)) {
        let unique = nextUnique
        nextUnique += 1
        var request = [UInt8](repeating: 0, count: FUSEKernelABI.inHeaderSize + 64)
        request.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(raw.count), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.opcodeInit, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: unique, toByteOffset: 8, as: UInt64.self)
            let body = FUSEKernelABI.inHeaderSize
            raw.storeBytes(of: 7, toByteOffset: body, as: UInt32.self)
            raw.storeBytes(of: 40, toByteOffset: body + 4, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.initExt, toByteOffset: body + FUSEKernelABI.initInFlags, as: UInt32.self)
            raw.storeBytes(
                of: FUSEKernelABI.passthroughInFlags2, toByteOffset: body + FUSEKernelABI.initInFlags2, as: UInt32.self)
        }
        request.withUnsafeBytes { instance.received($0.baseAddress!, count: $0.count) }
        let reply = send(instance, pipe: pipe, unique: unique, error: 0, body: [UInt8](repeating: 0, count: 64))
        let flags2 =
            reply.count == 64
            ? reply.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: FUSEKernelABI.initOutFlags2, as: UInt32.self) }
            : 0
        if flags2 & FUSEKernelABI.passthroughInFlags2 == 0 {
            mismatches.append("the INIT reply does not announce passthrough: \(reply)")
        }
    }

    /// libfuse's OPEN reply for `handle` (keep_cache, as the in-memory file systems open), or
    /// EBUSY; returns what the kernel reads.
    func sendOpenReply(
        _ instance: Passthrough, pipe: (read: Int32, write: Int32), unique: UInt64, handle: UInt64, refused: Bool
    ) -> [UInt8] {
        guard !refused else { return send(instance, pipe: pipe, unique: unique, error: -EBUSY, body: nil) }
        var body = [UInt8](repeating: 0, count: FUSEKernelABI.openOutSize)
        body.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: handle, toByteOffset: 0, as: UInt64.self)
            raw.storeBytes(of: FUSEKernelABI.fopenKeepCache, toByteOffset: FUSEKernelABI.openOutFlags, as: UInt32.self)
        }
        return send(instance, pipe: pipe, unique: unique, error: 0, body: body)
    }

    /// The OPEN reply the writev hook must write after `decision`.
    static func expectedReply(_ decision: PassthroughDecision, handle: UInt64, refused: Bool) -> [UInt8]? {
        guard !refused else { return nil }
        var reply = [UInt8](repeating: 0, count: FUSEKernelABI.outHeaderSize + FUSEKernelABI.openOutSize)
        let flags: UInt32
        let backingID: Int32
        switch decision {
        case .kernel(let id): (flags, backingID) = (FUSEKernelABI.fopenPassthrough, id)
        default: (flags, backingID) = (FUSEKernelABI.fopenKeepCache, 0)
        }
        reply.withUnsafeMutableBytes { raw in
            let body = FUSEKernelABI.outHeaderSize
            raw.storeBytes(of: handle, toByteOffset: body, as: UInt64.self)
            raw.storeBytes(of: flags, toByteOffset: body + FUSEKernelABI.openOutFlags, as: UInt32.self)
            raw.storeBytes(of: backingID, toByteOffset: body + FUSEKernelABI.openOutBackingID, as: Int32.self)
        }
        return Array(reply[FUSEKernelABI.outHeaderSize...])
    }

    /// Sends a reply (header + optional body) through `instance.send` and reads back what reached
    /// the pipe, as the kernel would read it: the body when there is one, else the header.
    func send(
        _ instance: Passthrough, pipe: (read: Int32, write: Int32), unique: UInt64, error: Int32, body: [UInt8]?
    )
        -> [UInt8]
    {
        var header = [UInt8](repeating: 0, count: FUSEKernelABI.outHeaderSize)
        let length = FUSEKernelABI.outHeaderSize + (body?.count ?? 0)
        header.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(length), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: error, toByteOffset: 4, as: Int32.self)
            raw.storeBytes(of: unique, toByteOffset: 8, as: UInt64.self)
        }
        var payload = body ?? []
        let written = header.withUnsafeMutableBytes { headerBytes in
            payload.withUnsafeMutableBytes { bodyBytes in
                var vectors = [
                    iovec(iov_base: headerBytes.baseAddress, iov_len: headerBytes.count),
                    iovec(iov_base: bodyBytes.baseAddress, iov_len: bodyBytes.count),
                ]
                return instance.send(pipe.write, &vectors, body == nil ? 1 : 2)
            }
        }
        var received = [UInt8](repeating: 0, count: length)
        let count = received.withUnsafeMutableBytes { read(pipe.read, $0.baseAddress, length) }
        if written != length || count != length {
            mismatches.append("reply of \(length) bytes: written \(written), read back \(count)")
            return []
        }
        return body == nil ? received : Array(received[FUSEKernelABI.outHeaderSize...])
    }
}
