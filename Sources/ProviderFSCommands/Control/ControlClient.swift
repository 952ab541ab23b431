// The CLI's side of a mount's control socket (docs/CONTROL.md): one connection per request, a
// deadline on every send and receive, failures as one sentence for the user.

import ControlWire
import Foundation
import SystemSupport

extension MountRegistry {
    /// The control socket of the daemon serving `mountpoint`: beside its registry file,
    /// `<runtime dir>/mounts/<FNV-1a of the mount point>.control.sock` (mode 0600, directory 0700).
    static func controlSocket(for mountpoint: String) -> String {
        ControlConnection.socketPath(forMountpoint: mountpoint)
    }
}

struct ControlClient: Sendable {
    let socketPath: String
    /// The mount point, for messages.
    let mountpoint: String
    /// The largest reply the client reads (requests stay within `ControlProtocol.maximumMessageSize`).
    static let maximumReplySize = 64 << 20
    /// How long a request may take from connect to reply.
    var timeout: Duration = .seconds(30)

    init(socketPath: String, mountpoint: String, timeout: Duration = .seconds(30)) {
        self.socketPath = socketPath
        self.mountpoint = mountpoint
        self.timeout = timeout
    }

    /// The client of the ProviderFS mount that contains `path`, and `path` relative to the mount's
    /// root ("" for the mount point itself). The mount point itself is never stat'ed.
    static func forMount(
        containing path: String
    ) throws(CommandFailure) -> (client: ControlClient, relativePath: String) {
        guard let mount = ControlConnection.mount(containing: path) else {
            throw CommandFailure("\(path) is not inside a ProviderFS mount")
        }
        let client = ControlClient(
            socketPath: MountRegistry.controlSocket(for: mount.mountpoint), mountpoint: mount.mountpoint)
        return (client, mount.relativePath)
    }

    func status() async throws(CommandFailure) -> ControlMountStatus {
        try await send(.status, as: ControlMountStatus.self)
    }

    func item(_ path: String) async throws(CommandFailure) -> ControlItemStatus {
        try await send(.item(path: path), as: ControlItemStatus.self)
    }

    func download(_ path: String) async throws(CommandFailure) -> ControlDownloadReply {
        try await send(.download(path: path), as: ControlDownloadReply.self)
    }

    func evict(_ path: String) async throws(CommandFailure) -> ControlEvictReply {
        try await send(.evict(path: path), as: ControlEvictReply.self)
    }

    func pin(_ path: String, state: String) async throws(CommandFailure) -> ControlPinReply {
        try await send(.pin(path: path, state: state), as: ControlPinReply.self)
    }

    func refresh(_ path: String) async throws(CommandFailure) -> ControlRefreshReply {
        try await send(.refresh(path: path), as: ControlRefreshReply.self)
    }

    /// One request and its decoded reply; every failure as one sentence.
    func send<Reply: Decodable & Sendable>(
        _ request: ControlRequest, as type: Reply.Type
    ) async throws(CommandFailure) -> Reply {
        do {
            return try await exchange(ControlProtocol.requestFrame(id: 1, request), as: Reply.self)
        } catch {
            switch error {
            case .control(let error): throw sentence(for: error)
            case .unreadable(let why): throw unreadable(why)
            }
        }
    }

    /// Sends one request frame and returns the `ok` value of its reply, decoded as `Reply`.
    func exchange<Reply: Decodable & Sendable>(
        _ frame: [UInt8], as type: Reply.Type
    ) async throws(ControlProtocol.ReplyFailure) -> Reply {
        let (socketPath, timeout) = (self.socketPath, self.timeout)
        let result = await BlockingIOPool.shared.run { () -> Result<Reply, ControlProtocol.ReplyFailure> in
            do throws(ControlError) {
                let payload = try Self.roundTrip(socketPath: socketPath, frame: frame, timeout: timeout)
                return ControlProtocol.parseResponse(payload, as: Reply.self).result
            } catch {
                return .failure(.control(error))
            }
        }
        return try result.get()
    }

    /// The sentence for a reply this version cannot read.
    func unreadable(_ why: String) -> CommandFailure {
        CommandFailure("the mount at \(mountpoint) sent a reply this version cannot read: \(why)")
    }

    /// Blocking: connect, send `frame`, read one reply frame (its payload).
    static func roundTrip(socketPath: String, frame: [UInt8], timeout: Duration) throws(ControlError) -> [UInt8] {
        try ControlConnection.roundTrip(
            socketPath: socketPath, frame: frame, timeout: timeout, maximumReplySize: maximumReplySize)
    }

    func sentence(for error: ControlError) -> CommandFailure {
        switch error.code {
        case .unavailable where error.message.contains("EACCES"):
            CommandFailure(
                "the control socket of the mount at \(mountpoint) belongs to another user (permission denied)")
        case .unavailable where error.message.hasPrefix("connect"):
            CommandFailure(
                "the mount at \(mountpoint) is not running: no daemon answers on \(socketPath)"
                    + "; clean up with 'providerfs unmount \(mountpoint)'")
        case .permissionDenied:
            CommandFailure("the mount at \(mountpoint) refused this user: \(error.message)")
        case .timedOut:
            CommandFailure("the mount at \(mountpoint) did not answer: \(error.message)")
        default:
            CommandFailure("the mount at \(mountpoint) could not answer: \(error.message)")
        }
    }
}
