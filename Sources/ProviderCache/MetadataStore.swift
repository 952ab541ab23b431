// Where the cache's metadata persists: items (the provider's namespace as last seen) and content
// records (which bytes of which content version are on disk). The cache keeps its working copy in
// memory and writes through to the store, so a restart finds both again.

public import ProviderModel
import SystemSupport

/// An item as persisted: the provider's metadata plus whether its children were ever listed (so a
/// restarted mount can answer `ls` of a listed directory while the provider is unreachable).
public struct StoredItem: Sendable, Equatable {
    public var item: ProviderItem
    public var childrenListed: Bool
    /// What stat shows as st_ino (`ItemSerials`, D-389); 0: none kept (a row of an older cache).
    public var serial: UInt64
    public init(item: ProviderItem, childrenListed: Bool, serial: UInt64 = 0) {
        self.item = item
        self.childrenListed = childrenListed
        self.serial = serial
    }
}

/// The last failure of an item's download, as shown by `user.providerfs.error`.
public struct RecordedError: Sendable, Equatable, CustomStringConvertible {
    /// The failure its waiting readers got (VirtualFileSystem turns it into their errno, through
    /// the one table).
    public var code: CacheError.Code
    public var message: String
    /// The byte where it happened: the stream position at the failure (for a checksum mismatch,
    /// the start of the fetch whose bytes did not match). Nil for a failure recorded before the
    /// offset was kept, or one that happened at no byte (a provider probe).
    public var offset: Int64?
    public init(code: CacheError.Code, message: String, offset: Int64? = nil) {
        self.code = code
        self.message = message
        self.offset = offset
    }
    public var description: String { message }
}

/// One sparse content file: which item and version it holds, its file number in
/// `<cache>/content/`, and the ranges known to be on disk.
public struct ContentRecord: Sendable, Equatable {
    public var identifier: ItemIdentifier
    public var version: ContentVersion
    public var size: Int64
    /// The file is `<cache>/content/<fileNumber>`.
    public var fileNumber: Int64
    /// Only ranges whose bytes were written and synced before this record was saved.
    public var present: ByteRanges
    public var lastError: RecordedError?
    public init(
        identifier: ItemIdentifier, version: ContentVersion, size: Int64, fileNumber: Int64, present: ByteRanges,
        lastError: RecordedError? = nil
    ) {
        self.identifier = identifier
        self.version = version
        self.size = size
        self.fileNumber = fileNumber
        self.present = present
        self.lastError = lastError
    }
}

/// Persistence for the cache. Calls are short and synchronous; implementations serialize them.
/// Errors are reported to the caller, which logs them and carries on with its in-memory state
/// (a store failure loses persistence, never bytes or correctness: unsaved ranges are refetched).
public protocol MetadataStore: Sendable {
    func loadItems() throws -> [StoredItem]
    /// Inserts or replaces, keyed by identifier.
    func saveItems(_ items: [StoredItem]) throws
    func deleteItems(_ identifiers: [ItemIdentifier]) throws
    func loadContents() throws -> [ContentRecord]
    /// Inserts or replaces, keyed by (identifier, version).
    func saveContent(_ record: ContentRecord) throws
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws
    /// chmod and utimens kept by the mount (AttributeOverrides.swift; defaults keep nothing).
    func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride]
    /// Inserts or replaces; nil deletes.
    func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws
    /// The write-back queue (issue 14): one row per item with a local version.
    func loadUploads() throws -> [UploadRecord]
    /// Inserts or replaces, keyed by identifier.
    func saveUpload(_ record: UploadRecord) throws
    func deleteUpload(_ identifier: ItemIdentifier) throws
    /// Items and upload records saved together, in one transaction where the store has them
    /// (D-529): a create's item and its parked record, a publish's item and its queued record.
    func save(items: [StoredItem], uploads: [UploadRecord]) throws
    /// Pin states set explicitly (issue 27, D-445): `.pinned` or `.unpinned` per item; an item
    /// without a row inherits its parent's policy.
    func loadPins() throws -> [ItemIdentifier: PinState]
    /// Inserts or replaces; `.inherited` deletes the row.
    func savePin(_ state: PinState, for identifier: ItemIdentifier) throws
}

/// Stores written before the write-back queue keep nothing of it (a restart loses the queue).
extension MetadataStore {
    /// One save after the other, for stores without transactions.
    public func save(items: [StoredItem], uploads: [UploadRecord]) throws {
        try saveItems(items)
        for record in uploads { try saveUpload(record) }
    }
    public func loadUploads() throws -> [UploadRecord] { [] }
    public func saveUpload(_ record: UploadRecord) throws {}
    public func deleteUpload(_ identifier: ItemIdentifier) throws {}
}

/// Stores written before pin states keep none (a restart forgets them).
extension MetadataStore {
    public func loadPins() throws -> [ItemIdentifier: PinState] { [:] }
    public func savePin(_ state: PinState, for identifier: ItemIdentifier) throws {}
}

/// A store that keeps everything in memory: for tests and for `--cache` less experiments. Sharing
/// one instance between two caches simulates a restart.
public final class InMemoryMetadataStore: MetadataStore {
    private struct State {
        var items: [ItemIdentifier: StoredItem] = [:]
        var contents: [String: ContentRecord] = [:]
        var attributes: [ItemIdentifier: AttributeOverride] = [:]
        var uploads: [ItemIdentifier: UploadRecord] = [:]
        var pins: [ItemIdentifier: PinState] = [:]
    }
    private let state = Locked(State())

    public init() {}

    private static func key(_ identifier: ItemIdentifier, _ version: ContentVersion) -> String {
        identifier.rawValue + "\u{0}" + version.rawValue
    }

    public func loadItems() throws -> [StoredItem] { state.withLock { Array($0.items.values) } }
    public func saveItems(_ items: [StoredItem]) throws {
        state.withLock { state in for item in items { state.items[item.item.identifier] = item } }
    }
    public func deleteItems(_ identifiers: [ItemIdentifier]) throws {
        state.withLock { state in for identifier in identifiers { state.items[identifier] = nil } }
    }
    public func loadContents() throws -> [ContentRecord] { state.withLock { Array($0.contents.values) } }
    public func saveContent(_ record: ContentRecord) throws {
        state.withLock { $0.contents[Self.key(record.identifier, record.version)] = record }
    }
    public func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        state.withLock { $0.contents[Self.key(identifier, version)] = nil }
    }
    public func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] {
        state.withLock { $0.attributes }
    }
    public func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {
        state.withLock { $0.attributes[identifier] = override }
    }
    public func loadUploads() throws -> [UploadRecord] { state.withLock { Array($0.uploads.values) } }
    public func saveUpload(_ record: UploadRecord) throws { state.withLock { $0.uploads[record.identifier] = record } }
    public func deleteUpload(_ identifier: ItemIdentifier) throws { state.withLock { $0.uploads[identifier] = nil } }
    public func save(items: [StoredItem], uploads: [UploadRecord]) throws {
        state.withLock { state in
            for item in items { state.items[item.item.identifier] = item }
            for record in uploads { state.uploads[record.identifier] = record }
        }
    }
    public func loadPins() throws -> [ItemIdentifier: PinState] { state.withLock { $0.pins } }
    public func savePin(_ state: PinState, for identifier: ItemIdentifier) throws {
        self.state.withLock { $0.pins[identifier] = state == .inherited ? nil : state }
    }
}
