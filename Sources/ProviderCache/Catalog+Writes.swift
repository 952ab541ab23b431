// How the catalog follows a namespace change made through the mount (issue 14): the provider has
// already done it and returned the item as it is now, so the catalog is updated at once, with no
// second round trip: an item inserted into its parent's listing, one removed, one moved (and, for a
// provider whose identifiers are paths, every descendant re-keyed).
//
// Each change also counts as a change report for its directories (`changeCount`,
// `lastChange`): a listing that started before it and ends after it may not show it, so it is
// applied as raced (expired, listed again when next used), and the change, recorded while a
// listing of its directory is on its way (`noteEntry`), wins over that listing (D-388). The
// provider's own report of the same change (inotify for a local directory) arrives later and
// only makes the catalog ask again: the item is already where the report says.

import Diagnostics
public import ProviderModel
import SystemSupport

extension ItemIdentifier {
    /// This identifier after `from` became `to`: `to` for `from` itself; for an identifier that is
    /// a path below `from` (`from/…`, compared byte for byte: a provider whose identifiers are
    /// paths, as a local directory's), the same path below `to`; nil for any other (not moved,
    /// or a provider whose identifiers stay the same when an item moves).
    public func rebased(from: ItemIdentifier, to: ItemIdentifier) -> ItemIdentifier? {
        if self == from { return to }
        guard from != .root, from != to else { return nil }
        let raw = rawValue.utf8
        let prefix = from.rawValue.utf8
        guard raw.count > prefix.count + 1, raw.starts(with: prefix) else { return nil }
        let slash = raw.index(raw.startIndex, offsetBy: prefix.count)
        guard raw[slash] == UInt8(ascii: "/") else { return nil }
        return ItemIdentifier(to.rawValue + String(rawValue[slash...]))
    }
}

extension Catalog {
    /// Counts a change made through the mount in `directories` as a change report (see the top).
    /// Their own mtimes changed with their entries: they are asked for again when next used, and
    /// the kernel drops their attributes (returned, for `tell`), before the provider's own report
    /// arrives (a stat right after a create showed the directory's old mtime).
    @discardableResult
    static func noteChange(in directories: [ItemIdentifier], of catalog: inout State) -> [CatalogChange] {
        catalog.changeCount &+= 1
        var told: [CatalogChange] = []
        for directory in directories {
            catalog.lastChange[directory] = catalog.changeCount
            guard catalog.items[directory] != nil else { continue }
            catalog.dirty.insert(directory)
            catalog.metadataOnly.insert(directory)
            if catalog.writtenInto[directory] != nil { catalog.changedWhileWritten.insert(directory) }
            told.append(.attributes(directory))
        }
        return told
    }

    /// `identifier` was made or moved in `directory` (present) or deleted or moved out of it
    /// (absent) through the mount, at the current `changeCount`: a listing of `directory` on its
    /// way now, begun before, shows the directory without this change and must not undo it
    /// (`applyListing`, D-388).
    static func noteEntry(
        _ identifier: ItemIdentifier, in directory: ItemIdentifier, present: Bool, of catalog: inout State
    ) {
        guard !catalog.listingsInFlight.isEmpty, catalog.listingsInFlight[directory] != nil else { return }
        catalog.changedWhileListed[directory, default: [:]][identifier] = (catalog.changeCount, present)
    }

    /// Places `item` under its name in its parent's listing (when the parent is listed) and in
    /// the item table, confirmed now.
    private static func place(_ item: ProviderItem, at now: Duration, in catalog: inout State) {
        catalog.items[item.identifier] = item
        catalog.serials.number(for: item.identifier, link: item.hardLinkIdentity)
        catalog.refreshedAt[item.identifier] = now
        if !catalog.dirty.isEmpty { catalog.dirty.remove(item.identifier) }
        guard item.identifier != .root, catalog.children[item.parent] != nil else { return }
        catalog.children[item.parent]!.insert(item.identifier)
        catalog.names[item.parent, default: [:]][NameKey(item.name)] = item.identifier
    }

    /// Takes `identifier` out of its parent's listing (not out of the item table).
    private static func unplace(
        _ identifier: ItemIdentifier, parent: ItemIdentifier, name: String, in catalog: inout State
    ) {
        guard catalog.children[parent] != nil else { return }
        catalog.children[parent]!.remove(identifier)
        let key = NameKey(name)
        if catalog.names[parent]?[key] == identifier { catalog.names[parent]?[key] = nil }
    }

    /// An item the mount created at the provider (mkdir, symlink, a new file): in its parent's
    /// listing from now on. An item the catalog still had under that name is gone (the provider
    /// refused to create over it, so it was deleted there meanwhile).
    func created(_ item: ProviderItem) {
        let now = environment.timeline.now
        let (previous, directories) = state.withLock { catalog -> (ItemIdentifier?, [CatalogChange]) in
            let directories = Self.noteChange(in: [item.parent], of: &catalog)
            let previous = catalog.names[item.parent]?[NameKey(item.name)]
            if let previous, previous != item.identifier {
                Self.noteEntry(previous, in: item.parent, present: false, of: &catalog)
            }
            return (previous == item.identifier ? nil : previous, directories)
        }
        if let previous { removeItem(previous) }
        state.withLock { catalog in
            Self.place(item, at: now, in: &catalog)
            Self.noteEntry(item.identifier, in: item.parent, present: true, of: &catalog)
        }
        save([item])
        tell([.entry(directory: item.parent, name: item.name, identifier: item.identifier)] + directories)
    }

    /// A second name the mount made for the file `existing` (link(2) at the provider): placed as
    /// `created` places it, with the file's number (D-396). The file's other names are asked for
    /// again (their ctime moved).
    func linked(_ item: ProviderItem, to existing: ItemIdentifier) {
        let others = state.withLock { catalog -> [ItemIdentifier] in
            // A local version an earlier file of that name left is not this name's (its bytes
            // went with that file).
            catalog.localVersions[item.identifier] = nil
            catalog.serials.share(item.identifier, with: existing, link: item.hardLinkIdentity)
            let others = catalog.serials.otherNames(of: item.identifier)
            for name in others { catalog.dirty.insert(name) }
            return others
        }
        created(item)
        tell(others.map { .attributes($0) })
    }

    /// An item the mount deleted at the provider: removed with its descendants; handles that pin
    /// its content keep their present bytes (missing ones fail as a deletion, EIO).
    func deleted(_ identifier: ItemIdentifier) {
        let directories = state.withLock { catalog -> [CatalogChange] in
            guard let item = catalog.items[identifier] else { return [] }
            let directories = Self.noteChange(in: [item.parent], of: &catalog)
            Self.noteEntry(identifier, in: item.parent, present: false, of: &catalog)
            return directories
        }
        removeItem(identifier)
        tell(directories)
    }

    /// RENAME_EXCHANGE of `one` and `other` at a provider whose identifiers are paths: both
    /// subtrees are forgotten, to be listed again, but their local versions (written files,
    /// Catalog+Local.swift) change places, as the content store's records do, so that written
    /// bytes not yet uploaded stay with their items.
    func exchanged(_ one: ItemIdentifier, _ other: ItemIdentifier) {
        func swapped(_ identifier: ItemIdentifier) -> ItemIdentifier? {
            identifier.rebased(from: one, to: other) ?? identifier.rebased(from: other, to: one)
        }
        let directories = state.withLock { catalog -> [CatalogChange] in
            var directories: [CatalogChange] = []
            for identifier in [one, other] {
                if let item = catalog.items[identifier] {
                    directories += Self.noteChange(in: [item.parent], of: &catalog)
                }
            }
            func swapKeys<Value>(_ table: inout [ItemIdentifier: Value]) {
                var moved: [(ItemIdentifier, Value)] = []
                for identifier in Array(table.keys) {
                    guard let target = swapped(identifier) else { continue }
                    moved.append((target, table.removeValue(forKey: identifier)!))
                }
                for (target, value) in moved { table[target] = value }
            }
            swapKeys(&catalog.localVersions)
            swapKeys(&catalog.heldAttributes)  // D-460
            return directories
        }
        content.identifiersMoved(swapped)
        // The items are forgotten but keep their numbers, swapped with their places: listed
        // again, each shows the st_ino it had (D-389).
        let kept = state.withLock { catalog in
            catalog.serials.rekey(swapped)
            return catalog.serials.numbers.filter { swapped($0.key) != nil }
        }
        removeItem(one, keepingContent: true)
        removeItem(other, keepingContent: true)
        state.withLock { catalog in catalog.serials.restoreKept(kept) }
        tell(directories)
    }

    /// The listings of `directories` are asked for again when next used (an exchange).
    func expireListings(_ directories: [ItemIdentifier]) {
        let expired = environment.timeline.now - environment.options.directoryTTL
        state.withLock { catalog in
            for directory in directories {
                catalog.listingTokens[directory] = nil
                if let at = catalog.listedAt[directory], at > expired { catalog.listedAt[directory] = expired }
            }
        }
        tell(directories.map { .entries(directory: $0) })
    }

    /// An item the mount moved at the provider: `old` as the catalog had it, `item` as the provider
    /// returned it. `replaced`: the item that was at the destination and is gone now (removed
    /// first, so that a provider whose identifiers are paths can give its identifier to `item`).
    /// Returns the identifiers re-keyed (old → new), for the other tables keyed by identifier.
    func moved(
        _ old: ProviderItem, to item: ProviderItem, replaced: ItemIdentifier?
    ) -> [ItemIdentifier: ItemIdentifier] {
        let now = environment.timeline.now
        // One lock for the whole change and its records for listings on their way (D-407): a
        // listing applied between a record and what it records removed the moving subtree.
        let (directories, removal, rekeyed, placed) = state.withLock {
            catalog -> ([CatalogChange], Removal?, Rekeyed?, ProviderItem) in
            let directories = Self.noteChange(in: [old.parent, item.parent], of: &catalog)
            if let replaced { Self.noteEntry(replaced, in: item.parent, present: false, of: &catalog) }
            var removal: Removal?
            if let replaced, replaced != old.identifier {
                removal = Self.remove(replaced, from: &catalog)
            }
            let rekeyed =
                old.identifier == item.identifier
                ? nil : Self.rekey(from: old.identifier, to: item.identifier, in: &catalog)
            // After the re-keying, which would take the record along to the new identifier.
            Self.noteEntry(old.identifier, in: old.parent, present: false, of: &catalog)
            Self.unplace(item.identifier, parent: old.parent, name: old.name, in: &catalog)
            Self.unplace(old.identifier, parent: old.parent, name: old.name, in: &catalog)
            // A moved file with a local version not uploaded yet (or uploaded as the provider's
            // version) keeps it: the provider answers with the version it has, which the
            // write-back replaces next (D-371). Without this the move superseded the local bytes.
            var placed = item
            if !catalog.localVersions.isEmpty { Self.overlayLocal(&placed, in: &catalog) }
            if !catalog.heldAttributes.isEmpty { Self.overlayHeld(&placed, in: catalog) }  // D-460
            Self.place(placed, at: now, in: &catalog)
            Self.noteEntry(placed.identifier, in: placed.parent, present: true, of: &catalog)
            return (directories, removal, rekeyed, placed)
        }
        defer { tell(directories) }
        hooks.step?(self, .moveRecorded)
        if let removal { finishRemoval(removal) }
        let moves = rekeyed.map { finishRekey($0, from: old.identifier, to: item.identifier) } ?? [:]
        hooks.step?(self, .moveRekeyed)
        save([item])
        tell([
            .entry(directory: old.parent, name: old.name, identifier: item.identifier),
            .entry(directory: item.parent, name: item.name, identifier: item.identifier),
        ])
        if old.contentVersion != placed.contentVersion {
            content.supersede(
                item.identifier, except: placed.contentVersion,
                error: CacheError(.stale, "\(item.identifier) changed on the provider"))
        }
        return moves
    }

    /// Re-keys `from` and every identifier below it (`ItemIdentifier.rebased`) in the catalog's
    /// tables and the store, and hands the same moves to the content store. The items keep their
    /// names; a moved item's parent is re-keyed with it. Returns the moves made (old → new).
    @discardableResult
    func identifiersMoved(from: ItemIdentifier, to: ItemIdentifier) -> [ItemIdentifier: ItemIdentifier] {
        guard from != to, from != .root else { return [:] }
        let rekeyed = state.withLock { Self.rekey(from: from, to: to, in: &$0) }
        return finishRekey(rekeyed, from: from, to: to)
    }

    /// What `rekey` did: the moves (old → new), the moved items' rows, whether `from` may have
    /// had identifiers below it.
    struct Rekeyed {
        var moves: [ItemIdentifier: ItemIdentifier]
        var saved: [StoredItem]
        var subtree: Bool
    }

    /// `identifiersMoved`'s change of the catalog's tables (under the lock of the caller, which
    /// may record more with it: `moved`).
    static func rekey(from: ItemIdentifier, to: ItemIdentifier, in catalog: inout State) -> Rekeyed {
        guard from != to, from != .root else { return Rekeyed(moves: [:], saved: [], subtree: false) }
        // Only a directory (or an item the catalog does not know) has identifiers below it: a
        // file's move re-keys its own entries, not a scan of every item (D-401).
        let subtree = catalog.items[from].map { $0.kind == .directory } ?? true
        var moves: [ItemIdentifier: ItemIdentifier] = [:]
        if subtree {
            for identifier in catalog.items.keys {
                if let moved = identifier.rebased(from: from, to: to) { moves[identifier] = moved }
            }
        } else {
            moves[from] = to
        }
        guard !moves.isEmpty || !catalog.localVersions.isEmpty else {
            return Rekeyed(moves: [:], saved: [], subtree: subtree)
        }
        func map(_ identifier: ItemIdentifier) -> ItemIdentifier { moves[identifier] ?? identifier }
        var items: [(ItemIdentifier, ProviderItem)] = []
        for (old, new) in moves {
            guard var item = catalog.items.removeValue(forKey: old) else { continue }
            item.identifier = new
            item.parent = map(item.parent)
            items.append((new, item))
        }
        for (new, item) in items { catalog.items[new] = item }
        func rekeyTable<Value>(_ table: inout [ItemIdentifier: Value], _ transform: (Value) -> Value = { $0 }) {
            var moved: [(ItemIdentifier, Value)] = []
            for (old, new) in moves {
                if let value = table.removeValue(forKey: old) { moved.append((new, transform(value))) }
            }
            for (new, value) in moved { table[new] = value }
        }
        rekeyTable(&catalog.children) { Set($0.map(map)) }
        rekeyTable(&catalog.names) { $0.mapValues(map) }
        rekeyTable(&catalog.listedAt)
        rekeyTable(&catalog.refreshedAt)
        rekeyTable(&catalog.lastChange)
        rekeyTable(&catalog.heldAttributes)  // D-460
        // What was recorded of the moved items for listings on their way follows them (D-407):
        // recorded under the old identifier, the listing dropped the item under its new one.
        if !catalog.changedWhileListed.isEmpty {
            for directory in Array(catalog.changedWhileListed.keys) {
                guard var records = catalog.changedWhileListed[directory] else { continue }
                var moved: [(ItemIdentifier, (count: UInt64, present: Bool))] = []
                for (old, new) in moves {
                    if let record = records.removeValue(forKey: old) { moved.append((new, record)) }
                }
                guard !moved.isEmpty else { continue }
                for (new, record) in moved { records[new] = record }
                catalog.changedWhileListed[directory] = records
            }
        }
        catalog.serials.rekey(moves)  // an item keeps its st_ino when it moves (D-389)
        // Local versions of written files (Catalog+Local.swift), also of items the catalog
        // forgot (an exchange forgets both subtrees but keeps their local versions, D-383).
        var localMoves: [(ItemIdentifier, LocalVersion)] = []
        for identifier in subtree ? Array(catalog.localVersions.keys) : [from] {
            guard let moved = identifier.rebased(from: from, to: to),
                let local = catalog.localVersions.removeValue(forKey: identifier)
            else { continue }
            localMoves.append((moved, local))
        }
        for (moved, local) in localMoves { catalog.localVersions[moved] = local }
        // A listing token names the directory where it was taken: a moved one is revalidated
        // by a new listing instead.
        for old in moves.keys { catalog.listingTokens[old] = nil }
        for (old, new) in moves where catalog.dirty.remove(old) != nil { catalog.dirty.insert(new) }
        if !catalog.unborn.isEmpty {
            for (old, new) in moves where catalog.unborn.remove(old) != nil { catalog.unborn.insert(new) }
        }
        // Moved: the next change of a moved directory drops its dentry (D-382).
        if !catalog.metadataOnly.isEmpty { for old in moves.keys { catalog.metadataOnly.remove(old) } }
        // The parent of `from` still lists it under its old identifier (the caller moves it).
        if let parent = catalog.items[to]?.parent, catalog.children[parent]?.remove(from) != nil {
            catalog.children[parent]!.insert(to)
            if let name = catalog.items[to]?.name { catalog.names[parent]?[NameKey(name)] = to }
        }
        let saved = items.map {
            StoredItem(
                item: $0.1, childrenListed: catalog.children[$0.0] != nil,
                serial: catalog.serials.number(for: $0.0))
        }
        return Rekeyed(moves: moves, saved: saved, subtree: subtree)
    }

    /// `identifiersMoved`'s effects, with the lock dropped: the store, the content store.
    private func finishRekey(
        _ rekeyed: Rekeyed, from: ItemIdentifier, to: ItemIdentifier
    ) -> [ItemIdentifier: ItemIdentifier] {
        let (moves, saved, subtree) = (rekeyed.moves, rekeyed.saved, rekeyed.subtree)
        if !moves.isEmpty {
            do {
                try environment.store.deleteItems(Array(moves.keys))
                try environment.store.saveItems(saved)
            } catch {
                environment.logger.warning("cannot re-key moved items in the metadata store: \(error)")
            }
        }
        // Every content record below `from`, also those of items the catalog forgot (D-383).
        content.identifiersMoved(among: subtree ? nil : [from]) { $0.rebased(from: from, to: to) }
        return moves
    }
}
