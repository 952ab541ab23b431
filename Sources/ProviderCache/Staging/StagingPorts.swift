// Staging's two ports: all that staging (open, write, sync, close, abandon, publish) asks of the
// catalog and of the content store. `LocalWrites` holds the catalog and the content store only
// as these and the write-back's (WriteBack/WriteBackPorts.swift), so a new need is a line here
// first (D-440).

import ProviderModel

/// What staging asks of the catalog.
protocol StagingCatalog: AnyObject, Sendable {
    /// A writer's first open: the version whose content the staging copy starts from is still the
    /// item's; fsync: the version to make durable.
    func currentVersion(of identifier: ItemIdentifier) -> ContentVersion?
    /// A writer's first open: the provider version the edit starts from (its upload's base).
    func providerBase(of identifier: ItemIdentifier) -> ContentVersion?
    /// A publish: the item's mtime when the copy did not change it.
    func knownItem(_ identifier: ItemIdentifier) -> ProviderItem?
    /// A publish whose item the catalog lost under that identifier: the provider asked again.
    func item(_ identifier: ItemIdentifier, maximumAge: Duration?) async throws(CacheError) -> ProviderItem
    /// A publish: the new local version becomes the item's.
    @discardableResult
    func publishLocal(
        _ identifier: ItemIdentifier, version: ContentVersion, size: Int64, modificationTime: ItemTime,
        permissions: UInt16?, savingWith records: () -> [UploadRecord]
    ) -> ProviderItem?
}

/// What staging asks of the content store: the staging files' life, and the content a copy starts
/// from.
protocol StagingContent: AnyObject, Sendable {
    func pin(
        _ item: ProviderItem, isCurrent: @escaping @Sendable (ContentVersion) -> Bool
    ) async throws(CacheError) -> ContentEntry
    func unpin(_ entry: ContentEntry)
    func makeStaging(
        _ identifier: ItemIdentifier, copying source: ContentEntry?, owner: String?
    ) async throws(CacheError) -> StagingFile
    func discardStaging(_ staging: StagingFile)
    func retireStaging(_ staging: StagingFile)
    func reserveFileNumber() -> Int64
    func publish(
        _ staging: StagingFile, as version: ContentVersion, syncing: Bool
    ) async throws(CacheError) -> ContentRecord
    func syncIfUnsynced(_ identifier: ItemIdentifier, _ version: ContentVersion) async throws(CacheError)
    func removeStagingLeftovers()
}

extension Catalog: StagingCatalog {}
extension ContentStore: StagingContent {}
