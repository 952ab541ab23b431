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
    /// How cache files are synced before a range-map save (fdatasync; a seam for tests).
    var fileSync: FileSync = fileDataSync
    /// What the cache's file system has free (fstatvfs; a seam for tests of a full disk).
    var freeSpace: FreeSpace = fileSystemFreeSpace
}
