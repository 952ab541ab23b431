// FUSE passthrough (Linux ≥ 6.9 with CONFIG_FUSE_PASSTHROUGH): reads of a handle whose content is a
// complete local file (`OpenedFile.servedFrom`) are done by the kernel on that file and never reach
// the daemon. libfuse 3.14 has no API for it, so the adapter sits between libfuse and /dev/fuse
// (`fuse_session_custom_io`): the read hook notes the INIT and OPEN requests, the writev hook
// rewrites their replies (FUSE_PASSTHROUGH in INIT, FOPEN_PASSTHROUGH + a backing id in OPEN).
//
// The kernel's rules (fs/fuse/iomode.c, fs/fuse/backing.c), which the bookkeeping here follows:
// - a node is either in caching mode (opens without passthrough) or in passthrough mode, never both:
//   a passthrough open while a caching open is alive, or the reverse, fails the open with EIO;
// - every passthrough open of a node must name the same backing registration (same id) as the
//   node's other open passthrough files, else EIO;
// - FOPEN_KEEP_CACHE is not allowed with FOPEN_PASSTHROUGH;
// - registering a backing file (FUSE_DEV_IOC_BACKING_OPEN) needs CAP_SYS_ADMIN, a connection that
//   negotiated passthrough, and a backing file system stacked less deep than max_stack_depth.
// So the adapter counts each node's open handles by mode (from the decision until RELEASE, which
// the kernel sends only after it has let go of the file) and keeps one backing id per node while
// the node has passthrough handles. Decisions: docs/DECISIONS.md D-261…D-264.

import CFuse3
import Diagnostics
import Synchronization
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// The parts of the kernel's FUSE protocol this file needs. Debian 12's linux/fuse.h (7.38) and
/// libfuse 3.14's private copy predate passthrough, so the values and offsets are written here, from
/// the kernel's include/uapi/linux/fuse.h (protocol 7.40 added passthrough).
enum FUSEKernelABI {
    static let opcodeOpen: UInt32 = 14  // FUSE_OPEN
    static let opcodeInit: UInt32 = 26  // FUSE_INIT
    /// struct fuse_in_header: len u32, opcode u32 @4, unique u64 @8, nodeid u64 @16, … (40 bytes).
    static let inHeaderSize = 40
    /// struct fuse_out_header: len u32, error i32 @4, unique u64 @8 (16 bytes).
    static let outHeaderSize = 16
    /// struct fuse_init_in: major, minor, max_readahead, flags @12, flags2 @16 (u32 each).
    static let initInFlags = 12
    static let initInFlags2 = 16
    /// struct fuse_init_out: … flags @12, … flags2 @32, max_stack_depth @36 (7.40; `unused[0]` in
    /// libfuse 3.14's copy, which sends the whole 64-byte struct).
    static let initOutFlags = 12
    static let initOutFlags2 = 32
    static let initOutMaxStackDepth = 36
    static let initExt: UInt32 = 1 << 30  // FUSE_INIT_EXT: flags2 is valid
    static let writebackCache: UInt32 = 1 << 16  // FUSE_WRITEBACK_CACHE (excludes passthrough)
    static let passthroughInFlags2: UInt32 = 1 << 5  // FUSE_PASSTHROUGH = 1 << 37, i.e. flags2 bit 5
    /// FUSE_DIRECT_IO_ALLOW_MMAP = 1 << 36, i.e. flags2 bit 4 (Linux ≥ 6.6): mmap(MAP_SHARED) of a
    /// handle opened with FOPEN_DIRECT_IO, through the node's page cache, instead of ENODEV.
    static let directIOAllowMmapInFlags2: UInt32 = 1 << 4
    /// struct fuse_open_out: fh u64, open_flags u32 @8, backing_id i32 @12 (7.40; `padding` before).
    static let openOutSize = 16
    static let openOutFlags = 8
    static let openOutBackingID = 12
    static let fopenDirectIO: UInt32 = 1 << 0  // FOPEN_DIRECT_IO
    static let fopenKeepCache: UInt32 = 1 << 1  // FOPEN_KEEP_CACHE
    static let fopenPassthrough: UInt32 = 1 << 7  // FOPEN_PASSTHROUGH
    /// FUSE_DEV_IOC_BACKING_OPEN = _IOW(229, 1, struct fuse_backing_map), the map being
    /// { i32 fd; u32 flags; u64 padding } (16 bytes; flags and padding must be 0).
    static let backingOpen: UInt = 0x4010_E501
    /// FUSE_DEV_IOC_BACKING_CLOSE = _IOW(229, 2, uint32_t).
    static let backingClose: UInt = 0x4004_E502
    /// max_stack_depth we announce: backing files on a plain file system (not overlayfs), and the
    /// mount itself may still be a lower layer of an overlay.
    static let maxStackDepth: UInt32 = 1
}

/// What the adapter does with one opened file handle.
enum PassthroughDecision: Equatable, Sendable {
    /// Reads reach the daemon (through the page cache, as keep_cache/direct_io say).
    case daemon
    /// Reads are done by the kernel on the backing file registered under `backingID`.
    case kernel(backingID: Int32)
    /// The node has handles open in passthrough on another file: the kernel would refuse this open.
    case conflict(String)
}

/// The two effects of a passthrough decision on the kernel: registering a backing file
/// (FUSE_DEV_IOC_BACKING_OPEN) and giving its id back (FUSE_DEV_IOC_BACKING_CLOSE). `kernel` is the
/// real one; tests without /dev/fuse put their own in (FUSEAdapterTests).
struct BackingFiles: Sendable {
    /// Registers `path` on the session's `device`; `simulatedFailure` (tests) fails with that
    /// errno after opening the file. Returns the backing id.
    var register: @Sendable (_ path: String, _ device: Int32, _ simulatedFailure: Int32?) -> Result<Int32, Errno>
    /// Gives `backingID` back on `device`; the error when the kernel refused.
    var close: @Sendable (_ backingID: Int32, _ device: Int32) -> Errno?

    static let kernel = BackingFiles(
        register: { path, device, simulatedFailure in
            Passthrough.registerBacking(path, device: device, simulatedFailure: simulatedFailure)
        },
        close: { backingID, device in Passthrough.closeBacking(backingID, device: device) })
}

/// Negotiates passthrough with the kernel and decides, per open, whether the kernel serves the
/// handle's reads from its backing file. Thread-safe; the hooks run on libfuse threads and on
/// whichever thread sends a reply.
final class Passthrough: Sendable {
    private let logger: Logger
    private let pool: BlockingIOPool
    /// Tests: registrations fail with this errno without asking the kernel.
    private let simulatedFailure: Int32?
    /// Registers and closes backing files (`BackingFiles.kernel` outside tests).
    private let backing: BackingFiles
    /// How often, and how long apart, `decide` asks again after a conflict (a RELEASE may be on
    /// its way); 5 × 20 ms outside tests.
    private let conflictRetries: Int
    private let conflictRetryDelay: Duration
    /// Ask the kernel for FUSE_DIRECT_IO_ALLOW_MMAP in the INIT reply (D-376).
    private let directIOMmap: Bool
    private let deviceFD = Atomic<Int32>(-1)
    /// The INIT request's `unique` is in `state.initUnique`; this says whether one is pending, so
    /// that other replies need no lock.
    private let initPending = Atomic<Bool>(false)
    /// OPEN requests whose reply has not been written (their uniques are in `state.openRequests`).
    private let openRequestCount = Atomic<Int>(0)
    private let state = Locked(State())

    private enum Availability: Equatable {
        /// Before the INIT reply.
        case awaitingInit
        /// Negotiated: backing files may be registered.
        case active
        /// Not on this connection, for the reason given (logged once).
        case unavailable(String)
    }

    private enum NodeMode {
        /// Open only by handles whose reads reach the daemon (the kernel's caching mode).
        case daemon(handles: Int)
        /// Open only by passthrough handles, all on the backing file `path` registered as `backingID`.
        case kernel(path: String, backingID: Int32, handles: Int)
    }

    private struct State {
        var availability = Availability.awaitingInit
        var initUnique: UInt64 = 0
        var kernelOffered = false
        /// The kernel offered FUSE_DIRECT_IO_ALLOW_MMAP.
        var kernelOfferedMmap = false
        /// `unique` of OPEN requests not answered yet.
        var openRequests: Set<UInt64> = []
        var nodes: [UInt64: NodeMode] = [:]
        /// Node of every handle counted in `nodes`.
        var handles: [UInt64: UInt64] = [:]
        /// Backing id to put into the OPEN reply of a handle (until the reply is written).
        var replies: [UInt64: Int32] = [:]
        /// Registration failures already logged (by errno).
        var reported: Set<Int32> = []
        var kernelOpens = 0
        var daemonOpens = 0
    }

    init(
        requested: Bool, logger: Logger, pool: BlockingIOPool = .shared, simulatedFailure: Int32? = nil,
        backing: BackingFiles = .kernel, conflictRetries: Int = 5, conflictRetryDelay: Duration = .milliseconds(20),
        directIOMmap: Bool = false
    ) {
        self.directIOMmap = directIOMmap
        self.logger = logger
        self.pool = pool
        self.simulatedFailure = simulatedFailure
        self.backing = backing
        self.conflictRetries = conflictRetries
        self.conflictRetryDelay = conflictRetryDelay
        if !requested {
            state.withLock { $0.availability = .unavailable("turned off for this mount (--no-passthrough)") }
        }
    }

    /// The session's /dev/fuse descriptor, once the hooks are installed.
    func attach(deviceFD fd: Int32) { deviceFD.store(fd, ordering: .releasing) }

    /// Passthrough cannot be used on this connection (the hooks could not be installed).
    func disable(_ reason: String) { markUnavailable(reason) }

    /// "N of M opens served by the kernel", or why passthrough was not used.
    var summary: String {
        state.withLock { state in
            switch state.availability {
            case .active, .awaitingInit:
                return "passthrough: \(state.kernelOpens) of \(state.kernelOpens + state.daemonOpens) opens "
                    + "were served by the kernel from the cache file"
            case .unavailable(let reason):
                return "passthrough: not used (\(reason))"
            }
        }
    }

    // MARK: Tests without /dev/fuse

    /// Puts the connection where a successful INIT negotiation puts it (`.active`: backing files
    /// may be registered), for tests that have no /dev/fuse to negotiate on. Unlike INIT, it also
    /// turns passthrough back on after `disable` or a registration failure turned it off, so that a
    /// test can go back and forth.
    func activateForTesting() { state.withLock { $0.availability = .active } }

    /// The bookkeeping as plain values, for tests comparing two instances.
    struct Bookkeeping: Equatable, CustomStringConvertible {
        /// "awaiting INIT", "active" or "unavailable: <reason>".
        var availability: String
        /// Per node: "daemon ×N" or "kernel <path> #<backing id> ×N".
        var nodes: [UInt64: String]
        /// Node of every counted handle.
        var handles: [UInt64: UInt64]
        /// Backing ids waiting for their OPEN reply.
        var replies: [UInt64: Int32]
        /// The backing ids the nodes in passthrough mode hold (registered and not closed).
        var backingIDs: Set<Int32>
        var kernelOpens: Int
        var daemonOpens: Int

        var description: String {
            "\(availability); nodes \(nodes.sorted { $0.key < $1.key }); handles \(handles.sorted { $0.key < $1.key }); "
                + "replies \(replies.sorted { $0.key < $1.key }); opens: \(kernelOpens) kernel, \(daemonOpens) daemon"
        }
    }

    func bookkeeping() -> Bookkeeping {
        state.withLock { state in
            let availability: String
            switch state.availability {
            case .awaitingInit: availability = "awaiting INIT"
            case .active: availability = "active"
            case .unavailable(let reason): availability = "unavailable: \(reason)"
            }
            return Bookkeeping(
                availability: availability,
                nodes: state.nodes.mapValues { mode in
                    switch mode {
                    case .daemon(let handles): "daemon ×\(handles)"
                    case .kernel(let path, let backingID, let handles): "kernel \(path) #\(backingID) ×\(handles)"
                    }
                }, handles: state.handles, replies: state.replies,
                backingIDs: Set(
                    state.nodes.values.compactMap { mode -> Int32? in
                        guard case .kernel(_, let backingID, _) = mode else { return nil }
                        return backingID
                    }), kernelOpens: state.kernelOpens, daemonOpens: state.daemonOpens)
        }
    }

    // MARK: Requests (read hook)

    /// Called with every request read from /dev/fuse: notes INIT (what the kernel offers) and OPEN.
    func received(_ request: UnsafeRawPointer, count: Int) {
        guard count >= FUSEKernelABI.inHeaderSize else { return }
        let opcode = request.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        guard opcode == FUSEKernelABI.opcodeOpen || opcode == FUSEKernelABI.opcodeInit else { return }
        let unique = request.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
        if opcode == FUSEKernelABI.opcodeOpen {
            state.withLock { _ = $0.openRequests.insert(unique) }
            openRequestCount.add(1, ordering: .releasing)
            return
        }
        let body = request + FUSEKernelABI.inHeaderSize
        var offered = false
        var offeredMmap = false
        if count >= FUSEKernelABI.inHeaderSize + FUSEKernelABI.initInFlags2 + 4 {
            let flags = body.loadUnaligned(fromByteOffset: FUSEKernelABI.initInFlags, as: UInt32.self)
            let flags2 = body.loadUnaligned(fromByteOffset: FUSEKernelABI.initInFlags2, as: UInt32.self)
            offered = flags & FUSEKernelABI.initExt != 0 && flags2 & FUSEKernelABI.passthroughInFlags2 != 0
            offeredMmap = flags & FUSEKernelABI.initExt != 0 && flags2 & FUSEKernelABI.directIOAllowMmapInFlags2 != 0
        }
        state.withLock {
            $0.initUnique = unique
            $0.kernelOffered = offered
            $0.kernelOfferedMmap = offeredMmap
        }
        initPending.store(true, ordering: .releasing)
    }

    // MARK: Replies (writev hook)

    /// Sends one reply to /dev/fuse, rewriting the INIT reply and passthrough OPEN replies.
    /// Returns what writev(2) returns, with its errno.
    func send(_ fd: Int32, _ iov: UnsafeMutablePointer<iovec>, _ count: Int32) -> Int {
        let initPending = initPending.load(ordering: .acquiring)
        guard initPending || openRequestCount.load(ordering: .acquiring) > 0, count >= 1,
            iov[0].iov_len >= FUSEKernelABI.outHeaderSize, let header = iov[0].iov_base
        else {
            return writev(fd, iov, count)
        }
        let error = header.loadUnaligned(fromByteOffset: 4, as: Int32.self)
        let unique = header.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
        let body: UnsafeMutableRawPointer? = count == 2 ? iov[1].iov_base : nil
        let bodyLength = count == 2 ? iov[1].iov_len : 0
        enum Kind { case initReply(offered: Bool, offeredMmap: Bool), openReply, other }
        let kind = state.withLock { state -> Kind in
            if initPending && unique == state.initUnique {
                return .initReply(offered: state.kernelOffered, offeredMmap: state.kernelOfferedMmap)
            }
            if state.openRequests.remove(unique) != nil { return .openReply }
            return .other
        }
        switch kind {
        case .other:
            return writev(fd, iov, count)
        case .openReply:
            openRequestCount.subtract(1, ordering: .releasing)
            guard error == 0, let body, bodyLength == FUSEKernelABI.openOutSize else { return writev(fd, iov, count) }
            let handle = body.loadUnaligned(as: UInt64.self)
            guard let backingID = state.withLock({ $0.replies.removeValue(forKey: handle) }) else {
                return writev(fd, iov, count)
            }
            return sendRewritten(fd, iov, body: body, length: bodyLength) { reply in
                var flags = reply.loadUnaligned(fromByteOffset: FUSEKernelABI.openOutFlags, as: UInt32.self)
                // The kernel refuses keep_cache with passthrough; direct_io would send reads to us.
                flags &= ~(FUSEKernelABI.fopenKeepCache | FUSEKernelABI.fopenDirectIO)
                flags |= FUSEKernelABI.fopenPassthrough
                reply.storeBytes(of: flags, toByteOffset: FUSEKernelABI.openOutFlags, as: UInt32.self)
                reply.storeBytes(of: backingID, toByteOffset: FUSEKernelABI.openOutBackingID, as: Int32.self)
            }
        case .initReply(let offered, let offeredMmap):
            self.initPending.store(false, ordering: .releasing)
            return sendInitReply(
                fd, iov, count, error: error, body: body, length: bodyLength, offered: offered,
                offeredMmap: offeredMmap)
        }
    }

    /// The INIT reply, with FUSE_PASSTHROUGH (when requested and offered) and
    /// FUSE_DIRECT_IO_ALLOW_MMAP (when `directIOMmap` and offered) added.
    private func sendInitReply(
        _ fd: Int32, _ iov: UnsafeMutablePointer<iovec>, _ count: Int32, error: Int32,
        body: UnsafeMutableRawPointer?, length: Int, offered: Bool, offeredMmap: Bool
    ) -> Int {
        let passthroughRequested = state.withLock { $0.availability == .awaitingInit }
        guard error == 0, let body, length >= FUSEKernelABI.initOutMaxStackDepth + 4 else {
            markUnavailable("the INIT reply has no room for passthrough (old protocol)")
            if directIOMmap { logger.info("mmap of direct I/O handles: not negotiated (old protocol)") }
            return writev(fd, iov, count)
        }
        var passthrough = passthroughRequested
        if passthrough && !offered {
            markUnavailable(
                "the kernel did not offer FUSE_PASSTHROUGH; it needs Linux 6.9 or later with CONFIG_FUSE_PASSTHROUGH")
            passthrough = false
        }
        let flags = body.loadUnaligned(fromByteOffset: FUSEKernelABI.initOutFlags, as: UInt32.self)
        if passthrough && flags & FUSEKernelABI.writebackCache != 0 {
            markUnavailable("the writeback cache is on, and the kernel allows passthrough only without it")
            passthrough = false
        }
        if directIOMmap && !offeredMmap {
            logger.info(
                "mmap of direct I/O handles: the kernel did not offer FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6 or later); "
                    + "mmap(MAP_SHARED) of a file on this mount fails with ENODEV")
        }
        let mmap = directIOMmap && offeredMmap
        guard passthrough || mmap else { return writev(fd, iov, count) }
        let result = sendRewritten(fd, iov, body: body, length: length) { reply in
            let flags = reply.loadUnaligned(fromByteOffset: FUSEKernelABI.initOutFlags, as: UInt32.self)
            var flags2 = reply.loadUnaligned(fromByteOffset: FUSEKernelABI.initOutFlags2, as: UInt32.self)
            if passthrough { flags2 |= FUSEKernelABI.passthroughInFlags2 }
            if mmap { flags2 |= FUSEKernelABI.directIOAllowMmapInFlags2 }
            reply.storeBytes(
                of: flags | FUSEKernelABI.initExt, toByteOffset: FUSEKernelABI.initOutFlags, as: UInt32.self)
            reply.storeBytes(of: flags2, toByteOffset: FUSEKernelABI.initOutFlags2, as: UInt32.self)
            if passthrough {
                reply.storeBytes(
                    of: FUSEKernelABI.maxStackDepth, toByteOffset: FUSEKernelABI.initOutMaxStackDepth,
                    as: UInt32.self)
            }
        }
        let savedErrno = errno
        if result >= 0 {
            if passthrough {
                state.withLock { state in
                    if state.availability == .awaitingInit { state.availability = .active }
                }
                logger.info("passthrough: negotiated; reads of materialized files are served by the kernel")
            }
            if mmap {
                logger.info("mmap of direct I/O handles: negotiated (FUSE_DIRECT_IO_ALLOW_MMAP)")
            }
        } else {
            markUnavailable("the INIT reply could not be sent")
        }
        errno = savedErrno
        return result
    }

    /// writev with the second buffer replaced by a copy that `edit` changed (libfuse's buffer is
    /// left alone). Keeps writev's errno.
    private func sendRewritten(
        _ fd: Int32, _ iov: UnsafeMutablePointer<iovec>, body: UnsafeMutableRawPointer, length: Int,
        _ edit: (UnsafeMutableRawPointer) -> Void
    ) -> Int {
        var savedErrno: Int32 = 0
        let result = withUnsafeTemporaryAllocation(byteCount: length, alignment: 8) { copy -> Int in
            copy.baseAddress!.copyMemory(from: body, byteCount: length)
            edit(copy.baseAddress!)
            return withUnsafeTemporaryAllocation(of: iovec.self, capacity: 2) { vectors -> Int in
                vectors[0] = iov[0]
                vectors[1] = iovec(iov_base: copy.baseAddress!, iov_len: length)
                let result = writev(fd, vectors.baseAddress!, 2)
                savedErrno = errno
                return result
            }
        }
        errno = savedErrno
        return result
    }

    private func markUnavailable(_ reason: String) {
        let changed = state.withLock { state -> Bool in
            guard case .unavailable = state.availability else {
                state.availability = .unavailable(reason)
                return true
            }
            return false
        }
        if changed { logger.info("passthrough: not used: \(reason); reads go through the daemon") }
    }

    // MARK: Decisions (open, release)

    /// Decides how the kernel serves `handle` of `node`, which the file system opened with
    /// `servedFrom` (nil: no complete local file). A `.kernel` decision is applied by the writev
    /// hook to the OPEN reply; every decided handle must be given back with `released`.
    func decide(node: UInt64, handle: UInt64, servedFrom: String?) async -> PassthroughDecision {
        // A RELEASE of the node's last passthrough handle may still be on its way (the kernel
        // sends it after letting go of the file): give it a moment before refusing the open.
        var attempt = 0
        while true {
            let decision = await decideOnce(node: node, handle: handle, servedFrom: servedFrom)
            guard case .conflict = decision, attempt < conflictRetries else { return decision }
            attempt += 1
            do { try await Task.sleep(for: conflictRetryDelay) } catch { return decision }
        }
    }

    /// `decide` without waiting, on the calling thread (a backing file is registered here: an
    /// open and an ioctl on the local cache file). Nil on a conflict, which `decide` retries for
    /// a moment (a RELEASE may be on its way), with nothing recorded.
    func decideNow(node: UInt64, handle: UInt64, servedFrom: String?) -> PassthroughDecision? {
        let decision: PassthroughDecision
        switch decisionStep(node: node, handle: handle, servedFrom: servedFrom) {
        case .decided(let decided): decision = decided
        case .register(let path):
            let registered = backing.register(path, deviceFD.load(ordering: .acquiring), simulatedFailure)
            decision = settle(node: node, handle: handle, path: path, registered: registered)
        }
        if case .conflict = decision { return nil }
        return decision
    }

    private enum Step {
        case decided(PassthroughDecision)
        case register(String)
    }

    private func decideOnce(node: UInt64, handle: UInt64, servedFrom: String?) async -> PassthroughDecision {
        switch decisionStep(node: node, handle: handle, servedFrom: servedFrom) {
        case .decided(let decision):
            return decision
        case .register(let path):
            let device = deviceFD.load(ordering: .acquiring)
            let simulated = simulatedFailure
            let register = backing.register
            let registered = await pool.run { () -> Result<Int32, Errno> in register(path, device, simulated) }
            return settle(node: node, handle: handle, path: path, registered: registered)
        }
    }

    /// The decision when the node's mode already settles it; `.register` when a backing file
    /// must be registered first (without the lock).
    private func decisionStep(node: UInt64, handle: UInt64, servedFrom: String?) -> Step {
        state.withLock { state -> Step in
            switch state.nodes[node] {
            case .kernel(let path, let backingID, let handles)?:
                guard servedFrom == path else { return .decided(Self.conflict(node, path: path, servedFrom)) }
                state.nodes[node] = .kernel(path: path, backingID: backingID, handles: handles + 1)
                state.handles[handle] = node
                state.replies[handle] = backingID
                state.kernelOpens += 1
                return .decided(.kernel(backingID: backingID))
            case .daemon(let handles)?:
                state.nodes[node] = .daemon(handles: handles + 1)
                state.handles[handle] = node
                state.daemonOpens += 1
                return .decided(.daemon)
            case nil:
                guard state.availability == .active else {
                    // No node can be in passthrough mode: nothing to keep track of.
                    state.daemonOpens += 1
                    return .decided(.daemon)
                }
                guard let servedFrom else {
                    state.nodes[node] = .daemon(handles: 1)
                    state.handles[handle] = node
                    state.daemonOpens += 1
                    return .decided(.daemon)
                }
                return .register(servedFrom)
            }
        }
    }

    /// Records the outcome of a backing registration made without the lock: another open of the
    /// node may have decided meanwhile, and then this one follows it (and gives its id back).
    private func settle(
        node: UInt64, handle: UInt64, path: String, registered: Result<Int32, Errno>
    )
        -> PassthroughDecision
    {
        if case .failure(let error) = registered { reportRegistrationFailure(error, path: path) }
        let (decision, unused) = state.withLock { state -> (PassthroughDecision, Int32?) in
            let ownID = try? registered.get()
            switch state.nodes[node] {
            case .kernel(let existing, let backingID, let handles)?:
                guard existing == path else { return (Self.conflict(node, path: existing, path), ownID) }
                state.nodes[node] = .kernel(path: existing, backingID: backingID, handles: handles + 1)
                state.handles[handle] = node
                state.replies[handle] = backingID
                state.kernelOpens += 1
                return (.kernel(backingID: backingID), ownID)
            case .daemon(let handles)?:
                state.nodes[node] = .daemon(handles: handles + 1)
                state.handles[handle] = node
                state.daemonOpens += 1
                return (.daemon, ownID)
            case nil:
                state.handles[handle] = node
                guard let ownID else {
                    state.nodes[node] = .daemon(handles: 1)
                    state.daemonOpens += 1
                    return (.daemon, nil)
                }
                state.nodes[node] = .kernel(path: path, backingID: ownID, handles: 1)
                state.replies[handle] = ownID
                state.kernelOpens += 1
                return (.kernel(backingID: ownID), nil)
            }
        }
        if let unused { closeBacking(unused) }
        return decision
    }

    private static func conflict(_ node: UInt64, path: String, _ wanted: String?) -> PassthroughDecision {
        .conflict(
            "node \(node) is open by handles the kernel serves from \(path); it cannot also be opened "
                + (wanted.map { "on \($0)" } ?? "without passthrough")
                + " until they are closed (a newer version was opened while an older one is still open)")
    }

    /// The kernel no longer uses `handle` (RELEASE), or its OPEN reply never reached the kernel.
    /// The node's last passthrough handle gives its backing id back.
    func released(handle: UInt64) {
        let close = state.withLock { state -> Int32? in
            guard let node = state.handles.removeValue(forKey: handle) else { return nil }
            state.replies[handle] = nil
            switch state.nodes[node] {
            case .kernel(let path, let backingID, let handles)?:
                if handles > 1 {
                    state.nodes[node] = .kernel(path: path, backingID: backingID, handles: handles - 1)
                    return nil
                }
                state.nodes[node] = nil
                return backingID
            case .daemon(let handles)?:
                state.nodes[node] = handles > 1 ? .daemon(handles: handles - 1) : nil
                return nil
            case nil:
                return nil
            }
        }
        if let close { closeBacking(close) }
    }

    /// Called after an OPEN reply was written: a passthrough decision that the writev hook did not
    /// apply would leave the kernel and this bookkeeping disagreeing, which is a bug worth a line.
    func replyWritten(handle: UInt64) {
        if state.withLock({ $0.replies.removeValue(forKey: handle) }) != nil {
            logger.error("passthrough: the OPEN reply of handle \(handle) was sent without passthrough (bug)")
        }
    }

    // MARK: Backing files

    /// Opens `path` read-only and registers it with the kernel; the kernel keeps its own reference,
    /// so the descriptor is closed at once. Returns the backing id.
    fileprivate static func registerBacking(
        _ path: String, device: Int32, simulatedFailure: Int32?
    ) -> Result<Int32, Errno> {
        guard device >= 0 else { return .failure(.badFileDescriptor) }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return .failure(.current) }
        defer { close(fd) }
        if let simulatedFailure { return .failure(Errno(simulatedFailure)) }
        // struct fuse_backing_map { int32_t fd; uint32_t flags; uint64_t padding; }
        var map: (Int32, UInt32, UInt64) = (fd, 0, 0)
        let id = withUnsafeMutableBytes(of: &map) { ioctl(device, FUSEKernelABI.backingOpen, $0.baseAddress!) }
        return id > 0 ? .success(id) : .failure(id < 0 ? .current : .invalidArgument)
    }

    /// Gives a backing id back to the kernel (the node's last passthrough handle is gone).
    fileprivate static func closeBacking(_ backingID: Int32, device: Int32) -> Errno? {
        var id = UInt32(bitPattern: backingID)
        return ioctl(device, FUSEKernelABI.backingClose, &id) != 0 ? .current : nil
    }

    private func closeBacking(_ backingID: Int32) {
        if let error = backing.close(backingID, deviceFD.load(ordering: .acquiring)) {
            logger.warning("passthrough: closing backing id \(backingID) failed: \(error)")
        }
    }

    /// Logs a failed registration once per errno. Failures that mean "never on this connection"
    /// (no privilege, not negotiated, not supported, stacked too deep) turn passthrough off.
    private func reportRegistrationFailure(_ error: Errno, path: String) {
        let general: String?
        switch error.rawValue {
        case EPERM:
            general = "the kernel refused to register a backing file (EPERM): the daemon needs CAP_SYS_ADMIN (root)"
        case ELOOP:
            general = "the cache directory is on a stacked file system (ELOOP): passthrough needs a plain one"
        case EOPNOTSUPP, ENOTTY, EINVAL:
            general = "the kernel does not support backing files here (\(error.name))"
        default:
            general = nil
        }
        let first = state.withLock { state -> Bool in
            if let general, state.availability == .active { state.availability = .unavailable(general) }
            return state.reported.insert(error.rawValue).inserted
        }
        guard first else { return }
        if let general {
            logger.info("passthrough: not used: \(general); reads go through the daemon")
        } else {
            logger.info("passthrough: cannot register \(path): \(error); this open goes through the daemon")
        }
    }
}
