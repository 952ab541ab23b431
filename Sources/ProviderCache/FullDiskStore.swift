// The metadata store as the cache uses it on a disk that may fill up (issue 23, D-390): a row of
// the namespace or of the write-back queue that the disk had no room for is written again later,
// so that a delete is not undone and a queue row not left behind by the next start.

import ProviderModel
import SystemSupport

/// `base`, except that a save or delete of an item or an upload record that fails with
/// `.noSpace` is kept (the newest per identifier) and made again before the next write and at
/// `flush()` (the cache's shutdown). The caller still gets the error. Other writes (content
/// records, attribute overrides) pass through: a content record is saved before its file counts
/// (a publish that cannot save it fails), and the rest only cost a refetch when lost (a pin state
/// that a full disk refused is still held in memory; `Pins` logs it).
final class FullDiskStore: MetadataStore {
    let base: any MetadataStore
    /// The rows to write again: a value to save, or nil to delete.
    private struct Pending {
        var items: [ItemIdentifier: StoredItem?] = [:]
        var uploads: [ItemIdentifier: UploadRecord?] = [:]
        var isEmpty: Bool { items.isEmpty && uploads.isEmpty }
    }
    private let pending = Locked(Pending())
    /// Held across each write of the kept rows and each write that may keep one, so that a row
    /// kept by a failed write is never written over a newer one. (`base`'s writes are serialized
    /// anyway: SQLite has one writer.)
    private let writing = Lock()

    init(_ base: any MetadataStore) { self.base = base }

    func loadItems() throws -> [StoredItem] { try base.loadItems() }
    func loadContents() throws -> [ContentRecord] { try base.loadContents() }
    func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] { try base.loadAttributeOverrides() }
    func loadUploads() throws -> [UploadRecord] { try base.loadUploads() }
    func loadPins() throws -> [ItemIdentifier: PinState] { try base.loadPins() }
    func savePin(_ state: PinState, for identifier: ItemIdentifier) throws { try base.savePin(state, for: identifier) }

    func saveContent(_ record: ContentRecord) throws { try base.saveContent(record) }
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        try base.deleteContent(identifier: identifier, version: version)
    }
    func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        try base.saveAttributeOverride(override, for: identifier)
    }

    func saveItems(_ items: [StoredItem]) throws {
        try write(items: items.map { ($0.item.identifier, $0) }) { try self.base.saveItems(items) }
    }
    func deleteItems(_ identifiers: [ItemIdentifier]) throws {
        try write(items: identifiers.map { ($0, nil) }) { try self.base.deleteItems(identifiers) }
    }
    func saveUpload(_ record: UploadRecord) throws {
        try write(uploads: [(record.identifier, record)]) { try self.base.saveUpload(record) }
    }
    func deleteUpload(_ identifier: ItemIdentifier) throws {
        try write(uploads: [(identifier, nil)]) { try self.base.deleteUpload(identifier) }
    }
    func save(items: [StoredItem], uploads: [UploadRecord]) throws {
        try write(items: items.map { ($0.item.identifier, $0) }, uploads: uploads.map { ($0.identifier, $0) }) {
            try self.base.save(items: items, uploads: uploads)
        }
    }

    /// Rows kept for writing again (tests, `flush`).
    var pendingCount: Int { pending.withLock { $0.items.count + $0.uploads.count } }

    /// Writes the kept rows now (the cache's shutdown; after space was freed). True when none is
    /// left.
    @discardableResult
    func flush() -> Bool {
        writing.withLock { writeKept() }
    }

    private func write(
        items: [(ItemIdentifier, StoredItem?)] = [], uploads: [(ItemIdentifier, UploadRecord?)] = [],
        _ body: () throws -> Void
    ) throws {
        try writing.withLock {
            _ = writeKept()
            do {
                try body()
            } catch let error as CacheError where error.code == .noSpace {
                pending.withLock { pending in
                    for (identifier, item) in items { pending.items[identifier] = .some(item) }
                    for (identifier, record) in uploads { pending.uploads[identifier] = .some(record) }
                }
                throw error
            }
            // Written: a kept older row of the same identifier must not come back over it.
            pending.withLock { pending in
                guard !pending.isEmpty else { return }
                for (identifier, _) in items { pending.items[identifier] = nil }
                for (identifier, _) in uploads { pending.uploads[identifier] = nil }
            }
        }
    }

    /// With `writing` held: every kept row, each removed once written. True when none is left.
    private func writeKept() -> Bool {
        let kept = pending.withLock { $0 }
        guard !kept.isEmpty else { return true }
        let saves = kept.items.compactMap { $0.value }
        let deletes = kept.items.filter { $0.value == nil }.map(\.key)
        if (try? base.saveItems(saves)) != nil, (try? base.deleteItems(deletes)) != nil {
            pending.withLock { pending in for identifier in kept.items.keys { pending.items[identifier] = nil } }
        }
        for (identifier, record) in kept.uploads {
            let written: Void? =
                if let record { try? base.saveUpload(record) } else { try? base.deleteUpload(identifier) }
            if written != nil { pending.withLock { _ = $0.uploads.removeValue(forKey: identifier) } }
        }
        return pending.withLock { $0.isEmpty }
    }
}
