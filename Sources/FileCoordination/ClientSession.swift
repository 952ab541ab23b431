// One client connection of a coordination server: framing in, frames out, the client's claims
// and presenters as one owner of the arbiter.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One client connection of a server. The loop thread owns `input`, `unsent`, `greeted`;
/// `outbox` receives frames from any thread.
final class ClientSession: ArbiterSink, @unchecked Sendable {
    // Safe: see the type comment; `owner` is set once by the loop thread right after creation,
    // before the session is visible to the arbiter.
    let fd: Int32
    let pid: Int32
    let connectedAt = monotonicNanoseconds()
    var owner: UInt64 = 0
    var greeted = false
    var closed = false
    var input = FrameBuffer()
    var unsent: [UInt8] = []
    private let outbox = Locked<[UInt8]>([])
    /// Claims granted to this connection and not yet released (any thread adds, the loop thread
    /// removes): whether the connection holds claims a successor must await (D-402).
    private let grantedLocals = Locked<Set<UInt64>>([])
    /// The client's start time (/proc/PID/stat), read when it first holds a claim (loop thread).
    private var cachedStartTime: UInt64?
    private weak var server: CoordinationServer?

    init(fd: Int32, pid: Int32, server: CoordinationServer) {
        self.fd = fd
        self.pid = pid
        self.server = server
    }

    func send(_ message: WireMessage) {
        let frame = message.frame()
        outbox.withLock { $0 += frame }
        server?.sessionHasOutput()
    }

    func takeOutbox() {
        let pending = outbox.withLock { box -> [UInt8] in
            defer { box.removeAll(keepingCapacity: true) }
            return box
        }
        unsent += pending
    }

    /// Whether the connection holds granted claims.
    var holdsClaims: Bool { grantedLocals.withLock { !$0.isEmpty } }

    /// The client process's start time, nil when it is gone (loop thread).
    var startTime: UInt64? {
        if cachedStartTime == nil { cachedStartTime = ProcessInfoFiles.startTime(of: pid) }
        return cachedStartTime
    }

    /// The client released claim `local` (loop thread).
    func ended(_ local: UInt64) {
        let nowEmpty = grantedLocals.withLock { locals -> Bool in
            locals.remove(local) != nil && locals.isEmpty
        }
        if nowEmpty { server?.holdersChanged() }
    }

    func granted(_ claim: ClaimID, paths: [String]) {
        // Recorded before the frame is queued: the server lists this connection as a holder
        // before the grant leaves (D-402).
        let first = grantedLocals.withLock { locals -> Bool in
            locals.insert(claim.local)
            return locals.count == 1
        }
        if first { server?.holdersChanged() }
        send(.granted(local: claim.local, paths: paths))
    }
    func failed(_ claim: ClaimID, error: CoordinationError) {
        send(.failed(local: claim.local, code: error.code.rawValue, message: error.message))
    }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        send(.deliver(presenter: presenter.local, messageID: messageID, message: message, claim: claim))
    }
}
