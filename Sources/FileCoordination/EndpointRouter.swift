// The client side of the protocol: a connection to a server (`ServerLink`), the routing of paths
// to servers (a `fuse.providerfs` mount's embedded server, or the standalone one), and starting
// the standalone server on demand.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One connection to a coordination server. Sends happen on the caller's thread. Reading is done
/// by whoever holds the read token: a thread blocked in a synchronous `coordinate` reads its own
/// grant (saving a thread wake-up on every claim), and a background thread reads while something
/// needs messages that nobody waits for on a thread (presenters, async claims) — the "demand".
final class ServerLink: CoordinationEndpoint, @unchecked Sendable {
    // Safe: `fd`, `serverPid`, `owner`, `socketPath` are immutable after init (and
    // `servesProviderMount` is set before the router shares the link); `sendLock` serialises
    // writes of whole frames (held across exactly one send, nothing else is locked inside);
    // `buffer` and `chunk` are only touched by the holder of the read token (`readState.reading`).
    let fd: Int32
    let socketPath: String
    let serverPid: Int32
    let owner: UInt64
    /// Set for the server of a ProviderFS mount (rules 50–52), once, before the link is shared.
    fileprivate(set) var servesProviderMount = false
    weak var delegate: DelegateBox?
    private let sendLock = Lock()

    struct ReadState {
        var reading = false
        var demand = 0
        var dead = false
        var closed = false
    }

    private let readState = Locked(ReadState())
    private let backgroundWake = DispatchSemaphore(value: 0)
    private var buffer: FrameBuffer
    private var chunk = [UInt8](repeating: 0, count: 64 * 1024)

    var isDead: Bool { readState.withLock { $0.dead } }

    private init(fd: Int32, socketPath: String, serverPid: Int32, owner: UInt64, buffer: FrameBuffer) {
        self.fd = fd
        self.socketPath = socketPath
        self.serverPid = serverPid
        self.owner = owner
        self.buffer = buffer
    }

    /// Connects and says hello; throws `ECONNREFUSED`/`ENOENT`-shaped errors as SystemCallError so
    /// the caller can decide to start a server.
    static func connect(socketPath: String, delegate: DelegateBox?) throws -> ServerLink {
        let fd = try UnixSocket.connect(socketPath)
        do {
            var buffer = FrameBuffer()
            let (pid, owner) = try handshake(fd: fd, buffer: &buffer)
            var timeout = timeval(tv_sec: 0, tv_usec: readSliceMilliseconds * 1000)
            guard setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0 else {
                throw SystemCallError("setsockopt(SO_RCVTIMEO)")
            }
            let link = ServerLink(fd: fd, socketPath: socketPath, serverPid: pid, owner: owner, buffer: buffer)
            link.delegate = delegate
            let thread = Thread { [link] in link.backgroundLoop() }
            thread.name = "providerfs.coordination-client"
            thread.start()
            return link
        } catch {
            close(fd)
            throw error
        }
    }

    /// Sends hello and waits (at most 5 s) for welcome.
    static func handshake(fd: Int32, buffer: inout FrameBuffer) throws -> (Int32, UInt64) {
        try UnixSocket.writeAll(fd, WireMessage.hello(magic: WireProtocol.magic, version: WireProtocol.version).frame())
        let message = try readMessage(fd: fd, buffer: &buffer, timeoutMilliseconds: 5000)
        switch message {
        case .welcome(let version, let pid, let owner) where version == WireProtocol.version: return (pid, owner)
        case .fatal(_, let text): throw CoordinationError(.protocolError, "The coordination server refused: \(text)")
        default: throw CoordinationError(.protocolError, "The coordination server answered hello with \(message).")
        }
    }

    /// Reads one message, waiting at most `timeoutMilliseconds` for each chunk.
    static func readMessage(fd: Int32, buffer: inout FrameBuffer, timeoutMilliseconds: Int32) throws -> WireMessage {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            if let payload = try buffer.next() { return try WireMessage.decode(payload) }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, timeoutMilliseconds)
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else {
                throw CoordinationError(.serverUnavailable, "The coordination server did not answer.")
            }
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                throw CoordinationError(.connectionLost, "The coordination server closed the connection.")
            }
            chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        }
    }

    private func send(_ message: WireMessage) {
        let frame = message.frame()
        let ok = sendLock.withLock { () -> Bool in
            do {
                try UnixSocket.writeAll(fd, frame)
                return true
            } catch {
                return false
            }
        }
        if !ok { markDead() }
    }

    // MARK: Reading

    private func tryTakeToken() -> Bool {
        readState.withLock { state in
            guard !state.reading, !state.dead else { return false }
            state.reading = true
            return true
        }
    }

    private func releaseToken() {
        let wakeBackground = readState.withLock { state -> Bool in
            state.reading = false
            return state.demand > 0 || state.dead
        }
        if wakeBackground { backgroundWake.signal() }
    }

    /// How long one blocking read waits (SO_RCVTIMEO) before its reader looks at its state again.
    static let readSliceMilliseconds = 50

    /// Waits up to `readSliceMilliseconds` for data, reads it and dispatches every complete
    /// message. Returns false when the connection is gone. Only the token holder calls it. A
    /// blocking read with a receive timeout, not poll + read: one system call per grant (D-113).
    private func readOnce() -> Bool {
        let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) { return true }
        guard count > 0 else { return false }
        chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        do {
            while let payload = try buffer.next() { dispatch(try WireMessage.decode(payload)) }
        } catch {
            return false
        }
        return true
    }

    /// Whether the server closed the connection (checked without reading, for a link nobody reads).
    func peerHungUp() -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&pfd, 1, 0) > 0 && pfd.revents & Int16(POLLHUP | POLLERR) != 0
    }

    /// The connection is gone (or no longer wanted): waiting claims fail, presenters move to a new
    /// server, the background thread closes the socket.
    func markDead() {
        let first = readState.withLock { state -> Bool in
            defer { state.dead = true }
            return !state.dead
        }
        guard first else { return }
        shutdown(fd, Int32(SHUT_RDWR))
        backgroundWake.signal()
        delegate?.endpointLost(self)
    }

    /// Reads while there is demand and nobody else reads; closes the socket once the link is dead.
    private func backgroundLoop() {
        while true {
            let (read, dead) = readState.withLock { state -> (Bool, Bool) in
                if state.dead { return (false, true) }
                guard state.demand > 0, !state.reading else { return (false, false) }
                state.reading = true
                return (true, false)
            }
            if dead { break }
            if !read {
                _ = backgroundWake.wait(timeout: .now() + .milliseconds(500))
                continue
            }
            var alive = true
            while alive && readState.withLock({ $0.demand > 0 && !$0.dead }) {
                alive = readOnce()
            }
            releaseToken()
            if !alive { markDead() }
        }
        // Nobody reads any more; wait for a synchronous reader to leave before closing.
        while !readState.withLock({ state -> Bool in
            if state.reading { return false }
            state.reading = true
            return true
        }) { usleep(1000) }
        sendLock.withLock { _ = close(fd) }
    }

    func changeReaderDemand(by delta: Int) {
        let wake = readState.withLock { state -> Bool in
            state.demand += delta
            return delta > 0 && !state.reading
        }
        if wake { backgroundWake.signal() }
    }

    func wait(for waiter: Waiter) -> Result<[String], CoordinationError> {
        while true {
            if let result = waiter.peek() { return result }
            if isDead {
                return waiter.wait(milliseconds: 1000)
                    ?? .failure(
                        CoordinationError(.connectionLost, "The connection to the coordination server was lost."))
            }
            if tryTakeToken() {
                var alive = true
                while alive && waiter.peek() == nil { alive = readOnce() }
                releaseToken()
                if !alive { markDead() }
                continue
            }
            // Someone else reads (and dispatches our answer too), or will hand the token back.
            _ = waiter.wait(milliseconds: 5)
        }
    }

    private func dispatch(_ message: WireMessage) {
        switch message {
        case .granted(let local, let paths): delegate?.granted(local: local, paths: paths)
        case .failed(let local, let code, let text):
            delegate?.failed(
                local: local, error: CoordinationError(CoordinationError.Code(rawValue: code) ?? .protocolError, text))
        case .deliver(let presenter, let messageID, let body, let claim):
            delegate?.deliver(presenter: presenter, messageID: messageID, message: body, claim: claim)
        default:
            break  // fatal: the server closes next; others are not sent to clients
        }
    }

    func submit(
        local: UInt64, purpose: String, intents: [ClaimIntent], heldByCaller: [UInt64], waitTimeout: UInt64,
        presenterTimeout: UInt64
    ) {
        send(
            .submit(
                local: local, purpose: purpose, waitTimeout: waitTimeout, presenterTimeout: presenterTimeout,
                held: heldByCaller, intents: intents))
    }
    func release(local: UInt64) { send(.release(local: local)) }
    func cancel(local: UInt64) { send(.cancel(local: local)) }
    func addPresenter(local: UInt64, purpose: String, item: ResolvedItem, methods: PresenterMethods) {
        changeReaderDemand(by: 1)
        send(
            .addPresenter(
                local: local, purpose: purpose, path: item.path, identity: item.identity, isDirectory: item.isDirectory,
                packageRoot: item.packageRoot, methods: methods.rawValue))
    }
    func removePresenter(local: UInt64) {
        send(.removePresenter(local: local))
        changeReaderDemand(by: -1)
    }
    func reply(messageID: UInt64, error: String?) { send(.reply(messageID: messageID, error: error)) }
    func itemMoved(from: String, to: String, purpose: String) {
        send(.itemMoved(from: from, to: to, purpose: purpose))
    }
    func versionChanged(path: String, change: VersionChange, version: String, versionName: String) {
        send(.versionChanged(path: path, change: change.rawValue, version: version, versionName: versionName))
    }
}

/// Routes paths to servers and keeps one connection per server.
final class EndpointRouter: @unchecked Sendable {
    // Safe: `delegate` is set once right after creation, before any use; `links` is a Locked.
    weak var delegate: DelegateBox?
    private let links = Locked<[String: ServerLink]>([:])
    private let mounts = MountTable()
    /// The environment is read once: building it is costlier than a whole claim round trip.
    private let environment = currentEnvironment()
    private let standaloneSocket: String

    init() {
        standaloneSocket = CoordinationServer.standaloneSocketPath(environment: environment)
    }

    func endpoint(for path: String) throws(CoordinationError) -> any CoordinationEndpoint {
        // Fast path (D-112): route with the mount table as last read, then one poll checks both
        // that the table did not change since and that the chosen link's server is still there.
        if let known = mounts.knownProviderMount(containing: path) {
            let socket =
                known.mount.map { CoordinationServer.socketPath(forMountPoint: $0, environment: environment) }
                ?? standaloneSocket
            if let link = links.withLock({ $0[socket] }), !link.isDead {
                let (tableChanged, hungUp) = mounts.pollChanges(since: known.generation, alongWith: link.fd)
                if !tableChanged && !hungUp { return link }
                if hungUp { link.markDead() }
            }
        }
        let mountPoint = mounts.providerMount(containing: path)
        let socket =
            mountPoint.map { CoordinationServer.socketPath(forMountPoint: $0, environment: environment) }
            ?? standaloneSocket
        if let link = links.withLock({ $0[socket] }), !link.isDead {
            // A link nobody reads does not see the server go away; check before using it.
            if !link.peerHungUp() { return link }
            link.markDead()
        }
        // Connect without holding the lock (it may take a server start); keep one link per socket.
        let link: ServerLink
        if let mountPoint {
            do {
                link = try ServerLink.connect(socketPath: socket, delegate: delegate)
                link.servesProviderMount = true
            } catch {
                throw CoordinationError(
                    .serverUnavailable,
                    "The coordination server of the mount at \(mountPoint) is not reachable: \(error).")
            }
        } else {
            link = try ServerLauncher.connectOrStart(socketPath: socket, delegate: delegate)
        }
        return links.withLock { links -> ServerLink in
            if let existing = links[socket], !existing.isDead, existing !== link {
                link.markDead()  // another thread connected first; keep one link
                return existing
            }
            links[socket] = link
            return link
        }
    }
}

/// Finds and starts the standalone server (decision D-108).
public enum ServerLauncher {
    /// How long a client waits for a server it started.
    static let startTimeout: UInt64 = 10_000_000_000

    /// Connects to the standalone server, starting it when no server answers.
    static func connectOrStart(socketPath: String, delegate: DelegateBox?) throws(CoordinationError) -> ServerLink {
        let deadline = monotonicNanoseconds() + startTimeout
        var started = false
        var pause: UInt32 = 1000
        var lastError = ""
        while true {
            do {
                return try ServerLink.connect(socketPath: socketPath, delegate: delegate)
            } catch let error as SystemCallError where [ENOENT, ECONNREFUSED].contains(error.errno.rawValue) {
                lastError = error.description
                if !started {
                    try start()
                    started = true
                }
            } catch let error as CoordinationError where error.code == .connectionLost {
                // The server was exiting on idle while we connected: start another.
                lastError = error.description
                started = false
            } catch {
                throw CoordinationError(.serverUnavailable, "Cannot reach the coordination server: \(error).")
            }
            guard monotonicNanoseconds() < deadline else {
                throw CoordinationError(
                    .serverUnavailable, "The coordination server at \(socketPath) did not start (\(lastError)).")
            }
            usleep(pause)
            pause = min(pause * 2, 50_000)
        }
    }

    /// The executable run as `EXE coordinator --idle-exit D`: `$PROVIDERFS_COORDINATOR`; else this
    /// process's own executable when it is `providerfs`; else `providerfs` beside it; else the first
    /// `providerfs` on PATH.
    public static func serverExecutable(environment: [String: String]? = nil) -> String? {
        let environment = environment ?? currentEnvironment()
        if let explicit = environment["PROVIDERFS_COORDINATOR"], !explicit.isEmpty { return explicit }
        let own = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
        if own.hasSuffix("/providerfs") { return own }
        if let slash = own.lastIndex(of: "/") {
            let sibling = String(own[..<slash]) + "/providerfs"
            if access(sibling, X_OK) == 0 { return sibling }
        }
        for directory in (environment["PATH"] ?? "").split(separator: ":") {
            let candidate = String(directory) + "/providerfs"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    /// Idle time after which an on-demand server exits: `$PROVIDERFS_COORDINATOR_IDLE`, default 30s.
    static func idleExit(environment: [String: String]) -> String {
        if let text = environment["PROVIDERFS_COORDINATOR_IDLE"], (try? parseDuration(text)) != nil { return text }
        return "30s"
    }

    /// Starts the server detached: own session, stdin/stdout/stderr on /dev/null, no inherited
    /// descriptors (it must never hold a caller's pipe open), reaped by a background thread.
    static func start() throws(CoordinationError) {
        let environment = currentEnvironment()
        guard let executable = serverExecutable(environment: environment) else {
            throw CoordinationError(
                .serverUnavailable,
                "No coordination server is running and no providerfs executable was found to start one; "
                    + "set PROVIDERFS_COORDINATOR to the providerfs binary.")
        }
        let arguments = [executable, "coordinator", "--idle-exit", idleExit(environment: environment)]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        // glibc 2.34+ has posix_spawn_file_actions_addclosefrom_np, but the Glibc module does not
        // declare it (_GNU_SOURCE): look it up.
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") {
            _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
        }
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let rc = withCleanSpawnAttributes(newSession: true) {
            posix_spawn(&pid, executable, &actions, $0, &argv, environ)
        }
        guard rc == 0 else {
            throw CoordinationError(
                .serverUnavailable, "Cannot start the coordination server \(executable): \(Errno(rc).message).")
        }
        let child = pid
        Thread.detachNewThread {
            var status: Int32 = 0
            while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        }
    }
}

/// The `fuse.providerfs` mounts of this process's mount namespace, re-read only when the kernel
/// says the table changed (poll on /proc/self/mountinfo reports POLLPRI/POLLERR).
final class MountTable: @unchecked Sendable {
    // Safe: `fd` is immutable; `table` is a Locked.
    private let fd: Int32
    /// The ProviderFS mount points as last read (nil: never read or dropped), and a counter
    /// bumped whenever they are re-read or dropped.
    private let table = Locked<(points: [String]?, generation: UInt64)>((nil, 0))

    init() {
        fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
    }

    deinit { if fd >= 0 { close(fd) } }

    /// The deepest ProviderFS mount point containing `path`, if any. The poll and the reload
    /// happen under the lock: a change one thread's poll consumed is never missed by another.
    func providerMount(containing path: String) -> String? {
        guard fd >= 0 else { return nil }
        let points = table.withLock { table -> [String] in
            if let points = table.points, !Self.changed(pollfd(fd: fd, events: Int16(POLLPRI), revents: 0)) {
                return points
            }
            let points = reload()
            table.points = points
            table.generation &+= 1
            return points
        }
        return Self.deepest(containing: path, in: points)
    }

    /// The routing by the table as last read, without checking it for changes: nil when the
    /// table was never read, else the mount (nil: none contains `path`) and the table's
    /// generation. Only valid together with a later `pollChanges` that reports no change.
    func knownProviderMount(containing path: String) -> (mount: String?, generation: UInt64)? {
        guard fd >= 0,
            let (points, generation) = table.withLock({ table in table.points.map { ($0, table.generation) } })
        else { return nil }
        return (Self.deepest(containing: path, in: points), generation)
    }

    /// One poll: whether the mount table changed since `generation` was current (a change seen
    /// here drops the table: the next `providerMount` reads it again), and whether the peer of
    /// the socket `linkFD` hung up.
    func pollChanges(since generation: UInt64, alongWith linkFD: Int32) -> (tableChanged: Bool, hungUp: Bool) {
        table.withLock { table in
            var fds = (
                pollfd(fd: fd, events: Int16(POLLPRI), revents: 0),
                pollfd(fd: linkFD, events: Int16(POLLIN), revents: 0)
            )
            let ready = withUnsafeMutablePointer(to: &fds) {
                $0.withMemoryRebound(to: pollfd.self, capacity: 2) { poll($0, 2, 0) }
            }
            if ready > 0 && fds.0.revents & Int16(POLLPRI | POLLERR) != 0 {
                table.points = nil
                table.generation &+= 1
            }
            let hungUp = ready > 0 && fds.1.revents & Int16(POLLHUP | POLLERR) != 0
            return (table.generation != generation, hungUp)
        }
    }

    private static func changed(_ descriptor: pollfd) -> Bool {
        var pfd = descriptor
        return poll(&pfd, 1, 0) > 0 && pfd.revents & Int16(POLLPRI | POLLERR) != 0
    }

    private static func deepest(containing path: String, in points: [String]) -> String? {
        var best: String?
        for point in points where path == point || Arbiter.isAncestor(point, of: path) {
            if best == nil || point.utf8.count > best!.utf8.count { best = point }
        }
        return best
    }

    private func reload() -> [String] {
        lseek(fd, 0, SEEK_SET)
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            data += chunk[0..<count]
        }
        return MountTable.parse(String(decoding: data, as: UTF8.self))
    }

    /// Mount points whose file-system type is `fuse.providerfs`, from mountinfo text.
    static func parse(_ text: String) -> [String] {
        var result: [String] = []
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard let dash = fields.firstIndex(of: "-"), dash + 1 < fields.count, fields.count > 4 else { continue }
            guard fields[dash + 1] == "fuse.providerfs" else { continue }
            result.append(unescape(fields[4]))
        }
        return result
    }

    /// Undoes mountinfo's octal escapes (`\040` for a space).
    static func unescape(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        let utf8 = Array(field.utf8)
        var index = 0
        while index < utf8.count {
            if utf8[index] == UInt8(ascii: "\\"), index + 3 < utf8.count,
                let value = UInt8(String(decoding: utf8[(index + 1)...(index + 3)], as: UTF8.self), radix: 8)
            {
                bytes.append(value)
                index += 4
            } else {
                bytes.append(utf8[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

extension CoordinationServer {
    /// The mount points of `fuse.providerfs` file systems in mountinfo text (as in
    /// /proc/self/mountinfo): paths under them are routed to that mount's embedded server.
    public static func providerMountPoints(mountInfo: String) -> [String] { MountTable.parse(mountInfo) }
}

/// Talking to a server without a domain: the claim dump for `providerfs claims`.
public enum CoordinationClient {
    /// The dump of the server at `socketPath`; nil when no server is running there (none is started).
    public static func dump(
        socketPath: String = CoordinationServer.standaloneSocketPath()
    ) throws
        -> CoordinationDump?
    {
        let connected: Result<Int32, SystemCallError> = Result { () throws(SystemCallError) in
            try UnixSocket.connect(socketPath)
        }
        let fd: Int32
        switch connected {
        case .success(let value): fd = value
        case .failure(let error):
            if [ENOENT, ECONNREFUSED].contains(error.errno.rawValue) { return nil }
            throw error
        }
        defer { close(fd) }
        var buffer = FrameBuffer()
        _ = try ServerLink.handshake(fd: fd, buffer: &buffer)
        try UnixSocket.writeAll(fd, WireMessage.dumpRequest(requestID: 1).frame())
        while true {
            let message = try ServerLink.readMessage(fd: fd, buffer: &buffer, timeoutMilliseconds: 5000)
            if case .dump(_, let json) = message { return try CoordinationDump.decode(json) }
        }
    }
}
