// `providerfs mount (--demo | --source DIR | --webdav URL) MOUNTPOINT [--foreground] [--cache DIR] …`
//
// Without --foreground the command starts the daemon (this same binary with --foreground) in its
// own session, with stdin from /dev/null and stdout/stderr into a log file, so it never holds the
// caller's terminal, pipe or CI step open; then waits on a readiness pipe until the daemon says
// READY (mounted, INIT done, registry written) or ERROR <sentence>, and returns.

import AccessTokens
import Diagnostics
import FUSEAdapter
import FileCoordination
import Foundation
import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import VirtualFileSystem
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

struct MountCommand: CLICommand {
    static let name = "mount"
    static let summary = "mount a provider (a directory, a WebDAV server, or the demo) as a FUSE file system"
    static let usage = """
        providerfs mount (--demo | --source DIR | --webdav URL [--user U] [--password-file F] [--ca-file F])
                         MOUNTPOINT
                         [--foreground] [--cache DIR] [--log FILE]
                         [--read-only] [--allow-other] [--no-passthrough] [--require-token]
                         [--stall-timeout DURATION] [--ready-timeout DURATION] [--write-back-delay DURATION]
                         [--poll-interval DURATION|0] [--lock-timeout DURATION] [--checksum-limit SIZE|0]
                         [--parallel-ranges N] [--ctag-covers-subtree]
                         [--cache-max-size SIZE] [--cache-min-free SIZE] [--cache-max-age DURATION]
                         [--no-download-for NAME,...] [--download-for NAME,...|all]
        """

    /// Free space the cache directory needs before we mount (SQLite, range maps, first downloads).
    static let minimumCacheSpace: Int64 = 64 << 20

    struct Plan {
        var source: String
        var demo: Bool
        var mountpoint: String
        var cacheDirectory: String
        var logFile: String
        var allowOther: Bool
        /// How many stale ProviderFS mounts at the mount point `prepare` cleaned up.
        var cleanedStaleMounts = 0
        /// Let the kernel serve reads of materialized files from the cache (FUSE passthrough).
        var passthrough = true
        /// `--read-only`: every change fails with EROFS, for the kernel too (MS_RDONLY); reads may
        /// then use passthrough and the page cache (D-363, D-376).
        var readOnly = false
        /// How long a download may deliver nothing before its readers get ETIMEDOUT (nil: the
        /// cache's default, `CacheOptions.stallTimeout`).
        var stallTimeout: Duration?
        /// How long an upload waits after the last publish of its file (D-405; nil: at once).
        var writeBackDelay: Duration?
        /// Require-token mode: plain paths only for this user's own providerfs commands; apps get
        /// in through access paths only (docs/SEMANTICS.md, "Require-token mode").
        var requireToken = false
        /// The cache's limits (issue 27, D-432); nil: none.
        var cacheMaximumSize: Int64?
        var cacheMinimumFree: Int64?
        var cacheMaximumAge: Duration?
        /// Processes that must not download, beyond the defaults, and defaults let through
        /// (D-433); `allowAllDownloads`: `--download-for all`.
        var noDownloadFor: [String] = []
        var downloadFor: [String] = []
        var allowAllDownloads = false
        /// `--webdav URL`: the provider is that WebDAV collection (`source` is its URL).
        var webdav: WebDAVSource?
        /// How often listed directories are asked again for remote changes (D-450); nil: the
        /// default (`MountPolling.defaultInterval`), zero: never.
        var pollInterval: Duration?
        /// How long a WebDAV lock lives at the server without a refresh (D-451); nil: the default.
        var lockTimeout: Duration?
    }

    /// A WebDAV server to mount (docs/WEBDAV.md). The password is not here: the daemon reads it
    /// from `passwordFile` or `PROVIDERFS_WEBDAV_PASSWORD` itself (D-418).
    struct WebDAVSource {
        var location: WebDAVLocation
        var user: String?
        /// Absolute.
        var passwordFile: String?
        /// PEM certificates to trust for https instead of the system's store; absolute.
        var caFile: String?
        /// Fetches up to this size are verified by the checksums the server sends (D-495); nil:
        /// the default, 0: none.
        var checksumLimit: Int64?
        /// Ranged GETs of one large fetch at once (D-513); nil: the default, 1: one GET per fetch.
        var parallelRanges: Int?
        /// The server's `getctag` changes with any change below a collection (D-525).
        var ctagCoversSubtree = false
    }

    struct Output: Encodable {
        var mountpoint: String
        var source: String
        var cacheDirectory: String
        var logFile: String
        var pid: Int32?
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let demo = try arguments.flag("--demo")
        let sourceArgument = try arguments.option("--source")
        let webdavArgument = try arguments.option("--webdav")
        let userArgument = try arguments.option("--user")
        let passwordFileArgument = try arguments.option("--password-file")
        let caFileArgument = try arguments.option("--ca-file")
        let checksumLimit = try arguments.size("--checksum-limit")
        let parallelRanges = try arguments.option("--parallel-ranges").map { text throws(UsageError) -> Int in
            guard let count = Int(text), (1...32).contains(count) else {
                throw UsageError("providerfs mount: --parallel-ranges must be a number from 1 to 32.")
            }
            return count
        }
        let ctagCoversSubtree = try arguments.flag("--ctag-covers-subtree")
        // A password on the command line shows in ps, shell history and logs: refused, not echoed.
        if arguments.optionalValueFlag("--password") != nil || arguments.optionalValueFlag("--pass") != nil {
            throw UsageError(
                "providerfs mount: no password on the command line (ps and shell history show it); "
                    + "use --password-file F or the environment variable \(webdavPasswordVariable).")
        }
        let foreground = try arguments.flag("--foreground")
        let cacheArgument = try arguments.option("--cache")
        let logArgument = try arguments.option("--log")
        let allowOther = try arguments.flag("--allow-other")
        let noPassthrough = try arguments.flag("--no-passthrough")
        let readOnly = try arguments.flag("--read-only")
        let requireToken = try arguments.flag("--require-token")
        // Internal: an `-o` option of the mount-helper form that this version does not know and
        // that looks like a misspelled security option (MountHelperForm.swift).
        if let unknown = try arguments.option("--unknown-mount-option") {
            throw UsageError(
                "providerfs mount: unknown mount option '\(unknown)'"
                    + (unknown.lowercased().contains("token") ? " (require-token mode is '-o require_token')." : "."))
        }
        let readyTimeout = try arguments.duration("--ready-timeout") ?? .seconds(60)
        let stallTimeout = try arguments.duration("--stall-timeout")
        if let stallTimeout, stallTimeout < .milliseconds(1) {
            throw UsageError("providerfs mount: --stall-timeout must be at least 1ms.")
        }
        let writeBackDelay = try arguments.duration("--write-back-delay")
        let pollInterval = try pollIntervalArgument(&arguments)
        let lockTimeout = try arguments.duration("--lock-timeout")
        if let lockTimeout, lockTimeout < .seconds(1) || lockTimeout > .seconds(3600) {
            throw UsageError("providerfs mount: --lock-timeout must be between 1s and 1h.")
        }
        if let writeBackDelay, writeBackDelay > .seconds(3600) {
            throw UsageError("providerfs mount: --write-back-delay must be at most 1h.")
        }
        let cacheMaximumSize = try arguments.size("--cache-max-size")
        let cacheMinimumFree = try arguments.size("--cache-min-free")
        let cacheMaximumAge = try arguments.duration("--cache-max-age")
        if let cacheMaximumSize, cacheMaximumSize < 1 << 20 {
            throw UsageError("providerfs mount: --cache-max-size must be at least 1M.")
        }
        if let cacheMaximumAge, cacheMaximumAge < .seconds(1) {
            throw UsageError("providerfs mount: --cache-max-age must be at least 1s.")
        }
        func names(_ text: String?) -> [String] {
            (text ?? "").split(whereSeparator: { $0 == "," || $0 == ":" }).map(String.init).filter { !$0.isEmpty }
        }
        var noDownloadFor: [String] = []
        while let value = try arguments.option("--no-download-for") { noDownloadFor += names(value) }
        var downloadFor: [String] = []
        while let value = try arguments.option("--download-for") { downloadFor += names(value) }
        // Internal: the write end of the readiness pipe, passed by the background parent.
        let readyFD = try arguments.option("--ready-fd").map { text throws(UsageError) -> Int32 in
            guard let fd = Int32(text), fd > 2 else { throw UsageError("providerfs mount: bad --ready-fd '\(text)'.") }
            return fd
        }
        let mountpointArgument = try arguments.requiredPositional("MOUNTPOINT")
        try arguments.finish()
        guard [demo, sourceArgument != nil, webdavArgument != nil].filter({ $0 }).count == 1 else {
            throw UsageError("providerfs mount: give exactly one of --demo, --source DIR or --webdav URL.")
        }
        if webdavArgument == nil,
            userArgument != nil || passwordFileArgument != nil || caFileArgument != nil || lockTimeout != nil
                || checksumLimit != nil || parallelRanges != nil || ctagCoversSubtree
        {
            throw UsageError(
                "providerfs mount: --user, --password-file, --ca-file, --lock-timeout, --checksum-limit, "
                    + "--parallel-ranges and --ctag-covers-subtree go with --webdav URL."
            )
        }

        let reporter = ReadinessReporter(fd: readyFD)
        do {
            var webdav = try webdavArgument.map { url throws(CommandFailure) in
                try webdavSource(
                    url: url, user: userArgument, passwordFile: passwordFileArgument, caFile: caFileArgument)
            }
            webdav?.checksumLimit = checksumLimit
            webdav?.parallelRanges = parallelRanges
            webdav?.ctagCoversSubtree = ctagCoversSubtree
            var plan = try prepare(
                demo: demo, source: sourceArgument ?? webdav?.location.description, mountpoint: mountpointArgument,
                cache: cacheArgument, log: logArgument, allowOther: allowOther, remote: webdav != nil)
            plan.webdav = webdav
            plan.passthrough = !noPassthrough
            plan.readOnly = readOnly
            plan.requireToken = requireToken
            plan.stallTimeout = stallTimeout
            plan.writeBackDelay = writeBackDelay
            plan.pollInterval = pollInterval
            plan.lockTimeout = lockTimeout
            plan.cacheMaximumSize = cacheMaximumSize
            plan.cacheMinimumFree = cacheMinimumFree
            plan.cacheMaximumAge = cacheMaximumAge
            plan.allowAllDownloads = downloadFor.contains("all")
            plan.downloadFor = downloadFor.filter { $0 != "all" }
            plan.noDownloadFor = noDownloadFor
            if plan.cleanedStaleMounts > 0 {
                io.error("providerfs mount: cleaned up the stale mount at \(plan.mountpoint) (its daemon was gone)")
            }
            if foreground {
                return try await serve(plan, reporter: reporter, io: io)
            }
            return try startDaemon(plan, timeout: readyTimeout, io: io)
        } catch let failure as CommandFailure {
            reporter.fail(failure.message)
            throw failure
        }
    }

    /// `--poll-interval DURATION` (`0` or `off`: never poll), at least 100ms otherwise.
    static func pollIntervalArgument(_ arguments: inout ArgumentList) throws(UsageError) -> Duration? {
        guard let text = try arguments.option("--poll-interval") else { return nil }
        if text == "0" || text == "off" { return .zero }
        let interval: Duration
        do { interval = try parseDuration(text) } catch {
            throw UsageError("providerfs mount: --poll-interval: \(error).")
        }
        guard interval == .zero || interval >= .milliseconds(100) else {
            throw UsageError("providerfs mount: --poll-interval must be 0 (off) or at least 100ms.")
        }
        return interval
    }

    /// `duration` as the daemon's command line gives it back to `parseDuration`: whole
    /// milliseconds (the finest unit a duration is written in), at least 1.
    static func durationArgument(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return "\(max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000))ms"
    }

    /// The environment variable a WebDAV password may come from (D-418).
    static let webdavPasswordVariable = "PROVIDERFS_WEBDAV_PASSWORD"

    /// `--webdav URL` checked (http or https, no credentials in it, …), the password and CA files
    /// made absolute and checked readable.
    static func webdavSource(
        url: String, user: String?, passwordFile: String?, caFile: String? = nil
    ) throws(CommandFailure) -> WebDAVSource {
        let location: WebDAVLocation
        do { location = try WebDAVLocation(url) } catch {
            throw CommandFailure("bad --webdav URL: \(error.description)")
        }
        var file: String?
        if let passwordFile {
            let path = mountPointPath(passwordFile)
            guard access(path, R_OK) == 0 else {
                throw CommandFailure("cannot read the password file \(path): \(Errno.current.message)")
            }
            file = path
        }
        var trusted: String?
        if let caFile {
            let path = mountPointPath(caFile)
            guard access(path, R_OK) == 0 else {
                throw CommandFailure("cannot read the CA file \(path): \(Errno.current.message)")
            }
            trusted = path
        }
        return WebDAVSource(location: location, user: user, passwordFile: file, caFile: trusted)
    }

    /// The daemon's connection settings for `source`: the password from its file (one trailing
    /// newline dropped) or from `PROVIDERFS_WEBDAV_PASSWORD`, never from the command line.
    static func webdavConfiguration(_ source: WebDAVSource) throws(CommandFailure) -> WebDAVConfiguration {
        var configuration = WebDAVConfiguration(location: source.location, user: source.user)
        configuration.caFile = source.caFile
        if let limit = source.checksumLimit { configuration.checksumLimit = limit }
        if let count = source.parallelRanges { configuration.parallelRanges = count }
        configuration.ctagCoversSubtree = source.ctagCoversSubtree
        if let file = source.passwordFile {
            guard var password = readTextFile(file) else {
                throw CommandFailure("cannot read the password file \(file): \(Errno.current.message)")
            }
            if password.hasSuffix("\n") { password.removeLast() }
            if password.hasSuffix("\r") { password.removeLast() }
            configuration.password = password
        } else if let password = currentEnvironment()[webdavPasswordVariable] {
            configuration.password = password
        }
        return configuration
    }

    /// Resolves paths and checks everything that can be checked before mounting. `remote`: the
    /// source is a URL (nothing local to check).
    static func prepare(
        demo: Bool, source: String?, mountpoint: String, cache: String?, log: String?, allowOther: Bool,
        remote: Bool = false
    ) throws -> Plan {
        var sourcePath: String
        if remote {
            sourcePath = source!
        } else if demo {
            // The demo directory holds the generated tree (`source/`) and its fault manifest.
            do { sourcePath = try DemoSource.ensure(at: UserDirectories.demoSource).sourceDirectory } catch {
                throw CommandFailure("cannot create the demo source in \(UserDirectories.demoSource): \(error)")
            }
        } else {
            sourcePath = source!
        }
        if !remote {
            var info = stat()
            if stat(sourcePath, &info) == 0, info.st_mode & S_IFMT == S_IFDIR {
                sourcePath = canonicalPath(sourcePath) ?? sourcePath
            } else {
                // Missing (a disk not plugged in, a share down): an offline start from the stored
                // metadata when the cache directory already caches this source (D-434).
                let failure = Errno.current
                let absolute = mountPointPath(sourcePath)
                let offlineCache = cache.map { mountPointPath($0) } ?? UserDirectories.defaultCache(forSource: absolute)
                guard !demo, MountComposition.canStartOffline(source: absolute, cacheDirectory: offlineCache) else {
                    if stat(sourcePath, &info) == 0 {
                        throw CommandFailure("the source \(sourcePath) is not a directory")
                    }
                    throw CommandFailure("the source \(sourcePath) does not exist (\(failure.message))")
                }
                sourcePath = absolute
            }
        }

        let mountpointPath = mountPointPath(mountpoint)
        var state = inspectMountPoint(mountpoint)
        // A stale ProviderFS mount (its daemon crashed) is cleaned and the mount point checked
        // again (a stack of them, one at a time); any other stale mount is refused (D-286).
        var cleaned = 0
        while state == .stale, cleaned < 8 {
            try cleanStaleProviderFSMount(mountpoint)
            cleaned += 1
            state = inspectMountPoint(mountpoint)
        }
        switch state {
        case .usable: break
        case .missing:
            throw CommandFailure(
                "the mount point \(mountpoint) does not exist; create it with 'mkdir -p \(mountpoint)'")
        case .notADirectory:
            throw CommandFailure("the mount point \(mountpoint) is not a directory")
        case .notEmpty:
            throw CommandFailure("the mount point \(mountpoint) is not empty; mount on an empty directory")
        case .stale:
            throw CommandFailure(staleMountAdvice(mountpoint))
        case .mounted(let type):
            throw CommandFailure(
                "\(mountpoint) is already mounted (\(type)); unmount it first with 'providerfs unmount \(mountpoint)'")
        case .inaccessible(let error):
            throw CommandFailure("cannot use the mount point \(mountpoint): \(error.message)")
        }
        if !remote, sourcePath == mountpointPath || sourcePath.hasPrefix(mountpointPath + "/") {
            throw CommandFailure("the source \(sourcePath) cannot be inside the mount point \(mountpointPath)")
        }

        let cacheDirectory = cache.map { mountPointPath($0) } ?? UserDirectories.defaultCache(forSource: sourcePath)
        if cacheDirectory == mountpointPath || cacheDirectory.hasPrefix(mountpointPath + "/") {
            throw CommandFailure("the cache directory \(cacheDirectory) cannot be inside the mount point")
        }
        do { try makeDirectories(cacheDirectory, mode: 0o700) } catch {
            throw CommandFailure("cannot create the cache directory \(cacheDirectory): \(error.errno.message)")
        }
        var space = statvfs()
        if statvfs(cacheDirectory, &space) == 0 {
            let available = Int64(space.f_bavail) * Int64(space.f_frsize)
            if available < minimumCacheSpace {
                throw CommandFailure(
                    "the cache directory \(cacheDirectory) is on a full disk (\(formatSize(available)) free, "
                        + "\(formatSize(minimumCacheSpace)) needed); free some space or choose another with --cache DIR"
                )
            }
        }
        let logFile = log.map { mountPointPath($0) } ?? MountRegistry.logFile(for: mountpointPath)
        return Plan(
            source: sourcePath, demo: demo, mountpoint: mountpointPath, cacheDirectory: cacheDirectory,
            logFile: logFile,
            allowOther: allowOther, cleanedStaleMounts: cleaned)
    }

    // MARK: Foreground: the daemon itself

    static func serve(_ plan: Plan, reporter: ReadinessReporter, io: CommandIO) async throws -> Int32 {
        LoggingSystem.bootstrap(sink: FileDescriptorLogSink(fd: 2), level: logLevel())
        let logger = Logger(label: "mount")
        // The daemon's code mapped before the mount is visible, so no request waits for the disk
        // to bring a page of it that the page cache dropped (D-531).
        let populated = ExecutablePages.populate()
        logger.debug("executable: \(populated >> 10) KiB of code and read-only data mapped")
        let fileSystem: ProviderFileSystem
        let faults: FaultPlan
        let tokens: TokenAuthority
        // A WebDAV server is asked for its root before mounting: a wrong URL, a server that is
        // down or refuses the credentials fails the mount with the reason. A server that cannot
        // be reached (no network, the server down) is an offline start from the stored metadata
        // when the cache already caches this URL (D-511, as D-434 for a missing directory).
        let webdav = try plan.webdav.map { source throws(CommandFailure) in try webdavConfiguration(source) }
        var startedOffline = false
        if let webdav {
            do {
                let root = try await WebDAVProvider(configuration: webdav).item(for: .root)
                guard root.kind == .directory else {
                    throw CommandFailure("\(webdav.location) is not a WebDAV collection")
                }
            } catch let failure as CommandFailure {
                throw failure
            } catch {
                let problem = ProviderError.from(error)
                guard problem.code == .unreachable || problem.code == .timedOut,
                    MountComposition.cacheRecords(plan.source, cacheDirectory: plan.cacheDirectory)
                else {
                    throw CommandFailure("cannot use the WebDAV server \(webdav.location): \(problem.message)")
                }
                logger.warning(
                    "the WebDAV server \(webdav.location) cannot be reached (\(problem.message)): "
                        + "starting offline from the stored metadata in \(plan.cacheDirectory)")
                startedOffline = true
            }
        }
        // Coordination across machines (D-451): a WebDAV mount's write claims take the server's
        // lock on the item too; the provider that holds the locks is the one that writes.
        let webdavProvider = webdav.map { WebDAVProvider(configuration: $0) }
        let remoteLocks = webdavProvider.map { provider in
            MountRemoteLocks(
                provider: provider, timeout: plan.lockTimeout ?? MountRemoteLocks.defaultTimeout,
                owner: "providerfs on \(ProcessInfo.processInfo.hostName), pid \(getpid()), \(plan.mountpoint)")
        }
        // The coordination server for paths under this mount: clients (the FileCoordination library,
        // `providerfs coordinate`, `providerfs claims`) find it from the mount point.
        let coordination = CoordinationServer(
            socketPath: CoordinationServer.socketPath(forMountPoint: plan.mountpoint),
            log: { message in Logger(label: "coordination").info(TokenRedaction.redacted(message)) },
            // Claims on access paths name tokens: `providerfs claims` shows `<token>` (D-318).
            redactPaths: TokenRedaction.redacted,
            // Coordination clients' write claims take the server's locks too (D-451).
            claimGate: remoteLocks.map { MountRemoteLockGate(locks: $0, mountpoint: plan.mountpoint) })
        do { try coordination.start() } catch {
            throw CommandFailure("cannot start the mount's coordination server: \(error.message)")
        }
        defer { coordination.stop() }
        let claims = MountReadClaims(
            server: coordination, mountpoint: plan.mountpoint, deadline: CoordinationDeadlines.default.claimWait)
        let namespaceClaims = MountNamespaceClaims(
            server: coordination, mountpoint: plan.mountpoint, deadline: CoordinationDeadlines.default.claimWait,
            readClaims: claims)
        let evictionClaims = MountEvictionClaims(
            server: coordination, mountpoint: plan.mountpoint, deadline: MountEvictionClaims.defaultDeadline)
        let writeClaims: any WriteClaimProvider =
            remoteLocks.map {
                RemoteLockingWriteClaims(base: claims, locks: $0, deadline: CoordinationDeadlines.default.claimWait)
            } ?? claims
        do {
            var fileSystemOptions = FileSystemOptions()
            if let stallTimeout = plan.stallTimeout { fileSystemOptions.cache.stallTimeout = stallTimeout }
            if plan.requireToken { fileSystemOptions.plainPaths = MountPlainPaths() }
            // Writable unless --read-only (D-376; D-350 kept it off while writing was being built).
            fileSystemOptions.writable = !plan.readOnly
            // The write-back settle (off unless asked), and how long an unmount waits for the
            // uploads it starts or finds running (D-405).
            if let delay = plan.writeBackDelay {
                fileSystemOptions.cache.uploadSettle = delay
                fileSystemOptions.cache.maximumUploadSettle = max(delay, .seconds(5))
            }
            fileSystemOptions.cache.shutdownFlush = .seconds(10)
            fileSystemOptions.cache.maximumSize = plan.cacheMaximumSize
            fileSystemOptions.cache.minimumFree = plan.cacheMinimumFree
            fileSystemOptions.cache.maximumAge = plan.cacheMaximumAge
            if !plan.allowAllDownloads {
                fileSystemOptions.downloads = MountDownloadPolicy(
                    refused: plan.noDownloadFor, allowed: plan.downloadFor)
            }
            (fileSystem, faults, tokens) = try MountComposition.makeMount(
                source: plan.source, cacheDirectory: plan.cacheDirectory, demo: plan.demo, options: fileSystemOptions,
                claims: ClaimPorts(
                    reads: claims, writes: writeClaims, namespace: namespaceClaims, evictions: evictionClaims),
                webdav: webdav,
                webdavProvider: webdavProvider,
                // Presenters hear what the provider changed (D-403).
                providerChanges: MountProviderChanges(server: coordination, mountpoint: plan.mountpoint))
        } catch {
            throw CommandFailure("cannot open the provider: \(error.message)")
        }
        let options = FUSEMountOptions(
            fileSystemName: plan.demo ? "providerfs-demo" : plan.source, subtype: "providerfs",
            allowOther: plan.allowOther,
            // A read-only mount is read-only for the kernel too (MS_RDONLY): every change fails with
            // EROFS before any permission check, for root and for an ordinary user alike (without
            // it an ordinary user's create met the r-x modes first and got EACCES).
            readOnly: !fileSystem.isWritable,
            debug: currentEnvironment()["PROVIDERFS_FUSE_DEBUG"] == "1",
            passthrough: plan.passthrough,
            // Every handle of a writable mount is direct I/O (D-363): without this mmap(MAP_SHARED)
            // of any file there fails with ENODEV (D-376).
            directIOMmap: fileSystem.isWritable)
        let record = MountRecord(
            pid: getpid(), processStartTime: ProcessInfoFiles.startTime(of: getpid()) ?? 0,
            mountpoint: plan.mountpoint,
            source: plan.source, demo: plan.demo, cacheDirectory: plan.cacheDirectory, logFile: plan.logFile,
            version: ProviderFSCLI.version, startedAt: Date(), requireToken: plan.requireToken)
        // The control socket (docs/CONTROL.md): `providerfs status MOUNTPOINT`, `download`. Bound
        // before the kernel mount, so a client that sees the mount finds its socket.
        // Recorded while the server answers, for a later offline start (D-511).
        if webdav != nil, !startedOffline { MountComposition.recordSource(plan.source, in: plan.cacheDirectory) }
        let control = makeControlServer(
            plan, fileSystem: fileSystem, faults: faults, tokens: tokens,
            evictionClaims: evictionClaims, remoteLocks: remoteLocks, startedOffline: startedOffline)
        if let control {
            do { try control.start() } catch {
                logger.warning("cannot start the control socket \(control.socketPath): \(error.errno.message)")
            }
        }
        defer { control?.stop() }
        remoteLocks?.start(cache: fileSystem.cache)
        // Remote changes (D-450): listings asked again every interval, for the life of the mount.
        let pollInterval = plan.pollInterval ?? MountPolling.defaultInterval(remote: plan.webdav != nil)
        let polling =
            pollInterval > .zero
            ? MountPolling(catalog: fileSystem.cache.catalog, interval: pollInterval, logger: logger) : nil
        let server = FUSEServer(fileSystem: fileSystem, mountpoint: plan.mountpoint, options: options) {
            do { try MountRegistry.write(record) } catch {
                logger.warning("cannot write the mount registry: \(error)")
            }
            logger.notice(
                "ready: \(plan.source) mounted at \(plan.mountpoint), cache \(plan.cacheDirectory)"
                    + (plan.requireToken
                        ? "; require-token mode: plain paths only for this user's providerfs commands" : ""))
            reporter.ready()
        }
        defer { MountRegistry.remove(mountpoint: plan.mountpoint) }
        // Audit entries of uses still waiting for the flusher are written before the daemon ends (D-347).
        defer { tokens.flushAuditLog() }
        let ran: Result<FUSEExit, FUSEServerError>
        do { ran = .success(try await server.run()) } catch { ran = .failure(error) }
        await polling?.stop()
        await remoteLocks?.stop()
        do {
            let end = try ran.get()
            logger.notice(
                "unmounted \(plan.mountpoint)"
                    + (end.signal.map { " after signal \($0)" } ?? "")
                    + (end.abandonedRequests > 0 ? "; \(end.abandonedRequests) pending requests answered EIO" : ""))
            return ExitStatus.success
        } catch {
            throw CommandFailure(error.message)
        }
    }

    static func logLevel() -> LogLevel {
        switch currentEnvironment()["PROVIDERFS_LOG_LEVEL"] {
        case "trace": .trace
        case "debug": .debug
        case "warning": .warning
        default: .info
        }
    }

    // MARK: Background: start the daemon and wait until it is ready

    static func startDaemon(_ plan: Plan, timeout: Duration, io: CommandIO) throws -> Int32 {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw CommandFailure("cannot create a pipe: \(Errno.current.message)") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        // pipe2 is hidden from Swift; nothing else spawns in this process, so setting close-on-exec
        // right after pipe() cannot leak the ends into another child.
        _ = fcntl(readEnd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(writeEnd, F_SETFD, FD_CLOEXEC)
        defer { close(readEnd) }
        let logDirectory = String(plan.logFile[..<(plan.logFile.lastIndex(of: "/") ?? plan.logFile.endIndex)])
        if !logDirectory.isEmpty { try? makeDirectories(logDirectory, mode: 0o700) }

        let executable = canonicalPath("/proc/self/exe") ?? CommandLine.arguments[0]
        var arguments = [
            executable, "mount", plan.demo ? "--demo" : "--source=\(plan.source)", "--cache=\(plan.cacheDirectory)",
            "--log=\(plan.logFile)", "--foreground", "--ready-fd=3", plan.mountpoint,
        ]
        if plan.demo { arguments.removeAll { $0 == "--source=\(plan.source)" } }
        if let webdav = plan.webdav {
            // The password stays out of the daemon's command line: its file, or the environment
            // the daemon inherits.
            arguments[2] = "--webdav=\(webdav.location)"
            if let user = webdav.user { arguments.append("--user=\(user)") }
            if let file = webdav.passwordFile { arguments.append("--password-file=\(file)") }
            if let file = webdav.caFile { arguments.append("--ca-file=\(file)") }
            if let limit = webdav.checksumLimit { arguments.append("--checksum-limit=\(limit)") }
            if let count = webdav.parallelRanges { arguments.append("--parallel-ranges=\(count)") }
            if webdav.ctagCoversSubtree { arguments.append("--ctag-covers-subtree") }
        }
        if plan.allowOther { arguments.append("--allow-other") }
        if !plan.passthrough { arguments.append("--no-passthrough") }
        if plan.readOnly { arguments.append("--read-only") }
        if plan.requireToken { arguments.append("--require-token") }
        if let stallTimeout = plan.stallTimeout {
            arguments.append("--stall-timeout=" + durationArgument(stallTimeout))
        }
        if let writeBackDelay = plan.writeBackDelay {
            arguments.append("--write-back-delay=" + durationArgument(writeBackDelay))
        }
        if let lockTimeout = plan.lockTimeout { arguments.append("--lock-timeout=" + durationArgument(lockTimeout)) }
        if let pollInterval = plan.pollInterval {
            arguments.append("--poll-interval=" + (pollInterval == .zero ? "0" : durationArgument(pollInterval)))
        }
        if let size = plan.cacheMaximumSize { arguments.append("--cache-max-size=\(size)") }
        if let size = plan.cacheMinimumFree { arguments.append("--cache-min-free=\(size)") }
        if let age = plan.cacheMaximumAge { arguments.append("--cache-max-age=" + durationArgument(age)) }
        if !plan.noDownloadFor.isEmpty {
            arguments.append("--no-download-for=" + plan.noDownloadFor.joined(separator: ","))
        }
        if plan.allowAllDownloads {
            arguments.append("--download-for=all")
        } else if !plan.downloadFor.isEmpty {
            arguments.append("--download-for=" + plan.downloadFor.joined(separator: ","))
        }

        let pid: pid_t
        do {
            pid = try spawnDetached(arguments, logFile: plan.logFile, readyFD: writeEnd)
        } catch {
            close(writeEnd)
            throw error
        }
        close(writeEnd)

        switch waitForReadiness(readEnd, timeout: timeout) {
        case .ready:
            if io.json {
                io.emit(
                    Output(
                        mountpoint: plan.mountpoint, source: plan.source, cacheDirectory: plan.cacheDirectory,
                        logFile: plan.logFile, pid: pid))
            } else {
                io.line(
                    "Mounted \(plan.demo ? "the demo provider" : plan.source) at \(plan.mountpoint) (daemon pid \(pid))."
                )
                io.line("Try:")
                let suggestions = suggestions(plan)
                let width = suggestions.map(\.0.count).max() ?? 0
                for (command, effect) in suggestions {
                    io.line("  " + command.padding(toLength: width, withPad: " ", startingAt: 0) + "   # " + effect)
                }
                io.line("Log: \(plan.logFile)")
                io.line("Unmount: providerfs unmount \(plan.mountpoint)")
            }
            return ExitStatus.success
        case .failed(let message):
            reap(pid)
            // libfuse writes its reason to the daemon's stderr (the log) only: show it.
            let log = message.contains("daemon's log") ? tail(plan.logFile, lines: 5) : ""
            throw CommandFailure(log.isEmpty ? message : "\(message)\nlast lines of \(plan.logFile):\n\(log)")
        case .exitedSilently:
            reap(pid)
            throw CommandFailure(
                "the daemon exited before the mount was ready; see \(plan.logFile):\n\(tail(plan.logFile))")
        case .timedOut:
            // Do not leave a half-started daemon behind: stop it and clean up the mount.
            kill(pid, SIGTERM)
            reap(pid, wait: .seconds(5))
            if MountTable.entry(at: plan.mountpoint) != nil { _ = runHelper(fusermountPath, ["-uz", plan.mountpoint]) }
            MountRegistry.remove(mountpoint: plan.mountpoint)
            throw CommandFailure("the mount was not ready within \(timeout.humanReadable); see \(plan.logFile)")
        }
    }

    enum Readiness { case ready, failed(String), exitedSilently, timedOut }

    /// What to try right after mounting (concrete items for the demo).
    static func suggestions(_ plan: Plan) -> [(String, String)] {
        let m = plan.mountpoint.contains(" ") ? "'\(plan.mountpoint)'" : plan.mountpoint
        if plan.requireToken {
            // Other programs get EACCES on plain paths: the way in is a token's access path.
            return [
                ("providerfs token grant \(m)/\(plan.demo ? "README.txt" : "FILE")", "prints the path apps may open"),
                ("cat \(m)/\(plan.demo ? "README.txt" : "FILE")", "refused (EACCES): plain paths need a token"),
                ("providerfs status \(m)", "the mount, in require-token mode"),
            ]
        }
        guard plan.demo else {
            return [
                ("ls -l \(m)", "placeholders: real sizes, nothing downloaded"),
                ("providerfs status \(m)/FILE", "state, progress, version, last error"),
                ("cat \(m)/FILE", "downloads only what is read"),
                ("providerfs download \(m)/FILE", "materializes it, with progress"),
            ] + (plan.readOnly ? [] : [("cp FILE \(m)/", "written through; uploaded to the source in the background")])
        }
        return [
            ("ls -lR \(m)", "placeholders: real sizes, nothing downloaded"),
            ("cat \(m)/README.txt", "downloads only what is read"),
            ("head -c 60 \(m)/Large/sparse-1GiB.bin", "the first bytes of 1 GiB, at once"),
            ("providerfs status \(m)/Large/sparse-1GiB.bin", "state, progress, version, last error"),
            ("getfattr -d \(m)/README.txt", "the same state as extended attributes"),
            ("providerfs download \(m)/Documents", "materializes a folder, with progress"),
            ("cat \(m)/Faults/fails-halfway.bin", "fails halfway with 'Input/output error'"),
        ] + (plan.readOnly ? [] : [("echo hi > \(m)/Documents/hi.txt", "written through; uploaded in the background")])
            + [
                ("providerfs fault add \(m)/Projects --stall 5s", "the provider stalls on cue; fault clear --all")
            ]
    }

    static func waitForReadiness(_ fd: Int32, timeout: Duration) -> Readiness {
        let deadline = ContinuousClock.now + timeout
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return .timedOut }
            var pollFD = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(min(remaining.seconds * 1000, 1000))
            let rc = poll(&pollFD, 1, max(milliseconds, 1))
            if rc < 0 && errno == EINTR { continue }
            if rc == 0 { continue }
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            received += buffer[0..<count]
            if received.contains(UInt8(ascii: "\n")) { break }
        }
        let text = String(decoding: received, as: UTF8.self)
        if text.hasPrefix("READY") { return .ready }
        if text.hasPrefix("ERROR ") {
            return .failed(String(text.dropFirst(6)).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return .exitedSilently
    }

    /// posix_spawn in a new session (setsid), stdin from /dev/null, stdout+stderr appended to the
    /// log, the readiness pipe as fd 3 and no other descriptor, an empty signal mask and default dispositions.
    static func spawnDetached(_ arguments: [String], logFile: String, readyFD: Int32) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, logFile, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        posix_spawn_file_actions_adddup2(&actions, readyFD, 3)
        closeDescriptors(from: 4, in: &actions)

        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = withCleanSpawnAttributes(newSession: true) {
            posix_spawn(&pid, arguments[0], &actions, $0, argv, environ)
        }
        guard rc == 0 else { throw CommandFailure("cannot start the daemon: \(Errno(rc).message)") }
        return pid
    }

    /// Collects an exited daemon child so it does not linger as a zombie of this process.
    static func reap(_ pid: pid_t, wait: Duration = .seconds(2)) {
        let deadline = ContinuousClock.now + wait
        var status: Int32 = 0
        while ContinuousClock.now < deadline {
            if waitpid(pid, &status, WNOHANG) != 0 { return }
            usleep(20_000)
        }
    }

    static func tail(_ path: String, lines: Int = 10) -> String {
        let text = readTextFile(path) ?? ""
        return text.split(separator: "\n").suffix(lines).joined(separator: "\n")
    }
}

/// The daemon's side of the readiness handshake (a no-op without --ready-fd).
struct ReadinessReporter: Sendable {
    let fd: Int32?

    func ready() { send("READY\n") }

    func fail(_ message: String) { send("ERROR \(message)\n") }

    private func send(_ text: String) {
        guard let fd else { return }
        let bytes = Array(text.utf8)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}
