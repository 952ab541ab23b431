// The mount daemon's control socket (docs/CONTROL.md). One thread runs a poll loop over the
// listening socket, every connection and a wake-up pipe; it alone reads and writes sockets, so a
// slow, silent or hostile client never blocks another, and never the FUSE threads. Requests are
// answered by a `ControlHandler` on Swift tasks; their replies come back to the loop through an
// outbox. Every connection's peer is checked with SO_PEERCRED: only `allowedUID` is served.

import ControlWire
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Answers the requests of the control protocol.
protocol ControlHandler: Sendable {
    /// The reply's `ok` payload (JSON), or the error to send. Never called for refused peers.
    func handle(_ request: ControlRequest, peer: UnixSocket.PeerCredentials) async -> Result<[UInt8], ControlError>
}

final class ControlServer: @unchecked Sendable {
    // Safe: `sessions`, `listenFD` and `receiveBuffer` are touched only by the loop thread after
    // `start()`; everything shared with other threads is in Locked values.

    struct Limits: Sendable {
        /// A frame that has begun must be complete within this long.
        var readDeadline: Duration = .seconds(10)
        /// A connection with nothing in flight and no bytes for this long is closed.
        var idleTimeout: Duration = .seconds(60)
        /// Connections beyond this many are answered `busy` and closed.
        var maximumConnections = 64
        /// Requests of one connection being answered at once; more wait in its buffer.
        var maximumInFlight = 8
        /// Replies a client has not read yet, beyond which its requests are not read.
        var maximumUnsentBytes = 1 << 20
        var maximumMessageSize = ControlProtocol.maximumMessageSize
    }

    let socketPath: String
    /// The only user served (the daemon's own, unless a test says otherwise).
    let allowedUID: UInt32
    let limits: Limits
    private let handler: any ControlHandler
    private let logger: @Sendable (String) -> Void

    private struct Control {
        var running = false
        var stopRequested = false
        var outbox: [(session: UInt64, frame: [UInt8])] = []
    }
    private let control = Locked(Control())
    private let finished = DispatchSemaphore(value: 0)
    private var listenFD: Int32 = -1
    /// Wakes the poll loop from other threads.
    private let wakePipe = WakePipe()

    private final class Session {
        let fd: Int32
        let serial: UInt64
        let peer: UnixSocket.PeerCredentials?
        var reader: ControlFrameReader
        var unsent: [UInt8] = []
        var inFlight = 0
        /// No more requests are read (EOF, protocol error, refusal); closed once replies are out.
        var inputClosed = false
        var closeWhenFlushed = false
        var lastActivity: UInt64
        /// When the first bytes of the frame now being received arrived.
        var frameStartedAt: UInt64?

        init(fd: Int32, serial: UInt64, peer: UnixSocket.PeerCredentials?, maximumMessageSize: Int, now: UInt64) {
            self.fd = fd
            self.serial = serial
            self.peer = peer
            self.reader = ControlFrameReader(maximumMessageSize: maximumMessageSize)
            self.lastActivity = now
        }
    }
    private var sessions: [Int32: Session] = [:]
    private var nextSerial: UInt64 = 1
    private var receiveBuffer = [UInt8](repeating: 0, count: 64 * 1024)

    init(
        socketPath: String, handler: any ControlHandler, allowedUID: UInt32 = getuid(), limits: Limits = Limits(),
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.socketPath = socketPath
        self.handler = handler
        self.allowedUID = allowedUID
        self.limits = limits
        self.logger = log
    }

    deinit {
        if listenFD >= 0 { close(listenFD) }
    }

    // MARK: Life cycle

    /// Binds the socket (mode 0600, in a 0700 directory created if missing; a stale socket file is
    /// replaced) and starts serving on a thread of its own.
    func start() throws(SystemCallError) {
        let directory = String(socketPath[..<(socketPath.lastIndex(of: "/") ?? socketPath.endIndex)])
        if !directory.isEmpty { try makeDirectories(directory, mode: 0o700) }
        unlink(socketPath)
        listenFD = try UnixSocket.listen(socketPath)
        control.withLock { $0.running = true }
        let thread = Thread { [self] in loop() }
        thread.name = "providerfs.control-server"
        thread.start()
    }

    /// Closes every connection, removes the socket file, and returns once the loop has ended.
    /// Requests still being answered finish; their replies are dropped.
    func stop() {
        let running = control.withLock { control -> Bool in
            control.stopRequested = true
            return control.running
        }
        guard running else { return }
        wake()
        finished.wait()
        control.withLock { $0.running = false }
    }

    /// Connections open now (tests).
    var connectionCount: Int { connectionCountValue.withLock { $0 } }
    private let connectionCountValue = Locked(0)

    private func wake() { wakePipe.wake() }

    private func post(_ frame: [UInt8], to session: UInt64) {
        control.withLock { $0.outbox.append((session, frame)) }
        wake()
    }

    // MARK: The loop

    private func loop() {
        var fds: [pollfd] = []
        var order: [Int32] = []
        while !control.withLock({ $0.stopRequested }) {
            fds.removeAll(keepingCapacity: true)
            order.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakePipe.descriptor, events: Int16(POLLIN), revents: 0))
            fds.append(pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0))
            for (fd, session) in sessions {
                var events: Int16 = 0
                if wantsInput(session) { events |= Int16(POLLIN) }
                if !session.unsent.isEmpty { events |= Int16(POLLOUT) }
                fds.append(pollfd(fd: fd, events: events, revents: 0))
                order.append(fd)
            }
            let ready = poll(&fds, nfds_t(fds.count), pollTimeout())
            if ready < 0 && errno != EINTR { break }
            if fds[0].revents != 0 { wakePipe.drain() }
            deliverOutbox()
            if fds[1].revents & Int16(POLLIN) != 0 { acceptAll() }
            for (index, fd) in order.enumerated() {
                guard let session = sessions[fd] else { continue }
                let revents = fds[index + 2].revents
                if revents & Int16(POLLIN) != 0 && wantsInput(session) {
                    receive(session)
                } else if revents & Int16(POLLHUP | POLLERR | POLLNVAL) != 0 {
                    // The peer is gone (a peer that only shut down its writing side raises no
                    // POLLHUP): what it asked for is of no use to it.
                    drop(session)
                }
            }
            enforceDeadlines()
            flushAll()
        }
        for session in Array(sessions.values) { drop(session) }
        unlink(socketPath)
        close(listenFD)
        listenFD = -1
        finished.signal()
    }

    private func wantsInput(_ session: Session) -> Bool {
        !session.inputClosed && session.inFlight < limits.maximumInFlight
            && session.unsent.count < limits.maximumUnsentBytes
    }

    /// Milliseconds until the next deadline of any connection (-1: none).
    private func pollTimeout() -> Int32 {
        let now = Self.now()
        var earliest: UInt64?
        for session in sessions.values {
            let due = deadline(of: session)
            earliest = min(earliest ?? due, due)
        }
        guard let earliest else { return -1 }
        return Int32(clamping: (earliest > now ? earliest - now : 0) / 1_000_000 + 1)
    }

    private func deadline(of session: Session) -> UInt64 {
        if let started = session.frameStartedAt { return started &+ limits.readDeadline.controlNanoseconds }
        return session.lastActivity &+ limits.idleTimeout.controlNanoseconds
    }

    private func acceptAll() {
        UnixSocket.acceptPending(listenFD) { fd in
            let peer = UnixSocket.peerCredentials(fd)
            let session = Session(
                fd: fd, serial: nextSerial, peer: peer, maximumMessageSize: limits.maximumMessageSize,
                now: Self.now())
            nextSerial += 1
            sessions[fd] = session
            connectionCountValue.withLock { $0 = sessions.count }
            guard let peer, peer.uid == allowedUID else {
                let who = peer.map { "pid \($0.pid) uid \($0.uid)" } ?? "a peer of unknown credentials"
                logger("refused a control connection from \(who): only uid \(allowedUID) is served")
                refuse(
                    session,
                    ControlError(
                        .permissionDenied, "this mount's control socket serves only uid \(allowedUID)"))
                return
            }
            if sessions.count > limits.maximumConnections {
                logger("refused a control connection from pid \(peer.pid): \(sessions.count - 1) already open")
                refuse(session, ControlError(.busy, "the daemon has too many control connections open; try again"))
            }
        }
    }

    /// Sends `error` (id null) and closes the connection once it is out; reads nothing more.
    private func refuse(_ session: Session, _ error: ControlError) {
        session.inputClosed = true
        session.closeWhenFlushed = true
        session.unsent += ControlProtocol.responseFrame(id: nil, .failure(error))
    }

    private func receive(_ session: Session) {
        let count = receiveBuffer.withUnsafeMutableBytes { read(session.fd, $0.baseAddress, $0.count) }
        if count < 0 {
            if errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK { return }
            drop(session)
            return
        }
        let now = Self.now()
        if count == 0 {
            // End of the client's requests. Replies still owed are sent (it may have shut down
            // only its writing side); a frame left half-sent is answered `truncated`.
            session.inputClosed = true
            if session.reader.pendingByteCount > 0 {
                session.unsent += ControlProtocol.responseFrame(
                    id: nil,
                    .failure(
                        ControlError(
                            .truncated,
                            "the connection ended inside a message (\(session.reader.pendingByteCount) bytes of a frame)"
                        )))
            }
            session.frameStartedAt = nil
            session.closeWhenFlushed = true
            return
        }
        session.lastActivity = now
        receiveBuffer.withUnsafeBytes { session.reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        if session.frameStartedAt == nil { session.frameStartedAt = now }
        dispatchBuffered(session)
    }

    /// Starts answering every complete request in the session's buffer, up to the in-flight limit.
    private func dispatchBuffered(_ session: Session) {
        var consumed = false
        while !session.inputClosed && session.inFlight < limits.maximumInFlight {
            let payload: [UInt8]
            do {
                guard let next = try session.reader.next() else { break }
                payload = next
            } catch {
                // The length prefix cannot be trusted: nothing after it can be read.
                logger("closing a control connection of pid \(session.peer?.pid ?? 0): \(error.message)")
                session.unsent += ControlProtocol.responseFrame(id: nil, .failure(error))
                session.inputClosed = true
                session.closeWhenFlushed = true
                session.frameStartedAt = nil
                return
            }
            consumed = true
            let (id, parsed) = ControlProtocol.parseRequest(payload)
            switch parsed {
            case .failure(let error):
                session.unsent += ControlProtocol.responseFrame(id: id, .failure(error))
            case .success(let request):
                session.inFlight += 1
                let (handler, serial, peer) = (self.handler, session.serial, session.peer!)
                Task { [self] in
                    let result = await handler.handle(request, peer: peer)
                    post(ControlProtocol.responseFrame(id: id, result), to: serial)
                }
            }
        }
        // A frame's deadline runs from its first byte: a client dripping bytes cannot extend it.
        if session.reader.pendingByteCount == 0 {
            session.frameStartedAt = nil
        } else if consumed {
            session.frameStartedAt = Self.now()
        }
    }

    private func deliverOutbox() {
        let replies = control.withLock { control in
            defer { control.outbox = [] }
            return control.outbox
        }
        guard !replies.isEmpty else { return }
        var bySerial: [UInt64: Session] = [:]
        for session in sessions.values { bySerial[session.serial] = session }
        var touched: [Session] = []
        for reply in replies {
            // A connection closed meanwhile: the reply has nowhere to go (the work is done anyway).
            guard let session = bySerial[reply.session] else { continue }
            session.inFlight -= 1
            session.unsent += reply.frame
            session.lastActivity = Self.now()
            touched.append(session)
        }
        for session in touched where sessions[session.fd] === session { dispatchBuffered(session) }
    }

    private func enforceDeadlines() {
        let now = Self.now()
        for session in Array(sessions.values) where !session.closeWhenFlushed {
            guard session.inFlight == 0, now >= deadline(of: session) else { continue }
            let error: ControlError
            if session.frameStartedAt != nil {
                error = ControlError(
                    .truncated, "a message was not completed within \(limits.readDeadline.humanReadable)")
            } else {
                error = ControlError(.timedOut, "no request within \(limits.idleTimeout.humanReadable)")
            }
            logger("closing a control connection of pid \(session.peer?.pid ?? 0): \(error.message)")
            session.unsent += ControlProtocol.responseFrame(id: nil, .failure(error))
            session.inputClosed = true
            session.closeWhenFlushed = true
            session.frameStartedAt = nil
            session.lastActivity = now
        }
        // A client that does not read what it is owed is not waited for past the read deadline.
        for session in Array(sessions.values) where session.closeWhenFlushed && session.inFlight == 0 {
            if now &- session.lastActivity >= limits.readDeadline.controlNanoseconds { drop(session) }
        }
    }

    private func flushAll() {
        for session in Array(sessions.values) {
            while !session.unsent.isEmpty {
                let written = session.unsent.withUnsafeBytes {
                    send(session.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
                }
                if written > 0 {
                    session.unsent.removeFirst(written)
                    continue
                }
                if written < 0 && errno == EINTR { continue }
                if written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
                drop(session)  // EPIPE, ECONNRESET: the client is gone
                break
            }
            if sessions[session.fd] === session, session.unsent.isEmpty, session.closeWhenFlushed,
                session.inFlight == 0
            {
                drop(session)
            }
        }
    }

    private static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    private func drop(_ session: Session) {
        guard sessions[session.fd] === session else { return }
        sessions[session.fd] = nil
        // Counted before the close, so that a peer that sees its connection end sees it counted.
        connectionCountValue.withLock { $0 = sessions.count }
        close(session.fd)
    }
}

extension Duration {
    fileprivate var controlNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        return UInt64(max(0, seconds)) &* 1_000_000_000 &+ UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}
