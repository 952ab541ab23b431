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
