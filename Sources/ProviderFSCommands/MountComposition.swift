// The composition root of a mount: the one place that chooses concrete providers (a local
// directory, the fault wrapper), the metadata store (SQLite) and builds the ProviderCache and the
// ProviderFileSystem over them. The layers below know only their protocols (`Provider`,
// `MetadataStore`, `ReadClaimProvider`); a new provider (WebDAV) or wrapper (access tokens) is
// added here.

import LocalProvider
package import ProviderCache
package import ProviderFaults
package import ProviderModel
import SystemSupport
package import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

package enum MountComposition {
    /// The file system a mount serves: for the demo, the generated demo source (its `source/`
    /// directory, under `UserDirectories.demoSource`) with the faults its manifest names;
    /// otherwise `source`.
    static func makeFileSystem(
        source: String, cacheDirectory: String, demo: Bool, options: FileSystemOptions = FileSystemOptions(),
        claims: any ReadClaimProvider = NoReadClaims()
    ) throws(FileSystemError)
        -> any FileSystem
    {
        if demo {
            return try makeDemo(
                demoDirectory: UserDirectories.demoSource, cacheDirectory: cacheDirectory, options: options,
                claims: claims
            ).0
        }
        return try makeFileSystem(source: source, cacheDirectory: cacheDirectory, options: options, claims: claims)
    }

    /// A file system serving `source` (a local directory acting as the remote; never modified),
    /// caching in `cacheDirectory` (created if needed): `metadata.sqlite` there holds items and range
    /// maps, `content/` the sparse files. Reopening the same cache directory finds everything again.
    ///
    /// - Parameters:
    ///   - faults: faults to inject into provider calls (the demo's failing item, `providerfs fault`).
    ///   - claims: the coordination hook every open-for-read goes through.
    /// - Throws: `.notFound` / `.notADirectory` for a bad source, `.io` for a cache directory that
    ///   cannot be created or a metadata store that cannot be opened; the message says which.
    package static func makeFileSystem(
        source: String, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        faults: FaultPlan? = nil, claims: any ReadClaimProvider = NoReadClaims(),
        clock: any Clock<Duration> = ContinuousClock()
    ) throws(FileSystemError) -> ProviderFileSystem {
        let provider = try makeProvider(source: source, faults: faults)
        let store = try openMetadataStore(in: cacheDirectory)
        do {
            let cache = try ProviderCache(
                provider: provider, directory: cacheDirectory, store: store, clock: clock, options: options.cache)
            return ProviderFileSystem(cache: cache, options: options, claims: claims)
        } catch {
            throw FileSystemError(error)
        }
    }

    /// The demo: ensures the demo source under `demoDirectory` (default
    /// `DemoSource.defaultDirectory()`, created on first use) and serves it with its faults (the
    /// item that fails halfway). Returns the file system and the demo (for messages: where the
    /// source lives, which item fails).
    package static func makeDemo(
        demoDirectory: String? = nil, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        claims: any ReadClaimProvider = NoReadClaims()
    ) throws(FileSystemError) -> (ProviderFileSystem, DemoSource) {
        let demo: DemoSource
        do {
            demo = try DemoSource.ensure(at: demoDirectory ?? DemoSource.defaultDirectory())
        } catch {
            throw FileSystemError(.io, "cannot create the demo source: \(error)")
        }
        let fileSystem = try makeFileSystem(
            source: demo.sourceDirectory, cacheDirectory: cacheDirectory, options: options, faults: demo.faultPlan(),
            claims: claims)
        return (fileSystem, demo)
    }

    /// The provider for `source`: a local directory, wrapped in `faults` when given (the wrapper
    /// keeps every capability of the local provider: lookups, tracking, pushes, immediate metadata).
    package static func makeProvider(source: String, faults: FaultPlan? = nil) throws(FileSystemError) -> any Provider {
        var info = stat()
        guard stat(source, &info) == 0 else {
            throw FileSystemError(.notFound, "the source directory \(source) does not exist")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw FileSystemError(.notADirectory, "the source \(source) is not a directory")
        }
        let local = LocalDirectoryProvider(root: source)
        guard let faults else { return local }
        return FaultInjectingProvider(wrapping: local, plan: faults)
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
