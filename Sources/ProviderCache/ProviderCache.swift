// The lazy materialization engine: the provider's namespace as last seen (kept in memory, written
// through to a MetadataStore) and the content entries (sparse files + range maps + downloads).
//
// Lock order: `ProviderCache.catalog` → `ContentEntry.state` (an entry's methods that take its lock
// may be called with the catalog lock held only where noted; none of them calls back into the cache).

public import Diagnostics
public import ProviderModel
public import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The state of one item as `providerfs status` and the xattrs show it.
public struct ItemStatus: Sendable, Equatable {
    public enum State: String, Sendable, Equatable {
        case dataless, downloading, partial, materialized, error
    }
    public var identifier: ItemIdentifier
    public var kind: ItemKind
    public var state: State
    public var presentBytes: Int64
    public var totalBytes: Int64
    public var version: ContentVersion
    public var lastError: RecordedError?
}

/// A change of the catalog that whoever caches its answers (the kernel, through the file system)
/// must hear of: told after the catalog changed, so that an answer asked for after the telling
/// is the new one.
public enum CatalogChange: Sendable, Equatable {
    /// The entry `name` of `directory` changed (created, deleted, renamed, written, metadata);
    /// `identifier` is the item the catalog had under that name, if any.
    case entry(directory: ItemIdentifier, name: String, identifier: ItemIdentifier?)
    /// Any entry of `directory` may have changed.
    case entries(directory: ItemIdentifier)
    /// Anything may have changed (the provider lost track).
    case everything
}

/// Provider metadata plus local content, with the persistence and refresh rules of
/// docs/SEMANTICS.md ("Remote changes").
public final class ProviderCache: Sendable {
    /// The cache directory (`content/` holds the sparse files).
    public let directory: String
    let environment: CacheEnvironment
    private let catalog: Locked<Catalog>
    /// Serializes creation of content entries (opening and sizing their file) so that two first
    /// opens of one item share one entry. Taken only on a pool thread, never with `catalog` held.
    private let creationLock = Lock()
    /// Entries whose range map is to be saved by the next batch (see `schedulePersist`).
    /// Range-map saves queued for the next batch, and how many batch flushes are running (shutdown
    /// waits for those: an entry closed while idle is only reachable from a running flush).
    private let pendingPersists = Locked<
        (
            entries: [ObjectIdentifier: ContentEntry], scheduled: Bool, flushing: Int,
            flushWaiters: [CheckedContinuation<Void, Never>]
        )
    >(([:], false, 0, []))

    /// Who hears of catalog changes (`observeChanges`).
    private let changeObserver = Locked<(@Sendable ([CatalogChange]) -> Void)?>(nil)

    /// The provider pushes changes (`ChangeNotifying`): a tracked listing is kept exact by them.
    public let pushesChanges: Bool

    /// The provider as `ImmediateMetadata`, when it is one (`itemNow`).
    private let immediateMetadata: (any ImmediateMetadata)?

    /// Background re-listings (`listingRefreshAhead`) by directory; shutdown cancels and awaits them.
    private let refreshes = Locked<(tasks: [ItemIdentifier: Task<Void, Never>], closed: Bool)>(([:], false))

    /// A name as its UTF-8 bytes: Swift String equality is canonical equivalence, POSIX names
    /// are bytes.
    struct NameKey: Hashable {
        let name: String
        init(_ name: String) { self.name = name }
        // Byte-wise, without copying the bytes out (a lookup makes one key per request).
        static func == (lhs: NameKey, rhs: NameKey) -> Bool { lhs.name.utf8.elementsEqual(rhs.name.utf8) }
        func hash(into hasher: inout Hasher) {
            var name = self.name
            name.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        }
    }

    private struct ContentKey: Hashable {
        var identifier: ItemIdentifier
        var version: ContentVersion
    }

    private struct Catalog {
        var items: [ItemIdentifier: ProviderItem] = [:]
        /// Children of directories listed at least once (in any session).
        var children: [ItemIdentifier: Set<ItemIdentifier>] = [:]
        /// The same children by name, compared byte for byte (lookup is O(1), not a scan).
        var names: [ItemIdentifier: [NameKey: ItemIdentifier]] = [:]
        /// When (on the timeline) a directory was last listed, or its listing revalidated, in this
        /// session.
        var listedAt: [ItemIdentifier: Duration] = [:]
        /// A listing's change token (`ListingChangeTracking`) and when that listing was taken.
        var listingTokens: [ItemIdentifier: (token: ListingChangeToken, listedAt: Duration)] = [:]
        /// When an item's metadata was last confirmed by the provider in this session.
        var refreshedAt: [ItemIdentifier: Duration] = [:]
        /// Items the provider reported changed (`ChangeNotifying`) since their metadata was last
        /// confirmed: asked for again before they are used.
        var dirty: Set<ItemIdentifier> = []
        /// Counts the provider's change reports; `lastChange[directory]` is the count at the last
        /// report about that directory's entries. A listing started before it may miss the change.
        var changeCount: UInt64 = 0
        var lastChange: [ItemIdentifier: UInt64] = [:]
        var entries: [ContentKey: ContentEntry] = [:]
        /// Content records loaded from the store and not opened yet.
        var records: [ContentKey: ContentRecord] = [:]
        var nextFileNumber: Int64 = 1
        var isShutDown = false
    }

    /// The root item, before the provider has been asked.
    static func placeholderRoot() -> ProviderItem {
        ProviderItem(
            identifier: .root, parent: .root, name: "", kind: .directory, size: 0,
            modificationTime: ItemTime(seconds: 0), contentVersion: ContentVersion("root"), permissions: 0o755)
    }

    /// Opens the cache in `directory` (created if needed), loading the items and range maps the
    /// store kept from earlier sessions.
    public init(
        provider: any Provider, directory: String, store: any MetadataStore,
        clock: any Clock<Duration> = ContinuousClock(), options: CacheOptions = CacheOptions(),
        pool: BlockingIOPool = .shared, logger: Logger = Logger(label: "providerfs.cache")
    ) throws(CacheError) {
        self.directory = directory
        environment = CacheEnvironment(
            provider: provider, store: store, timeline: Timeline(clock), options: options, pool: pool, logger: logger)
        do {
            try makeDirectories(directory + "/content", mode: 0o700)
        } catch {
            throw CacheError(.io, "cannot create cache directory \(directory): \(error.errno.message)")
        }
        var catalog = Catalog()
        let storedItems: [StoredItem]
        let storedContents: [ContentRecord]
        do {
            storedItems = try store.loadItems()
            storedContents = try store.loadContents()
        } catch {
            throw CacheError(.io, "cannot read the metadata store: \(error)")
        }
        for stored in storedItems {
            catalog.items[stored.item.identifier] = stored.item
            if stored.childrenListed, stored.item.kind == .directory {
                catalog.children[stored.item.identifier, default: []] = catalog.children[stored.item.identifier] ?? []
            }
        }
        for stored in storedItems where stored.item.identifier != .root {
            if catalog.items[stored.item.parent] != nil, catalog.children[stored.item.parent] != nil {
                catalog.children[stored.item.parent]!.insert(stored.item.identifier)
            }
        }
        for (directory, children) in catalog.children {
            catalog.names[directory] = Dictionary(
                children.compactMap { id in catalog.items[id].map { (NameKey($0.name), id) } },
                uniquingKeysWith: { first, _ in first })
        }
        if catalog.items[.root] == nil { catalog.items[.root] = Self.placeholderRoot() }
        var orphans: [ContentRecord] = []
        for record in storedContents {
            catalog.nextFileNumber = max(catalog.nextFileNumber, record.fileNumber + 1)
            if let item = catalog.items[record.identifier], item.contentVersion == record.version, item.kind == .file {
                catalog.records[ContentKey(identifier: record.identifier, version: record.version)] = record
            } else {
                orphans.append(record)
            }
        }
        self.catalog = Locked(catalog)
        let notifying = provider as? any ChangeNotifying
        pushesChanges = notifying != nil
        immediateMetadata = provider as? any ImmediateMetadata
        for record in orphans { discard(record: record) }
        removeUnreferencedFiles()
        notifying?.observeChanges { [weak self] changes in self?.providerChanged(changes) }
    }

    // MARK: Changes

    /// Calls `observer` with every change of the catalog from now on (one observer: the file
    /// system serving it; nil stops). Called on the thread that changed the catalog, never with a
    /// lock of the cache held.
    public func observeChanges(_ observer: (@Sendable ([CatalogChange]) -> Void)?) {
        changeObserver.withLock { $0 = observer }
    }

    private func tell(_ changes: [CatalogChange]) {
        guard !changes.isEmpty, let observer = changeObserver.withLock({ $0 }) else { return }
        observer(changes)
    }

    /// The provider says what changed (`ChangeNotifying`): the listings and items concerned stop
    /// counting as fresh (the next answer asks the provider), then the observer hears of it.
    func providerChanged(_ changes: [ProviderChange]?) {
        let now = environment.timeline.now
        let expired = now - environment.options.directoryTTL
        let told = catalog.withLock { catalog -> [CatalogChange] in
            catalog.changeCount &+= 1
            func expire(_ directory: ItemIdentifier) {
                catalog.lastChange[directory] = catalog.changeCount
                catalog.listingTokens[directory] = nil
                if let at = catalog.listedAt[directory], at > expired { catalog.listedAt[directory] = expired }
            }
            guard let changes else {
                for directory in Array(catalog.listedAt.keys) { expire(directory) }
                catalog.refreshedAt.removeAll()
                return [.everything]
            }
            var told: [CatalogChange] = []
            told.reserveCapacity(changes.count)
            for change in changes {
                switch change {
                case .entry(let directory, let name), .membership(let directory, let name):
                    // A child written or chmod'ed changes only that child, asked for alone when
                    // next used; a name created or removed (or one the listing lacks) changes the
                    // listing, listed again when next used.
                    let identifier = Self.child(NameKey(name), of: directory, in: &catalog)
                    if let identifier {
                        catalog.dirty.insert(identifier)
                        catalog.refreshedAt[identifier] = nil
                    }
                    var membership = identifier == nil
                    if case .membership = change { membership = true }
                    if membership {
                        expire(directory)
                    } else {
                        // Its token is void (the provider counted the event), so the listing is
                        // listed again once it expires anyway; a listing taken meanwhile may
                        // still show the old metadata.
                        catalog.lastChange[directory] = catalog.changeCount
                    }
                    told.append(.entry(directory: directory, name: name, identifier: identifier))
                case .entries(let directory):
                    expire(directory)
                    for child in catalog.children[directory] ?? [] {
                        catalog.dirty.insert(child)
                        catalog.refreshedAt[child] = nil
                    }
                    told.append(.entries(directory: directory))
                }
            }
            return told
        }
        tell(told)
    }

    // MARK: Metadata

    /// The item as last seen, without asking the provider.
    public func cachedItem(_ identifier: ItemIdentifier) -> ProviderItem? {
        catalog.withLock { $0.items[identifier] }
    }

    /// The item's metadata, asking the provider when the cached copy is older than `maximumAge`
    /// (nil: use the cache whenever it has the item). Unreachable provider: the cached copy if
    /// any. Gone on the provider: removed from the cache, `.notFound`.
    public func item(_ identifier: ItemIdentifier, maximumAge: Duration?) async throws(CacheError) -> ProviderItem {
        if let cached = freshItem(identifier, maximumAge: maximumAge) { return cached }
        do {
            // Metadata calls get the same deadline as content chunks: a hung provider makes
            // lookup/getattr/open fall back to the cached metadata instead of hanging.
            let provider = environment.provider
            let item = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                try await provider.item(for: identifier)
            }
            apply(item)
            return item
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            case .unreachable, .timedOut:
                if let fallback = cachedItem(identifier) { return fallback }
                throw failure
            case .notFound:
                removeItem(identifier)
                throw failure
            default:
                throw failure
            }
        }
    }

    /// `item(_:maximumAge:)` without waiting: the cached copy when fresh enough, else the
    /// provider's immediate answer (`ImmediateMetadata`, D-229), applied like any other. Nil when
    /// only the async form can answer: the provider would have to be waited for, or it reported
    /// an error (the async form handles and words those).
    public func itemNow(_ identifier: ItemIdentifier, maximumAge: Duration?) -> ProviderItem? {
        if let cached = freshItem(identifier, maximumAge: maximumAge) { return cached }
        guard let provider = immediateMetadata, let item = try? provider.itemNow(for: identifier),
            item.identifier == identifier
        else { return nil }
        apply(item)
        return item
    }

    /// The item when the cached copy is younger than `maximumAge` (nil age: whenever the cache
    /// has it); nil when the provider must be asked, via `item(_:maximumAge:)`. Never waits.
    public func freshItem(_ identifier: ItemIdentifier, maximumAge: Duration?) -> ProviderItem? {
        let now = environment.timeline.now
        return catalog.withLock { Self.freshItem(identifier, maximumAge: maximumAge, now: now, in: $0) }
    }

    /// `freshItem` and `presentBytes` in one visit of the catalog (a getattr answered from memory);
    /// `tracked`: as `isTracked(_:)`.
    public func freshItemAndPresentBytes(
        _ identifier: ItemIdentifier, maximumAge: Duration?
    ) -> (ProviderItem, presentBytes: Int64, tracked: Bool)? {
        let now = environment.timeline.now
        let pushes = pushesChanges
        let found = catalog.withLock { catalog -> (ProviderItem, Presence, Bool)? in
            Self.freshItem(identifier, maximumAge: maximumAge, now: now, in: catalog).map {
                ($0, Self.presence(of: $0, in: catalog), Self.isTracked($0, pushes: pushes, in: catalog))
            }
        }
        return found.map { ($0.0, $0.1.bytes, $0.2) }
    }

    /// Whether the provider tells of every change of the item as it happens (`ChangeNotifying`,
    /// its directory's listing tracked and unchanged in membership since): then whoever caches it
    /// may keep it until told (D-228). False for the root and for untracked directories.
    public func isTracked(_ item: ProviderItem) -> Bool {
        guard pushesChanges else { return false }
        return catalog.withLock { Self.isTracked(item, pushes: true, in: $0) }
    }

    private static func isTracked(_ item: ProviderItem, pushes: Bool, in catalog: Catalog) -> Bool {
        pushes && item.identifier != .root && catalog.listingTokens[item.parent] != nil
            && (catalog.dirty.isEmpty || !catalog.dirty.contains(item.identifier))
    }

    private static func freshItem(
        _ identifier: ItemIdentifier, maximumAge: Duration?, now: Duration, in catalog: Catalog
    ) -> ProviderItem? {
        guard let item = catalog.items[identifier] else { return nil }
        if identifier == .root && item.contentVersion.rawValue == "root" { return nil }
        guard let maximumAge else { return item }
        if !catalog.dirty.isEmpty, catalog.dirty.contains(identifier) { return nil }
        guard let at = catalog.refreshedAt[identifier], now - at < maximumAge else { return nil }
        return item
    }

    /// How many bytes of the item's current content version are stored locally (0 for a
    /// placeholder, a directory or a symbolic link).
    public func presentBytes(of item: ProviderItem) -> Int64 {
        catalog.withLock { Self.presence(of: item, in: $0) }.bytes
    }

    /// Where the local byte count of an item comes from, taken under the catalog lock and read
    /// after it (an open entry's count is behind the entry's own lock).
    private enum Presence {
        case count(Int64)
        case entry(ContentEntry)

        var bytes: Int64 {
            switch self {
            case .count(let count): count
            case .entry(let entry): entry.progress.present
            }
        }
    }

    private static func presence(of item: ProviderItem, in catalog: Catalog) -> Presence {
        // Most items were never opened: no key to build or hash.
        guard item.kind == .file, !catalog.entries.isEmpty || !catalog.records.isEmpty else { return .count(0) }
        let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
        if let entry = catalog.entries[key] { return .entry(entry) }
        return .count(catalog.records[key]?.present.count ?? 0)
    }

    /// What the cached listing of a directory says about one name, without asking the provider.
    public enum CachedChild: Sendable {
        /// The listing is younger than asked and has the name; `presentBytes` as `presentBytes(of:)`,
        /// `tracked` as `isTracked(_:)`.
        case found(ProviderItem, presentBytes: Int64, tracked: Bool)
        /// The listing is younger than asked and lacks the name; `listingAge` is its age.
        case absent(listingAge: Duration)
        /// No listing young enough: the provider must be asked (`child(named:of:maximumAge:)`).
        case unknown
    }

    /// The identifier listed under `key` in `directory`, looked up in place: reading
    /// `catalog.names[directory]` would copy (retain and release) the directory's whole name table
    /// on every LOOKUP.
    private static func child(
        _ key: NameKey, of directory: ItemIdentifier, in catalog: inout Catalog
    ) -> ItemIdentifier? {
        guard let index = catalog.names.index(forKey: directory) else { return nil }
        func find(_ names: inout [NameKey: ItemIdentifier]) -> ItemIdentifier? { names[key] }
        return find(&catalog.names.values[index])
    }

    /// The child named `name` (bytes) per the cached listing, if that listing is younger than
    /// `maximumAge` (nil: any listing of this session). Never waits.
    public func cachedChild(named name: String, of directory: ItemIdentifier, maximumAge: Duration?) -> CachedChild {
        let key = NameKey(name)
        let now = environment.timeline.now
        enum Answer {
            case found(ProviderItem, Presence, tracked: Bool)
            case absent(listingAge: Duration)
            case unknown
        }
        let refreshAhead = environment.options.listingRefreshAhead
        let pushes = pushesChanges
        var listingAge = Duration.zero
        let answer = catalog.withLock { catalog -> Answer in
            guard let at = catalog.listedAt[directory] else { return .unknown }
            listingAge = now - at
            if let maximumAge, listingAge >= maximumAge { return .unknown }
            if let item = Self.child(key, of: directory, in: &catalog).flatMap({ catalog.items[$0] }) {
                // Reported changed by the provider: asked for again (`child(named:…)`).
                if !catalog.dirty.isEmpty, catalog.dirty.contains(item.identifier) { return .unknown }
                return .found(
                    item, Self.presence(of: item, in: catalog),
                    tracked: Self.isTracked(item, pushes: pushes, in: catalog))
            }
            return .absent(listingAge: listingAge)
        }
        // Not for a miss: past missRefreshInterval the caller lists in the foreground anyway.
        if case .found = answer, let refreshAhead, let maximumAge, listingAge >= refreshAhead, listingAge < maximumAge {
            refreshInBackground(directory, maximumAge: refreshAhead)
        }
        switch answer {
        case .found(let item, let presence, let tracked):
            return .found(item, presentBytes: presence.bytes, tracked: tracked)
        case .absent(let age): return .absent(listingAge: age)
        case .unknown: return .unknown
        }
    }

    /// The children of a directory, listing it again when the last listing of this session is
    /// older than `maximumAge` (nil: never re-list once listed). Unreachable provider: the last
    /// listing kept from any session, else `.unreachable`.
    public func children(
        of identifier: ItemIdentifier, maximumAge: Duration?
    ) async throws(CacheError)
        -> [ProviderItem]
    {
        try await listChildren(of: identifier, maximumAge: maximumAge)
        return catalog.withLock { Self.childItems(of: identifier, in: $0) }
    }

    /// Makes the catalog hold a listing of `identifier` younger than `maximumAge` (or, with the
    /// provider unreachable, any listing kept from any session). Lookups use this without
    /// building the sorted children array.
    private func listChildren(of identifier: ItemIdentifier, maximumAge: Duration?) async throws(CacheError) {
        let now = environment.timeline.now
        let fresh = catalog.withLock { catalog -> Bool in
            guard let at = catalog.listedAt[identifier] else { return false }
            if let maximumAge, now - at >= maximumAge { return false }
            return true
        }
        if fresh { return }
        let tracking = environment.provider as? any ListingChangeTracking
        if let tracking, revalidateListing(of: identifier, with: tracking, at: now) { return }
        // Read before the provider's token: a change reported after it may be missing from the listing.
        let changeCount = catalog.withLock { $0.changeCount }
        do {
            let provider = environment.provider
            let listed = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                () async throws -> (children: [ProviderItem], token: ListingChangeToken?) in
                if let tracking { return try await tracking.trackedChildren(of: identifier) }
                return (try await provider.children(of: identifier), nil)
            }
            applyListing(
                of: identifier, children: listed.children, token: listed.token, at: now, changeCount: changeCount)
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            case .unreachable, .timedOut:
                if catalog.withLock({ $0.children[identifier] != nil }) { return }
                throw failure
            case .notFound:
                removeItem(identifier)
                throw failure
            default:
                throw failure
            }
        }
    }

    /// A listing past its age whose directory the provider reports unchanged since the listing
    /// was taken is as good as one taken now: it and its children count as refreshed `now`, with
    /// no provider call (D-224). Not once the listing itself is `fullListingInterval` old (what
    /// the provider's tracking misses is seen then). False: list again.
    private func revalidateListing(
        of directory: ItemIdentifier, with tracking: any ListingChangeTracking, at now: Duration
    ) -> Bool {
        let limit = environment.options.fullListingInterval
        guard
            let tracked = catalog.withLock({ catalog -> ListingChangeToken? in
                guard catalog.listedAt[directory] != nil, let tracked = catalog.listingTokens[directory],
                    now - tracked.listedAt < limit
                else { return nil }
                return tracked.token
            }), !tracking.hasChanges(since: tracked)
        else { return false }
        return catalog.withLock { catalog in
            // Checked again: a listing applied meanwhile carries its own token.
            guard catalog.listingTokens[directory]?.token == tracked, let applied = catalog.listedAt[directory],
                applied < now
            else { return false }
            catalog.listedAt[directory] = now
            for child in catalog.children[directory] ?? [] { catalog.refreshedAt[child] = now }
            return true
        }
    }

    /// Lists `directory` again in a task of its own unless one is already doing so (or the cache
    /// is shutting down). Errors are left to the next lookup that needs the listing.
    private func refreshInBackground(_ directory: ItemIdentifier, maximumAge: Duration) {
        refreshes.withLock { refreshes in
            // At most `maximumBackgroundRefreshes` at once: a tree walk over many directories
            // must not start a listing per directory; the rest are listed when a lookup needs it.
            guard !refreshes.closed, refreshes.tasks[directory] == nil,
                refreshes.tasks.count < Self.maximumBackgroundRefreshes
            else { return }
            // Registered under the lock the task takes to deregister: it cannot finish first.
            refreshes.tasks[directory] = Task { [self] in
                try? await listChildren(of: directory, maximumAge: maximumAge)
                _ = self.refreshes.withLock { $0.tasks.removeValue(forKey: directory) }
            }
        }
    }

    static let maximumBackgroundRefreshes = 2

    /// Waits for the background re-listings running now (tests; shutdown cancels them instead).
    public func waitForBackgroundRefreshes() async {
        for task in refreshes.withLock({ Array($0.tasks.values) }) { await task.value }
    }

    /// The child of `directory` named exactly `name` (bytes), listing the directory first if its
    /// listing is older than `maximumAge`. Nil when there is no such child.
    public func child(
        named name: String, of directory: ItemIdentifier, maximumAge: Duration?
    ) async throws(CacheError) -> ProviderItem? {
        switch cachedChild(named: name, of: directory, maximumAge: maximumAge) {
        case .found(let item, _, _): return item
        case .absent: return nil
        case .unknown: break
        }
        try await listChildren(of: directory, maximumAge: maximumAge)
        let key = NameKey(name)
        let (found, dirty) = catalog.withLock { catalog -> (ProviderItem?, Bool) in
            let found = catalog.names[directory]?[key].flatMap { catalog.items[$0] }
            return (found, found.map { catalog.dirty.contains($0.identifier) } ?? false)
        }
        // Reported changed since listed: its own metadata, asked for alone (gone: removed, nil).
        guard let found, dirty else { return found }
        do {
            return try await item(found.identifier, maximumAge: .zero)
        } catch  where error.code == .notFound {
            return nil
        }
    }

    /// A name the cached listing lacks, asked of the provider again: with a provider that looks
    /// up one name (`NamedChildLookup`), that name alone; otherwise by listing the directory.
    /// A child found is recorded like a listed one. Nil: there is no such child.
    public func recheckMissingChild(
        named name: String, of directory: ItemIdentifier
    ) async throws(CacheError)
        -> ProviderItem?
    {
        guard let lookup = environment.provider as? any NamedChildLookup else {
            return try await child(named: name, of: directory, maximumAge: .zero)
        }
        let found: ProviderItem?
        do {
            found = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                try await lookup.child(named: name, of: directory)
            }
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            // No answer from the provider: the listing we have stands (the name is missing).
            case .unreachable, .timedOut: return nil
            case .notFound:
                removeItem(directory)
                throw failure
            default: throw failure
            }
        }
        guard let found else { return nil }
        // Another identifier under that name in the index is the old holder of the name.
        let key = NameKey(name)
        let previous = catalog.withLock { $0.names[directory]?[key] }
        if let previous, previous != found.identifier { removeItem(previous) }
        apply(found)
        return found
    }

    /// The names and identifiers the cached listing of `directory` has, without asking the provider.
    public func cachedChildNames(of directory: ItemIdentifier) -> [(name: String, identifier: ItemIdentifier)] {
        catalog.withLock { catalog in
            (catalog.names[directory] ?? [:]).map { (name: $0.key.name, identifier: $0.value) }
        }
    }

    /// How long ago (on the cache's timeline) the directory was listed in this session.
    public func listingAge(of identifier: ItemIdentifier) -> Duration? {
        let now = environment.timeline.now
        return catalog.withLock { catalog in catalog.listedAt[identifier].map { now - $0 } }
    }

    private static func childItems(of identifier: ItemIdentifier, in catalog: Catalog) -> [ProviderItem] {
        (catalog.children[identifier] ?? []).compactMap { catalog.items[$0] }.sorted { $0.name < $1.name }
    }

    /// Records new metadata for one item; a new content version supersedes the old content.
    private func apply(_ item: ProviderItem) {
        let now = environment.timeline.now
        var told: [CatalogChange] = []
        let (changed, superseded) = catalog.withLock { catalog -> (Bool, [ContentEntryOrRecord]) in
            catalog.refreshedAt[item.identifier] = now
            if !catalog.dirty.isEmpty { catalog.dirty.remove(item.identifier) }
            let old = catalog.items[item.identifier]
            if let old, old != item, old.identifier != .root {
                told.append(.entry(directory: old.parent, name: old.name, identifier: old.identifier))
                if old.name != item.name || old.parent != item.parent {
                    told.append(.entry(directory: item.parent, name: item.name, identifier: old.identifier))
                }
            }
            var item = item
            if let old { item.identifier = old.identifier }  // the stored string: see `sharingStorage`
            catalog.items[item.identifier] = item
            if item.identifier != .root, catalog.children[item.parent] != nil {
                if catalog.children[item.parent]!.insert(item.identifier).inserted || old?.name != item.name {
                    if let old { catalog.names[item.parent]?[NameKey(old.name)] = nil }
                    catalog.names[item.parent, default: [:]][NameKey(item.name)] = item.identifier
                }
            }
            guard let old, old.contentVersion != item.contentVersion || old.kind != item.kind else {
                return (old != item, [])
            }
            return (true, Self.takeContents(of: item.identifier, except: item.contentVersion, from: &catalog))
        }
        if changed { save([item]) }
        tell(told)
        finish(superseded, error: CacheError(.stale, "\(item.identifier) changed on the provider"))
    }

    /// Replaces the children of `directory` with a fresh listing: new items appear, changed ones
    /// are updated (old content superseded), missing ones are removed with their descendants.
    private func applyListing(
        of directory: ItemIdentifier, children listed: [ProviderItem], token: ListingChangeToken? = nil,
        at now: Duration, changeCount: UInt64? = nil
    ) {
        var told: [CatalogChange] = []
        let (toSave, removed, superseded) = catalog.withLock {
            catalog -> ([ProviderItem], [ItemIdentifier], [ContentEntryOrRecord]) in
            // Two listings can overlap (a background refresh and a lookup miss): one taken
            // before the listing already applied is older news and is dropped.
            if let applied = catalog.listedAt[directory], applied > now { return ([], [], []) }
            // The provider reported a change in the directory after this listing began: it may
            // not show it, so it stands (it is newer than what the catalog has) but is not
            // trusted past this answer (expired, no token) and reported items stay dirty.
            let raced = changeCount.map { (catalog.lastChange[directory] ?? 0) > $0 } ?? false
            var toSave: [ProviderItem] = []
            var superseded: [ContentEntryOrRecord] = []
            var removed: [ItemIdentifier] = []
            let oldIdentifiers = catalog.children[directory]
            // What a re-list changed is told (a first listing changes nothing anyone was told).
            func tellRemoved(_ identifier: ItemIdentifier) {
                if oldIdentifiers != nil, let old = catalog.items[identifier] {
                    told.append(.entry(directory: directory, name: old.name, identifier: identifier))
                }
            }
            // A re-list usually finds the same children: one set probe per child tells, instead of
            // building and comparing sets of thousands.
            var sameMembers =
                oldIdentifiers.map { old in
                    old.count == listed.count && listed.allSatisfy { old.contains($0.identifier) }
                } ?? false
            var newIdentifiers = oldIdentifiers ?? []
            // Membership compared the slow way: old children not listed any more are removed.
            func removeUnlisted() {
                newIdentifiers = Set(listed.map(\.identifier))
                for identifier in (oldIdentifiers ?? []).subtracting(newIdentifiers) {
                    tellRemoved(identifier)
                    removed += Self.removeSubtree(identifier, from: &catalog, superseded: &superseded)
                }
            }
            if !sameMembers { removeUnlisted() }
            var renamed = false
            var stampedTwice = false
            for var item in listed {
                let old = catalog.items[item.identifier]
                if let old { item.identifier = old.identifier }  // the stored string: see `sharingStorage`
                if let old, old.contentVersion != item.contentVersion || old.kind != item.kind {
                    superseded += Self.takeContents(of: item.identifier, except: item.contentVersion, from: &catalog)
                    if old.kind != item.kind {
                        removed += Self.removeSubtree(item.identifier, from: &catalog, superseded: &superseded)
                    }
                }
                if old != item {
                    if let old, oldIdentifiers != nil {
                        told.append(.entry(directory: directory, name: old.name, identifier: old.identifier))
                        if old.name != item.name {
                            told.append(.entry(directory: directory, name: item.name, identifier: old.identifier))
                        }
                    }
                    toSave.append(item)
                    catalog.items[item.identifier] = item
                    if old?.name != item.name { renamed = true }
                }
                if catalog.refreshedAt.updateValue(now, forKey: item.identifier) == now { stampedTwice = true }
                if !raced, !catalog.dirty.isEmpty { catalog.dirty.remove(item.identifier) }
            }
            if sameMembers, stampedTwice {
                // An identifier listed twice (or one refreshed at this very instant) can hide a
                // missing child behind an equal count: compare the sets after all. Every listed
                // child was already a child here, so none of them is inside what is removed.
                sameMembers = false
                removeUnlisted()
            }
            // The by-name index changes only when membership or a name did (a re-list of an
            // unchanged directory of thousands of files rebuilds nothing).
            if renamed || !removed.isEmpty || !sameMembers || catalog.names[directory] == nil {
                catalog.names[directory] = Dictionary(
                    listed.map { (NameKey($0.name), Self.sharingStorage($0.identifier, in: catalog)) },
                    uniquingKeysWith: { first, _ in first })
            }
            catalog.children[directory] = newIdentifiers
            catalog.listedAt[directory] = raced ? now - environment.options.directoryTTL : now
            catalog.listingTokens[directory] = raced ? nil : token.map { ($0, now) }
            if oldIdentifiers == nil, let directoryItem = catalog.items[directory] { toSave.append(directoryItem) }
            return (toSave, removed, superseded)
        }
        if !removed.isEmpty {
            do { try environment.store.deleteItems(removed) } catch {
                environment.logger.warning("cannot delete items from the metadata store: \(error)")
            }
        }
        save(toSave)
        tell(told)
        finish(superseded, error: CacheError(.stale, "the item changed or was deleted on the provider"))
    }

    /// `identifier` as the catalog stores it. The name index, the item table and the node table
    /// then hold one string per identifier, and every lookup's probes compare it by pointer
    /// instead of by bytes (a memcmp was 4 % of the daemon's time in a stat loop).
    private static func sharingStorage(_ identifier: ItemIdentifier, in catalog: Catalog) -> ItemIdentifier {
        catalog.items.index(forKey: identifier).map { catalog.items.keys[$0] } ?? identifier
    }

    /// Forgets an item the provider no longer has (and its descendants).
    private func removeItem(_ identifier: ItemIdentifier) {
        guard identifier != .root else { return }
        var told: [CatalogChange] = []
        let (removed, superseded) = catalog.withLock { catalog -> ([ItemIdentifier], [ContentEntryOrRecord]) in
            var superseded: [ContentEntryOrRecord] = []
            if let item = catalog.items[identifier] {
                told.append(.entry(directory: item.parent, name: item.name, identifier: identifier))
            }
            let removed = Self.removeSubtree(identifier, from: &catalog, superseded: &superseded)
            return (removed, superseded)
        }
        tell(told)
        if !removed.isEmpty {
            do { try environment.store.deleteItems(removed) } catch {
                environment.logger.warning("cannot delete items from the metadata store: \(error)")
            }
        }
        finish(superseded, error: CacheError(.deletedRemotely, "\(identifier) was deleted on the provider"))
    }

    private static func removeSubtree(
        _ identifier: ItemIdentifier, from catalog: inout Catalog, superseded: inout [ContentEntryOrRecord]
    ) -> [ItemIdentifier] {
        var removed: [ItemIdentifier] = []
        var stack = [identifier]
        while let next = stack.popLast() {
            guard let item = catalog.items.removeValue(forKey: next) else { continue }
            removed.append(next)
            stack += catalog.children.removeValue(forKey: next) ?? []
            catalog.listedAt[next] = nil
            catalog.listingTokens[next] = nil
            catalog.refreshedAt[next] = nil
            catalog.lastChange[next] = nil
            if !catalog.dirty.isEmpty { catalog.dirty.remove(next) }
            superseded += takeContents(of: next, except: nil, from: &catalog)
            catalog.names[next] = nil
            if catalog.children[item.parent] != nil {
                catalog.children[item.parent]!.remove(next)
                let key = NameKey(item.name)
                if catalog.names[item.parent]?[key] == next { catalog.names[item.parent]?[key] = nil }
            }
        }
        return removed
    }

    private enum ContentEntryOrRecord {
        case entry(ContentEntry)
        case record(ContentRecord)
    }

    /// Removes from the catalog the contents of `identifier` other than `version`.
    private static func takeContents(
        of identifier: ItemIdentifier, except version: ContentVersion?, from catalog: inout Catalog
    ) -> [ContentEntryOrRecord] {
        var result: [ContentEntryOrRecord] = []
        for (key, entry) in catalog.entries where key.identifier == identifier && key.version != version {
            catalog.entries[key] = nil
            result.append(.entry(entry))
        }
        for (key, record) in catalog.records where key.identifier == identifier && key.version != version {
            catalog.records[key] = nil
            result.append(.record(record))
        }
        return result
    }

    /// Superseded content: entries still pinned by handles are retired (their present bytes stay
    /// readable, missing ones fail with `error`) and discarded at their last unpin; others now.
    private func finish(_ superseded: [ContentEntryOrRecord], error: CacheError) {
        for content in superseded {
            switch content {
            case .record(let record): discard(record: record)
            case .entry(let entry):
                entry.retire(error)
                discardIfUnused(entry)
            }
        }
    }

    private func save(_ items: [ProviderItem]) {
        guard !items.isEmpty else { return }
        let stored = catalog.withLock { catalog in
            items.map { StoredItem(item: $0, childrenListed: catalog.children[$0.identifier] != nil) }
        }
        do { try environment.store.saveItems(stored) } catch {
            environment.logger.warning("cannot save items to the metadata store: \(error)")
        }
    }

    private func contentPath(_ fileNumber: Int64) -> String { "\(directory)/content/\(fileNumber)" }

    /// Deletes content files no record names (a crash before their first range-map save, or a
    /// record deleted while its file was kept open), at startup before any entry exists.
    private func removeUnreferencedFiles() {
        let referenced = catalog.withLock { catalog in Set(catalog.records.values.map(\.fileNumber)) }
        guard let handle = opendir(directory + "/content") else { return }
        var stray: [String] = []
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard name != ".", name != ".." else { continue }
            if let number = Int64(name), referenced.contains(number) { continue }
            stray.append(name)
        }
        closedir(handle)
        for name in stray { unlink(directory + "/content/" + name) }
        if !stray.isEmpty { environment.logger.info("removed \(stray.count) unreferenced cache files") }
    }

    private func discard(record: ContentRecord) {
        unlink(contentPath(record.fileNumber))
        do { try environment.store.deleteContent(identifier: record.identifier, version: record.version) } catch {
            environment.logger.warning("cannot delete a content record: \(error)")
        }
    }

    private func discard(entry: ContentEntry) {
        discard(
            record: ContentRecord(
                identifier: entry.identifier, version: entry.version, size: entry.size, fileNumber: entry.fileNumber,
                present: ByteRanges()))
    }

    // MARK: Content

    /// The content entry of `item`'s current version, pinned (call `unpin` when done). Its file is
    /// created on the I/O pool on first use.
    public func pinContent(of item: ProviderItem) async throws(CacheError) -> ContentEntry {
        guard item.kind == .file else { throw CacheError(.wrongKind, "\(item.identifier) is not a file") }
        let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
        if let entry = pinOpenEntry(key) { return entry }
        return try await environment.pool.run { () throws(CacheError) -> ContentEntry in
            try self.creationLock.withLock { () throws(CacheError) -> ContentEntry in
                try self.createEntry(key, item: item)
            }
        }
    }

    /// `pinContent(of:)` on the calling thread (which may block on local file I/O: a new entry
    /// opens its cache file). Nil on any error, for the async form to report.
    public func pinContentNow(of item: ProviderItem) -> ContentEntry? {
        guard item.kind == .file else { return nil }
        let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
        if let entry = pinOpenEntry(key) { return entry }
        return try? creationLock.withLock { () throws(CacheError) -> ContentEntry in
            try createEntry(key, item: item)
        }
    }

    /// The open entry of `key`, pinned under the catalog lock (so an idle close cannot take it).
    private func pinOpenEntry(_ key: ContentKey) -> ContentEntry? {
        catalog.withLock { catalog -> ContentEntry? in
            let entry = catalog.entries[key]
            entry?.pin()
            return entry
        }
    }

    private func createEntry(_ key: ContentKey, item: ProviderItem) throws(CacheError) -> ContentEntry {
        enum Existing {
            case entry(ContentEntry)
            case record(ContentRecord, isNew: Bool)
        }
        let existing = try catalog.withLock { catalog throws(CacheError) -> Existing in
            if catalog.isShutDown { throw CacheError(.cancelled, "the cache is shutting down") }
            if let entry = catalog.entries[key] {
                entry.pin()
                return .entry(entry)
            }
            if let record = catalog.records[key] { return .record(record, isNew: false) }
            let record = ContentRecord(
                identifier: key.identifier, version: key.version, size: item.size, fileNumber: catalog.nextFileNumber,
                present: ByteRanges())
            catalog.nextFileNumber += 1
            return .record(record, isNew: true)
        }
        let record: ContentRecord
        switch existing {
        case .entry(let entry): return entry
        case .record(let found, _):
            // A new record is saved by the first range-map save, not now: a file that never got
            // a saved range is an orphan, deleted at the next start (one SQLite write less per
            // first open).
            record = found
        }
        let file = try ContentFile(path: contentPath(record.fileNumber), size: record.size, pool: environment.pool)
        let entry = ContentEntry(record: record, file: file, environment: environment)
        entry.pin()
        entry.setDeferredPersist { [weak self] entry in self?.schedulePersist(entry) }
        entry.setIdleHandler { [weak self] entry in
            guard let self else { return }
            let key = ContentKey(identifier: entry.identifier, version: entry.version)
            if self.catalog.withLock({ $0.entries[key] === entry }) {
                self.close(ifIdle: entry)
            } else {
                self.discardIfUnused(entry)
            }
        }
        let current = catalog.withLock { catalog -> Bool in
            catalog.records[key] = nil
            // The item may have changed while the file was opened: then this entry is born retired.
            guard catalog.items[key.identifier]?.contentVersion == key.version else { return false }
            catalog.entries[key] = entry
            return true
        }
        if !current { entry.retire(CacheError(.stale, "\(key.identifier) changed on the provider")) }
        return entry
    }

    /// Gives back a pin. A superseded entry is discarded at its last unpin; a current one is
    /// closed once idle (no pin, no download), keeping its record, so open descriptors stay
    /// bounded by open handles and running downloads, not by the number of files ever read.
    public func unpin(_ entry: ContentEntry) {
        let remaining = entry.unpin()
        guard remaining == 0 else { return }
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        let live = catalog.withLock { $0.entries[key] === entry }
        if live { close(ifIdle: entry) } else { discardIfUnused(entry) }
    }

    /// Deletes a superseded entry's file and record, unless the catalog still uses that file (the
    /// entry was closed into a record, or reopened as a new entry of the same file).
    private func discardIfUnused(_ entry: ContentEntry) {
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        let inUse = catalog.withLock { catalog in
            catalog.entries[key]?.fileNumber == entry.fileNumber || catalog.records[key]?.fileNumber == entry.fileNumber
        }
        if !inUse && entry.pins == 0 { discard(entry: entry) }
    }

    /// Replaces an idle live entry by its record (the entry's file descriptor closes with it).
    private func close(ifIdle entry: ContentEntry) {
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        catalog.withLock { catalog in
            // Lock order catalog → entry: a concurrent pinContent pins under the catalog lock, so
            // an entry found idle here cannot gain a pin before it is removed.
            guard catalog.entries[key] === entry, entry.isIdle else { return }
            catalog.entries[key] = nil
            catalog.records[key] = entry.record
        }
    }

    /// Items with content in the cache: an open entry or a stored record of their current or an
    /// older version (for `contentActivity()`, ProviderCache+Control.swift).
    var identifiersWithContent: Set<ItemIdentifier> {
        catalog.withLock { Set($0.entries.keys.map(\.identifier)).union($0.records.keys.map(\.identifier)) }
    }

    /// Number of content entries open (tests: descriptors are bounded).
    public var openEntryCount: Int { catalog.withLock { $0.entries.count } }

    /// The state of an item, from the cache only (no provider call).
    public func status(of identifier: ItemIdentifier) -> ItemStatus? {
        let found = catalog.withLock { catalog -> (ProviderItem, ContentEntry?, ContentRecord?, Bool)? in
            guard let item = catalog.items[identifier] else { return nil }
            let key = ContentKey(identifier: identifier, version: item.contentVersion)
            return (item, catalog.entries[key], catalog.records[key], catalog.children[identifier] != nil)
        }
        guard let (item, entry, record, listed) = found else { return nil }
        switch item.kind {
        case .directory, .symbolicLink:
            let state: ItemStatus.State = item.kind == .symbolicLink || listed ? .materialized : .dataless
            return ItemStatus(
                identifier: identifier, kind: item.kind, state: state, presentBytes: 0, totalBytes: 0,
                version: item.contentVersion, lastError: nil)
        case .file:
            let progress =
                entry?.progress
                ?? ContentProgress(
                    present: record?.present.count ?? 0, total: item.size, downloading: false,
                    lastError: record?.lastError)
            let state: ItemStatus.State =
                if progress.downloading {
                    .downloading
                } else if progress.present >= item.size {
                    .materialized
                } else if progress.lastError != nil {
                    .error
                } else if progress.present > 0 {
                    .partial
                } else {
                    .dataless
                }
            return ItemStatus(
                identifier: identifier, kind: .file, state: state, presentBytes: progress.present,
                totalBytes: item.size,
                version: item.contentVersion, lastError: state == .materialized ? nil : progress.lastError)
        }
    }

    /// Number of items known (for statfs).
    public var itemCount: Int { catalog.withLock { $0.items.count } }

    /// Queues `entry`'s range-map save for a batch run `persistDelay` later (on the injected
    /// clock) or at shutdown, whichever comes first. A crash before it only loses the map (the
    /// bytes are fetched again), never claims bytes that are not on disk.
    func schedulePersist(_ entry: ContentEntry) {
        let start = pendingPersists.withLock { pending -> Bool in
            pending.entries[ObjectIdentifier(entry)] = entry
            if pending.scheduled { return false }
            pending.scheduled = true
            return true
        }
        guard start else { return }
        let delay = environment.options.persistDelay
        let timeline = environment.timeline
        Task { [weak self] in
            try? await timeline.sleep(for: delay)
            await self?.flushPendingPersists()
        }
    }

    /// Saves every queued range map now.
    public func flushPendingPersists() async {
        let entries = pendingPersists.withLock { pending -> [ContentEntry] in
            defer {
                pending.entries = [:]
                pending.scheduled = false
                pending.flushing += 1
            }
            return Array(pending.entries.values)
        }
        for entry in entries { await entry.persist() }
        let waiters = pendingPersists.withLock { pending -> [CheckedContinuation<Void, Never>] in
            pending.flushing -= 1
            guard pending.flushing == 0 else { return [] }
            defer { pending.flushWaiters = [] }
            return pending.flushWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once no batch flush is running.
    func waitForRunningFlushes() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = pendingPersists.withLock { pending -> Bool in
                if pending.flushing == 0 { return true }
                pending.flushWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }

    /// Stops every download, fails waiting readers, saves range maps. Later content requests fail.
    public func shutdown() async {
        (environment.provider as? any ChangeNotifying)?.observeChanges(nil)
        observeChanges(nil)
        let entries = catalog.withLock { catalog -> [ContentEntry] in
            catalog.isShutDown = true
            return Array(catalog.entries.values)
        }
        let running = refreshes.withLock { refreshes in
            refreshes.closed = true
            return Array(refreshes.tasks.values)
        }
        for task in running {
            task.cancel()
            await task.value
        }
        for entry in entries {
            entry.retire(CacheError(.cancelled, "the file system is shutting down"))
            await entry.waitForDownload()
            await entry.persist()
        }
        await flushPendingPersists()
        // A batch that the persist timer started before shutdown may still be saving.
        await waitForRunningFlushes()
    }
}

extension ProviderCache {
    /// The item's path relative to the provider root ("" for the root), from the cached names of
    /// its ancestors; nil when an ancestor is not cached.
    public func path(of identifier: ItemIdentifier) -> String? {
        catalog.withLock { catalog in
            var components: [String] = []
            var current = identifier
            while current != .root {
                guard let item = catalog.items[current], components.count < 4096 else { return nil }
                components.append(item.name)
                current = item.parent
            }
            return components.reversed().joined(separator: "/")
        }
    }
}
