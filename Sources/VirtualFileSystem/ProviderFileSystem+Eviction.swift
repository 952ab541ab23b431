// `providerfs evict` in the file system (issue 27): a path resolved to its item, the cache's
// eviction, and the kernel told to drop the node's cached pages (a read-only mount keeps them).

public import ProviderCache
import ProviderModel
import SystemSupport

extension ProviderFileSystem {
    /// Why the file at `path` (relative to the mount root) cannot be evicted now, with its
    /// status; nil refusal: it can (the eviction checks again).
    public func evictionRefusal(
        ofPath path: String
    ) async throws(FileSystemError) -> (status: ItemStatus, refusal: ProviderCache.EvictionRefusal?) {
        let status = try await status(ofPath: path)
        do { return (status, try cache.evictionRefusal(of: status.identifier)) } catch {
            throw FileSystemError(error)
        }
    }

    /// Evicts the local content of the file at `path`; returns what happened and the item's
    /// status after it.
    public func evict(
        ofPath path: String
    ) async throws(FileSystemError) -> (status: ItemStatus, eviction: ProviderCache.Eviction) {
        let status = try await status(ofPath: path)
        let eviction = try await evict(status.identifier)
        return (cache.status(of: status.identifier) ?? status, eviction)
    }

    /// Evicts `identifier`'s local content and tells the kernel to drop the node's pages.
    func evict(_ identifier: ItemIdentifier) async throws(FileSystemError) -> ProviderCache.Eviction {
        let eviction: ProviderCache.Eviction
        do { eviction = try await cache.evict(identifier) } catch { throw FileSystemError(error) }
        if case .evicted = eviction, let node = state.withLock({ $0.inodes.inode(of: identifier) }) {
            kernelInvalidation.withLock { $0 }?.call([.content(node)])
        }
        return eviction
    }
}
