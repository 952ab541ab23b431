// How the catalog changes: one item's new metadata, a directory's new listing, an item gone.
// Each updates the catalog under its lock, then saves to the store, tells the observer, and hands
// superseded content to the content store, in that order, with the lock dropped.

import Diagnostics
import ProviderModel
import SystemSupport

extension Catalog {
    /// Records new metadata for one item; a new content version supersedes the old content.
    /// `origin`: `.provider` for an answer the provider gave on its own (a refresh, a lookup):
    /// what it changed is told to the provider-change listener (D-403). `appeared`: the item is
    /// new in its parent through the mount (`applyCreated`), recorded for listings of the parent
    /// on their way under the same lock (D-407).
    @discardableResult
    /// `savingWith`: the write-back's upload records saved with the item in one transaction
    /// (D-529), asked once the catalog holds the item.
    func apply(
        _ item: ProviderItem, origin: ChangeOrigin = .mount, appeared: Bool = false,
        savingWith records: () -> [UploadRecord] = { [] }
    ) -> ProviderItem {
        let now = environment.timeline.now
        let provider = environment.provider
        var told: [CatalogChange] = []
        var copied: [ProviderItem] = []
        let listening = origin == .provider && listensForProviderChanges()
        var reported: ProviderOriginChange?
        let (changed, superseded, item) = state.withLock { catalog -> (Bool, [Superseded], ProviderItem) in
            var item = item
            // Not at the provider yet: the catalog's item is the truth until its `.create` upload
            // (what the provider says of the identifier meanwhile is someone else's), with its
            // local version on top (D-386).
            if !catalog.unborn.isEmpty, catalog.unborn.contains(item.identifier),
                let ours = catalog.items[item.identifier]
            {
                item = ours
            }
            Self.keepVersionOfSameContent(&item, in: catalog, provider: provider)  // D-510
            // A local version is served instead of the provider's (Catalog+Local.swift).
            if !catalog.localVersions.isEmpty { Self.overlayLocal(&item, in: &catalog) }
            if !catalog.heldAttributes.isEmpty { Self.overlayHeld(&item, in: catalog) }  // D-460
            if !catalog.writtenInto.isEmpty { Self.holdWhileWrittenInto(&item, in: catalog) }
            catalog.refreshedAt[item.identifier] = now
            if !catalog.dirty.isEmpty { catalog.dirty.remove(item.identifier) }
            let old = catalog.items[item.identifier]
            if let old, old != item, old.identifier != .root {
                if old.kind == .directory, item.kind == .directory, old.name == item.name, old.parent == item.parent,
                    catalog.metadataOnly.remove(old.identifier) != nil
                {
                    // A directory's own metadata, known to be no more (its mtime moves with every
                    // entry the mount makes in it): its attributes, not its dentry. Dropping the
                    // dentry made the kernel forget the directory and look it up again before
                    // every path walk through it (a new inode each time, D-382). A directory
                    // replaced under its name (a rename over it, an exchange) is not in
                    // `metadataOnly`: its dentry goes, and with it what the kernel holds below.
                    told.append(.attributes(old.identifier))
                } else {
                    told.append(.entry(directory: old.parent, name: old.name, identifier: old.identifier))
                    if old.name != item.name || old.parent != item.parent {
                        told.append(.entry(directory: item.parent, name: item.name, identifier: old.identifier))
                    }
                }
            }
            if let old { item.identifier = old.identifier }  // the stored string: see `sharingStorage`
            if listening { reported = Self.providerChange(from: old, to: item, in: catalog) }
            catalog.items[item.identifier] = item
            // Another kind under the identifier is another item: another number (D-389).
            if let old, old.kind != item.kind { catalog.serials.renew(item.identifier) }
            Self.leaveGroupIfAnotherFile(item, in: &catalog)
            catalog.serials.number(for: item.identifier, link: item.hardLinkIdentity)
            if item.identifier != .root, catalog.children[item.parent] != nil {
                if catalog.children[item.parent]!.insert(item.identifier).inserted || old?.name != item.name {
                    if let old { catalog.names[item.parent]?[NameKey(old.name)] = nil }
                    catalog.names[item.parent, default: [:]][NameKey(item.name)] = item.identifier
                }
            }
            if appeared { Self.noteAppeared(item.identifier, in: item.parent, of: &catalog) }
            // A directory's own metadata (its mtime moves with every entry made in it) is not
            // saved: the next session asks for it anyway, and `tar x` saved every directory once
            // per file made in it (D-387).
            let directoryMetadata =
                old?.kind == .directory && item.kind == .directory && old?.name == item.name
                && old?.parent == item.parent
            // The other names of a file with hard links have its new content and attributes: the
            // provider's are copied to them; a local version (written through this name, maybe
            // not uploaded yet) is this name's alone, so they are asked for again (D-396).
            var shared: [Superseded] = []
            if !catalog.serials.groups.isEmpty, item.kind == .file {
                let local = catalog.localVersions[item.identifier] != nil
                for name in catalog.serials.otherNames(of: item.identifier) {
                    if local {
                        catalog.dirty.insert(name)
                        if let other = catalog.items[name] {
                            told.append(.entry(directory: other.parent, name: other.name, identifier: name))
                        }
                        continue
                    }
                    // A name with a local version keeps it (the write through it is the newer).
                    guard var other = catalog.items[name], other.kind == .file, catalog.localVersions[name] == nil,
                        other.contentVersion != item.contentVersion || other.permissions != item.permissions
                            || other.modificationTime != item.modificationTime || other.size != item.size
                    else { continue }
                    let superseded = other.contentVersion != item.contentVersion
                    other.size = item.size
                    other.modificationTime = item.modificationTime
                    other.contentVersion = item.contentVersion
                    other.permissions = item.permissions
                    other.hardLinkIdentity = item.hardLinkIdentity
                    catalog.items[name] = other
                    copied.append(other)
                    catalog.refreshedAt[name] = now
                    told.append(.entry(directory: other.parent, name: other.name, identifier: name))
                    if superseded {
                        shared += Self.takeContents(of: name, except: other.contentVersion, from: &catalog)
                    }
                }
            }
            guard let old, old.contentVersion != item.contentVersion || old.kind != item.kind else {
                return (old != item && !directoryMetadata, shared, item)
            }
            return (
                !directoryMetadata,
                Self.takeContents(of: item.identifier, except: item.contentVersion, from: &catalog) + shared, item
            )
        }
        let records = records()
        if changed || !copied.isEmpty || !records.isEmpty { save((changed ? [item] : []) + copied, with: records) }
        tell(told)
        finish(superseded, error: CacheError(.stale, "\(item.identifier) changed on the provider"))
        if let reported { announce([reported]) }
        return item
    }

    /// Replaces the children of `directory` with a fresh listing: new items appear, changed ones
    /// are updated (old content superseded), missing ones are removed with their descendants.
    /// `applied`: called once the catalog holds the listing, before it is saved to the store
    /// (D-486: a readdir waiting for the listing's end is answered then); its items are then
    /// saved with `saveSoon`.
    func applyListing(
        of directory: ItemIdentifier, children listed: [ProviderItem], token: ListingChangeToken? = nil,
        at now: Duration, changeCount: UInt64? = nil, applied: (() -> Void)? = nil
    ) {
        var told: [CatalogChange] = []
        let listening = listensForProviderChanges()
        let provider = environment.provider
        // What the provider changed (D-403): children gone, new, and changed or renamed.
        var gone: [ProviderItem] = []
        var appeared: [ProviderItem] = []
        var reported: [ProviderOriginChange] = []
        var directoryPath: String?
        var own: [String: Int] = [:]
        let (toSave, removed, superseded) = state.withLock {
            catalog -> ([ProviderItem], [ItemIdentifier], [Superseded]) in
            // Two listings can overlap (a background refresh and a lookup miss): one taken
            // before the listing already applied is older news and is dropped.
            if let applied = catalog.listedAt[directory], applied > now { return ([], [], []) }
            // Files created through the mount that the provider does not have yet stay listed,
            // and someone else's file under one of their names waits for their upload (D-386).
            var listed = listed
            if !catalog.unborn.isEmpty {
                listed.removeAll { catalog.unborn.contains($0.identifier) }
                for identifier in catalog.unborn {
                    if let item = catalog.items[identifier], item.parent == directory { listed.append(item) }
                }
            }
            // What the mount changed in the directory after this listing began stands: a file
            // created (or born) meanwhile stays, one deleted or moved away stays gone (D-388).
            if let changeCount, let changes = catalog.changedWhileListed[directory] {
                let newer = changes.filter { $0.value.count > changeCount }
                if !newer.isEmpty {
                    listed.removeAll { newer[$0.identifier] != nil }
                    for (identifier, change) in newer where change.present {
                        if let item = catalog.items[identifier], item.parent == directory { listed.append(item) }
                    }
                }
            }
            // The provider reported a change in the directory after this listing began: it may
            // not show it, so it stands (it is newer than what the catalog has) but is not
            // trusted past this answer (expired, no token) and reported items stay dirty.
            let raced = changeCount.map { (catalog.lastChange[directory] ?? 0) > $0 } ?? false
            var toSave: [ProviderItem] = []
            var superseded: [Superseded] = []
            var removed: [ItemIdentifier] = []
            let oldIdentifiers = catalog.children[directory]
            if listening, oldIdentifiers != nil {
                directoryPath = Self.path(of: directory, in: catalog)
                own = catalog.ownChanges
            }
            // What a re-list changed is told (a first listing changes nothing anyone was told).
            func tellRemoved(_ identifier: ItemIdentifier) {
                if oldIdentifiers != nil, let old = catalog.items[identifier] {
                    told.append(.entry(directory: directory, name: old.name, identifier: identifier))
                    if directoryPath != nil { gone.append(old) }
                }
            }
            // A re-list usually finds the same children: one set probe per child tells, instead of
            // building and comparing sets of thousands.
            var sameMembers =
                oldIdentifiers.map { old in
                    old.count == listed.count && listed.allSatisfy { old.contains($0.identifier) }
                } ?? false
            var newIdentifiers = oldIdentifiers ?? []
            // Children the listing lacks while the mount's own call changes them (D-465): kept,
            // and asked for again when next used.
            var kept: [ProviderItem] = []
            // Membership compared the slow way: old children not listed any more are removed.
            func removeUnlisted() {
                newIdentifiers = Set(listed.map(\.identifier))
                kept = []
                for identifier in (oldIdentifiers ?? []).subtracting(newIdentifiers) {
                    if let item = catalog.items[identifier],
                        Self.missIsPassing(identifier, askedAt: changeCount, in: catalog)
                    {
                        kept.append(item)
                        newIdentifiers.insert(identifier)
                        catalog.dirty.insert(identifier)
                        catalog.refreshedAt[identifier] = nil
                        continue
                    }
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
                Self.keepVersionOfSameContent(&item, in: catalog, provider: provider)  // D-510
                if !catalog.localVersions.isEmpty { Self.overlayLocal(&item, in: &catalog) }  // Catalog+Local.swift
                if !catalog.heldAttributes.isEmpty { Self.overlayHeld(&item, in: catalog) }  // D-460
                if !catalog.writtenInto.isEmpty { Self.holdWhileWrittenInto(&item, in: catalog) }
                if let old, old.contentVersion != item.contentVersion || old.kind != item.kind {
                    superseded += Self.takeContents(of: item.identifier, except: item.contentVersion, from: &catalog)
                    if old.kind != item.kind {
                        removed += Self.removeSubtree(item.identifier, from: &catalog, superseded: &superseded)
                    }
                }
                if old != item {
                    if let directoryPath {
                        if old == nil {
                            appeared.append(item)
                        } else if let change = Self.providerChange(from: old, to: item, in: catalog) {
                            // Its parent is this directory: the path the listing gives it.
                            if case .moved(let from, _) = change {
                                reported.append(.moved(from: from, to: Self.join(directoryPath, item.name)))
                            } else {
                                reported.append(change)
                            }
                        }
                    }
                    if let old, oldIdentifiers != nil {
                        told.append(.entry(directory: directory, name: old.name, identifier: old.identifier))
                        if old.name != item.name {
                            told.append(.entry(directory: directory, name: item.name, identifier: old.identifier))
                        }
                    }
                    toSave.append(item)
                    catalog.items[item.identifier] = item
                    Self.leaveGroupIfAnotherFile(item, in: &catalog)
                    catalog.serials.number(for: item.identifier, link: item.hardLinkIdentity)
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
                    (listed + kept).map { (NameKey($0.name), Self.sharingStorage($0.identifier, in: catalog)) },
                    uniquingKeysWith: { first, _ in first })
            }
            catalog.children[directory] = newIdentifiers
            catalog.listedAt[directory] = raced ? now - environment.options.directoryTTL : now
            catalog.listingTokens[directory] = raced ? nil : token.map { ($0, now) }
            if oldIdentifiers == nil, let directoryItem = catalog.items[directory] { toSave.append(directoryItem) }
            return (toSave, removed, superseded)
        }
        applied?()
        if !removed.isEmpty {
            do { try environment.store.deleteItems(removed) } catch {
                environment.logger.warning("cannot delete items from the metadata store: \(error)")
            }
        }
        if applied != nil { saveSoon(toSave) } else { save(toSave) }
        tell(told)
        let announced =
            (directoryPath.map {
                Self.listingChanges(in: $0, gone: gone, appeared: appeared, changed: reported)
            } ?? []).filter { !Self.isOwn($0, own) }
        // A child gone from the listing is a deletion (EIO for a handle that still needs bytes),
        // as when a fetch or an item call finds it gone; only a new version is ESTALE (D-280).
        for content in superseded {
            let error =
                content.current == nil
                ? CacheError(.deletedRemotely, "\(content.identifier) was deleted on the provider")
                : CacheError(.stale, "\(content.identifier) changed on the provider")
            finish([content], error: error)
        }
        announce(announced)
    }

    /// `identifier` as the catalog stores it. The name index, the item table and the node table
    /// then hold one string per identifier, and every lookup's probes compare it by pointer
    /// instead of by bytes (a memcmp was 4 % of the daemon's time in a stat loop).
    private static func sharingStorage(_ identifier: ItemIdentifier, in catalog: State) -> ItemIdentifier {
        catalog.items.index(forKey: identifier).map { catalog.items.keys[$0] } ?? identifier
    }

    /// Forgets an item the provider no longer has (and its descendants). `keepingContent`: their
    /// content records stay (an exchange, whose content the content store re-keyed).
    /// A directory a write-back upload is writing into keeps the metadata the catalog had when
    /// the upload began (D-384): what the provider shows meanwhile is passing — the upload's
    /// temporary file and rename move the directory's mtime, and the local provider then puts
    /// the times back (D-377). A stat in that window showed an mtime the directory never keeps.
    /// Not when the mount itself changed the directory meanwhile.
    static func holdWhileWrittenInto(_ item: inout ProviderItem, in catalog: State) {
        guard item.kind == .directory, catalog.writtenInto[item.identifier] != nil,
            !catalog.changedWhileWritten.contains(item.identifier),
            let old = catalog.items[item.identifier], old.kind == .directory
        else { return }
        item.modificationTime = old.modificationTime
        item.contentVersion = old.contentVersion
        item.size = old.size
    }

    /// A write-back upload into `directory` begins (D-384). `current`: asks for the directory as
    /// the provider shows it right before (its `itemNow`); without an answer nothing is held, and
    /// false is returned (no `endWriting` then).
    func beginWriting(into directory: ItemIdentifier, current: () -> ProviderItem?) -> Bool {
        let first = state.withLock { catalog -> Bool in
            if let count = catalog.writtenInto[directory] {
                catalog.writtenInto[directory] = count + 1
                return false
            }
            catalog.capturing[directory, default: (0, nil)].count += 1
            return true
        }
        guard first else { return true }
        let asked = current()
        // Recorded as it is before the upload touches it, then held.
        if let asked { apply(asked) }
        let set = state.withLock { catalog -> Bool in
            let capture = catalog.capturing.removeValue(forKey: directory) ?? (1, nil)
            if capture.count > 1 { catalog.capturing[directory] = (capture.count - 1, capture.set) }
            guard asked != nil else { return false }
            catalog.writtenInto[directory, default: 0] += 1
            // A chmod or utimens through the mount since the question: its answer is the newer
            // (it no longer waits for the uploads into the directory, D-521).
            return capture.set.map { Self.holdAttributes(of: $0, in: &catalog) } ?? false
        }
        if set { tell([.attributes(directory)]) }
        return asked != nil
    }

    /// A chmod or utimens of the directory `item` through the mount (D-521): what it made is the
    /// metadata held while uploads write into it (`holdWhileWrittenInto` held what the catalog
    /// had before), and what an upload asking for it meanwhile gets is older.
    func directoryAttributesSet(_ item: ProviderItem) {
        let held = state.withLock { catalog -> Bool in
            if catalog.capturing[item.identifier] != nil { catalog.capturing[item.identifier]!.set = item }
            guard catalog.writtenInto[item.identifier] != nil else { return false }
            return Self.holdAttributes(of: item, in: &catalog)
        }
        if held { tell([.attributes(item.identifier)]) }
    }

    /// The directory's held mtime, version and size become `item`'s.
    private static func holdAttributes(of item: ProviderItem, in catalog: inout State) -> Bool {
        guard var held = catalog.items[item.identifier], held.kind == .directory, item.kind == .directory else {
            return false
        }
        held.modificationTime = item.modificationTime
        held.contentVersion = item.contentVersion
        held.size = item.size
        catalog.items[item.identifier] = held
        return true
    }

    /// That upload ended: the directory's metadata is asked for again when next used, and the
    /// kernel drops what it holds of it.
    func endWriting(into directory: ItemIdentifier) {
        let ended = state.withLock { catalog -> Bool in
            guard let count = catalog.writtenInto[directory] else { return false }
            if count > 1 {
                catalog.writtenInto[directory] = count - 1
                return false
            }
            catalog.writtenInto[directory] = nil
            catalog.changedWhileWritten.remove(directory)
            guard catalog.items[directory] != nil else { return false }
            catalog.dirty.insert(directory)
            catalog.refreshedAt[directory] = nil
            catalog.metadataOnly.insert(directory)
            return true
        }
        if ended { tell([.attributes(directory)]) }
    }

    /// `origin`: `.provider` when the provider said the item is gone (D-403).
    func removeItem(_ identifier: ItemIdentifier, keepingContent: Bool = false, origin: ChangeOrigin = .mount) {
        guard identifier != .root else { return }
        let listening = origin == .provider && listensForProviderChanges()
        var reported: ProviderOriginChange?
        var removal = state.withLock { catalog -> Removal in
            if listening { reported = Self.reportedDeletion(of: identifier, in: catalog) }
            return Self.remove(identifier, from: &catalog)
        }
        if keepingContent { removal.superseded = [] }
        finishRemoval(removal)
        if let reported { announce([reported]) }
    }

    /// An item taken out of the catalog with its descendants, for `finishRemoval`.
    struct Removal {
        var identifier: ItemIdentifier
        var told: [CatalogChange]
        var removed: [ItemIdentifier]
        var superseded: [Superseded]
    }

    /// `removeItem`'s change of the catalog (under the lock of the caller, which may record
    /// more with it: `moved`, `createdUnborn`).
    static func remove(_ identifier: ItemIdentifier, from catalog: inout State) -> Removal {
        var removal = Removal(identifier: identifier, told: [], removed: [], superseded: [])
        guard identifier != .root else { return removal }
        if let item = catalog.items[identifier] {
            removal.told.append(.entry(directory: item.parent, name: item.name, identifier: identifier))
        }
        removal.removed = removeSubtree(identifier, from: &catalog, superseded: &removal.superseded)
        return removal
    }

    /// `removeItem`'s effects, with the lock dropped: the observer, the store, the content store.
    func finishRemoval(_ removal: Removal) {
        tell(removal.told)
        if !removal.removed.isEmpty {
            do { try environment.store.deleteItems(removal.removed) } catch {
                environment.logger.warning("cannot delete items from the metadata store: \(error)")
            }
        }
        finish(
            removal.superseded,
            error: CacheError(.deletedRemotely, "\(removal.identifier) was deleted on the provider"))
    }

    /// A provider version whose text differs from the one the catalog holds for the item (or
    /// that its local version was made from) but that names the same content by the provider's
    /// rule (`Provider.isSameContent`: a WebDAV ETag turned from weak to strong) is taken as the
    /// held one, so the content cached for it stays (D-510).
    static func keepVersionOfSameContent(_ item: inout ProviderItem, in catalog: State, provider: any Provider) {
        guard item.kind == .file else { return }
        if let held = catalog.items[item.identifier]?.contentVersion, held != item.contentVersion,
            provider.isSameContent(held, as: item.contentVersion)
        {
            item.contentVersion = held
        } else if !catalog.localVersions.isEmpty,
            let held = catalog.localVersions[item.identifier]?.providerVersion, held != item.contentVersion,
            provider.isSameContent(held, as: item.contentVersion)
        {
            item.contentVersion = held
        }
    }

    /// A name of a file with hard links that the provider now reports with no other name and
    /// another content than the catalog's other names of that file have: another file now (one
    /// name replaced at the provider behind the mount), so it leaves the group with a number of
    /// its own (D-396). A name with a local version (written through the mount) stays.
    static func leaveGroupIfAnotherFile(_ item: ProviderItem, in catalog: inout State) {
        guard item.hardLinkIdentity == nil, item.kind != .directory, !catalog.serials.groups.isEmpty,
            catalog.localVersions[item.identifier] == nil
        else { return }
        let others = catalog.serials.otherNames(of: item.identifier)
        guard others.contains(where: { catalog.items[$0].map { $0.contentVersion != item.contentVersion } ?? false })
        else { return }
        catalog.serials.renew(item.identifier)
    }

    private static func removeSubtree(
        _ identifier: ItemIdentifier, from catalog: inout State, superseded: inout [Superseded]
    ) -> [ItemIdentifier] {
        var removed: [ItemIdentifier] = []
        var stack = [identifier]
        while let next = stack.popLast() {
            guard let item = catalog.items.removeValue(forKey: next) else { continue }
            removed.append(next)
            catalog.serials.remove(next)
            if !catalog.metadataOnly.isEmpty { catalog.metadataOnly.remove(next) }
            if !catalog.unborn.isEmpty { catalog.unborn.remove(next) }
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

    /// The content of `identifier` other than `version`, which the catalog no longer has.
    static func takeContents(
        of identifier: ItemIdentifier, except version: ContentVersion?, from catalog: inout State
    ) -> [Superseded] {
        [Superseded(identifier: identifier, current: version)]
    }

    /// Hands superseded content to the content store, after the catalog changed (so an entry the
    /// store creates meanwhile either sees the new version or is found here; see
    /// `ContentStore.pin`): pinned entries are retired (their present bytes stay readable, missing
    /// ones fail with `error`) and discarded at their last unpin; others now.
    func finish(_ superseded: [Superseded], error: CacheError) {
        for content in superseded {
            self.content.supersede(content.identifier, except: content.current, error: error)
        }
    }
    /// Saves the items of listings answered before their save (D-486) together, `listingSaveDelay`
    /// after the first of them, as the catalog has them then (one removed meanwhile is not
    /// saved): a second pass right after a cold listing does not meet its save, and a tree walk's
    /// listings are saved a few at a time. `shutdown` saves what waits at once.
    func saveSoon(_ items: [ProviderItem]) {
        guard !items.isEmpty else { return }
        let waits = listingSaves.withLock { saves -> Bool in
            guard !saves.closed else { return false }
            saves.identifiers += items.map(\.identifier)
            if saves.task == nil {
                listingSavesRunning.begin()
                saves.task = Task { [self] in
                    try? await Task.sleep(for: Self.listingSaveDelay)
                    saveListed()
                    listingSavesRunning.end()
                }
            }
            return true
        }
        if !waits { save(items) }
    }

    static let listingSaveDelay = Duration.seconds(1)

    /// Saves what `saveSoon` holds, as the catalog has it now.
    func saveListed() {
        let identifiers = listingSaves.withLock { saves -> [ItemIdentifier] in
            defer {
                saves.identifiers = []
                saves.task = nil
            }
            return saves.identifiers
        }
        save(state.withLock { catalog in identifiers.compactMap { catalog.items[$0] } })
    }

    /// `items` as the catalog holds them, and `records` of the write-back with them (one
    /// transaction, D-529).
    func save(_ items: [ProviderItem], with records: [UploadRecord] = []) {
        guard !items.isEmpty || !records.isEmpty else { return }
        let stored = state.withLock { catalog in
            items.map {
                StoredItem(
                    item: $0, childrenListed: catalog.children[$0.identifier] != nil,
                    serial: catalog.serials.number(for: $0.identifier))
            }
        }
        do {
            if records.isEmpty {
                try environment.store.saveItems(stored)
            } else {
                try environment.store.save(items: stored, uploads: records)
            }
        } catch {
            environment.logger.warning("cannot save items to the metadata store: \(error)")
        }
    }
}
