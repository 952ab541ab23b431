// The client side of the protocol: one connection to a coordination server.

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
    var servesProviderMount = false
    weak var delegate: DelegateBox?
    private let sendLock = Lock()

    struct ReadState {
        var reading = false
        var demand = 0
        var dead = false
        var closed = false
    }

    private let readState = Locked(ReadState())
    /// `confirmReceived`'s round trips on their way: a dump request's id, and who waits for its
    /// answer.
    private let confirmations = Locked<(next: UInt64, waiting: [UInt64: Waiter])>((1, [:]))
    /// Wakes the background thread; while idle it also watches the socket for the server's end.
    private let backgroundWake = WakePipe()
    private var buffer: FrameBuffer
    private var chunk = [UInt8](repeating: 0, count: 64 * 1024)

    var isDead: Bool { readState.withLock { $0.dead } }
    var isLost: Bool { isDead }
    var address: String? { socketPath }

    /// The socket: the server releases this connection's claims when its last copy is closed.
    var claimDescriptor: Int32? { isDead ? nil : fd }

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
        if wakeBackground { backgroundWake.wake() }
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
        backgroundWake.wake()
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
                // Idle: sleep until woken, or until the server closes the connection — noticed at
                // once, so claims held inside accessors are reclaimed from a new server (D-402).
                // Events 0 on the socket: only a hang-up or error is reported, not unread data.
                var fds = [
                    pollfd(fd: backgroundWake.descriptor, events: Int16(POLLIN), revents: 0),
                    pollfd(fd: fd, events: 0, revents: 0),
                ]
                _ = poll(&fds, 2, 500)
                if fds[0].revents != 0 { backgroundWake.drain() }
                if fds[1].revents & Int16(POLLHUP | POLLERR) != 0 { markDead() }
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
        if wake { backgroundWake.wake() }
    }

    func wait(for waiter: Waiter) -> Result<[String], CoordinationError>? {
        while true {
            if let result = waiter.peek() { return result }
            // Gone: the domain resubmits the claim to a new server, or fails it (D-402).
            if isDead { return nil }
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
        case .dump(let requestID, _):
            confirmations.withLock { $0.waiting[requestID] }?.fulfil(.success([]))
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
    var holderKey: ClaimHolder? { ClaimHolder(server: serverPid, owner: owner) }
    func reclaim(previous: ClaimHolder, claims: [ReclaimedClaim]) {
        send(.reclaim(previousServer: previous.server, previousOwner: previous.owner, claims: claims))
    }
    func cancel(local: UInt64) { send(.cancel(local: local)) }
    func holdFor(pid: Int32, startTime: UInt64) { send(.holdFor(pid: pid, startTime: startTime)) }

    /// A dump request: the server handles a connection's messages in order, so its answer says
    /// that everything sent before it was handled. Read here when nobody else reads, as `wait`
    /// does; false when no answer came within `milliseconds` or the connection broke.
    func confirmReceived(milliseconds: Int) -> Bool {
        let waiter = Waiter()
        let id = confirmations.withLock { confirmations -> UInt64 in
            let id = confirmations.next
            confirmations.next += 1
            confirmations.waiting[id] = waiter
            return id
        }
        defer { confirmations.withLock { _ = $0.waiting.removeValue(forKey: id) } }
        send(.dumpRequest(requestID: id))
        let deadline = monotonicNanoseconds() + UInt64(max(0, milliseconds)) * 1_000_000
        while waiter.peek() == nil {
            if isDead || monotonicNanoseconds() >= deadline { return false }
            if tryTakeToken() {
                let alive = readOnce()  // at most one read slice (SO_RCVTIMEO)
                releaseToken()
                if !alive {
                    markDead()
                    return false
                }
            } else {
                _ = waiter.wait(milliseconds: 5)
            }
        }
        return true
    }
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
