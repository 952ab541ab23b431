import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import VirtualFileSystem

/// A ProviderFileSystem over an InMemoryProvider with a manual clock and an in-memory store.
final class VFSFixture: Sendable {
    let provider = InMemoryProvider()
    let faults = FaultPlan()
    let clock = ManualClock()
    let directory: TemporaryDirectory
    let store = InMemoryMetadataStore()
    let options: FileSystemOptions

    init(options: FileSystemOptions = VFSFixture.defaultOptions()) throws {
        directory = try TemporaryDirectory(prefix: "providerfs-vfs")
        self.options = options
    }

    static func defaultOptions() -> FileSystemOptions {
        var options = FileSystemOptions()
        options.cache.chunkSize = 64 << 10
        options.cache.firstChunkSize = 64 << 10
        options.cache.retryDelay = .zero
        options.cache.directoryTTL = .seconds(5)
        options.cache.attributeTTL = .seconds(1)
        options.cache.missRefreshInterval = .milliseconds(500)
        // Tests count provider calls: no listing in the background unless a test asks for it.
        options.cache.listingRefreshAhead = nil
        return options
    }

    func makeFileSystem(
        claims: any ReadClaimProvider = NoReadClaims(),
        namespaceClaims: any NamespaceClaimProvider = NoNamespaceClaims(), provider wrapped: (any Provider)? = nil,
        scopedAccess: (any ScopedAccessProvider)? = nil, providerChanges: (any ProviderChangeListener)? = nil
    ) throws -> ProviderFileSystem {
        let cache = try ProviderCache(
            provider: wrapped ?? FaultInjectingProvider(wrapping: provider, plan: faults), directory: directory.path,
            store: store, clock: clock, options: options.cache, providerChanges: providerChanges)
        return ProviderFileSystem(
            cache: cache, options: options, claims: ClaimPorts(reads: claims, namespace: namespaceClaims),
            scopedAccess: scopedAccess)
    }

    deinit { directory.remove() }
}

extension VFSFixture {
    /// The default options of a writable mount.
    static func writableOptions() -> FileSystemOptions {
        var options = VFSFixture.defaultOptions()
        options.writable = true
        return options
    }
}

/// The errno `body` failed with: nil when it did not fail (or failed with something that is not
/// a `FileSystemError`).
func failureErrno(_ body: () async throws -> Void) async -> Errno? {
    do {
        try await body()
        return nil
    } catch let error as FileSystemError {
        return error.errno
    } catch {
        return nil
    }
}

/// A directory's names, without "." and "..".
func childNames(_ fileSystem: ProviderFileSystem, _ inode: InodeNumber) async throws -> [String] {
    try await listAll(fileSystem, inode).map(\.name).filter { $0 != "." && $0 != ".." }
}

/// Every entry of a directory, read `limit` at a time through cookies.
func listAll(_ fileSystem: ProviderFileSystem, _ inode: InodeNumber, limit: Int = 1000) async throws -> [DirectoryEntry]
{
    let handle = try await fileSystem.openDirectory(inode, context: .kernel)
    defer { fileSystem.releaseDirectory(inode, handle: handle) }
    var result: [DirectoryEntry] = []
    var cookie: UInt64 = 0
    while true {
        let batch = try await fileSystem.readDirectory(
            inode, handle: handle, after: cookie, limit: limit, context: .kernel)
        if batch.isEmpty { return result }
        result += batch
        cookie = batch.last!.cookie
    }
}

func xattr(_ fileSystem: ProviderFileSystem, _ inode: InodeNumber, _ name: String) async throws -> String {
    String(decoding: try await fileSystem.getExtendedAttribute(inode, name: name, context: .kernel), as: UTF8.self)
}

/// The fixture's provider, able to look up one name (as LocalDirectoryProvider is), counting
/// those lookups apart from listings.
final class NameLookupProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = .namedChildLookup
    let pointLookups = Locked(0)
    init(base: InMemoryProvider) { self.base = base }
    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        pointLookups.withLock { $0 += 1 }
        do {
            return try await base.item(for: ItemIdentifier(directory == .root ? name : directory.rawValue + "/" + name))
        } catch let error as ProviderError where error.code == .noSuchItem {
            return nil
        }
    }
}
