// The construction entry point for `providerfs mount`: a local directory as the provider, a cache
// directory holding the metadata store and the sparse content files.

import ProviderCache
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension ProviderFileSystem {
    /// A file system serving `source` (a local directory acting as the remote; never modified),
    /// caching in `cacheDirectory` (created if needed): `metadata.sqlite` there holds items and range
    /// maps, `content/` the sparse files. Reopening the same cache directory finds everything again.
    ///
    /// - Parameters:
    ///   - faults: faults to inject into provider calls (the demo's failing item, `providerfs fault`).
    ///   - claims: the coordination hook every open-for-read goes through.
    /// - Throws: `.notFound` / `.notADirectory` for a bad source, `.io` for a cache directory that
    ///   cannot be created or a metadata store that cannot be opened; the message says which.
    public static func make(
        source: String, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        faults: FaultPlan? = nil, claims: any ReadClaimProvider = NoReadClaims(),
        clock: any Clock<Duration> = ContinuousClock()
    ) throws(FileSystemError) -> ProviderFileSystem {
        var info = stat()
        guard stat(source, &info) == 0 else {
            throw FileSystemError(.notFound, "the source directory \(source) does not exist")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw FileSystemError(.notADirectory, "the source \(source) is not a directory")
        }
        var provider: any Provider = LocalDirectoryProvider(root: source)
        if let faults { provider = FaultInjectingProvider.wrapping(provider, plan: faults) }
        let store = try openMetadataStore(in: cacheDirectory)
        do {
            let cache = try ProviderCache(
                provider: provider, directory: cacheDirectory, store: store, clock: clock, options: options.cache)
            return ProviderFileSystem(cache: cache, options: options, claims: claims)
        } catch {
            throw FileSystemError(error)
        }
    }

    /// The store kept in `<cacheDirectory>/metadata.sqlite`.
    static func openMetadataStore(in cacheDirectory: String) throws(FileSystemError) -> any MetadataStore {
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

extension ProviderFileSystem {
    /// The demo: ensures the demo source under `demoDirectory` (default
    /// `DemoSource.defaultDirectory()`, created on first use) and serves it with its faults (the
    /// item that fails halfway). Returns the file system and the demo (for messages: where the
    /// source lives, which item fails).
    public static func makeDemo(
        demoDirectory: String? = nil, cacheDirectory: String, options: FileSystemOptions = FileSystemOptions(),
        claims: any ReadClaimProvider = NoReadClaims()
    ) throws(FileSystemError) -> (ProviderFileSystem, DemoSource) {
        let demo: DemoSource
        do {
            demo = try DemoSource.ensure(at: demoDirectory ?? DemoSource.defaultDirectory())
        } catch {
            throw FileSystemError(.io, "cannot create the demo source: \(error)")
        }
        let fileSystem = try make(
            source: demo.sourceDirectory, cacheDirectory: cacheDirectory, options: options, faults: demo.faultPlan(),
            claims: claims)
        return (fileSystem, demo)
    }
}
