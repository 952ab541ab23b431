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
    /// The process this connection's claims are for: the client (SO_PEERCRED), or the process it
    /// named with `holdFor` (D-406; loop thread).
    var claimPid: Int32
    let connectedAt = monotonicNanoseconds()
    var owner: UInt64 = 0
    var greeted = false
    var closed = false
    var input = FrameBuffer()
    var unsent: [UInt8] = []
    private let outbox = Locked<[UInt8]>([])
    /// Claims granted to this connection and not yet released (any thread adds, the loop thread
    /// removes), and whether the holders file lists this connection (D-402).
    private let grants = Locked<(locals: Set<UInt64>, listed: Bool)>(([], false))
    /// The client's start time (/proc/PID/stat), read when it first holds a claim (loop thread).
    private var cachedStartTime: UInt64?
    private weak var server: CoordinationServer?
    /// Write claims and the gate (D-451; ClaimGate.swift).
    private let gated = Locked(GatedClaims())

    init(fd: Int32, pid: Int32, server: CoordinationServer) {
        self.fd = fd
        self.pid = pid
        claimPid = pid
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
    var holdsClaims: Bool { grants.withLock { !$0.locals.isEmpty } }

    /// Before the holders file is written (loop thread): whether to list this connection, which
    /// is whether it holds claims, noted in the same step — a grant racing with the write either
    /// is listed now or finds the connection unlisted and asks for another write.
    func markListed() -> Bool {
        grants.withLock { grants -> Bool in
            grants.listed = !grants.locals.isEmpty
            return grants.listed
        }
    }

    /// The client process's start time, nil when it is gone (loop thread).
    var startTime: UInt64? {
        if cachedStartTime == nil { cachedStartTime = ProcessInfoFiles.startTime(of: pid) }
        return cachedStartTime
    }

    /// The client released claim `local` (loop thread). The file keeps listing the connection a
    /// little (the server drops it later), so a client claiming in a loop costs no write per claim.
    func ended(_ local: UInt64) {
        grants.withLock { _ = $0.locals.remove(local) }
        if let token = gated.withLock({ $0.held.removeValue(forKey: local) }) { server?.claimGate?.release(token) }
    }

    /// A submitted claim writes `paths` (loop thread; only with a gate): its grant passes the gate.
    func noteSubmitted(_ local: UInt64, writing paths: [String], deadline: UInt64) {
        guard !paths.isEmpty else { return }
        gated.withLock { $0.submitted[local] = (paths, deadline) }
    }

    /// The connection is gone: what the gate holds for it ends.
    func releaseGates() {
        let tokens = gated.withLock { gated in
            defer { gated = GatedClaims(closed: true) }
            return Array(gated.held.values)
        }
        guard let gate = server?.claimGate else { return }
        for token in tokens { gate.release(token) }
    }

    func granted(_ claim: ClaimID, paths: [String]) {
        if let writing = gated.withLock({ $0.submitted.removeValue(forKey: claim.local) }),
            let gate = server?.claimGate
        {
            // The arbiter granted it; the gate (another machine's lock) may still make it wait.
            Task { [self] in
                do throws(CoordinationError) {
                    let token = try await gate.acquire(writing: writing.paths, until: writing.deadline)
                    if let token {
                        let gone = gated.withLock { gated -> Bool in
                            if gated.closed { return true }
                            gated.held[claim.local] = token
                            return false
                        }
                        if gone { gate.release(token) }
                    }
                    grant(claim, paths: paths)
                } catch {
                    server?.host.release(claim)
                    failed(claim, error: error)
                }
            }
            return
        }
        grant(claim, paths: paths)
    }

    private func grant(_ claim: ClaimID, paths: [String]) {
        // Recorded before the frame is queued: the server lists this connection as a holder
        // before the grant leaves (D-402).
        let unlisted = grants.withLock { grants -> Bool in
            grants.locals.insert(claim.local)
            return !grants.listed
        }
        if unlisted { server?.holdersChanged() }
        send(.granted(local: claim.local, paths: paths))
    }
    func failed(_ claim: ClaimID, error: CoordinationError) {
        send(.failed(local: claim.local, code: error.code.rawValue, message: error.message))
    }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        send(.deliver(presenter: presenter.local, messageID: messageID, message: message, claim: claim))
    }
}
