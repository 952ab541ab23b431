// How many metadata-store transactions a file created through the mount costs (D-529), through a
// store that logs every write call as one transaction with the rows it holds. Each SQLite commit
// is about 15 system calls and most of a file's SQLite time; `tar x` makes one file after the
// other, so the count per file is what this pins.

import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// A store that logs each write (one transaction) with the rows it holds, then keeps them in
/// memory.
final class TransactionLogStore: MetadataStore {
    enum Row: Equatable, CustomStringConvertible {
        case item(ItemIdentifier, ContentVersion)
        case content(ItemIdentifier, ContentVersion)
        case upload(ItemIdentifier, UploadPhase, ContentVersion)
        case other(String)

        var identifier: ItemIdentifier? {
            switch self {
            case .item(let identifier, _), .content(let identifier, _), .upload(let identifier, _, _): identifier
            case .other: nil
            }
        }
        var description: String {
            switch self {
            case .item(let identifier, let version): "item \(identifier) \(version)"
            case .content(let identifier, let version): "content \(identifier) \(version)"
            case .upload(let identifier, let phase, let version): "upload \(identifier) \(phase) \(version)"
            case .other(let what): what
            }
        }
    }
    let base = InMemoryMetadataStore()
    let transactions = Locked<[[Row]]>([])

    private func log(_ rows: [Row]) { transactions.withLock { $0.append(rows) } }

    func loadItems() throws -> [StoredItem] { try base.loadItems() }
    func saveItems(_ items: [StoredItem]) throws {
        log(items.map { .item($0.item.identifier, $0.item.contentVersion) })
        try base.saveItems(items)
    }
    func deleteItems(_ identifiers: [ItemIdentifier]) throws {
        log(identifiers.map { .other("delete item \($0)") })
        try base.deleteItems(identifiers)
    }
    func loadContents() throws -> [ContentRecord] { try base.loadContents() }
    func saveContent(_ record: ContentRecord) throws {
        log([.content(record.identifier, record.version)])
        try base.saveContent(record)
    }
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        log([.other("delete content \(identifier) \(version)")])
        try base.deleteContent(identifier: identifier, version: version)
    }
    func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] { try base.loadAttributeOverrides() }
    func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        log([.other("attributes \(identifier)")])
        try base.saveAttributeOverride(override, for: identifier)
    }
    func loadUploads() throws -> [UploadRecord] { try base.loadUploads() }
    func saveUpload(_ record: UploadRecord) throws {
        log([.upload(record.identifier, record.phase, record.localVersion)])
        try base.saveUpload(record)
    }
    func deleteUpload(_ identifier: ItemIdentifier) throws {
        log([.other("delete upload \(identifier)")])
        try base.deleteUpload(identifier)
    }
    func save(items: [StoredItem], uploads: [UploadRecord]) throws {
        log(
            items.map { .item($0.item.identifier, $0.item.contentVersion) }
                + uploads.map { .upload($0.identifier, $0.phase, $0.localVersion) })
        try base.save(items: items, uploads: uploads)
    }
}

@Suite("Store transactions per created file (D-529)")
struct StoreTransactionTests {
    /// `tar x`'s file: created (deferred to its upload, as by the local provider, D-386),
    /// written, closed, uploaded. Four transactions: the create's item with its parked record;
    /// the published content record; the published item with its queued record; the uploaded
    /// item with its record. An item row never goes without its record (a crash between the two
    /// left an item the provider never had, or a record of nothing).
    @Test func aCreatedFileCostsFourTransactionsEachItemWithItsRecord() async throws {
        let store = TransactionLogStore()
        let fixture = try WriteFixture(store: store)
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let before = store.transactions.value.count

        let created = try await cache.createFile(named: "n.txt", in: .root, permissions: 0o644)
        let writer = try await cache.writes.openWriter(created, truncating: true)
        try await cache.writes.write(writer, Array("abc".utf8), at: 0)
        let published = try #require(try await cache.writes.closeWriter(writer))
        #expect(await cache.writes.waitUntilUploaded(created.identifier, timeout: .seconds(30)))
        #expect(fixture.provider.base.content(of: "n.txt")?.0 == .bytes(Array("abc".utf8)))

        let file = store.transactions.value.dropFirst(before).filter { rows in
            rows.contains { $0.identifier == created.identifier }
        }
        let shown = file.map { "[\($0.map(\.description).joined(separator: ", "))]" }.joined(separator: " ")
        #expect(file.count == 4, "transactions of the file: \(shown)")
        for rows in file where rows.contains(where: { if case .item = $0 { true } else { false } }) {
            #expect(
                rows.contains { if case .upload = $0 { true } else { false } },
                "an item saved without its upload record: \(shown)")
        }
        let local = published.item.contentVersion
        let unborn = created.contentVersion
        #expect(file.first == [.item(created.identifier, unborn), .upload(created.identifier, .dirty, unborn)])
        #expect(file.dropFirst().first == [.content(created.identifier, local)])
        #expect(file.dropFirst(2).first?.contains(.upload(created.identifier, .uploading, local)) == true)
        #expect(file.last?.contains(.upload(created.identifier, .materialized, local)) == true)
        await cache.shutdown()
    }
}
