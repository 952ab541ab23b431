// The mount daemon's answers to control requests (docs/CONTROL.md): what `providerfs status
// MOUNTPOINT` and `providerfs download` show, from the file system and its cache. The replies'
// shapes are shared with `ControlClient`.

import AccessTokens
import ControlWire
import Diagnostics
import FileCoordination
import Foundation
import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A recorded failure as errno name, number, message and the byte where it happened (`EIO`, 5,
/// "…", 4194304; no offset for a failure at no byte, or one recorded before offsets were kept).
struct ControlItemError: Codable, Sendable, Equatable {
    var errno: String
    var errnoValue: Int32
    var message: String
    var offset: Int64?

    init(_ error: RecordedError) {
        let number = FileSystemError(CacheError(error.code, error.message)).errno
        self.errno = number.name
        self.errnoValue = number.rawValue
        self.message = error.message
        self.offset = error.offset
    }

    /// "EIO: at byte 4194304: message", as `user.providerfs.error` shows it.
    var text: String {
        guard let offset else { return "\(errno): \(message)" }
        return "\(errno): at byte \(offset): \(message)"
    }
}

/// One item's state, as the `item` and `download` requests answer it.
struct ControlItemStatus: Codable, Sendable, Equatable {
    /// Relative to the mount root.
    var path: String
    /// dataless, downloading, partial, materialized or error (docs/SEMANTICS.md).
    var state: String
    var presentBytes: Int64
    var totalBytes: Int64
    var version: String
    var error: ControlItemError?

    init(path: String, _ status: ItemStatus) {
        self.path = path
        self.state = status.state.rawValue
        self.presentBytes = status.presentBytes
        self.totalBytes = status.totalBytes
        self.version = status.version.rawValue
        self.error = status.lastError.map(ControlItemError.init)
    }
}

/// The reply to `download`.
struct ControlDownloadReply: Codable, Sendable, Equatable {
    var item: ControlItemStatus
    /// Every byte was already here: nothing was started.
    var alreadyDownloaded: Bool
}

/// The reply to `evict`.
struct ControlEvictReply: Codable, Sendable, Equatable {
    /// The item's state after it (`dataless` once evicted).
    var item: ControlItemStatus
    /// evicted, alreadyPlaceholder or refused.
    var outcome: String
    /// Why it was refused: one of `ProviderCache.EvictionRefusal`'s texts, or what a presenter
    /// or the coordinator said.
    var reason: String?
    /// Disk bytes its files had (evicted only).
    var freedBytes: Int64
}

/// The reply to `pin` (D-445).
struct ControlPinReply: Codable, Sendable, Equatable {
    /// The item's status after it.
    var item: ControlItemStatus
    /// Its own state now: pinned, unpinned or inherited.
    var pin: String
    /// Its effective policy: pinned (kept downloaded) or unpinned (download on read).
    var policy: String
    /// The item whose state decides the policy (relative path; "" the root), absent: the
    /// default.
    var decidedBy: String?
    /// Unpinned: one reply per file under it that had content (evicted, or refused and why).
    var evictions: [ControlEvictReply]
}

/// The reply to `status`.
struct ControlMountStatus: Codable, Sendable, Equatable {
    struct CacheSpace: Codable, Sendable, Equatable {
        var directory: String
        /// Bytes the cache directory's files occupy on disk (allocated blocks, so sparse content
        /// files count what they hold).
        var usedBytes: Int64
        /// Bytes available to this user on the cache directory's file system.
        var freeBytes: Int64
        /// The limits (`--cache-max-size`, …) and what they did; absent when none is set.
        var limits: CacheLimits? = nil
        /// Pinned content (D-445); absent when no item has a pin state of its own.
        var pins: Pins? = nil
    }
    struct Pins: Codable, Sendable, Equatable {
        var pinnedItems: Int
        var unpinnedItems: Int
        /// Files known under pinned items, those complete, their bytes present and total.
        var files: Int
        var downloadedFiles: Int
        var presentBytes: Int64
        var totalBytes: Int64
        var queued: Int
        var downloading: Int
        /// Pinned files whose last download failed.
        var failed: [ControlItemStatus]
    }
    struct CacheLimits: Codable, Sendable, Equatable {
        var maximumSize: Int64?
        var minimumFree: Int64?
        var maximumAgeSeconds: Double?
        /// Bytes of stored content at the last check.
        var storedBytes: Int64
        var evictions: Int
        var evictedBytes: Int64
        /// Why new downloads are refused (ENOSPC); absent when they are not.
        var blockedReason: String?

        init(_ status: CacheLimitsStatus) {
            maximumSize = status.maximumSize
            minimumFree = status.minimumFree
            maximumAgeSeconds = status.maximumAge?.seconds
            storedBytes = status.storedBytes
            evictions = status.evictions
            evictedBytes = status.evictedBytes
            blockedReason = status.blockedReason
        }
    }
    struct ProviderReachability: Codable, Sendable, Equatable {
        /// The provider answered for its root item within `probeDeadlineSeconds`.
        var reachable: Bool
        var responseMilliseconds: Double
        var probeDeadlineSeconds: Double
        var error: ControlItemError?
        /// When unreachable: since when the mount knows it (ISO 8601; D-434).
        var offlineSince: String? = nil
    }

    var mountpoint: String
    var source: String
    var pid: Int32
    var uptimeSeconds: Double
    var cache: CacheSpace
    var provider: ProviderReachability
    /// Files downloading or partly present, by path.
    var transfers: [ControlItemStatus]
    /// Files whose last download failed (and that are not downloading again), by path.
    var errors: [ControlItemStatus]
    /// Require-token mode: plain paths only for the owner's providerfs commands (nil from a
    /// daemon of an older version: not in it).
    var requireToken: Bool? = nil
    /// Coordination across machines (WebDAV mounts, D-451): whether writes take the server's
    /// locks, and why not; nil for other mounts.
    var acrossMachines: String? = nil
}

/// `ControlHandler` over a mount's `ProviderFileSystem`.
struct MountControl: ControlHandler {
    let fileSystem: ProviderFileSystem
    let mountpoint: String
    let source: String
    let started: ContinuousClock.Instant
    /// How long the provider has to answer the reachability probe of `status`.
    var probeDeadline: Duration = .seconds(5)
    /// The mount's faults (`faultAdd`, `faultList`, `faultClear`); nil: none can be set.
    var faults: MountFaults?
    /// The mount's scoped access tokens (docs/TOKENS.md); nil: this mount hands out none.
    var tokens: TokenAuthority?
    /// Asks presenters before an eviction; nil: evictions ask nobody (no coordination server).
    var evictionClaims: MountEvictionClaims?
    /// Since when the provider has been unreachable, as far as the mount knows (D-434).
    var offline = OfflineSince(nil)
    /// The server locks of a WebDAV mount's writers (D-451); nil for other mounts.
    var remoteLocks: MountRemoteLocks?

    func handle(_ request: ControlRequest, peer: UnixSocket.PeerCredentials) async -> Result<[UInt8], ControlError> {
        if let refusal = Self.requireTokenRefusal(request, peer: peer, policy: fileSystem.options.plainPaths) {
            return .failure(refusal)
        }
        switch request {
        case .faultAdd, .faultList, .faultClear:
            guard let faults else { return .failure(ControlError(.failed, "this mount takes no faults")) }
            return await faults.handle(request) ?? .failure(ControlError(.failed, "not a fault request"))
        case .tokenDerive, .tokenRelease, .identifyItem, .resolveItem:
            return await MountItemAccess(authority: tokens, fileSystem: fileSystem).handle(request, peer: peer)
        case .tokenGrant, .tokenList, .tokenRevoke, .tokenExpire, .tokenLog:
            guard let tokens else { return .failure(ControlError(.failed, "this mount hands out no tokens")) }
            return await MountTokens(authority: tokens, fileSystem: fileSystem).handle(request, peer: peer)
                ?? .failure(ControlError(.failed, "not a token request"))
        case .status:
            return ControlProtocol.encode(await status())
        case .item(let path):
            do {
                let status = try await fileSystem.status(ofPath: path)
                return ControlProtocol.encode(ControlItemStatus(path: path, status))
            } catch {
                return .failure(Self.controlError(error, path: path))
            }
        case .download(let path):
            do {
                return ControlProtocol.encode(try await download(path))
            } catch {
                return .failure(error)
            }
        case .evict(let path):
            do {
                return ControlProtocol.encode(try await evict(path, pid: peer.pid))
            } catch {
                return .failure(error)
            }
        case .pin(let path, let state):
            do {
                return ControlProtocol.encode(try await pin(path, state: state, pid: peer.pid))
            } catch {
                return .failure(error)
            }
        case .refresh(let path):
            do {
                return ControlProtocol.encode(try await refresh(path))
            } catch {
                return .failure(error)
            }
        }
    }

    /// Require-token mode (D-319): the control socket is the owner's, but a program of the owner
    /// that is not a providerfs command must not get through it what the mount refuses it on plain
    /// paths (a grant, an item's status, a download, faults). Requests that present a token
    /// (ScopedAccess's derive, release and bookmark calls with a token) are for any program.
    static func requireTokenRefusal(
        _ request: ControlRequest, peer: UnixSocket.PeerCredentials, policy: (any PlainPathPolicy)?
    ) -> ControlError? {
        guard let policy else { return nil }
        switch request {
        case .tokenDerive, .tokenRelease: return nil
        case .identifyItem(let locator) where locator.token != nil: return nil
        case .resolveItem(let identity) where identity.token != nil: return nil
        default: break
        }
        let context = RequestContext(threadID: peer.pid, uid: peer.uid, gid: peer.gid)
        guard case .refused(let reason) = policy.decide(context) else { return nil }
        return ControlError(
            .permissionDenied,
            "\(request.kind) refused (require-token mode: only the mount owner's providerfs commands may ask; "
                + "apps use access paths): \(reason)")
    }

    func download(_ path: String) async throws(ControlError) -> ControlDownloadReply {
        let status: ItemStatus
        do { status = try await fileSystem.status(ofPath: path) } catch { throw Self.controlError(error, path: path) }
        guard status.kind == .file else {
            throw ControlError(.notAFile, "\(path.isEmpty ? "the mount root" : path) is not a file")
        }
        let started: ProviderCache.FullDownload
        do { started = try await fileSystem.cache.startFullDownload(of: status.identifier) } catch {
            throw Self.controlError(FileSystemError(error), path: path)
        }
        let now = fileSystem.cache.status(of: status.identifier) ?? status
        return ControlDownloadReply(
            item: ControlItemStatus(path: path, now), alreadyDownloaded: started == .alreadyPresent)
    }

    /// Evicts a file's local content: the cache's refusals first (what only this machine has,
    /// what is in use), then its presenters (a forEvicting claim for the asking process), then
    /// the eviction itself, which checks again.
    func evict(_ path: String, pid: Int32) async throws(ControlError) -> ControlEvictReply {
        let checked: (status: ItemStatus, refusal: ProviderCache.EvictionRefusal?)
        do { checked = try await fileSystem.evictionRefusal(ofPath: path) } catch {
            throw Self.controlError(error, path: path)
        }
        guard checked.status.kind == .file else {
            throw ControlError(.notAFile, "\(path.isEmpty ? "the mount root" : path) is not a file")
        }
        if let refusal = checked.refusal {
            return ControlEvictReply(
                item: ControlItemStatus(path: path, checked.status), outcome: "refused", reason: refusal.rawValue,
                freedBytes: 0)
        }
        let evicted: Result<(status: ItemStatus, eviction: ProviderCache.Eviction), FileSystemError>
        do {
            if let evictionClaims {
                evicted = try await evictionClaims.withEvictionClaim(path, pid: pid) {
                    await Self.evict(path, in: fileSystem)
                }
            } else {
                evicted = await Self.evict(path, in: fileSystem)
            }
        } catch {
            let reason =
                error.code == .presenterFailed
                ? "a presenter refused: \(error.message)"
                : "not coordinated: \(error.message)"
            return ControlEvictReply(
                item: ControlItemStatus(path: path, checked.status), outcome: "refused", reason: reason,
                freedBytes: 0)
        }
        let (status, eviction) = try evicted.mapError { Self.controlError($0, path: path) }.get()
        let item = ControlItemStatus(path: path, status)
        switch eviction {
        case .evicted(let freed):
            return ControlEvictReply(item: item, outcome: "evicted", reason: nil, freedBytes: freed)
        case .alreadyPlaceholder:
            return ControlEvictReply(item: item, outcome: "alreadyPlaceholder", reason: nil, freedBytes: 0)
        case .refused(let refusal):
            return ControlEvictReply(item: item, outcome: "refused", reason: refusal.rawValue, freedBytes: 0)
        }
    }

    /// Sets an item's pin state; unpinned: then evicts each file under it with content, as
    /// `evict` does (its refusals, presenters asked first), and answers each.
    func pin(_ path: String, state: String, pid: Int32) async throws(ControlError) -> ControlPinReply {
        guard let pin = PinState(rawValue: state) else {
            throw ControlError(.invalidArguments, "\"state\" must be pinned, unpinned or inherited")
        }
        let info: ProviderFileSystem.PinInfo
        do { info = try await fileSystem.setPinState(pin, ofPath: path) } catch {
            throw Self.controlError(error, path: path)
        }
        var evictions: [ControlEvictReply] = []
        if pin == .unpinned {
            let cache = fileSystem.cache
            for file in cache.filesWithContent(atOrUnder: info.status.identifier) {
                guard let filePath = cache.catalog.path(of: file) else { continue }
                do { evictions.append(try await evict(filePath, pid: pid)) } catch {
                    // Gone meanwhile: nothing to evict.
                    guard let status = cache.status(of: file) else { continue }
                    evictions.append(
                        ControlEvictReply(
                            item: ControlItemStatus(path: filePath, status), outcome: "failed", reason: error.message,
                            freedBytes: 0))
                }
            }
        }
        let now = (try? await fileSystem.pinInfo(ofPath: path)) ?? info
        return ControlPinReply(
            item: ControlItemStatus(path: path, now.status), pin: now.state.rawValue,
            policy: now.policy.pinned ? "pinned" : "unpinned",
            decidedBy: now.policy.decidedBy.map { fileSystem.cache.catalog.path(of: $0) ?? "\($0)" },
            evictions: evictions)
    }

    private static func evict(
        _ path: String, in fileSystem: ProviderFileSystem
    ) async -> Result<(status: ItemStatus, eviction: ProviderCache.Eviction), FileSystemError> {
        do { return .success(try await fileSystem.evict(ofPath: path)) } catch { return .failure(error) }
    }

    func status() async -> ControlMountStatus {
        let cache = fileSystem.cache
        async let probe = cache.probeProvider(deadline: probeDeadline)
        let directory = cache.directory
        let usage = await BlockingIOPool.shared.run { cache.content.usage() }
        var transfers: [ControlItemStatus] = []
        var errors: [ControlItemStatus] = []
        for item in cache.contentActivity() {
            let entry = ControlItemStatus(path: cache.catalog.path(of: item.identifier) ?? "\(item.identifier)", item)
            if item.state == .error { errors.append(entry) } else { transfers.append(entry) }
        }
        let found = await probe
        let offlineSince = offline.update(reachable: found.reachable)
        return ControlMountStatus(
            mountpoint: mountpoint, source: source, pid: getpid(),
            uptimeSeconds: (ContinuousClock.now - started).seconds,
            cache: .init(
                directory: directory, usedBytes: usage.usedBytes, freeBytes: usage.availableBytes,
                limits: cache.limitsStatus.map(ControlMountStatus.CacheLimits.init),
                pins: cache.pinsStatus().map { pins in
                    ControlMountStatus.Pins(
                        pinnedItems: pins.pinnedItems, unpinnedItems: pins.unpinnedItems, files: pins.files,
                        downloadedFiles: pins.downloadedFiles, presentBytes: pins.presentBytes,
                        totalBytes: pins.totalBytes, queued: pins.queued, downloading: pins.downloading,
                        failed: pins.failures.compactMap { failure in
                            cache.status(of: failure.identifier).map { status in
                                var status = status
                                status.lastError = failure.error
                                return ControlItemStatus(
                                    path: cache.catalog.path(of: failure.identifier) ?? "\(failure.identifier)", status)
                            }
                        })
                }),
            provider: .init(
                reachable: found.reachable, responseMilliseconds: found.elapsed.seconds * 1000,
                probeDeadlineSeconds: probeDeadline.seconds, error: found.error.map(ControlItemError.init),
                offlineSince: offlineSince.map { $0.formatted(.iso8601) }),
            transfers: transfers.sorted { $0.path < $1.path }, errors: errors.sorted { $0.path < $1.path },
            requireToken: fileSystem.options.plainPaths != nil, acrossMachines: await remoteLocks?.statusLine())
    }

    static func controlError(_ error: FileSystemError, path: String) -> ControlError {
        switch error.code {
        case .notFound, .notADirectory:
            ControlError(.notFound, "\(path) is not in the mount (\(error.message))")
        default:
            ControlError(.failed, "\(path): \(error.message) [\(error.errno.name)]")
        }
    }
}

extension MountCommand {
    /// The control server of a mount (not started): nil when the file system is not a
    /// `ProviderFileSystem` (nothing to answer from).
    static func makeControlServer(
        _ plan: Plan, fileSystem: any FileSystem, faults: FaultPlan?, tokens: TokenAuthority? = nil,
        evictionClaims: MountEvictionClaims? = nil, remoteLocks: MountRemoteLocks? = nil, startedOffline: Bool = false
    ) -> ControlServer? {
        guard let fileSystem = fileSystem as? ProviderFileSystem else { return nil }
        let handler = MountControl(
            fileSystem: fileSystem, mountpoint: plan.mountpoint,
            source: plan.demo ? "demo (\(plan.source))" : plan.source,
            started: .now, faults: faults.map { MountFaults(plan: $0, fileSystem: fileSystem) }, tokens: tokens,
            evictionClaims: evictionClaims,
            offline: OfflineSince(
                startedOffline || plan.webdav == nil && !MountComposition.sourceIsPresent(plan.source) ? Date() : nil),
            remoteLocks: remoteLocks)
        return ControlServer(
            socketPath: MountRegistry.controlSocket(for: plan.mountpoint), handler: handler,
            log: { message in Logger(label: "control").notice(message) })
    }
}

/// Since when a mount's provider has been unreachable, as far as the mount knows (D-434): from an
/// offline start, or from the first status probe that failed; cleared by a probe that answers.
/// (Only `status` probes; a failure that no probe saw is not dated.)
final class OfflineSince: Sendable {
    private let since: Locked<Date?>

    init(_ start: Date?) { since = Locked(start) }

    /// Records a probe's outcome; returns since when the provider is unreachable (nil: reachable).
    func update(reachable: Bool) -> Date? {
        since.withLock { since in
            if reachable {
                since = nil
            } else if since == nil {
                since = Date()
            }
            return since
        }
    }
}
