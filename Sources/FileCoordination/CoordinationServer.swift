// The coordination server: an ArbiterHost behind a Unix socket. One thread runs a poll loop over
// the listening socket, every client connection and a wake-up eventfd; it alone reads and writes
// sockets, so a slow or silent client never blocks anyone else. Embeddable: the mount daemon runs
// one for paths under its mount and takes claims in-process on behalf of kernel callers.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A coordination server listening on a Unix socket (docs/COORDINATION-PROTOCOL.md).
package final class CoordinationServer: @unchecked Sendable {
    // Safe: `sessions`, `listenFD`, `lockFD` and `cleanupPaths` are touched only by the loop thread
    // after `start()` (or before it starts); cross-thread state is in Locked values.

    /// Where the server listens.
    package let socketPath: String
    /// The arbiter it serves.
    package let host: ArbiterHost
    /// Exit after being idle (no connection, no claim, no presenter) this long; nil: never.
    package let idleExit: Duration?
    /// A connection that has not said hello after this long is dropped.
    package let helloTimeout: Duration
    /// After a predecessor died holding claims, how long claims wait for its holders to reclaim
    /// theirs at most (D-402).
    package let grace: Duration
    /// Where the server lists the connections holding granted claims, for a successor to await
    /// after a crash (D-402): beside the socket, `.holders` instead of `.sock`.
    package var holdersPath: String {
        (socketPath.hasSuffix(".sock") ? String(socketPath.dropLast(5)) : socketPath) + ".holders"
    }

    struct Control {
        var running = false
        var stopRequested = false
        var finished = false
    }

    private let control = Locked(Control())
    /// What clients' write claims also take beyond the arbiter (D-451: a WebDAV mount's server
    /// locks); nil: the arbiter alone. Given at construction, as every port.
    let claimGate: (any ClaimGate)?
    private let finishedSignal = DispatchSemaphore(value: 0)
    private var listenFD: Int32 = -1
    /// Wakes the poll loop from other threads.
    private let wakePipe = WakePipe()
    private var sessions: [Int32: ClientSession] = [:]
    private let loopThread = Locked<pthread_t?>(nil)
    private var cleanupPaths: [String] = []
    private var lockFD: Int32 = -1
    private let logger: (@Sendable (String) -> Void)?
    /// Applied to every path and event text a dump shows (`providerfs claims`).
    private let redact: @Sendable (String) -> String
    /// Owns the claims taken for kernel callers. Created in init: a `lazy var` here raced when two
    /// mount threads made the first claims at once (TSan, CI).
    private let mountOwner: KernelClaimOwner
    /// The holders file, open for rewriting (loop thread).
    private var holdersFD: Int32 = -1
    /// Set when a session starts or stops holding granted claims: the holders file is rewritten
    /// before the next frame goes out, so no client holds a grant the file does not list.
    private let holdersDirty = Locked(false)
    /// The predecessor's holders still awaited in the grace period, with the process each must be
    /// (pid, start time) to still be alive (loop thread).
    private var predecessors: [ClaimHolder: (pid: Int32, start: UInt64)] = [:]
    private var lastLivenessCheck: UInt64 = 0
    /// The sessions (owners) the holders file lists now (loop thread).
    private var listedHolders: Set<UInt64> = []
    /// Since when the file lists a session that no longer holds anything (loop thread): dropped
    /// from the file after `holderLinger`, so a client claiming in a loop costs no write per claim.
    private var staleSince: UInt64?
    /// When the listed sessions were last compared with the holding ones (loop thread).
    private var lastHoldersCheck: UInt64 = 0
    /// How long a former holder stays listed (D-402).
    static let holderLinger: UInt64 = 100_000_000

    /// A server for `socketPath` over `host`. Nothing happens until `start()`.
    package init(
        socketPath: String, host: ArbiterHost = ArbiterHost(), idleExit: Duration? = nil,
        helloTimeout: Duration = .seconds(5), grace: Duration = CoordinationServer.defaultGrace(),
        log: (@Sendable (String) -> Void)? = nil, redactPaths: @escaping @Sendable (String) -> String = { $0 },
        claimGate: (any ClaimGate)? = nil
    ) {
        self.claimGate = claimGate
        self.grace = grace
        self.redact = redactPaths
        self.socketPath = socketPath
        self.host = host
        self.mountOwner = KernelClaimOwner(host: host)
        self.idleExit = idleExit
        self.helloTimeout = helloTimeout
        self.logger = log
    }

    deinit {
        if listenFD >= 0 { close(listenFD) }
        if holdersFD >= 0 { close(holdersFD) }
    }

    /// The grace period: `$PROVIDERFS_COORDINATOR_GRACE` (a duration), default 10 s (D-402).
    package static func defaultGrace(environment: [String: String]? = nil) -> Duration {
        let environment = environment ?? currentEnvironment()
        if let text = environment["PROVIDERFS_COORDINATOR_GRACE"], let value = try? parseDuration(text) {
            return value
        }
        return .seconds(10)
    }

    // MARK: Life cycle

    /// Binds the socket (replacing a stale one) and starts serving on a thread of its own.
    package func start() throws(CoordinationError) {
        let directory = String(socketPath[..<(socketPath.lastIndex(of: "/") ?? socketPath.endIndex)])
        if !directory.isEmpty {
            do { try makeDirectories(directory, mode: 0o700) } catch {
                throw CoordinationError(.serverUnavailable, "Cannot create \(directory): \(error.errno.message).")
            }
        }
        unlink(socketPath)
        takeOverHolders()
        do { listenFD = try UnixSocket.listen(socketPath) } catch {
            throw CoordinationError(.serverUnavailable, "Cannot listen on \(socketPath): \(error.errno.message).")
        }
        control.withLock { $0.running = true }
        let thread = Thread { [self] in
            loopThread.withLock { $0 = pthread_self() }
            loop()
        }
        thread.name = "providerfs.coordination-server"
        thread.start()
    }

    /// Stops serving: closes every connection (their claims and presenters go), removes the socket.
    package func stop() {
        let running = control.withLock { control -> Bool in
            control.stopRequested = true
            return control.running && !control.finished
        }
        guard running else { return }
        wake()
        waitUntilStopped()
    }

    /// Blocks until the server has stopped (by `stop()` or idle exit).
    package func waitUntilStopped() {
        guard control.withLock({ $0.running }) else { return }
        finishedSignal.wait()
        finishedSignal.signal()
    }

    private func wake() { wakePipe.wake() }

    private var onLoopThread: Bool {
        guard let loop = loopThread.withLock({ $0 }) else { return false }
        return pthread_equal(pthread_self(), loop) != 0
    }

    // MARK: Standalone server

    /// The socket of the standalone server: `RuntimeDirectory/coordinator.sock`.
    package static func standaloneSocketPath(environment: [String: String]? = nil) -> String {
        RuntimeDirectory.path(environment: environment ?? currentEnvironment()) + "/coordinator.sock"
    }

    /// The socket a mount's embedded server uses for `mountPoint`:
    /// `RuntimeDirectory/mounts/<16 hex digits of FNV-1a(canonical mount point)>.sock`.
    package static func socketPath(
        forMountPoint mountPoint: String, environment: [String: String]? = nil
    ) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in ItemResolver.lexicallyNormalized(mountPoint).utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return RuntimeDirectory.path(environment: environment ?? currentEnvironment()) + "/mounts/"
            + String(repeating: "0", count: 16 - hex.count) + hex + ".sock"
    }

    /// Starts the standalone server of this user (RuntimeDirectory), unless one is already
    /// running: the lock file `coordinator.lock` (flock) makes concurrent starts race-free, and only
    /// its holder binds the socket. Returns nil when another server holds the lock.
    package static func startStandalone(
        idleExit: Duration?, environment: [String: String]? = nil,
        log: (@Sendable (String) -> Void)? = nil
    ) throws(CoordinationError) -> CoordinationServer? {
        let environment = environment ?? currentEnvironment()
        let directory: String
        do { directory = try RuntimeDirectory.ensure(environment: environment) } catch {
            throw CoordinationError(.serverUnavailable, "Cannot create the runtime directory: \(error).")
        }
        let lockPath = directory + "/coordinator.lock"
        let lockFD = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lockFD >= 0 else {
            throw CoordinationError(.serverUnavailable, "Cannot open \(lockPath): \(Errno.current.message).")
        }
        // The lock holder is the server. If it answers, we are not needed: leave at once (many
        // clients may have started servers at the same time). If it does not answer yet, it is
        // starting or exiting on idle: retry briefly.
        let socketPath = standaloneSocketPath(environment: environment)
        var locked = false
        for _ in 0..<200 {
            if flock(lockFD, LOCK_EX | LOCK_NB) == 0 {
                locked = true
                break
            }
            if let probe = try? UnixSocket.connect(socketPath) {
                close(probe)
                break
            }
            usleep(10_000)
        }
        guard locked else {
            close(lockFD)
            return nil
        }
        let server = CoordinationServer(
            socketPath: socketPath, idleExit: idleExit, grace: defaultGrace(environment: environment), log: log)
        server.lockFD = lockFD
        let pidPath = directory + "/coordinator.pid"
        server.cleanupPaths = [socketPath, pidPath]
        do { try server.start() } catch {
            close(lockFD)
            throw error
        }
        let pidText = "\(getpid())\n"
        let fd = open(pidPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if fd >= 0 {
            _ = pidText.withCString { write(fd, $0, strlen($0)) }
            close(fd)
        }
        return server
    }

    // MARK: The loop

    private func log(_ text: String) { logger?(text) }

    private func loop() {
        var idleSince = monotonicNanoseconds()
        var fds: [pollfd] = []
        var order: [Int32] = []
        while !control.withLock({ $0.stopRequested }) {
            fds.removeAll(keepingCapacity: true)
            order.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakePipe.descriptor, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0))
            for (fd, session) in sessions {
                var events = Int16(POLLIN)
                if !session.unsent.isEmpty { events |= Int16(POLLOUT) }
                fds.append(pollfd(fd: fd, events: events, revents: 0))
                order.append(fd)
            }
            let now = monotonicNanoseconds()
            var timeout: Int32 = -1
            let helloNanos = helloTimeout.nanosecondCount
            for session in sessions.values where !session.greeted {
                let due = session.connectedAt &+ helloNanos
                timeout = min(
                    timeout < 0 ? .max : timeout, Int32(clamping: (due > now ? due - now : 0) / 1_000_000 + 1))
            }
            if let idleExit, sessions.isEmpty {
                let due = idleSince &+ idleExit.nanosecondCount
                timeout = min(
                    timeout < 0 ? .max : timeout, Int32(clamping: (due > now ? due - now : 0) / 1_000_000 + 1))
            }
            if !predecessors.isEmpty || !listedHolders.isEmpty {
                // Look at awaited holders' liveness; drop former holders from the file.
                timeout = min(timeout < 0 ? .max : timeout, 100)
            }
            let ready = poll(&fds, nfds_t(fds.count), timeout)
            if ready < 0 && errno != EINTR { break }
            if fds[0].revents != 0 { wakePipe.drain() }
            if fds[1].revents & Int16(POLLIN) != 0 { acceptAll() }
            for (index, fd) in order.enumerated() {
                guard let session = sessions[fd] else { continue }
                let revents = fds[index + 2].revents
                if revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { receive(session) }
            }
            let later = monotonicNanoseconds()
            for session in sessions.values where !session.greeted && later &- session.connectedAt >= helloNanos {
                log("dropping pid \(session.pid): no hello within \(helloTimeout)")
                drop(session, reason: "No hello within \(helloTimeout).")
            }
            if !predecessors.isEmpty { watchPredecessors(now: later) }
            flushAll()
            if !sessions.isEmpty || !host.isIdle {
                idleSince = later
            } else if let idleExit, later &- idleSince >= idleExit.nanosecondCount, predecessors.isEmpty {
                // (Never while awaiting a predecessor's holders: a clean exit would forget them.)
                acceptAll()  // a client that connected just now keeps the server alive
                if sessions.isEmpty {
                    log("idle for \(idleExit); exiting")
                    break
                }
            }
        }
        shutdown()
    }

    private func shutdown() {
        for session in Array(sessions.values) { drop(session, reason: nil) }
        for path in cleanupPaths { unlink(path) }
        if cleanupPaths.isEmpty { unlink(socketPath) }
        // A clean end: every connection was closed, nobody holds anything to reclaim.
        unlink(holdersPath)
        if holdersFD >= 0 {
            close(holdersFD)
            holdersFD = -1
        }
        close(listenFD)
        listenFD = -1
        if lockFD >= 0 {
            close(lockFD)
            lockFD = -1
        }
        control.withLock { $0.finished = true }
        finishedSignal.signal()
    }

    private func acceptAll() {
        UnixSocket.acceptPending(listenFD) { fd in
            let session = ClientSession(fd: fd, pid: UnixSocket.peerPid(fd), server: self)
            session.owner = host.addOwner(session)
            sessions[fd] = session
        }
    }

    /// Read buffer of the loop thread, reused for every read.
    private var receiveBuffer = [UInt8](repeating: 0, count: 64 * 1024)

    private func receive(_ session: ClientSession) {
        while true {
            let count = receiveBuffer.withUnsafeMutableBytes { read(session.fd, $0.baseAddress, $0.count) }
            if count > 0 {
                receiveBuffer.withUnsafeBytes { session.input.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
                do {
                    while let payload = try session.input.next() {
                        let message = try WireMessage.decode(payload)
                        guard handle(message, from: session) else { return }
                    }
                } catch {
                    log("dropping pid \(session.pid): \(error)")
                    drop(session, reason: "Protocol error: \(error)")
                    return
                }
                if count < receiveBuffer.count { return }
                continue
            }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            drop(session, reason: nil)  // EOF or error: the client is gone
            return
        }
    }

    /// Handles one message; false when the session was dropped.
    private func handle(_ message: WireMessage, from session: ClientSession) -> Bool {
        if !session.greeted {
            guard case .hello(let magic, let version) = message, magic == WireProtocol.magic else {
                drop(session, reason: "The first message must be hello.")
                return false
            }
            guard version == WireProtocol.version else {
                drop(
                    session,
                    reason: "Protocol version \(version) is not supported; this server speaks \(WireProtocol.version).")
                return false
            }
            session.greeted = true
            session.send(.welcome(version: WireProtocol.version, serverPid: getpid(), owner: session.owner))
            return true
        }
        let owner = session.owner
        switch message {
        case .submit(let local, let purpose, let waitTimeout, let presenterTimeout, let held, let intents):
            let now = host.now
            if claimGate != nil {
                session.noteSubmitted(
                    local, writing: intents.filter { $0.kind == .write }.map(\.path),
                    deadline: now &+ min(waitTimeout, UInt64(Int64.max) / 2))
            }
            host.submit(
                ClaimRequest(
                    id: ClaimID(owner: owner, local: local), pid: session.claimPid, purpose: purpose,
                    intents: intents,
                    heldByCaller: held.map { ClaimID(owner: owner, local: $0) },
                    waitDeadline: now &+ min(waitTimeout, UInt64(Int64.max) / 2),
                    presenterTimeout: min(presenterTimeout, UInt64(Int64.max) / 2)))
        case .release(let local):
            session.ended(local)
            host.release(ClaimID(owner: owner, local: local))
        case .reclaim(let server, let previousOwner, let claims):
            host.reclaim(
                claims.map {
                    ClaimRequest(
                        id: ClaimID(owner: owner, local: $0.local), pid: session.claimPid, purpose: $0.purpose,
                        intents: $0.intents, waitDeadline: 0,
                        presenterTimeout: min($0.presenterTimeout, UInt64(Int64.max) / 2))
                }, from: ClaimHolder(server: server, owner: previousOwner))
        case .holdFor(let pid, let startTime):
            // Only a live process is named (pid and start time, so not a later process that
            // reuses a dead one's pid): CMD that has already exited keeps the client's pid.
            guard pid > 0, ProcessInfoFiles.startTime(of: pid) == startTime else {
                log("pid \(session.pid): holdFor \(pid) ignored: no such process (started at \(startTime))")
                return true
            }
            session.claimPid = pid
            host.holdFor(owner, pid: pid)
        case .cancel(let local): host.cancel(ClaimID(owner: owner, local: local))
        case .addPresenter(
            let local, let purpose, let path, let identity, let isDirectory, let packageRoot, let methods):
            host.addPresenter(
                PresenterRegistration(
                    id: PresenterID(owner: owner, local: local), pid: session.pid, purpose: purpose, path: path,
                    identity: identity, isDirectory: isDirectory, packageRoot: packageRoot,
                    methods: PresenterMethods(rawValue: methods)))
        case .removePresenter(let local): host.removePresenter(PresenterID(owner: owner, local: local))
        case .reply(let messageID, let error): host.reply(messageID: messageID, error: error, from: owner)
        case .itemMoved(let from, let to, let purpose): host.itemMoved(from: from, to: to, purpose: purpose)
        case .versionChanged(let path, let change, let version, let versionName):
            if let change = VersionChange(rawValue: change) {
                host.versionChanged(path: path, change: change, version: version, versionName: versionName)
            }
        case .dumpRequest(let requestID):
            session.send(.dump(requestID: requestID, json: CoordinationDump.make(host: host, redact: redact).json()))
        case .hello, .welcome, .granted, .failed, .deliver, .dump, .fatal:
            drop(session, reason: "Unexpected message from a client.")
            return false
        }
        return true
    }

    private func drop(_ session: ClientSession, reason: String?) {
        guard sessions.removeValue(forKey: session.fd) != nil else { return }
        if let reason {
            // Best effort: tell the client why, without waiting for it.
            let frame = WireMessage.fatal(code: CoordinationError.Code.protocolError.rawValue, message: reason).frame()
            _ = frame.withUnsafeBytes { send(session.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        }
        close(session.fd)
        session.closed = true
        host.removeOwner(session.owner)
        session.releaseGates()
    }

    // MARK: Holders and the grace period (D-402)

    func holdersChanged() { holdersDirty.withLock { $0 = true } }

    /// At start: reads the holders a dead predecessor listed, awaits those still alive in a grace
    /// period, and keeps listing them until they reclaim (a successor of this server, should it
    /// die too, awaits them as well).
    private func takeOverHolders() {
        if let text = try? String(contentsOfFile: holdersPath, encoding: .utf8) {
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ")
                guard fields.count == 4, let server = Int32(fields[0]), let owner = UInt64(fields[1]),
                    let pid = Int32(fields[2]), let start = UInt64(fields[3])
                else { continue }
                guard ProcessInfoFiles.startTime(of: pid) == start else { continue }  // gone: nothing to await
                predecessors[ClaimHolder(server: server, owner: owner)] = (pid, start)
            }
        }
        holdersFD = open(holdersPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if !predecessors.isEmpty {
            log("the previous server died holding claims: awaiting \(predecessors.count) holder(s) for up to \(grace)")
            host.beginGrace(awaiting: Set(predecessors.keys), for: grace.nanosecondCount)
        }
        writeHolders()
    }

    /// Forgets awaited holders that reclaimed (the arbiter no longer awaits them) or whose process
    /// is gone (the arbiter is told); at most every 100 ms.
    private func watchPredecessors(now: UInt64) {
        guard now &- lastLivenessCheck >= 100_000_000 else { return }
        lastLivenessCheck = now
        let awaited = host.awaitedHolders
        var gone: Set<ClaimHolder> = []
        var changed = false
        for (holder, process) in predecessors {
            if !awaited.contains(holder) {
                predecessors[holder] = nil
                changed = true
            } else if ProcessInfoFiles.startTime(of: process.pid) != process.start {
                gone.insert(holder)
                predecessors[holder] = nil
                changed = true
            }
        }
        if changed { writeHolders() }
        if !gone.isEmpty { host.holdersGone(gone) }
    }

    /// Writes the holders file when a session holds claims the file does not list yet (at once:
    /// its grant leaves after this), or when a listed one has held nothing for `holderLinger`.
    private func updateHolders() {
        var current: Set<UInt64> = []
        for session in sessions.values where session.holdsClaims { current.insert(session.owner) }
        let now = monotonicNanoseconds()
        lastHoldersCheck = now
        if !current.isSubset(of: listedHolders) {
            writeHolders()
        } else if current != listedHolders {
            if let since = staleSince, now &- since >= Self.holderLinger {
                writeHolders()
            } else if staleSince == nil {
                staleSince = now
            }
        } else {
            staleSince = nil
        }
    }

    /// Rewrites the holders file: this server's connections that hold granted claims, then the
    /// predecessor's holders still awaited. One line each: server pid, owner, holder pid, holder
    /// start time.
    private func writeHolders() {
        guard holdersFD >= 0 else { return }
        let me = getpid()
        var text = ""
        listedHolders = []
        staleSince = nil
        for session in sessions.values where session.markListed() {
            guard let start = session.startTime else { continue }
            listedHolders.insert(session.owner)
            text += "\(me) \(session.owner) \(session.pid) \(start)\n"
        }
        for (holder, process) in predecessors {
            text += "\(holder.server) \(holder.owner) \(process.pid) \(process.start)\n"
        }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { pwrite(holdersFD, $0.baseAddress, $0.count, 0) }
        if written != bytes.count { log("cannot write \(holdersPath): \(Errno.current.message)") }
        _ = ftruncate(holdersFD, off_t(bytes.count))
    }

    private func flushAll() {
        // Frames first taken, then the holders file written, then frames sent: a grant taken
        // here was recorded in its session before it was queued, so the file lists its holder.
        for session in sessions.values { session.takeOutbox() }
        let dirty = holdersDirty.withLock { dirty in
            defer { dirty = false }
            return dirty
        }
        if dirty || (!listedHolders.isEmpty && monotonicNanoseconds() &- lastHoldersCheck >= Self.holderLinger) {
            updateHolders()
        }
        for session in Array(sessions.values) {
            guard !session.unsent.isEmpty else { continue }
            let written = session.unsent.withUnsafeBytes {
                send(session.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if written > 0 {
                session.unsent.removeFirst(written)
            } else if written < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                drop(session, reason: nil)
            }
        }
    }

    func sessionHasOutput() {
        if !onLoopThread { wake() }
    }

    // MARK: Claims on behalf of kernel callers (the mount)

    /// Takes a claim for a process that reached the file through the mount. Granted claims held by
    /// that process or one of its ancestors do not block it: the coordinator never coordinates with
    /// itself (e.g. `providerfs coordinate --write F -- CMD`: CMD's own writes to F go through).
    /// `path` is the absolute path in the mount; it is only normalised lexically — this call makes
    /// no file-system access, because the mount daemon must never call into its own mount. Pass
    /// what the mount knows: `identity` (st_dev of the mount, the inode it reports), whether it is
    /// a directory, and the enclosing package if any. `completion` runs once, on any thread.
    package func claim(
        _ path: String, kind: AccessKind, readingOptions: ReadingOptions = [], writingOptions: WritingOptions = [],
        identity: ItemIdentity? = nil, isDirectory: Bool = false, packageRoot: String? = nil,
        onBehalfOf pid: Int32, deadline: Duration,
        completion: @escaping @Sendable (Result<KernelClaim, CoordinationError>) -> Void
    ) {
        do {
            let intent = try Self.kernelIntent(
                path, kind: kind, readingOptions: readingOptions, writingOptions: writingOptions, identity: identity,
                isDirectory: isDirectory, packageRoot: packageRoot)
            mountOwner.submit(
                intent, pid: pid, ancestry: { processAncestry(of: pid) }, deadline: deadline.nanosecondCount,
                completion: completion)
        } catch {
            completion(.failure(error))
        }
    }

    /// `claim(_:kind:…)` when it can be granted at once (nothing conflicting held or waiting, no
    /// presenter to ask); nil otherwise, with nothing changed: then take it with `claim`, which
    /// waits. For callers that must not wait (a FUSE thread, D-229).
    package func claimNow(
        _ path: String, kind: AccessKind, readingOptions: ReadingOptions = [], writingOptions: WritingOptions = [],
        identity: ItemIdentity? = nil, isDirectory: Bool = false, packageRoot: String? = nil,
        onBehalfOf pid: Int32
    ) -> KernelClaim? {
        guard
            let intent = try? Self.kernelIntent(
                path, kind: kind, readingOptions: readingOptions, writingOptions: writingOptions, identity: identity,
                isDirectory: isDirectory, packageRoot: packageRoot)
        else { return nil }
        return mountOwner.claimNow(intent, pid: pid, ancestry: { processAncestry(of: pid) })
    }

    /// The intent of a kernel caller's claim on `path`, normalised lexically only (no file-system
    /// access: the daemon must never call into its own mount).
    private static func kernelIntent(
        _ path: String, kind: AccessKind, readingOptions: ReadingOptions, writingOptions: WritingOptions,
        identity: ItemIdentity?, isDirectory: Bool, packageRoot: String?
    ) throws(CoordinationError) -> ClaimIntent {
        ClaimIntent(
            kind: kind, path: ItemResolver.lexicallyNormalized(try ItemResolver.validatedPath(path)),
            readingOptions: readingOptions, writingOptions: writingOptions, identity: identity,
            isDirectory: isDirectory, packageRoot: packageRoot)
    }

    /// Async form of `claim(_:kind:…:completion:)`. Cancelling the task withdraws a claim that
    /// still waits (for conflicting claims or presenters' answers): it throws `.cancelled` at once
    /// (an interrupted FUSE request, D-400). A claim granted before the cancellation is returned.
    package func claim(
        _ path: String, kind: AccessKind, readingOptions: ReadingOptions = [], writingOptions: WritingOptions = [],
        identity: ItemIdentity? = nil, isDirectory: Bool = false, packageRoot: String? = nil,
        onBehalfOf pid: Int32, deadline: Duration
    ) async throws(CoordinationError) -> KernelClaim {
        if Task.isCancelled { throw CoordinationError(.cancelled, "The coordination was cancelled.") }
        let intent = try Self.kernelIntent(
            path, kind: kind, readingOptions: readingOptions, writingOptions: writingOptions, identity: identity,
            isDirectory: isDirectory, packageRoot: packageRoot)
        // The result is handed over under a lock, not through the continuation: ThreadSanitizer
        // sees no happens-before from a resume on the server thread to a task resumed on a
        // custom executor, and reported the claim's fields as raced (see BlockingIOPool.run).
        // `local` is the claim's number once submitted, for the cancellation handler.
        let box = Locked<(result: Result<KernelClaim, CoordinationError>?, local: UInt64?)>((nil, nil))
        let owner = mountOwner
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let local = owner.submit(
                    intent, pid: pid, ancestry: { processAncestry(of: pid) }, deadline: deadline.nanosecondCount
                ) { result in
                    box.withLock { $0.result = result }
                    continuation.resume()
                }
                box.withLock { $0.local = local }
                // Cancelled before `local` was known to the handler: withdrawn here.
                if Task.isCancelled { owner.cancel(local) }
            }
        } onCancel: {
            if let local = box.withLock({ $0.local }) { owner.cancel(local) }
        }
        return try box.withLock { $0.result! }.get()
    }
}
