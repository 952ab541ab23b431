import Diagnostics
import ProviderModel
import SystemSupport

/// What every part of the cache shares: the provider, the store, time, tunables, I/O threads.
struct CacheEnvironment: Sendable {
    let provider: any Provider
    let store: any MetadataStore
    let timeline: Timeline
    let options: CacheOptions
    let pool: BlockingIOPool
    let logger: Logger
    /// How cache files are synced (fdatasync; a seam for tests): a content file before its
    /// range-map save, a staging file before a publish renames it, a content file an fsync
    /// makes durable (D-381).
    var fileSync: FileSync = fileDataSync
    /// What the cache's file system has free (fstatvfs; a seam for tests of a full disk).
    var freeSpace: FreeSpace = fileSystemFreeSpace
}

extension CacheEnvironment {
    /// `made`, just created at the provider, given `owner` when the provider stores owners and
    /// `made` has another (D-397). The permissions go along: a chown clears setuid and setgid.
    /// A failed chown leaves the item as made (logged): it exists, the create is not undone.
    func owned(_ made: ProviderItem, by owner: ItemOwner?, permissions: UInt16? = nil) async -> ProviderItem {
        guard let owner, made.owner != owner, provider.capabilities.contains(.storesOwnership) else { return made }
        let changes = ItemAttributeChanges(
            permissions: made.kind == .symbolicLink ? nil : permissions ?? made.permissions, uid: owner.uid,
            gid: owner.gid)
        do {
            return try await provider.setAttributes(made.identifier, changes)
        } catch {
            logger.warning("\(made.identifier): cannot give it to \(owner): \(error)")
            return made
        }
    }
}
