// The write-back's two ports: all that the write-back queue (upload, retry, conflict copy, move
// exclusion, a restart's resume) asks of the catalog and of the content store. `LocalWrites`
// holds the catalog and the content store only as these and staging's (Staging/StagingPorts.swift),
// so a new need is a line here first (D-440).

import ProviderModel

/// What the write-back asks of the catalog.
protocol WriteBackCatalog: AnyObject, Sendable {
    /// The item an upload sends (by the identifier renames moved it to).
    func knownItem(_ identifier: ItemIdentifier) -> ProviderItem?
    /// After a conflict copy: the provider's version of the original name, asked again.
    func item(_ identifier: ItemIdentifier, maximumAge: Duration?) async throws(CacheError) -> ProviderItem
    /// A restart: a pending upload's local version is the item's again; a create not at the
    /// provider yet is held back from its answers (D-386).
    func restoreLocal(_ record: UploadRecord)
    func restoreUnborn(_ identifier: ItemIdentifier)
    /// Around an upload call: what the provider shows of the item is the mount's own change
    /// (D-403), and its directory's metadata is passing (D-384).
    func beginOwnChange(
        of identifiers: [ItemIdentifier], naming names: [(parent: ItemIdentifier, name: String)]
    ) -> [String]
    func endOwnChange(_ paths: [String])
    func beginWriting(into directory: ItemIdentifier, current: () -> ProviderItem?) -> Bool
    func endWriting(into directory: ItemIdentifier)
    /// An upload's result: a create reached the provider; a conflict copy was made (the local
    /// version dropped, the copy recorded); a version uploaded (for each name of the file, D-396).
    func born(_ identifier: ItemIdentifier)
    func dropLocal(_ identifier: ItemIdentifier)
    @discardableResult
    func applyCreated(_ item: ProviderItem) -> ProviderItem
    @discardableResult
    func apply(
        _ item: ProviderItem, origin: ChangeOrigin, appeared: Bool, savingWith records: () -> [UploadRecord]
    ) -> ProviderItem
    func localUploaded(
        _ identifier: ItemIdentifier, version: ContentVersion, providerVersion: ContentVersion, base: ContentVersion?)
    func otherNames(of identifier: ItemIdentifier) -> [ItemIdentifier]
    func otherNameUploaded(_ identifier: ItemIdentifier, from: ContentVersion?, to: ContentVersion)
    /// A chmod or utimens through the mount: one held by an upload record is shown (D-460, at
    /// a restart too); one made at the provider moves the local version's provider version
    /// (D-375).
    @discardableResult
    func attributesHeld(_ identifier: ItemIdentifier, _ held: HeldAttributes) -> ProviderItem?
    /// What was held is made at the provider, or given up: no longer shown over its item.
    func heldAttributesEnded(_ identifier: ItemIdentifier)
    func providerVersionChanged(
        _ identifier: ItemIdentifier, from: ContentVersion, to: ContentVersion, modificationTime: ItemTime?)
    /// The item was replaced or deleted: its local version goes with its record (D-411).
    func forgetLocal(_ identifier: ItemIdentifier, subtree: Bool)
}

/// What the write-back asks of the content store: the bytes an upload sends.
protocol WriteBackContent: AnyObject, Sendable {
    func pin(
        _ item: ProviderItem, isCurrent: @escaping @Sendable (ContentVersion) -> Bool
    ) async throws(CacheError) -> ContentEntry
    func unpin(_ entry: ContentEntry)
    /// A create closed unwritten sends the empty file (D-386).
    func emptyFile() async throws(CacheError) -> String
    func contentFilePath(_ identifier: ItemIdentifier, _ version: ContentVersion) -> String?
    /// Before an upload replaces the item at the provider: the provider versions handles still
    /// read are here in full, or none is read any more (false: a download failed; D-494).
    func secureReplaced(_ identifier: ItemIdentifier) async -> Bool
}

extension Catalog: WriteBackCatalog {}
extension ContentStore: WriteBackContent {}
