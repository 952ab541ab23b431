// The daemon as ScopedAccess sees it: four control requests over the mount's control socket
// (docs/CONTROL.md). A protocol so that the per-process reference counting is tested without a
// mount.

import ControlWire
import Foundation

/// A derived token (`tokenDerive`): bound to this process, ended by `release` or with its parent.
package struct DerivedToken: Sendable, Hashable {
    package var token: String
    package var id: String

    package init(token: String, id: String) {
        self.token = token
        self.id = id
    }
}

/// An item's identity and where it is now (`identifyItem`, `resolveItem`).
package struct ItemIdentityReply: Codable, Sendable, Hashable {
    package var identifier: String
    package var fingerprint: String?
    package var kind: String
    package var name: String
    package var path: String
    package var scopedPath: String?
    package var foundBy: String?
}

/// The calls start, stop, bookmarkData and resolution make. Blocking (a local socket round trip).
package protocol ScopedAccessBackend: Sendable {
    func derive(mountpoint: String, token: String) throws(ScopedAccessError) -> DerivedToken
    func release(mountpoint: String, token: String) throws(ScopedAccessError)
    /// `path` relative to the mount root, or with `token` relative to its access-path directory.
    func identify(mountpoint: String, token: String?, path: String) throws(ScopedAccessError) -> ItemIdentityReply
    func resolve(
        mountpoint: String, token: String?, identifier: String, fingerprint: String?, path: String
    ) throws(ScopedAccessError) -> ItemIdentityReply
}

/// The real backend: the mount's control socket.
package struct ControlSocketBackend: ScopedAccessBackend {
    package var timeout: Duration = .seconds(10)
    /// Where the mounts' control sockets are; nil: the runtime directory's (`PROVIDERFS_RUNTIME_DIR`,
    /// else `$XDG_RUNTIME_DIR/providerfs`), as the daemon chose it.
    package var mountsDirectory: String?

    package init(mountsDirectory: String? = nil) {
        self.mountsDirectory = mountsDirectory
    }

    private struct DeriveReply: Decodable {
        struct Info: Decodable { var id: String }
        var token: String
        var info: Info
    }

    private struct TokenRow: Decodable { var id: String }

    package func derive(mountpoint: String, token: String) throws(ScopedAccessError) -> DerivedToken {
        let reply = try request(mountpoint, "tokenDerive", ["token": token], as: DeriveReply.self)
        return DerivedToken(token: reply.token, id: reply.info.id)
    }

    package func release(mountpoint: String, token: String) throws(ScopedAccessError) {
        _ = try request(mountpoint, "tokenRelease", ["token": token], as: TokenRow.self)
    }

    package func identify(
        mountpoint: String, token: String?, path: String
    ) throws(ScopedAccessError) -> ItemIdentityReply {
        var arguments: [String: Any] = ["path": path]
        if let token { arguments["token"] = token }
        return try request(mountpoint, "identifyItem", arguments, as: ItemIdentityReply.self)
    }

    package func resolve(
        mountpoint: String, token: String?, identifier: String, fingerprint: String?, path: String
    ) throws(ScopedAccessError) -> ItemIdentityReply {
        var arguments: [String: Any] = ["identifier": identifier, "path": path]
        if let token { arguments["token"] = token }
        if let fingerprint { arguments["fingerprint"] = fingerprint }
        return try request(mountpoint, "resolveItem", arguments, as: ItemIdentityReply.self)
    }

    private func request<Reply: Decodable>(
        _ mountpoint: String, _ kind: String, _ arguments: [String: Any], as type: Reply.Type
    ) throws(ScopedAccessError) -> Reply {
        let payload: [UInt8]
        do {
            payload = try ControlConnection.request(
                socketPath: ControlConnection.socketPath(forMountpoint: mountpoint, in: mountsDirectory), kind: kind,
                arguments: arguments, timeout: timeout)
        } catch {
            throw Self.scopedError(error, mountpoint: mountpoint)
        }
        do {
            return try JSONDecoder().decode(Reply.self, from: Data(payload))
        } catch {
            throw .failed(reason: "the mount at \(mountpoint) sent a reply this version cannot read")
        }
    }

    static func scopedError(_ error: ControlError, mountpoint: String) -> ScopedAccessError {
        switch error.code {
        case .accessDenied: .accessEnded(reason: error.message)
        case .notFound: .itemGone(reason: error.message)
        case .unavailable, .timedOut, .permissionDenied, .busy:
            .mountUnavailable(reason: "the mount at \(mountpoint) did not answer: \(error.message)")
        case .unknownRequest:
            .failed(reason: "the mount at \(mountpoint) is of a version without scoped access: \(error.message)")
        default: .failed(reason: "the mount at \(mountpoint) refused: \(error.message)")
        }
    }
}
