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

    func granted(_ claim: ClaimID, paths: [String]) { send(.granted(local: claim.local, paths: paths)) }
    func failed(_ claim: ClaimID, error: CoordinationError) {
        send(.failed(local: claim.local, code: error.code.rawValue, message: error.message))
    }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        send(.deliver(presenter: presenter.local, messageID: messageID, message: message, claim: claim))
    }
}
