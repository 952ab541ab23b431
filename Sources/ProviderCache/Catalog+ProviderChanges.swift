// Changes the provider made, as the catalog learns them (a listing, an item refresh, a lookup):
// told to a `ProviderChangeListener` (the mount's presenters, D-403) after the kernel's caches
// were told. Changes the mount made are recorded by Catalog+Writes.swift and the mount's own
// write paths (`ChangeOrigin.mount`) and announced by the mount's claims instead: a provider
// answer that only confirms them changes nothing here, so they are not told twice. Items a
// listener wants that the provider reports changed (`.changeNotifying`) are refreshed at once.

import ProviderModel
import SystemSupport

/// A change the provider made to an item, by the item's path relative to the provider root.
public enum ProviderOriginChange: Sendable, Hashable {
    /// New content or attributes of a file or symbolic link, or a new item under that name.
    case changed(path: String)
    /// The item (and what is inside it) moved: the same identifier under another name.
    case moved(from: String, to: String)
    /// The item (and what is inside it) is gone.
    case deleted(path: String)
}

/// Who hears of provider-origin changes (the mount: its coordination server's presenters).
/// Called with no lock of the cache held.
public protocol ProviderChangeListener: Sendable {
    /// Whether a change at `path` (relative to the provider root; "" is the root) would be heard:
    /// someone presents it, an item inside it or a directory above it. nil: at any path (is
    /// anyone listening at all). Must be cheap: asked for every change the provider reports.
    func wantsChanges(near path: String?) -> Bool
    /// Changes the provider made, in the order the catalog applied them.
    func providerChanged(_ changes: [ProviderOriginChange])
}

/// Who made a change the catalog applies: the mount (told by its own claims) or the provider.
enum ChangeOrigin: Sendable {
    case mount
    case provider
}

extension Catalog {
    /// `path(of:)` under the lock.
    static func path(of identifier: ItemIdentifier, in catalog: State) -> String? {
        var components: [String] = []
        var current = identifier
        while current != .root {
            guard let item = catalog.items[current], components.count < 4096 else { return nil }
            components.append(item.name)
            current = item.parent
        }
        return components.reversed().joined(separator: "/")
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory.isEmpty ? name : directory + "/" + name
    }

    /// Whether provider-origin changes are worth working out now (a listener, and someone in it).
    func listensForProviderChanges() -> Bool {
        providerChanges?.wantsChanges(near: nil) ?? false
    }

    // MARK: The mount's own changes

    /// The mount begins changing, at the provider, the items `identifiers` and the names `name`
    /// in directories `parent`; call `endOwnChange` with the paths returned once the catalog
    /// recorded the result. Provider answers about them (and what is inside them) meanwhile are
    /// not told (D-403): the provider may show the change before the catalog records it, and the
    /// mount's claims tell presenters of it.
    func beginOwnChange(
        of identifiers: [ItemIdentifier], naming names: [(parent: ItemIdentifier, name: String)] = []
    ) -> [String] {
        state.withLock { catalog -> [String] in
            let paths =
                identifiers.compactMap { Self.path(of: $0, in: catalog) }
                + names.compactMap { entry in Self.path(of: entry.parent, in: catalog).map { Self.join($0, entry.name) }
                }
            for path in paths { catalog.ownChanges[path, default: 0] += 1 }
            return paths
        }
    }

    func endOwnChange(_ paths: [String]) {
        state.withLock { catalog in
            // A question on its way, asked before this end, may not show the change (D-465).
            if !catalog.questions.isEmpty, !paths.isEmpty {
                catalog.changeCount &+= 1
                for path in paths { catalog.ownEnded[path] = catalog.changeCount }
            }
            for path in paths {
                let left = (catalog.ownChanges[path] ?? 1) - 1
                catalog.ownChanges[path] = left > 0 ? left : nil
            }
        }
    }

    // MARK: Misses (D-465)

    /// A question to the provider (a listing, an item or a name) is asked now: returns its mark,
    /// for `providerMissed` / `missIsPassing` and `endQuestion`.
    func beginQuestion() -> UInt64 {
        state.withLock { Self.beginQuestion(in: &$0) }
    }

    static func beginQuestion(in catalog: inout State) -> UInt64 {
        catalog.questions[catalog.changeCount, default: 0] += 1
        return catalog.changeCount
    }

    /// The question asked at `mark` was answered (and the answer applied) or failed.
    func endQuestion(_ mark: UInt64) {
        state.withLock { Self.endQuestion(mark, in: &$0) }
    }

    static func endQuestion(_ mark: UInt64, in catalog: inout State) {
        let left = (catalog.questions[mark] ?? 1) - 1
        catalog.questions[mark] = left > 0 ? left : nil
        guard !catalog.ownEnded.isEmpty else { return }
        // Ends no question still on its way was asked before are of no more use.
        guard let oldest = catalog.questions.keys.min() else { return catalog.ownEnded.removeAll() }
        catalog.ownEnded = catalog.ownEnded.filter { $0.value > oldest }
    }

    /// Whether the provider's "not there" for `identifier`, answering a question asked at `mark`
    /// (nil: when is not known), says nothing about the item (D-465): the mount's own call
    /// changing it (or an item above it) is on its way — the provider may show the item taken
    /// away and not yet put back (rclone's MOVE deletes the destination, then renames) — or it
    /// ended after the question was asked. The one rule for every miss: a listing that lacks the
    /// item (`applyListing`), an item or name lookup that finds none (`providerMissed`).
    static func missIsPassing(_ identifier: ItemIdentifier, askedAt mark: UInt64?, in catalog: State) -> Bool {
        guard !catalog.ownChanges.isEmpty || !catalog.ownEnded.isEmpty, identifier != .root,
            let path = path(of: identifier, in: catalog)
        else { return false }
        if isOwn(.deleted(path: path), catalog.ownChanges) { return true }
        guard let mark else { return false }
        return catalog.ownEnded.contains { ended, at in
            at > mark && (ended == path || path.hasPrefix(ended + "/"))
        }
    }

    /// The provider answered that `identifier` is not there (a lookup asked at `mark`): the item
    /// is removed with what is inside it, told as the provider's deletion (D-403) — unless the
    /// miss is passing (`missIsPassing`): then it stays, asked for again when next used, and is
    /// returned.
    @discardableResult
    func providerMissed(_ identifier: ItemIdentifier, askedAt mark: UInt64?) -> ProviderItem? {
        guard identifier != .root else { return nil }
        let listening = listensForProviderChanges()
        var reported: ProviderOriginChange?
        let (kept, removal) = state.withLock { catalog -> (ProviderItem?, Removal?) in
            if let item = catalog.items[identifier], Self.missIsPassing(identifier, askedAt: mark, in: catalog) {
                catalog.dirty.insert(identifier)
                catalog.refreshedAt[identifier] = nil
                return (item, nil)
            }
            if listening { reported = Self.reportedDeletion(of: identifier, in: catalog) }
            return (nil, Self.remove(identifier, from: &catalog))
        }
        if let removal { finishRemoval(removal) }
        if let reported { announce([reported]) }
        return kept
    }

    /// The provider's deletion of `identifier` as presenters hear of it (D-403), unless the
    /// mount is changing it itself.
    static func reportedDeletion(of identifier: ItemIdentifier, in catalog: State) -> ProviderOriginChange? {
        guard let item = catalog.items[identifier], let directory = path(of: item.parent, in: catalog) else {
            return nil
        }
        let deleted = ProviderOriginChange.deleted(path: join(directory, item.name))
        return isOwn(deleted, catalog.ownChanges) ? nil : deleted
    }

    /// Whether `change` concerns a path the mount is changing now (`own`: `State.ownChanges`).
    static func isOwn(_ change: ProviderOriginChange, _ own: [String: Int]) -> Bool {
        if own.isEmpty { return false }
        func covered(_ path: String) -> Bool {
            own[path] != nil || own.keys.contains { path.hasPrefix($0 + "/") }
        }
        switch change {
        case .changed(let path), .deleted(let path): return covered(path)
        case .moved(let from, let to): return covered(from) || covered(to)
        }
    }

    /// What a provider answer changed: `old` (the catalog's item before, nil: none) became `new`.
    /// Nil for no change, for an item first seen in a directory never listed (discovered, not
    /// changed), and for a directory's own metadata (its mtime follows its entries, which are
    /// told as their own changes).
    static func providerChange(
        from old: ProviderItem?, to new: ProviderItem, in catalog: State
    )
        -> ProviderOriginChange?
    {
        guard let change = changeOf(old, to: new, in: catalog), !isOwn(change, catalog.ownChanges) else { return nil }
        return change
    }

    private static func changeOf(
        _ old: ProviderItem?, to new: ProviderItem, in catalog: State
    )
        -> ProviderOriginChange?
    {
        guard new.identifier != .root, let directory = path(of: new.parent, in: catalog) else { return nil }
        let newPath = join(directory, new.name)
        guard let old else { return catalog.children[new.parent] != nil ? .changed(path: newPath) : nil }
        // The ctime alone moves with every metadata change at the source, the mount's own (an
        // upload's owner and mode, a swap): it is no change to tell (atime is never compared).
        var unchanged = old
        unchanged.changeTime = new.changeTime
        // Checksums listed for the same content are no change of it either (D-526).
        unchanged.statedChecksums = new.statedChecksums
        if unchanged == new { return nil }
        if old.name != new.name || old.parent != new.parent {
            guard let oldDirectory = path(of: old.parent, in: catalog) else { return .changed(path: newPath) }
            return .moved(from: join(oldDirectory, old.name), to: newPath)
        }
        if old.kind == .directory && new.kind == .directory { return nil }
        return .changed(path: newPath)
    }

    /// The changes of one re-listing of a directory at `directory`: children gone, new, renamed
    /// or changed. A file gone and a file new in the same listing with the same content version
    /// (the local provider's version holds the inode: a rename in place) are one move.
    static func listingChanges(
        in directory: String, gone: [ProviderItem], appeared: [ProviderItem], changed: [ProviderOriginChange]
    ) -> [ProviderOriginChange] {
        var gone = gone
        var result: [ProviderOriginChange] = []
        var created: [ProviderOriginChange] = []
        for item in appeared {
            if item.kind == .file,
                let index = gone.firstIndex(where: { $0.kind == .file && $0.contentVersion == item.contentVersion })
            {
                result.append(.moved(from: join(directory, gone[index].name), to: join(directory, item.name)))
                gone.remove(at: index)
            } else {
                created.append(.changed(path: join(directory, item.name)))
            }
        }
        return gone.map { .deleted(path: join(directory, $0.name)) } + result + changed + created
    }

    /// Tells the listener, after the kernel's caches were told.
    func announce(_ changes: [ProviderOriginChange]) {
        guard !changes.isEmpty, let listener = providerChanges else { return }
        listener.providerChanged(changes)
    }

    /// The provider says what changed (`.changeNotifying`): the listings and items concerned stop
    /// counting as fresh (the next answer asks the provider), then the observer hears of it.
    func providerChanged(_ changes: [ProviderChange]?) {
        let now = environment.timeline.now
        let expired = now - environment.options.directoryTTL
        let told = state.withLock { catalog -> [CatalogChange] in
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
                    if !membership, let identifier, catalog.items[identifier]?.kind == .directory {
                        // A directory's own metadata (the local provider restores a directory's
                        // times after every upload into it): its attributes, not its dentry,
                        // whose drop made the kernel forget and look up again (D-382).
                        catalog.metadataOnly.insert(identifier)
                        told.append(.attributes(identifier))
                    } else {
                        if let identifier, !catalog.metadataOnly.isEmpty { catalog.metadataOnly.remove(identifier) }
                        told.append(.entry(directory: directory, name: name, identifier: identifier))
                    }
                case .entries(let directory):
                    expire(directory)
                    for child in catalog.children[directory] ?? [] {
                        catalog.dirty.insert(child)
                        catalog.refreshedAt[child] = nil
                        if !catalog.metadataOnly.isEmpty { catalog.metadataOnly.remove(child) }
                    }
                    told.append(.entries(directory: directory))
                }
            }
            return told
        }
        tell(told)
        refreshWanted(changes)
        afterProviderChanges.withLock { $0 }?.call(changes)
    }

    /// The provider reported changes (`.changeNotifying`), which only mark items and listings
    /// stale: those a listener wants are refreshed now (one task at a time, coalescing what
    /// arrives meanwhile), so their changes are told without waiting for a lookup. Nothing
    /// else is refreshed. A lost-events report (nil) is left to the next lookup.
    func refreshWanted(_ changes: [ProviderChange]?) {
        guard let listener = providerChanges, let changes, listener.wantsChanges(near: nil) else { return }
        var listings: Set<ItemIdentifier> = []
        var items: Set<ItemIdentifier> = []
        for change in changes {
            switch change {
            case .entry(let directory, let name), .membership(let directory, let name):
                let (directoryPath, identifier) = state.withLock { catalog in
                    (Self.path(of: directory, in: catalog), catalog.names[directory]?[NameKey(name)])
                }
                guard let directoryPath, listener.wantsChanges(near: Self.join(directoryPath, name)) else { continue }
                if case .entry = change, let identifier { items.insert(identifier) } else { listings.insert(directory) }
            case .entries(let directory):
                guard let directoryPath = path(of: directory), listener.wantsChanges(near: directoryPath) else {
                    continue
                }
                listings.insert(directory)
            }
        }
        enqueueWanted(listings: listings, items: items)
    }

    /// A download found the provider's version of `identifier` changed (its readers got ESTALE):
    /// refreshed now when someone wants to hear of it, so that they do.
    func versionGone(_ identifier: ItemIdentifier) {
        guard let listener = providerChanges, listener.wantsChanges(near: nil), let path = path(of: identifier),
            listener.wantsChanges(near: path)
        else { return }
        enqueueWanted(listings: [], items: [identifier])
    }

    /// Adds to what the refresh loop refreshes, starting it if it is not running.
    private func enqueueWanted(listings: Set<ItemIdentifier>, items: Set<ItemIdentifier>) {
        if listings.isEmpty && items.isEmpty { return }
        let start = wantedRefreshes.withLock { wanted -> Bool in
            guard !wanted.closed else { return false }
            wanted.listings.formUnion(listings)
            wanted.items.formUnion(items)
            if wanted.running { return false }
            wanted.running = true
            return true
        }
        guard start else { return }
        let task = Task { [self] in await refreshWantedLoop() }
        // Kept for shutdown (a loop that has ended already is awaited at once).
        wantedRefreshes.withLock { $0.task = task }
    }

    /// Refreshes what `refreshWanted` collected until nothing is left.
    private func refreshWantedLoop() async {
        while true {
            let next = wantedRefreshes.withLock { wanted -> (Set<ItemIdentifier>, Set<ItemIdentifier>)? in
                if wanted.closed || (wanted.listings.isEmpty && wanted.items.isEmpty) {
                    wanted.running = false
                    return nil
                }
                defer {
                    wanted.listings = []
                    wanted.items = []
                }
                return (wanted.listings, wanted.items)
            }
            guard let (listings, items) = next else { return }
            for directory in listings where !Task.isCancelled {
                _ = try? await children(of: directory, maximumAge: .zero)
            }
            for identifier in items where !Task.isCancelled {
                // A listing just taken refreshed its children already.
                if let parent = knownItem(identifier)?.parent, listings.contains(parent) { continue }
                _ = try? await item(identifier, maximumAge: .zero)
            }
        }
    }
}

/// What `Catalog.refreshWanted` has still to refresh, and its task.
struct WantedRefreshes: Sendable {
    var listings: Set<ItemIdentifier> = []
    var items: Set<ItemIdentifier> = []
    /// A refresh loop is running (it takes what is added meanwhile).
    var running = false
    var closed = false
    var task: Task<Void, Never>?
}

extension Catalog {
    /// Waits until the refreshes of reported changes a listener wants are done (tests).
    public func waitForProviderChangeRefreshes() async {
        while true {
            let (task, running) = wantedRefreshes.withLock { ($0.task, $0.running) }
            guard running else { return }
            if let task { await task.value } else { await Task.yield() }
        }
    }
}
