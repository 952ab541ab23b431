// The namespace catalog: the provider's items and listings as last seen (kept in memory, written
// through to a MetadataStore), their freshness (TTLs, pushed changes, listing tokens), lookups and
// misses. Content is the ContentStore's: a new content version or a removed item hands the old
// content to it (`ContentStore.supersede`), after the catalog changed.
//
// Lock order: `Catalog.state` → `ContentStore.state` → `ContentEntry.state`; the catalog calls the
// content store only with its own lock dropped.

import Diagnostics
public import ProviderModel
import SystemSupport

/// A change of the catalog that whoever caches its answers (the kernel, through the file system)
/// must hear of: told after the catalog changed, so that an answer asked for after the telling
/// is the new one.
public enum CatalogChange: Sendable, Equatable {
    /// The entry `name` of `directory` changed (created, deleted, renamed, written, metadata);
    /// `identifier` is the item the catalog had under that name, if any.
    case entry(directory: ItemIdentifier, name: String, identifier: ItemIdentifier?)
    /// Any entry of `directory` may have changed.
    case entries(directory: ItemIdentifier)
    /// The item's own attributes changed (a directory's mtime, when the mount changed its
    /// entries), not its name.
    case attributes(ItemIdentifier)
    /// Anything may have changed (the provider lost track).
    case everything
}

/// Points inside a change made through the mount where a listing applied by another task could
/// meet the change half made (D-407): each is reached with no lock held. Tests apply a listing
/// there (`CatalogHooks`); since D-407 each comes after the change is recorded.
public enum CatalogStep: Sendable, Equatable {
    /// `moved`: the old identifier counted as gone for listings on their way.
    case moveRecorded
    /// `moved`: the identifiers re-keyed (`identifiersMoved`).
    case moveRekeyed
    /// `applyCreated`: the new item applied.
    case createApplied
    /// `createdUnborn`: the item the catalog had under the name removed.
    case unbornNameFreed
}

/// Test seams of the catalog (D-407). Unset (the default) each costs one nil check.
public struct CatalogHooks: Sendable {
    /// Called at each `CatalogStep` with the catalog, no lock held.
    public var step: (@Sendable (Catalog, CatalogStep) -> Void)?
    public init(step: (@Sendable (Catalog, CatalogStep) -> Void)? = nil) { self.step = step }
}

/// The provider's namespace with the refresh rules of docs/SEMANTICS.md ("Remote changes").
///
/// Item access, by what the answer promises:
/// - `knownItem(_:)`: whatever the catalog holds; no freshness promise, never asks the provider.
/// - `itemNow(_:maximumAge:)`: fresh (younger than `maximumAge`, not reported changed), or nil
///   when answering would wait for the provider. Never waits.
/// - `item(_:maximumAge:)`: fresh, asking the provider if needed (async).
/// Children, the same way: `childNow(named:of:)` / `child(named:of:)` apply the lookup policy
/// (listing TTL, then a miss rechecked once the listing is `missRefreshInterval` old).
public final class Catalog: Sendable {
    let environment: CacheEnvironment
    /// Where superseded and removed items' content goes.
    let content: ContentStore
    let state: Locked<State>

    /// Who hears of catalog changes (`observeChanges`).
    private let changeObserver = Locked<Callback<[CatalogChange]>?>(nil)

    /// The provider pushes changes (`.changeNotifying`): a tracked listing is kept exact by them.
    public let pushesChanges: Bool

    /// The provider, when it offers `.immediateMetadata` (`itemNow`).
    let immediateMetadata: (any Provider)?

    /// Test seams (D-407).
    let hooks: CatalogHooks

    /// Who hears of changes the provider made (D-403); nil: nobody.
    let providerChanges: (any ProviderChangeListener)?
    /// Refreshes of items a listener wants that the provider reported changed (D-403).
    let wantedRefreshes = Locked(WantedRefreshes())

    /// Background re-listings (`listingRefreshAhead`) by directory; shutdown cancels and awaits them.
    private let refreshes = Locked<(tasks: [ItemIdentifier: Task<Void, Never>], closed: Bool)>(([:], false))

    /// Items of listings answered before their save to the store, saved soon (`saveSoon`, D-486);
    /// shutdown saves them at once and waits for saves under way.
    let listingSaves = Locked<(identifiers: [ItemIdentifier], task: Task<Void, Never>?, closed: Bool)>(([], nil, false))
    let listingSavesRunning = PendingWork()

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

    struct State {
        var items: [ItemIdentifier: ProviderItem] = [:]
        /// Children of directories listed at least once (in any session).
        var children: [ItemIdentifier: Set<ItemIdentifier>] = [:]
        /// The same children by name, compared byte for byte (lookup is O(1), not a scan).
        var names: [ItemIdentifier: [NameKey: ItemIdentifier]] = [:]
        /// When (on the timeline) a directory was last listed, or its listing revalidated, in this
        /// session.
        var listedAt: [ItemIdentifier: Duration] = [:]
        /// A listing's change token (`.listingChangeTracking`) and when that listing was taken.
        var listingTokens: [ItemIdentifier: (token: ListingChangeToken, listedAt: Duration)] = [:]
        /// When an item's metadata was last confirmed by the provider in this session.
        var refreshedAt: [ItemIdentifier: Duration] = [:]
        /// Items the provider reported changed (`.changeNotifying`) since their metadata was last
        /// confirmed: asked for again before they are used.
        var dirty: Set<ItemIdentifier> = []
        /// Counts the provider's change reports; `lastChange[directory]` is the count at the last
        /// report about that directory's entries. A listing started before it may miss the change.
        var changeCount: UInt64 = 0
        var lastChange: [ItemIdentifier: UInt64] = [:]
        /// Directories whose next change is known to be their own metadata only (the mount made
        /// or removed an entry in them; the provider reported their attributes changed): the
        /// kernel is told to drop their attributes, not their dentry (D-382). Anything else that
        /// touches them (a membership report, a removal) takes them out.
        var metadataOnly: Set<ItemIdentifier> = []
        /// Directories a write-back upload is writing into now, with how many (D-384), and those
        /// of them the mount itself changed meanwhile (their held metadata is not theirs any more).
        var writtenInto: [ItemIdentifier: Int] = [:]
        var changedWhileWritten: Set<ItemIdentifier> = []
        /// Directories whose metadata an upload asks the provider for before it writes into them
        /// (`beginWriting`), with how many, and the chmod or utimens the mount made of them
        /// meanwhile, whose answer is newer than the one asked for (D-521).
        var capturing: [ItemIdentifier: (count: Int, set: ProviderItem?)] = [:]
        /// Items with a local version (Catalog+Local.swift): served instead of the provider's.
        var localVersions: [ItemIdentifier: LocalVersion] = [:]
        /// chmod and utimens the write-back holds until it makes them at the provider (D-460):
        /// shown over whatever the provider says of the item until then (Catalog+Local.swift).
        var heldAttributes: [ItemIdentifier: HeldAttributes] = [:]
        /// Files created through the mount that the provider does not have yet (D-386): the
        /// catalog's item is the truth until their `.create` upload; what the provider says of
        /// their identifier meanwhile (nothing, or someone else's file of that name) is not.
        var unborn: Set<ItemIdentifier> = []
        /// Listings of a directory on their way now, with how many, and what the mount changed in
        /// those directories meanwhile: a child made or moved in (present) or deleted or moved
        /// out (absent), at which `changeCount`. A listing taken before such a change does not
        /// undo it (D-388). Kept only while a listing of the directory is on its way.
        var listingsInFlight: [ItemIdentifier: Int] = [:]
        var changedWhileListed: [ItemIdentifier: [ItemIdentifier: (count: UInt64, present: Bool)]] = [:]
        /// Every item's st_ino (D-389): handed out where an item enters `items`, re-keyed with
        /// it, dropped with it, saved with it.
        var serials = ItemSerials()
        /// Paths (relative to the root) the mount is changing at the provider now, from before
        /// its provider call until the catalog recorded the result, with how many changes: what
        /// the provider shows of them meanwhile is the mount's own change (D-403).
        var ownChanges: [String: Int] = [:]
        /// Questions to the provider on their way now (listings, item and name lookups), by the
        /// `changeCount` read when each was asked (`beginQuestion`), with how many; and the paths
        /// whose `ownChanges` ended since the oldest of them was asked, with the `changeCount` of
        /// the end. An answer asked before that end may predate the change (D-465).
        var questions: [UInt64: Int] = [:]
        var ownEnded: [String: UInt64] = [:]
    }

    /// Content of an item that the catalog no longer has in that version: every version of
    /// `identifier` except `current` (nil: all of them).
    struct Superseded {
        var identifier: ItemIdentifier
        var current: ContentVersion?
    }

    /// The root item, before the provider has been asked.
    static func placeholderRoot() -> ProviderItem {
        ProviderItem(
            identifier: .root, parent: .root, name: "", kind: .directory, size: 0,
            modificationTime: ItemTime(seconds: 0), contentVersion: ContentVersion("root"), permissions: 0o755)
    }

    /// A catalog of the items the store kept from earlier sessions.
    init(
        stored storedItems: [StoredItem], content: ContentStore, environment: CacheEnvironment,
        providerChanges: (any ProviderChangeListener)? = nil, hooks: CatalogHooks = CatalogHooks()
    ) {
        self.environment = environment
        self.hooks = hooks
        self.providerChanges = providerChanges
        self.content = content
        var catalog = State()
        var unnumbered: [ItemIdentifier] = []
        for stored in storedItems {
            catalog.items[stored.item.identifier] = stored.item
            // Kept by the mount alone (D-398): never the provider's, as a file not created there yet.
            if stored.item.special != nil { catalog.unborn.insert(stored.item.identifier) }
            if catalog.serials.restore(stored.item.identifier, stored.serial) {
                unnumbered.append(stored.item.identifier)
            }
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
        // Rows of an older cache had no number: numbered once, after every kept number is known,
        // and saved so the next session shows the same ones.
        catalog.serials.numberRestored(unnumbered)
        let unnumberedSet = Set(unnumbered)
        let renumbered = storedItems.filter { unnumberedSet.contains($0.item.identifier) }
            .map { stored in
                var stored = stored
                stored.serial = catalog.serials[stored.item.identifier] ?? 0
                return stored
            }
        if !renumbered.isEmpty {
            do { try environment.store.saveItems(renumbered) } catch {
                environment.logger.warning("cannot save the items' serial numbers to the metadata store: \(error)")
            }
        }
        state = Locked(catalog)
        let provider = environment.provider
        pushesChanges = provider.capabilities.contains(.changeNotifying)
        immediateMetadata = provider.capabilities.contains(.immediateMetadata) ? provider : nil
    }

    /// Starts hearing the provider's pushed changes (`.changeNotifying`), once the cache is built.
    func startObservingProvider() {
        guard environment.provider.capabilities.contains(.changeNotifying) else { return }
        environment.provider.observeChanges { [weak self] changes in
            self?.providerChanged(changes)
        }
    }

    /// Hears each batch of changes the provider reported (pushed, or `refresh PATH`) once the
    /// catalog applied it: the pinned directories (D-445). No lock of the cache held.
    let afterProviderChanges = Locked<Callback<[ProviderChange]?>?>(nil)

    /// Stops telling the observer and cancels (and awaits) the background re-listings.
    func shutdown() async {
        observeChanges(nil)
        let wanted = wantedRefreshes.withLock { wanted in
            wanted.closed = true
            return wanted.task
        }
        wanted?.cancel()
        await wanted?.value
        let running = refreshes.withLock { refreshes in
            refreshes.closed = true
            return Array(refreshes.tasks.values)
        }
        for task in running {
            task.cancel()
            await task.value
        }
        let waiting = listingSaves.withLock { saves in
            saves.closed = true
            return saves.task
        }
        waiting?.cancel()  // its sleep ends now, and it saves
        await listingSavesRunning.drained()
    }

    /// The content version the catalog holds for `identifier` (nil: not known).
    func currentVersion(of identifier: ItemIdentifier) -> ContentVersion? {
        state.withLock { $0.items[identifier]?.contentVersion }
    }

    /// What stat shows as the item's st_ino (D-389): its number for as long as the catalog holds
    /// it, and across sessions. An identifier the catalog does not hold gets one now (kept until
    /// the item is removed).
    public func serialNumber(of identifier: ItemIdentifier) -> UInt64 {
        state.withLock { $0.serials.number(for: identifier) }
    }

    /// The item's st_ino and st_nlink: its number and how many names the catalog knows for its
    /// file (1 without hard links, D-396). One lock.
    public func serialAndLinks(of identifier: ItemIdentifier) -> (serial: UInt64, links: Int) {
        state.withLock { ($0.serials.number(for: identifier), $0.serials.linkCount(of: identifier)) }
    }

    /// The other names the catalog knows of the item's file (hard links, D-396), in no order.
    public func otherNames(of identifier: ItemIdentifier) -> [ItemIdentifier] {
        state.withLock { $0.serials.otherNames(of: identifier) }
    }

    /// The numbers of `identifiers`, in order (one lock for a directory's listing).
    public func serialNumbers(of identifiers: [ItemIdentifier]) -> [UInt64] {
        state.withLock { catalog in identifiers.map { catalog.serials.number(for: $0) } }
    }

    /// Whether the catalog holds a listing of `identifier` (from any session).
    func isListed(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { $0.children[identifier] != nil }
    }

    // MARK: Changes

    /// Calls `observer` with every change of the catalog from now on (one observer: the file
    /// system serving it; nil stops). Called on the thread that changed the catalog, never with a
    /// lock of the cache held.
    public func observeChanges(_ observer: (@Sendable ([CatalogChange]) -> Void)?) {
        changeObserver.withLock { $0 = observer.map(Callback.init) }
    }

    func tell(_ changes: [CatalogChange]) {
        guard !changes.isEmpty, let observer = changeObserver.withLock({ $0 })?.call else { return }
        observer(changes)
    }

    // MARK: Items

    /// Whatever the catalog holds for `identifier`: no freshness promise, never asks the provider.
    public func knownItem(_ identifier: ItemIdentifier) -> ProviderItem? {
        state.withLock { $0.items[identifier] }
    }

    /// `knownItem`, unless the item was reported changed since it was recorded (dirty: another
    /// name of its file changed, D-396; a change the provider told of): then `.askAgain`, and
    /// whoever would answer from it (readdirplus) leaves the answer to a lookup, which asks.
    public func knownItemToShow(_ identifier: ItemIdentifier) -> KnownItem {
        state.withLock { catalog in
            guard let item = catalog.items[identifier] else { return .notHeld }
            if !catalog.dirty.isEmpty, catalog.dirty.contains(identifier) { return .askAgain }
            return .held(item)
        }
    }

    /// What `knownItemToShow` finds.
    public enum KnownItem: Sendable {
        case held(ProviderItem)
        /// Recorded, but reported changed since: not to be shown before it is asked for again.
        case askAgain
        case notHeld
    }

    /// The item, fresh: the catalog's copy when younger than `maximumAge` (nil: whenever the
    /// catalog has it) and not reported changed, else the provider's answer, waited for.
    /// Unreachable provider: the known copy if any. Gone on the provider: removed, `.notFound`.
    public func item(_ identifier: ItemIdentifier, maximumAge: Duration?) async throws(CacheError) -> ProviderItem {
        if let cached = itemNow(identifier, maximumAge: maximumAge, askingProvider: false) { return cached }
        let asked = beginQuestion()
        defer { endQuestion(asked) }
        do {
            // Metadata calls get the same deadline as content chunks: a hung provider makes
            // lookup/getattr/open fall back to the cached metadata instead of hanging.
            let provider = environment.provider
            let item = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                try await provider.item(for: identifier)
            }
            return apply(item, origin: .provider)
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            case .unreachable, .timedOut:
                if let fallback = knownItem(identifier) { return fallback }
                throw failure
            case .notFound:
                // Not while the mount's own call changes it (D-465).
                if let kept = providerMissed(identifier, askedAt: asked) { return kept }
                throw failure
            default:
                throw failure
            }
        }
    }

    /// The immediate twin of `item(_:maximumAge:)`: the same fresh item, or nil when answering
    /// would wait. The catalog's copy when fresh enough; else, with `askingProvider`, the
    /// provider's immediate answer (`.immediateMetadata`, D-229), applied like any other. Nil also
    /// when the provider reported an error (the async form handles and words those). Without
    /// `askingProvider` it is answered from memory alone (a getattr on a FUSE thread).
    public func itemNow(
        _ identifier: ItemIdentifier, maximumAge: Duration?, askingProvider: Bool = true
    ) -> ProviderItem? {
        let now = environment.timeline.now
        if let cached = state.withLock({ Self.freshItem(identifier, maximumAge: maximumAge, now: now, in: $0) }) {
            return cached
        }
        guard askingProvider, let provider = immediateMetadata, let item = try? provider.itemNow(for: identifier),
            item.identifier == identifier
        else { return nil }
        return apply(item, origin: .provider)
    }

    /// Whether the provider tells of every change of the item as it happens (`.changeNotifying`,
    /// its directory's listing tracked and unchanged in membership since): then whoever caches it
    /// may keep it until told (D-228). False for the root and for untracked directories.
    public func isTracked(_ item: ProviderItem) -> Bool {
        guard pushesChanges else { return false }
        return state.withLock { Self.isTracked(item, pushes: true, in: $0) }
    }

    private static func isTracked(_ item: ProviderItem, pushes: Bool, in catalog: State) -> Bool {
        pushes && item.identifier != .root && catalog.listingTokens[item.parent] != nil
            && (catalog.dirty.isEmpty || !catalog.dirty.contains(item.identifier))
    }

    private static func freshItem(
        _ identifier: ItemIdentifier, maximumAge: Duration?, now: Duration, in catalog: State
    ) -> ProviderItem? {
        guard let item = catalog.items[identifier] else { return nil }
        if identifier == .root && item.contentVersion.rawValue == "root" { return nil }
        guard let maximumAge else { return item }
        if !catalog.unborn.isEmpty, catalog.unborn.contains(identifier) { return item }  // D-386
        if !catalog.dirty.isEmpty, catalog.dirty.contains(identifier) { return nil }
        guard let at = catalog.refreshedAt[identifier], now - at < maximumAge else { return nil }
        return item
    }

    /// Number of items known (for statfs).
    public var itemCount: Int { state.withLock { $0.items.count } }

    /// The item's path relative to the provider root ("" for the root), from the known names of
    /// its ancestors; nil when an ancestor is not known.
    public func path(of identifier: ItemIdentifier) -> String? {
        state.withLock { Self.path(of: identifier, in: $0) }
    }

    // MARK: Children

    /// What the catalog answers about one name of a directory without asking the provider.
    public enum ChildAnswer: Sendable {
        /// The name's item; `tracked` as `isTracked(_:)`.
        case found(ProviderItem, tracked: Bool)
        /// There is no such child.
        case absent
        /// Only the provider can tell: ask `child(named:of:)`.
        case unknown
    }

    /// The identifier listed under `key` in `directory`, looked up in place: reading
    /// `catalog.names[directory]` would copy (retain and release) the directory's whole name table
    /// on every LOOKUP.
    static func child(
        _ key: NameKey, of directory: ItemIdentifier, in catalog: inout State
    ) -> ItemIdentifier? {
        guard let index = catalog.names.index(forKey: directory) else { return nil }
        func find(_ names: inout [NameKey: ItemIdentifier]) -> ItemIdentifier? { names[key] }
        return find(&catalog.names.values[index])
    }

    enum CachedChild {
        /// The listing is younger than asked and has the name.
        case found(ProviderItem, tracked: Bool)
        /// The listing is younger than asked and lacks the name; `listingAge` is its age.
        case absent(listingAge: Duration)
        /// No listing young enough: the provider must be asked.
        case unknown
    }

    /// The child named `name` (bytes) per the cached listing, if that listing is younger than
    /// `maximumAge` (nil: any listing of this session). Never waits.
    func cachedChild(named name: String, of directory: ItemIdentifier, maximumAge: Duration?) -> CachedChild {
        let key = NameKey(name)
        let now = environment.timeline.now
        let refreshAhead = environment.options.listingRefreshAhead
        let pushes = pushesChanges
        var listingAge = Duration.zero
        let answer = state.withLock { catalog -> CachedChild in
            guard let at = catalog.listedAt[directory] else { return .unknown }
            listingAge = now - at
            if let maximumAge, listingAge >= maximumAge { return .unknown }
            if let item = Self.child(key, of: directory, in: &catalog).flatMap({ catalog.items[$0] }) {
                // Reported changed by the provider: asked for again (`child(named:…)`).
                if !catalog.dirty.isEmpty, catalog.dirty.contains(item.identifier) { return .unknown }
                return .found(item, tracked: Self.isTracked(item, pushes: pushes, in: catalog))
            }
            return .absent(listingAge: listingAge)
        }
        // Not for a miss: past missRefreshInterval the caller lists in the foreground anyway.
        if case .found = answer, let refreshAhead, let maximumAge, listingAge >= refreshAhead, listingAge < maximumAge {
            refreshInBackground(directory, maximumAge: refreshAhead)
        }
        return answer
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
        return state.withLock { Self.childItems(of: identifier, in: $0) }
    }

    /// Makes the catalog hold a listing of `identifier` younger than `maximumAge` (or, with the
    /// provider unreachable, any listing kept from any session). Lookups use this without
    /// building the sorted children array. `batch`: as `children(of:maximumAge:batch:)`.
    func listChildren(
        of identifier: ItemIdentifier, maximumAge: Duration?, batch: (@Sendable ([ProviderItem]) -> Void)? = nil,
        applied: (() -> Void)? = nil
    ) async throws(CacheError) {
        let now = environment.timeline.now
        let fresh = state.withLock { catalog -> Bool in
            guard let at = catalog.listedAt[identifier] else { return false }
            if let maximumAge, now - at >= maximumAge { return false }
            return true
        }
        if fresh { return }
        let tracking = environment.provider.capabilities.contains(.listingChangeTracking) ? environment.provider : nil
        if let tracking, revalidateListing(of: identifier, with: tracking, at: now) { return }
        // Read before the provider's token: a change reported after it may be missing from the listing.
        let changeCount = beginListing(of: identifier)
        defer { endListing(of: identifier, askedAt: changeCount) }
        do {
            let provider = environment.provider
            let listed = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                () async throws -> (children: [ProviderItem], token: ListingChangeToken?) in
                if let batch {
                    // Any provider may list in batches (WebDAV does, D-478); the token only
                    // counts from one that tracks.
                    let listed = try await provider.trackedChildren(of: identifier) { [self] items in
                        let kept = listedBatch(items, of: identifier, changeCount: changeCount)
                        if !kept.isEmpty { batch(kept) }
                    }
                    return (listed.children, tracking == nil ? nil : listed.token)
                }
                if let tracking { return try await tracking.trackedChildren(of: identifier) }
                return (try await provider.children(of: identifier), nil)
            }
            applyListing(
                of: identifier, children: listed.children, token: listed.token, at: now, changeCount: changeCount,
                applied: applied)
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            case .unreachable, .timedOut:
                if state.withLock({ $0.children[identifier] != nil }) { return }
                throw failure
            case .notFound:
                providerMissed(identifier, askedAt: changeCount)
                throw failure
            default:
                throw failure
            }
        }
    }

    /// A listing of `directory` is on its way from now (D-388): what the mount changes there is
    /// recorded until `endListing`. Returns the change count to apply the listing with.
    /// It is a question to the provider (D-465) too.
    func beginListing(of directory: ItemIdentifier) -> UInt64 {
        state.withLock { catalog in
            catalog.listingsInFlight[directory, default: 0] += 1
            return Self.beginQuestion(in: &catalog)
        }
    }

    /// That listing (begun at `count`) was applied, or failed.
    func endListing(of directory: ItemIdentifier, askedAt count: UInt64) {
        state.withLock { catalog in
            let left = (catalog.listingsInFlight[directory] ?? 1) - 1
            catalog.listingsInFlight[directory] = left > 0 ? left : nil
            if left <= 0 { catalog.changedWhileListed[directory] = nil }
            Self.endQuestion(count, in: &catalog)
        }
    }

    /// A listing past its age whose directory the provider reports unchanged since the listing
    /// was taken is as good as one taken now: it and its children count as refreshed `now`, with
    /// no provider call (D-224). Not once the listing itself is `fullListingInterval` old (what
    /// the provider's tracking misses is seen then). False: list again.
    func revalidateListing(
        of directory: ItemIdentifier, with tracking: any Provider, at now: Duration
    ) -> Bool {
        let limit = environment.options.fullListingInterval
        guard
            let tracked = state.withLock({ catalog -> ListingChangeToken? in
                guard catalog.listedAt[directory] != nil, let tracked = catalog.listingTokens[directory],
                    now - tracked.listedAt < limit
                else { return nil }
                return tracked.token
            }), !tracking.hasChanges(since: tracked)
        else { return false }
        return state.withLock { catalog in
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
    func child(
        named name: String, of directory: ItemIdentifier, maximumAge: Duration?
    ) async throws(CacheError) -> ProviderItem? {
        switch cachedChild(named: name, of: directory, maximumAge: maximumAge) {
        case .found(let item, _): return item
        case .absent: return nil
        case .unknown: break
        }
        try await listChildren(of: directory, maximumAge: maximumAge)
        let key = NameKey(name)
        let (found, dirty) = state.withLock { catalog -> (ProviderItem?, Bool) in
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

    /// The count of the last change the mount made in `directory` (`noteChange`, a birth): an
    /// answer the provider gave about the directory while it moved was asked before the change.
    func changeMark(of directory: ItemIdentifier) -> UInt64 {
        state.withLock { $0.lastChange[directory] ?? 0 }
    }

    /// The names and identifiers the cached listing of `directory` has, without asking the provider.
    public func cachedChildNames(of directory: ItemIdentifier) -> [(name: String, identifier: ItemIdentifier)] {
        state.withLock { catalog in
            (catalog.names[directory] ?? [:]).map { (name: $0.key.name, identifier: $0.value) }
        }
    }

    /// How long ago (on the cache's timeline) the directory was listed in this session.
    public func listingAge(of identifier: ItemIdentifier) -> Duration? {
        let now = environment.timeline.now
        return state.withLock { catalog in catalog.listedAt[identifier].map { now - $0 } }
    }

    static func childItems(of identifier: ItemIdentifier, in catalog: State) -> [ProviderItem] {
        unsortedChildItems(of: identifier, in: catalog).sorted { $0.name < $1.name }
    }

    static func unsortedChildItems(of identifier: ItemIdentifier, in catalog: State) -> [ProviderItem] {
        (catalog.children[identifier] ?? []).compactMap { catalog.items[$0] }
    }
}
