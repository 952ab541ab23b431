// Coordination through the mount (DESIGN.md §4): the mount daemon runs an embedded coordination
// server for the paths under its mount point, and every open-for-read through the mount takes a
// read claim from it on behalf of the calling process (every write open a write claim,
// MountWriteClaims.swift, D-399). A library writer holding a write claim on
// the item (through that same server: clients route paths under a fuse.providerfs mount to it) so
// makes new opens wait until it is done, bounded by the claim deadline; a process that holds its
// own claim (or whose ancestor does, e.g. `providerfs coordinate --write F -- CMD`) is not blocked.

package import FileCoordination
import Foundation
import SystemSupport
package import VirtualFileSystem

/// `ReadClaimProvider` over a mount's embedded `CoordinationServer`.
package final class MountReadClaims: ReadClaimProvider {
    let server: CoordinationServer
    /// The canonical mount point: claims are taken on `mountpoint/relativePath`, the same paths
    /// clients name when they coordinate on items of the mount.
    let mountpoint: String
    /// How long an open waits for a conflicting claim before failing with ETIMEDOUT.
    let deadline: Duration
    /// Claims of open handles: read claims, and the write claims of write handles (D-399).
    private let held = Locked<(next: UInt64, claims: [UInt64: (claim: KernelClaim, writes: Bool)])>((1, [:]))

    package init(server: CoordinationServer, mountpoint: String, deadline: Duration) {
        self.server = server
        self.mountpoint = mountpoint
        self.deadline = deadline
    }

    package func acquireReadClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> ReadClaimToken {
        let (path, pid) = target(of: request)
        let claim: KernelClaim
        do {
            claim = try await server.claim(path, kind: .read, onBehalfOf: pid, deadline: deadline)
        } catch {
            throw Self.fileSystemError(error, path: path)
        }
        return ReadClaimToken(rawValue: hold(claim, writes: false))
    }

    package func acquireReadClaimNow(_ request: ReadClaimRequest) -> ReadClaimToken? {
        let (path, pid) = target(of: request)
        guard let claim = server.claimNow(path, kind: .read, onBehalfOf: pid) else { return nil }
        return ReadClaimToken(rawValue: hold(claim, writes: false))
    }

    /// `target(of:)` for the write claims (MountWriteClaims.swift).
    func claimTarget(of request: ReadClaimRequest) -> (path: String, pid: Int32) { target(of: request) }

    /// `hold(_:)` for the write claims (MountWriteClaims.swift): one table of held claims.
    func holdClaim(_ claim: KernelClaim, writes: Bool) -> UInt64 { hold(claim, writes: writes) }

    /// The path in the mount a request claims, and the process it claims for.
    private func target(of request: ReadClaimRequest) -> (path: String, pid: Int32) {
        (
            request.relativePath.isEmpty ? mountpoint : mountpoint + "/" + request.relativePath,
            ProcessIdentity.processID(ofThread: request.context.threadID)
        )
    }

    private func hold(_ claim: KernelClaim, writes: Bool) -> UInt64 {
        held.withLock { state -> UInt64 in
            let token = state.next
            state.next += 1
            state.claims[token] = (claim, writes)
            return token
        }
    }

    package func releaseReadClaim(_ token: ReadClaimToken) {
        held.withLock { $0.claims.removeValue(forKey: token.rawValue) }?.claim.release()
    }

    /// Claims still held (open handles), for tests and diagnostics.
    package var heldCount: Int { held.withLock { $0.claims.count } }

    /// Ends the read claims of open handles on `path` and below (an absolute path in the mount),
    /// before the item is deleted or moved through the mount: those handles read the version they
    /// pinned to the end whatever happens to the name, so their claims have nothing left to
    /// protect, and holding them would make the change wait for every reader that keeps a file
    /// open (`tail -f`, an editor) until the claim deadline. The tokens stay valid; releasing
    /// them later does nothing more. Write handles keep theirs: a publish never happens without
    /// its write claim (D-399), and the change does not wait for them (one purpose, rules 4–6).
    package func endClaims(at path: String) {
        let prefix = path.hasSuffix("/") ? path : path + "/"
        let ending = held.withLock { state in
            state.claims.values.filter { !$0.writes && ($0.claim.path == path || $0.claim.path.hasPrefix(prefix)) }
        }
        for held in ending { held.claim.release() }
    }

    /// Coordination failures as file-system errors (and so errno, through FileSystemError's table).
    static func fileSystemError(_ error: CoordinationError, path: String) -> FileSystemError {
        switch error.code {
        case .timedOut:
            FileSystemError(
                .coordinationFailed, "a coordination claim on \(path) was not granted in time: \(error.message)",
                cause: error)
        case .wouldDeadlock:
            FileSystemError(
                .materializationRefused, "reading \(path) would deadlock with a claim: \(error.message)", cause: error)
        case .cancelled:
            FileSystemError(.interrupted, "the open of \(path) was interrupted while waiting for a claim", cause: error)
        case .invalidURL, .invalidRequest:
            FileSystemError(.invalidArgument, "cannot coordinate on \(path): \(error.message)", cause: error)
        default:
            FileSystemError(.io, "coordination failed for \(path): \(error.message)", cause: error)
        }
    }
}

/// Maps kernel caller thread ids to process ids.
enum ProcessIdentity {
    /// The process (thread group) of thread `tid`, from `/proc/<tid>/status`; `tid` itself when
    /// that cannot be read (the thread is gone, or it is a process's main thread anyway).
    static func processID(ofThread tid: Int32) -> Int32 {
        ProcessInfoFiles.threadGroup(ofThread: tid) ?? tid
    }
}

/// `NamespaceClaimProvider` over a mount's embedded `CoordinationServer`: unlink and rmdir take a
/// forDeleting write claim on the item (its presenters accommodate the deletion before it is
/// granted), rename a forMoving one on the source and a forReplacing one on the destination (an
/// exchange: forMoving on both), taken in path order so that two renames never wait on each
/// other crosswise. A rename that happened is announced inside its claims (`itemMoved`):
/// presenters of the moved items get presentedItemDidMove(to:), directory presenters their
/// subitem messages. Paths are `mountpoint/relativePath`, as presenters register them.
package final class MountNamespaceClaims: NamespaceClaimProvider {
    let server: CoordinationServer
    let mountpoint: String
    /// How long a change waits for conflicting claims (and presenters) before failing (ETIMEDOUT).
    let deadline: Duration
    /// The read claims of the mount's open handles, ended on what a change deletes or moves
    /// (`MountReadClaims.endClaims(at:)`).
    let readClaims: MountReadClaims?
    private struct Held {
        var claims: [KernelClaim]
        var change: NamespaceChange
        var pid: Int32
    }
    private let held = Locked<(next: UInt64, changes: [UInt64: Held])>((1, [:]))

    package init(
        server: CoordinationServer, mountpoint: String, deadline: Duration, readClaims: MountReadClaims? = nil
    ) {
        self.server = server
        self.mountpoint = mountpoint
        self.deadline = deadline
        self.readClaims = readClaims
    }

    private func absolute(_ relativePath: String) -> String {
        relativePath.isEmpty ? mountpoint : mountpoint + "/" + relativePath
    }

    package func acquireNamespaceClaims(
        _ request: NamespaceClaimRequest
    ) async throws(FileSystemError) -> NamespaceClaimToken {
        let pid = ProcessIdentity.processID(ofThread: request.context.threadID)
        var wanted: [(path: String, options: WritingOptions, isDirectory: Bool)]
        switch request.change {
        case .deleting(let path, let isDirectory):
            wanted = [(absolute(path), .forDeleting, isDirectory)]
        case .moving(let from, let to, let isDirectory, let exchanging):
            wanted = [
                (absolute(from), .forMoving, isDirectory),
                (absolute(to), exchanging ? .forMoving : .forReplacing, isDirectory),
            ]
            wanted.sort { $0.path < $1.path }
        }
        for claim in wanted { readClaims?.endClaims(at: claim.path) }
        var claims: [KernelClaim] = []
        for claim in wanted {
            do {
                claims.append(
                    try await server.claim(
                        claim.path, kind: .write, writingOptions: claim.options, isDirectory: claim.isDirectory,
                        onBehalfOf: pid, deadline: deadline))
            } catch {
                for taken in claims { taken.release() }
                throw MountReadClaims.fileSystemError(error, path: claim.path)
            }
        }
        let token = held.withLock { state -> UInt64 in
            defer { state.next += 1 }
            state.changes[state.next] = Held(claims: claims, change: request.change, pid: pid)
            return state.next
        }
        return NamespaceClaimToken(rawValue: token)
    }

    package func finishNamespaceChange(_ token: NamespaceClaimToken, happened: Bool) {
        guard let change = held.withLock({ $0.changes.removeValue(forKey: token.rawValue) }) else { return }
        if happened, case .moving(let from, let to, _, let exchanging) = change.change {
            // The purpose of the mover's claims: its own presenters are not told (Apple's rule).
            let purpose = "providerfs.kernel.\(change.pid)"
            let from = absolute(from)
            let to = absolute(to)
            if exchanging {
                // Each item took the other's place: told through a name neither has.
                let aside = to + ".providerfs-exchange-\(token.rawValue)"
                server.host.itemMoved(from: to, to: aside, purpose: purpose)
                server.host.itemMoved(from: from, to: to, purpose: purpose)
                server.host.itemMoved(from: aside, to: from, purpose: purpose)
            } else {
                server.host.itemMoved(from: from, to: to, purpose: purpose)
            }
        }
        for claim in change.claims { claim.release() }
    }

    /// Changes whose claims are still held, for tests and diagnostics.
    package var heldCount: Int { held.withLock { $0.changes.count } }
}

/// The presenters of an item are asked before its content is evicted (`providerfs evict`, rule
/// 34): a forEvicting write claim through the mount's server, for the asking process. A presenter
/// without accommodatePresentedItemEviction, or one that answers with an error, vetoes it
/// (`.presenterFailed`); a coordinated reader or writer of the item makes it wait, up to
/// `deadline`. The mount's own handles do not (one purpose, D-399): an open item is refused by
/// the cache instead.
package struct MountEvictionClaims: Sendable {
    let server: CoordinationServer
    let mountpoint: String
    let deadline: Duration
    /// How long an eviction waits for coordinated readers and writers of the item: short, since
    /// an eviction is never needed now (the item is refused, and can be evicted later).
    package static let defaultDeadline: Duration = .seconds(5)

    package init(server: CoordinationServer, mountpoint: String, deadline: Duration) {
        self.server = server
        self.mountpoint = mountpoint
        self.deadline = deadline
    }

    /// Runs `body` inside the claim on `relativePath`, taken on behalf of `pid`.
    func withEvictionClaim<T: Sendable>(
        _ relativePath: String, pid: Int32, _ body: () async -> T
    ) async throws(CoordinationError) -> T {
        let path = relativePath.isEmpty ? mountpoint : mountpoint + "/" + relativePath
        let claim = try await server.claim(
            path, kind: .write, writingOptions: .forEvicting, onBehalfOf: pid, deadline: deadline)
        defer { claim.release() }
        return await body()
    }
}

/// The file system's eviction port (a `user.providerfs.pin` of `unpinned`): the same claim.
extension MountEvictionClaims: EvictionClaimProvider {
    package func evictingClaim<T: Sendable>(
        _ relativePath: String, pid: Int32, _ body: () async -> T
    ) async throws(FileSystemError) -> T {
        do throws(CoordinationError) {
            return try await withEvictionClaim(relativePath, pid: pid, body)
        } catch {
            let reason = error.code == .presenterFailed ? "a presenter refused" : "not coordinated"
            throw FileSystemError(.coordinationFailed, "\(reason): \(error.message)")
        }
    }
}
