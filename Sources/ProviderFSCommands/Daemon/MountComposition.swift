// The composition root of a mount: the one place that chooses concrete providers (a local
// directory, the fault wrapper), the metadata store (SQLite) and builds the ProviderCache and the
// ProviderFileSystem over them. The layers below know only their protocols (`Provider`,
// `MetadataStore`, `ReadClaimProvider`); a new provider (WebDAV, `makeFileSystem(webdav:)`) or
// wrapper (access tokens) is added here.

package import AccessTokens
import Diagnostics
import Foundation
import LocalProvider
package import ProviderCache
package import ProviderFaults
package import ProviderModel
import SystemSupport
package import VirtualFileSystem
package import WebDAVProvider

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

package enum MountComposition {
    /// The file system a mount serves, and its faults: for the demo, the generated demo source
    /// (its `source/` directory, under `UserDirectories.demoSource`); otherwise `source`. The
    /// faults are stored in `<cacheDirectory>/faults.json` (`providerfs fault`), seeded for the
    /// demo with its failing item when that file is first created.
    static func makeMount(
        source: String, cacheDirectory: String, demo: Bool, options: FileSystemOptions = FileSystemOptions(),
        claims: ClaimPorts = ClaimPorts(), webdav: WebDAVConfiguration? = nil,
        webdavProvider: WebDAVProvider? = nil, providerChanges: (any ProviderChangeListener)? = nil
    ) throws(FileSystemError) -> (fileSystem: ProviderFileSystem, faults: FaultPlan, tokens: TokenAuthority) {
        // One authority: the control handler's token commands and the file system's access paths
        // (`MountScopedAccess`) see the same tokens.
        try ensureCacheDirectory(cacheDirectory)
        let tokens = openTokenAuthority(in: cacheDirectory)
        let scopedAccess = MountScopedAccess(authority: tokens)
        if demo {
            let (fileSystem, _, faults) = try makeDemoMount(
                demoDirectory: UserDirectories.demoSource, cacheDirectory: cacheDirectory, options: options,
                claims: claims, scopedAccess: scopedAccess, providerChanges: providerChanges)
            return (fileSystem, faults, tokens)
        }
        let faults = try storedFaults(in: cacheDirectory)
        let fileSystem = try makeFileSystem(
            source: source, cacheDirectory: cacheDirectory, options: options, faults: faults, claims: claims,
            scopedAccess: scopedAccess, webdav: webdav, webdavProvider: webdavProvider,
            providerChanges: providerChanges)
        return (fileSystem, faults, tokens)
    }

    /// The mount's scoped access tokens (docs/TOKENS.md), kept hashed in `<cacheDirectory>`
    /// (`tokens.db`, `tokens-audit.jsonl`), on the monotonic clock. The cache directory exists
    /// (`ensureCacheDirectory`).
    package static func openTokenAuthority(in cacheDirectory: String) -> TokenAuthority {
        TokenAuthority(
            storeDirectory: cacheDirectory, clock: ContinuousClock(),
            log: { message in Logger(label: "tokens").warning(message) })
    }

    /// The fault plan of the mount caching in `cacheDirectory` (created if needed):
    /// `faults.json` there, created holding `seed` when missing.
    package static func storedFaults(
        in cacheDirectory: String, seed: [FaultRule] = []
    ) throws(FileSystemError) -> FaultPlan {
        try ensureCacheDirectory(cacheDirectory)
        return FaultPlan.stored(
            at: cacheDirectory + "/" + faultStoreName, seed: seed,
            log: { message in Logger(label: "faults").warning(message) })
    }

    /// Creates the cache directory (mode 0700) if needed.
    package static func ensureCacheDirectory(_ cacheDirectory: String) throws(FileSystemError) {
        do {
            try makeDirectories(cacheDirectory, mode: 0o700)
        } catch {
            throw FileSystemError(.io, "cannot create the cache directory \(cacheDirectory): \(error.errno.message)")
        }
    }

    /// The name of a mount's fault store in its cache directory.
    package static let faultStoreName = "faults.json"

    /// A file system serving `source` (a local directory acting as the remote; never modified),
    /// caching in `cacheDirectory` (created if needed): `metadata.sqlite` there holds items and range
    /// maps, `content/` the sparse files. Reopening the same cache directory finds everything again.
    ///
    /// - Parameters:
    ///   - faults: the faults to inject into provider calls; nil: the plan stored in the cache
    ///     directory (every mount's provider is wrapped in `FaultInjectingProvider`).
    ///   - claims: the coordination ports: read claims of opens, write claims, namespace claims.
    ///   - scopedAccess: checks access paths (`.scoped/<token>/…`); nil: the mount has none.
    ///   - webdav: the provider is this WebDAV server (`source` is then only its name);
    ///     `webdavProvider`: the one to use for it (the mount's server locks share it, D-451).
    ///   - providerChanges: hears of changes the provider made (the mount's presenters, D-403).
    /// - Throws: `.notFound` / `.notADirectory` for a bad source, `.io` for a cache directory that
    ///   cannot be created or a metadata store that cannot be opened; the message says which.
    package static func makeFileSystem(
        source: String, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        faults: FaultPlan? = nil, claims: ClaimPorts = ClaimPorts(),
        clock: any Clock<Duration> = ContinuousClock(), scopedAccess: (any ScopedAccessProvider)? = nil,
        webdav: WebDAVConfiguration? = nil, webdavProvider: WebDAVProvider? = nil,
        providerChanges: (any ProviderChangeListener)? = nil
    ) throws(FileSystemError) -> ProviderFileSystem {
        let plan: FaultPlan
        if let faults { plan = faults } else { plan = try storedFaults(in: cacheDirectory) }
        let provider =
            if let webdav {
                FaultInjectingProvider(
                    wrapping: webdavProvider ?? WebDAVProvider(configuration: webdav), plan: plan, clock: clock)
            } else {
                try makeProvider(source: source, faults: plan, clock: clock, cacheDirectory: cacheDirectory)
            }
        let offline = webdav == nil && !sourceIsPresent(source)
        let store = try openMetadataStore(in: cacheDirectory)
        // Recorded while the source is here, for a later offline start (D-434).
        if webdav == nil, !offline { recordSource(source, in: cacheDirectory) }
        if offline {
            Logger(label: "mount").warning(
                "the source \(source) is not available: starting offline from the stored metadata in \(cacheDirectory)")
        }
        do {
            let cache = try ProviderCache(
                provider: provider, directory: cacheDirectory, store: store, clock: clock, options: options.cache,
                providerChanges: providerChanges)
            return ProviderFileSystem(cache: cache, options: options, claims: claims, scopedAccess: scopedAccess)
        } catch {
            throw FileSystemError(error)
        }
    }

    /// The demo: ensures the demo source under `demoDirectory` (default
    /// `DemoSource.defaultDirectory()`, created on first use) and serves it with its faults (the
    /// item that fails halfway, a stored fault seeded when the cache's fault store is created).
    /// Returns the file system and the demo (for messages: where the source lives, which item fails).
    package static func makeDemo(
        demoDirectory: String? = nil, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        claims: ClaimPorts = ClaimPorts()
    ) throws(FileSystemError) -> (ProviderFileSystem, DemoSource) {
        let (fileSystem, demo, _) = try makeDemoMount(
            demoDirectory: demoDirectory, cacheDirectory: cacheDirectory, options: options, claims: claims)
        return (fileSystem, demo)
    }

    static func makeDemoMount(
        demoDirectory: String?, cacheDirectory: String, options: FileSystemOptions, claims: ClaimPorts,
        scopedAccess: (any ScopedAccessProvider)? = nil, providerChanges: (any ProviderChangeListener)? = nil
    ) throws(FileSystemError) -> (ProviderFileSystem, DemoSource, FaultPlan) {
        let demo: DemoSource
        do {
            demo = try DemoSource.ensure(at: demoDirectory ?? DemoSource.defaultDirectory())
        } catch {
            throw FileSystemError(.io, "cannot create the demo source: \(error)")
        }
        let faults = try storedFaults(in: cacheDirectory, seed: demo.faults)
        let fileSystem = try makeFileSystem(
            source: demo.sourceDirectory, cacheDirectory: cacheDirectory, options: options, faults: faults,
            claims: claims, scopedAccess: scopedAccess, providerChanges: providerChanges)
        return (fileSystem, demo, faults)
    }

    /// The provider for `source`: a local directory, wrapped in `faults` when given (the wrapper
    /// keeps every capability of the local provider: lookups, tracking, pushes, immediate metadata;
    /// with no rule it hands out the local streams untouched).
    /// A source that is missing (or is no directory) is refused unless `cacheDirectory` may start
    /// offline for it (`canStartOffline`, D-434): the provider then answers `.unreachable` until
    /// the directory appears.
    package static func makeProvider(
        source: String, faults: FaultPlan? = nil, clock: any Clock<Duration> = ContinuousClock(),
        cacheDirectory: String? = nil
    ) throws(FileSystemError) -> any Provider {
        var info = stat()
        if let cacheDirectory, canStartOffline(source: source, cacheDirectory: cacheDirectory) {
            // Offline start: the provider itself reads a missing root as `.unreachable`.
        } else if stat(source, &info) != 0 {
            throw FileSystemError(.notFound, "the source directory \(source) does not exist")
        } else if info.st_mode & S_IFMT != S_IFDIR {
            throw FileSystemError(.notADirectory, "the source \(source) is not a directory")
        }
        let local = LocalDirectoryProvider(root: source)
        guard let faults else { return local }
        return FaultInjectingProvider(wrapping: local, plan: faults, clock: clock)
    }

    /// The name of the file in a cache directory that records the source it caches (D-434).
    package static let sourceRecordName = "source"

    /// Whether `source` is a directory now (a stat that fails, e.g. ENOENT or a network file
    /// system's EIO/ENOTCONN, is "not present").
    package static func sourceIsPresent(_ source: String) -> Bool {
        var info = stat()
        return stat(source, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// Whether a mount of `source`, absent now, may start offline from `cacheDirectory` (D-434):
    /// only when the directory holds a metadata store and records `source` (its real path when
    /// it was last mounted) as what it caches. A first mount, or a typo in `--source`, is refused.
    package static func canStartOffline(source: String, cacheDirectory: String) -> Bool {
        !sourceIsPresent(source) && cacheRecords(source, cacheDirectory: cacheDirectory)
    }

    /// Whether `cacheDirectory` holds a metadata store and records `source` (a directory's real
    /// path, a WebDAV URL) as what it caches (D-434, D-511).
    package static func cacheRecords(_ source: String, cacheDirectory: String) -> Bool {
        guard access(cacheDirectory + "/metadata.sqlite", F_OK) == 0,
            let data = FileManager.default.contents(atPath: cacheDirectory + "/" + sourceRecordName)
        else { return false }
        let recorded = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        return recorded.contains(source)
    }

    /// Writes `source` into the cache directory's source record unless it is there already.
    static func recordSource(_ source: String, in cacheDirectory: String) {
        let path = cacheDirectory + "/" + sourceRecordName
        let bytes = Array((source + "\n").utf8)
        if let data = FileManager.default.contents(atPath: path), Array(data) == bytes { return }
        if let failure = replaceFileAtomically(path, with: bytes) {
            Logger(label: "mount").warning("cannot record the source in \(path): \(failure)")
        }
    }

    /// The store kept in `<cacheDirectory>/metadata.sqlite`.
    package static func openMetadataStore(in cacheDirectory: String) throws(FileSystemError) -> any MetadataStore {
        do {
            try makeDirectories(cacheDirectory, mode: 0o700)
        } catch {
            throw FileSystemError(.io, "cannot create the cache directory \(cacheDirectory): \(error.errno.message)")
        }
        do {
            return try SQLiteMetadataStore(path: cacheDirectory + "/metadata.sqlite")
        } catch {
            throw FileSystemError(error)
        }
    }
}
