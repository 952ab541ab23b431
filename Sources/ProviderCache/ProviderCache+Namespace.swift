// Namespace changes at the provider, for the mount (issue 14): each calls the provider at once
// (not queued: D-355) and updates the catalog from the item the provider returns, so the next
// lookup answers the change without asking again.

public import ProviderModel

extension ProviderCache {
    func providerCall<T: Sendable>(_ body: () async throws -> T) async throws(CacheError) -> T {
        do {
            return try await body()
        } catch {
            throw CacheError.from(error)
        }
    }

    /// mkdir: the new directory, in its parent's listing. `owner`: who made it (D-397).
    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16, owner: ItemOwner? = nil
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        let made = try await providerCall {
            try await provider.createDirectory(named: name, in: parent, permissions: permissions)
        }
        let item = await environment.owned(made, by: owner)
        catalog.created(item)
        return item
    }

    /// symlink: the new link, in its parent's listing. `owner`: who made it (D-397).
    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String, owner: ItemOwner? = nil
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        let made = try await providerCall {
            try await provider.createSymbolicLink(named: name, in: parent, target: target)
        }
        let item = await environment.owned(made, by: owner)
        catalog.created(item)
        return item
    }

    /// unlink, rmdir: the item is gone from the provider and the catalog; handles that pin its
    /// content keep their present bytes.
    public func delete(_ item: ProviderItem) async throws(CacheError) {
        let provider = environment.provider
        // Like a move (D-372): no upload call for the item runs meanwhile. Then its queued upload
        // and unpublished writes go with it (D-374), else a retry would bring the file back or
        // meet the next file of that name as a conflict.
        await writes.beginMove([item.identifier])
        defer { writes.endMove([item.identifier]) }
        // A file not at the provider yet goes with its write-back record alone; a directory with
        // such files in it is not empty, which the provider says once they are there (D-386).
        if item.special != nil { return await deleteLocalOnly(item) }  // D-398
        if item.kind == .file, dropUnborn(item.identifier) { return }
        if item.kind == .directory {
            // Nodes the mount keeps alone (D-398) are entries the provider never sees.
            guard catalog.localOnly(atOrUnder: [item.identifier]).isEmpty else {
                throw CacheError(.notEmpty, "\(item.identifier) holds a FIFO, socket or device kept by the mount")
            }
            try await bearUnborn(atOrUnder: [item.identifier])
        }
        do {
            try await provider.delete(item.identifier, kind: item.kind)
        } catch {
            let failure = CacheError.from(error)
            // Already gone: what was asked for is true; the catalog learns it.
            guard failure.code == .notFound else { throw failure }
        }
        writes.forget(item.identifier)
        catalog.deleted(item.identifier)
        attributeOverrides.remove(item.identifier)
    }

    /// Forgets `identifier` when it is a file the provider does not have yet (D-386): its records
    /// and the catalog's item. True when it was one.
    @discardableResult
    public func dropUnborn(_ identifier: ItemIdentifier) -> Bool {
        guard catalog.isUnborn(identifier) else { return false }
        environment.provider.forgetDeferredCreate(identifier)
        writes.forget(identifier)
        catalog.deleted(identifier)
        attributeOverrides.remove(identifier)
        return true
    }

    /// rename: `item` now `name` in `parent` (`mode`: rename(2)'s flags). `replaced`: the item at
    /// the destination, if any (gone after a `.replacing` move; moved to `item`'s old place by an
    /// `.exchange`). Returns the moved item and the identifiers re-keyed (old → new) for the
    /// tables above the cache keyed by identifier.
    public func move(
        _ item: ProviderItem, to parent: ItemIdentifier, named name: String, mode: MoveMode, replaced: ProviderItem?
    ) async throws(CacheError) -> (item: ProviderItem, moves: [ItemIdentifier: ItemIdentifier]) {
        let provider = environment.provider
        if item.special != nil {  // a local-only node (D-398)
            return try await moveLocalOnly(item, to: parent, named: name, mode: mode, replaced: replaced)
        }
        if replaced?.special != nil, mode == .exchange {
            throw CacheError(.unsupported, "a FIFO, socket or device kept by the mount cannot be exchanged")
        }
        // A directory holding nodes the mount keeps alone is not empty, whatever the provider sees.
        if let replaced, replaced.kind == .directory, mode != .exchange,
            !catalog.localOnly(atOrUnder: [replaced.identifier]).isEmpty
        {
            throw CacheError(.notEmpty, "\(replaced.identifier) holds a FIFO, socket or device kept by the mount")
        }
        // Upload calls for the items wait, and running ones end first (D-372).
        let moving = [item.identifier] + (replaced.map { [$0.identifier] } ?? [])
        await writes.beginMove(moving)
        defer { writes.endMove(moving) }
        // What the move takes along must be at the provider (D-386).
        try await bearUnborn(atOrUnder: moving)
        let moved = try await providerCall {
            try await provider.move(item.identifier, to: parent, named: name, mode: mode)
        }
        if mode == .exchange, let replaced {
            // Both items changed places: the catalog forgets both (their listings are asked for
            // again) rather than re-keying two subtrees into each other's identifiers. Open
            // writers and queued uploads follow their items (D-371).
            if moved.identifier == replaced.identifier {
                writes.exchange(item.identifier, replaced.identifier)
                catalog.exchanged(item.identifier, replaced.identifier)
            } else {
                catalog.deleted(item.identifier)
                catalog.deleted(replaced.identifier)
            }
            catalog.created(moved)
            catalog.expireListings([item.parent, parent])
            return (moved, [:])
        }
        if let replaced, replaced.identifier != item.identifier {
            attributeOverrides.remove(replaced.identifier)
            writes.forget(replaced.identifier)
        }
        let moves = catalog.moved(item, to: moved, replaced: replaced?.identifier)
        attributeOverrides.rekey(moves)
        // Open writers publish, and queued uploads go, under the new identifier (D-371).
        if moved.identifier != item.identifier { writes.rekey(from: item.identifier, to: moved.identifier) }
        return (moved, moves)
    }

    /// chmod, utimens at a provider that stores them (`.storesAttributes`).
    public func setAttributes(
        of identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        if let node = catalog.localOnlyItem(identifier) { return setLocalOnlyAttributes(node, changes) }  // D-398
        // Like a move (D-372): no upload call for the item runs meanwhile, so none meets the
        // version this changes. Edits that started from the version before follow it (D-375).
        await writes.beginMove([identifier])
        defer { writes.endMove([identifier]) }
        // Not at the provider yet: made there first (a directory's unborn files need not be).
        if catalog.isUnborn(identifier) { try await bearUnborn(atOrUnder: [identifier]) }  // D-386
        // The version before, at once when the provider can tell it (a watched local directory:
        // one lstat, no hop to its threads).
        var before = try? provider.itemNow(for: identifier)
        if before == nil { before = try? await providerCall { try await provider.item(for: identifier) } }
        let item = try await providerCall { try await provider.setAttributes(identifier, changes) }
        // A queued upload that carries a chmod held earlier must not undo this one (D-385).
        if let permissions = changes.permissions {
            writes.permissionsSet(identifier, to: permissions)
            catalog.permissionsSet(identifier, to: permissions)
        }
        if let before, before.contentVersion != item.contentVersion {
            writes.rebase(identifier, from: before.contentVersion, to: item.contentVersion)
            catalog.providerVersionChanged(
                identifier, from: before.contentVersion, to: item.contentVersion,
                modificationTime: changes.modificationTime == nil ? nil : item.modificationTime)
        }
        catalog.apply(item)
        return item
    }

    /// Items re-keyed outside a move through the mount (the write-back queue's hook): `from` and,
    /// for a provider whose identifiers are paths, everything below it now has the identifier
    /// `ItemIdentifier.rebased(from:to:)` gives, in the catalog, the store and the content store.
    @discardableResult
    public func identifiersMoved(from: ItemIdentifier, to: ItemIdentifier) -> [ItemIdentifier: ItemIdentifier] {
        let moves = catalog.identifiersMoved(from: from, to: to)
        attributeOverrides.rekey(moves)
        if from != to { writes.rekey(from: from, to: to) }  // the write-back queue, forgotten items too (D-383)
        return moves
    }

    /// chmod, utimens at a provider that does not store them: kept by the mount and shown by
    /// `shown(_:)` (AttributeOverrides.swift for how long each holds).
    public func keepAttributes(_ changes: ItemAttributeChanges, for item: ProviderItem) {
        attributeOverrides.set(changes, for: item)
        catalog.tell([.entry(directory: item.parent, name: item.name, identifier: item.identifier)])
    }

    /// `item` with the attributes the mount keeps for it (`keepAttributes`).
    public func shown(_ item: ProviderItem) -> ProviderItem { attributeOverrides.applied(to: item) }
}
