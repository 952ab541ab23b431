// Local versions in the catalog (issue 14): an item published through the mount is served in its
// local version ("local:…") until the write-back uploaded it, whatever the provider lists
// meanwhile; after the upload the provider's version is read as the local one (the same bytes),
// so the next listing does not look like a remote change. Another provider version after the
// upload is a remote change like any other.

public import ProviderModel
import SystemSupport

/// An item's local version as the catalog serves it.
struct LocalVersion: Sendable, Equatable {
    var version: ContentVersion
    var size: Int64
    var modificationTime: ItemTime
    /// Not uploaded yet (dirty, uploading, error): the provider's metadata does not replace it.
    var pending: Bool
    /// While pending: permission bits a chmod during the edit set, which its upload carries
    /// (D-385).
    var permissions: UInt16? = nil
    /// Once uploaded: the provider's version that holds these bytes.
    var providerVersion: ContentVersion?
    /// Provider versions known to be older than the local one (what its edits started from, or
    /// replaced by uploading): a provider answer that was on its way before an upload and names
    /// one of them is stale news, not a remote change.
    var older: Set<ContentVersion> = []
}

extension Catalog {
    /// The provider's `item` as the catalog keeps it, given the item's local version if any.
    static func overlayLocal(_ item: inout ProviderItem, in catalog: inout State) {
        guard let local = catalog.localVersions[item.identifier] else { return }
        guard item.kind == .file else {
            catalog.localVersions[item.identifier] = nil
            return
        }
        // Already the local version: the catalog's own item, which a listing keeps when the
        // mount changed the directory meanwhile (D-388). Taking it for a provider version other
        // than the upload's dropped the local version, and the next listing then told the
        // upload's own version as a remote change (ESTALE for readers; D-403 found it).
        if item.contentVersion == local.version { return }
        if local.pending {
            item.contentVersion = local.version
            item.size = local.size
            item.modificationTime = local.modificationTime
            if let permissions = local.permissions { item.permissions = permissions }
        } else if item.contentVersion == local.providerVersion || local.older.contains(item.contentVersion) {
            item.contentVersion = local.version
            item.size = local.size
            item.modificationTime = local.modificationTime
        } else {
            // Changed on the provider since the upload: the provider's version wins.
            catalog.localVersions[item.identifier] = nil
        }
    }

    /// The provider's `item` with the chmod and utimens the write-back holds for it (D-460):
    /// until they are made there, what the provider says of its mode and time is older.
    static func overlayHeld(_ item: inout ProviderItem, in catalog: State) {
        guard let held = catalog.heldAttributes[item.identifier], item.kind == .file else { return }
        held.apply(to: &item)
    }

    /// The write-back made (or gave up) the chmod and utimens it held for the item: the
    /// provider's item shows as it comes again.
    func heldAttributesEnded(_ identifier: ItemIdentifier) {
        state.withLock { catalog in
            guard !catalog.heldAttributes.isEmpty else { return }
            catalog.heldAttributes[identifier] = nil
        }
    }

    /// Makes `version` (just published) the item's version: new size and time, the old content
    /// superseded (handles that pinned it keep reading it), the observer told. Returns the item.
    /// `permissions`: a chmod the edit carries (D-385); a pending version's stays unless this one
    /// sets its own. `savingWith`: as `apply`'s (the publish's queued record, D-529).
    @discardableResult
    func publishLocal(
        _ identifier: ItemIdentifier, version: ContentVersion, size: Int64, modificationTime: ItemTime,
        permissions: UInt16? = nil, savingWith records: () -> [UploadRecord] = { [] }
    ) -> ProviderItem? {
        guard
            let current = state.withLock({ catalog -> ProviderItem? in
                guard let item = catalog.items[identifier] else { return nil }
                let previous = catalog.localVersions[identifier]
                var older = previous?.older ?? []
                if let provider = previous?.providerVersion { older.insert(provider) }
                if previous == nil { older.insert(item.contentVersion) }
                let carried = permissions ?? (previous?.pending == true ? previous?.permissions : nil)
                catalog.localVersions[identifier] = LocalVersion(
                    version: version, size: size, modificationTime: modificationTime, pending: true,
                    permissions: carried, providerVersion: nil, older: older)
                return item
            })
        else { return nil }
        return apply(current, savingWith: records)
    }

    /// A restart: the stored item already has its local version; it is served as such again.
    func restoreLocal(_ record: UploadRecord) {
        state.withLock { catalog in
            guard let item = catalog.items[record.identifier], item.contentVersion == record.localVersion else {
                return
            }
            if record.isPending || record.providerVersion != nil {
                catalog.localVersions[record.identifier] = LocalVersion(
                    version: record.localVersion, size: item.size, modificationTime: item.modificationTime,
                    pending: record.isPending, permissions: record.isPending ? record.permissions : nil,
                    providerVersion: record.providerVersion,
                    older: Set([record.baseVersion].compactMap { $0 }))
            }
        }
    }

    /// The upload of `version` made the provider's `providerVersion`.
    func localUploaded(
        _ identifier: ItemIdentifier, version: ContentVersion, providerVersion: ContentVersion, base: ContentVersion?
    ) {
        state.withLock { catalog in
            guard var local = catalog.localVersions[identifier], local.version == version else { return }
            if let base { local.older.insert(base) }
            local.pending = false
            local.permissions = nil
            local.providerVersion = providerVersion
            catalog.localVersions[identifier] = local
        }
    }

    /// The mount itself changed the provider's version `from` into `to` (chmod, utimens at a
    /// provider whose versions include them): the local version's provider version and the
    /// versions it counts as older follow, so that the change is not taken for a remote one.
    /// `modificationTime`: the time a utimens set, which the local version (and its upload) now
    /// carries instead of its publish time.
    func providerVersionChanged(
        _ identifier: ItemIdentifier, from: ContentVersion, to: ContentVersion, modificationTime: ItemTime?
    ) {
        state.withLock { catalog in
            guard var local = catalog.localVersions[identifier] else { return }
            if let modificationTime { local.modificationTime = modificationTime }
            if local.providerVersion == from { local.providerVersion = to }
            if local.older.contains(from) { local.older.insert(to) }
            catalog.localVersions[identifier] = local
        }
    }

    /// An upload through another name of the same file (hard links, D-396) replaced the
    /// provider's version `from` (nil: a first upload) by `to`, other bytes. A local version of
    /// this name still to upload is the newer edit: it stays, and counts `to` as older (its own
    /// upload replaces it). One already uploaded stood for bytes the file no longer has: it goes
    /// (relabelled as `to`, it showed those old bytes for good, D-410). Either way the name's
    /// item is asked for again.
    func otherNameUploaded(_ identifier: ItemIdentifier, from: ContentVersion?, to: ContentVersion) {
        let told = state.withLock { catalog -> CatalogChange? in
            if var local = catalog.localVersions[identifier], local.pending {
                if let from, local.older.contains(from) { local.older.insert(to) }
                catalog.localVersions[identifier] = local
                return nil
            }
            catalog.localVersions[identifier] = nil
            catalog.dirty.insert(identifier)
            guard let item = catalog.items[identifier] else { return nil }
            return .entry(directory: item.parent, name: item.name, identifier: identifier)
        }
        if let told { tell([told]) }
    }

    /// A chmod reached the provider: a pending local version that carried held permissions
    /// (D-385) shows these now.
    func permissionsSet(_ identifier: ItemIdentifier, to permissions: UInt16) {
        state.withLock { catalog in
            guard var local = catalog.localVersions[identifier], local.pending, local.permissions != nil else { return }
            local.permissions = permissions
            catalog.localVersions[identifier] = local
        }
    }

    /// A chmod or utimens held by the item's upload record (D-460), or a restart that finds one
    /// held: the item shows it now, and so does a local version still to upload (and its upload
    /// carries that mtime), over whatever the provider says until the write-back ends them
    /// (`heldAttributesEnded`). Not saved: the record is what a restart reads (`LocalWrites.resume`
    /// calls this again). Returns the item; nil when the catalog does not have it.
    @discardableResult
    func attributesHeld(_ identifier: ItemIdentifier, _ held: HeldAttributes) -> ProviderItem? {
        let now = environment.timeline.now
        return state.withLock { catalog -> ProviderItem? in
            guard var item = catalog.items[identifier] else { return nil }
            if var local = catalog.localVersions[identifier] {
                // Pending: the upload carries the bits. No longer pending (uploaded, what was held
                // made after it): the provider's item brings the bits, and the time shown is the
                // local version's.
                if local.pending, let permissions = held.permissions { local.permissions = permissions }
                if let time = held.modificationTime { local.modificationTime = time }
                catalog.localVersions[identifier] = local
            }
            // Kept over what the provider says until the write-back made them (`overlayHeld`).
            var kept = catalog.heldAttributes[identifier] ?? HeldAttributes()
            if let permissions = held.permissions { kept.permissions = permissions }
            if let time = held.modificationTime { kept.modificationTime = time }
            if let time = held.accessTime { kept.accessTime = time }
            catalog.heldAttributes[identifier] = kept
            Self.overlayHeld(&item, in: catalog)
            catalog.items[identifier] = item
            catalog.refreshedAt[identifier] = now
            return item
        }
    }

    /// The local version is given up (kept as a conflict copy): the provider's is asked for.
    func dropLocal(_ identifier: ItemIdentifier) {
        state.withLock { catalog in
            catalog.localVersions[identifier] = nil
            catalog.heldAttributes[identifier] = nil
            catalog.refreshedAt[identifier] = nil
        }
    }

    /// Eviction of a file written through the mount and uploaded since (issue 27): the item goes
    /// back to the provider's version its local one stands for (same bytes, same size and
    /// time), so that a later read fetches that version. Nothing is told: nothing changed for a
    /// reader. Returns the item; nil (nothing done) when its local version is pending or the
    /// provider's version is not known.
    func returnToProviderVersion(_ identifier: ItemIdentifier) -> ProviderItem? {
        let returned = state.withLock { catalog -> (ProviderItem, [Superseded])? in
            guard var item = catalog.items[identifier], let local = catalog.localVersions[identifier], !local.pending,
                let providerVersion = local.providerVersion, item.contentVersion == local.version
            else { return nil }
            catalog.localVersions[identifier] = nil
            item.contentVersion = providerVersion
            catalog.items[identifier] = item
            return (item, Self.takeContents(of: identifier, except: providerVersion, from: &catalog))
        }
        guard let (item, superseded) = returned else { return nil }
        save([item])
        finish(superseded, error: CacheError(.stale, "\(identifier): its local content was evicted"))
        return item
    }

    /// Whether the item is served from a local version (written through the mount), uploaded
    /// or not.
    func hasLocalVersion(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { $0.localVersions[identifier] != nil }
    }

    /// `identifier` (and, `subtree`, what lies under it) was deleted or replaced through the
    /// mount, its uploads forgotten with it (`LocalWrites.forget`): its local versions go too, so
    /// that the item that takes the identifier next (a file renamed onto the name) starts clean
    /// rather than showing a version that will never be uploaded (D-411).
    func forgetLocal(_ identifier: ItemIdentifier, subtree: Bool) {
        state.withLock { catalog in
            catalog.heldAttributes[identifier] = nil
            if subtree {
                for key in Array(catalog.heldAttributes.keys) where key.rebased(from: identifier, to: identifier) != nil
                {
                    catalog.heldAttributes[key] = nil
                }
            }
            guard !catalog.localVersions.isEmpty else { return }
            catalog.localVersions[identifier] = nil
            guard subtree else { return }
            for key in Array(catalog.localVersions.keys) where key.rebased(from: identifier, to: identifier) != nil {
                catalog.localVersions[key] = nil
            }
        }
    }

    /// Whether the item has a local version not uploaded yet.
    func hasPendingLocal(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { $0.localVersions[identifier]?.pending ?? false }
    }

    /// For each of `identifiers` that is a name of a file with other names (hard links, D-396)
    /// whose edit not uploaded yet is kept under another of them: that name. What is written
    /// through a file's node is published under the node's name alone, so a new node of the file
    /// (the kernel forgot the last one) must go by that name, whichever name it is looked up by
    /// (D-410). Empty without hard links or pending edits.
    public func namesHoldingEdits(of identifiers: [ItemIdentifier]) -> [ItemIdentifier: ItemIdentifier] {
        state.withLock { catalog in
            guard !catalog.serials.groups.isEmpty, !catalog.localVersions.isEmpty else { return [:] }
            var holders: [ItemIdentifier: ItemIdentifier] = [:]
            for identifier in identifiers where catalog.localVersions[identifier]?.pending != true {
                let holder = catalog.serials.otherNames(of: identifier)
                    .filter { catalog.localVersions[$0]?.pending == true }.min()
                if let holder { holders[identifier] = holder }
            }
            return holders
        }
    }

    /// The provider's version the item's current local version stands for (after its upload), or
    /// the item's own version when it has no local one.
    func providerBase(of identifier: ItemIdentifier) -> ContentVersion? {
        state.withLock { catalog in
            if let local = catalog.localVersions[identifier] { return local.pending ? nil : local.providerVersion }
            return catalog.items[identifier]?.contentVersion
        }
    }

    /// Records an item the provider just made (a file created through the mount).
    @discardableResult
    func applyCreated(_ item: ProviderItem) -> ProviderItem {
        let applied = apply(item, appeared: true)
        hooks.step?(self, .createApplied)
        return applied
    }

    /// `identifier` appeared at the provider in `directory` with no change the catalog counted
    /// (a conflict copy, a birth): counted now for a listing of `directory` on its way, which may
    /// have been taken before it (D-388).
    static func noteAppeared(_ identifier: ItemIdentifier, in directory: ItemIdentifier, of catalog: inout State) {
        guard !catalog.listingsInFlight.isEmpty, catalog.listingsInFlight[directory] != nil else { return }
        catalog.changeCount &+= 1
        catalog.lastChange[directory] = catalog.changeCount
        noteEntry(identifier, in: directory, present: true, of: &catalog)
    }
}

// Files created through the mount, not at the provider yet (D-386): `ProviderCache.createFile`
// records one with `createdUnborn`; its `.create` upload (or a birth before a namespace change,
// `ProviderCache.bearUnborn`) ends it with `born`.
extension Catalog {
    /// Records `item`, made by the mount alone, in its parent's listing; the provider's answers
    /// about its identifier are not taken until `born`. `directory`: the parent as the provider
    /// shows it now (its mtime moved by `deferCreateNow`). `record`: its parked write-back
    /// record (none for a node kept by the mount alone), saved with the item in one transaction
    /// (D-529).
    /// False (nothing recorded) when the name is one not at the provider yet already: the
    /// provider cannot tell two creates of it apart, the catalog must (O_EXCL).
    func createdUnborn(_ item: ProviderItem, directory: ProviderItem?, record: UploadRecord? = nil) -> Bool {
        let now = environment.timeline.now
        // One lock for the item the name held and the new file (D-407): a listing applied in
        // between brought the old item back next to the new one.
        let recorded = state.withLock { catalog -> (changes: [CatalogChange], removal: Removal?)? in
            guard !catalog.unborn.contains(item.identifier) else { return nil }
            // The directory's entries changed: its attributes, not its dentry (D-382).
            let directories = Self.noteChange(in: [item.parent], of: &catalog)
            var removal: Removal?
            if let previous = catalog.names[item.parent]?[NameKey(item.name)], previous != item.identifier {
                // Gone for a listing on its way too (taken before, it still has it).
                Self.noteEntry(previous, in: item.parent, present: false, of: &catalog)
                removal = Self.remove(previous, from: &catalog)
            }
            catalog.unborn.insert(item.identifier)
            catalog.items[item.identifier] = item
            // A new file: a local version left by an earlier file of that name is not its base,
            // and its number is its own (D-389).
            catalog.localVersions[item.identifier] = nil
            catalog.serials.renew(item.identifier)
            catalog.refreshedAt[item.identifier] = now
            if !catalog.dirty.isEmpty { catalog.dirty.remove(item.identifier) }
            if catalog.children[item.parent] != nil {
                catalog.children[item.parent]!.insert(item.identifier)
                catalog.names[item.parent, default: [:]][NameKey(item.name)] = item.identifier
            }
            // Not recorded present: a listing keeps every unborn item of its directory anyway.
            return (directories, removal)
        }
        guard let recorded else { return false }
        hooks.step?(self, .unbornNameFreed)
        if let removal = recorded.removal { finishRemoval(removal) }
        save([item], with: record.map { [$0] } ?? [])
        if let directory { apply(directory) }
        tell(recorded.changes)
        return true
    }

    /// A restart: `identifier`, stored, is still to be created at the provider.
    func restoreUnborn(_ identifier: ItemIdentifier) {
        state.withLock { catalog in
            if catalog.items[identifier] != nil { catalog.unborn.insert(identifier) }
        }
    }

    /// The provider has `identifier` now: its answers count again.
    func born(_ identifier: ItemIdentifier) {
        state.withLock { catalog in
            guard catalog.unborn.remove(identifier) != nil, let parent = catalog.items[identifier]?.parent else {
                return
            }
            // A change of the directory: a name lookup asked of the provider before it does not
            // undo it (`changeMark`, D-392).
            catalog.changeCount &+= 1
            catalog.lastChange[parent] = catalog.changeCount
            Self.noteAppeared(identifier, in: parent, of: &catalog)
        }
    }

    func isUnborn(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { $0.unborn.isEmpty ? false : $0.unborn.contains(identifier) }
    }

    /// The item when it is not at the provider yet.
    func unbornItem(_ identifier: ItemIdentifier) -> ProviderItem? {
        state.withLock { catalog in
            guard !catalog.unborn.isEmpty, catalog.unborn.contains(identifier) else { return nil }
            return catalog.items[identifier]
        }
    }

    /// The unborn items at or under `roots`.
    func unborn(atOrUnder roots: [ItemIdentifier]) -> [ItemIdentifier] {
        state.withLock { catalog in
            guard !catalog.unborn.isEmpty else { return [] }
            let roots = Set(roots)
            // A local-only node is never made at the provider (D-398).
            return catalog.unborn.filter { candidate in
                catalog.items[candidate]?.special == nil && Self.lies(candidate, atOrUnder: roots, in: catalog)
            }
        }
    }
}

extension Catalog {
    /// Whether `candidate` or a directory above it is one of `roots`, found up its parents
    /// (identifiers need not be paths).
    static func lies(_ candidate: ItemIdentifier, atOrUnder roots: Set<ItemIdentifier>, in catalog: State) -> Bool {
        var next: ItemIdentifier? = candidate
        var steps = 0
        while let current = next, steps < 4096 {
            if roots.contains(current) { return true }
            if current == .root { return false }
            next = catalog.items[current]?.parent
            steps += 1
        }
        return false
    }
}

// FIFOs, sockets and devices made through the mount (D-398): in the catalog alone, for good.
// They are unborn items that are never born: listings and lookups of the provider do not remove
// them, no upload is ever queued, and `unborn(atOrUnder:)` leaves them out, so no namespace
// change makes them at the provider. The store keeps them (`special`), and a restart restores
// them as such (`init(stored:…)`).
extension Catalog {
    /// The local-only nodes at or under `roots` (a directory holding one is not empty).
    func localOnly(atOrUnder roots: [ItemIdentifier]) -> [ItemIdentifier] {
        state.withLock { catalog in
            guard !catalog.unborn.isEmpty else { return [] }
            let roots = Set(roots)
            return catalog.unborn.filter { candidate in
                catalog.items[candidate]?.special != nil && Self.lies(candidate, atOrUnder: roots, in: catalog)
            }
        }
    }

    /// The local-only node `identifier`, nil for any other item.
    func localOnlyItem(_ identifier: ItemIdentifier) -> ProviderItem? {
        state.withLock { catalog in
            guard !catalog.unborn.isEmpty, catalog.unborn.contains(identifier),
                let item = catalog.items[identifier], item.special != nil
            else { return nil }
            return item
        }
    }

    /// A chmod, chown or utimens of a local-only node: the catalog's item is the node.
    func changedLocalOnly(_ item: ProviderItem) {
        let known = state.withLock { catalog -> Bool in
            guard catalog.items[item.identifier]?.special != nil else { return false }
            catalog.items[item.identifier] = item
            return true
        }
        guard known else { return }
        save([item])
        tell([.attributes(item.identifier)])
    }
}
