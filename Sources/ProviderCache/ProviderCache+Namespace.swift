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
        let own = catalog.beginOwnChange(of: [], naming: [(parent, name)])  // D-403
        defer { catalog.endOwnChange(own) }
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
        let own = catalog.beginOwnChange(of: [], naming: [(parent, name)])  // D-403
        defer { catalog.endOwnChange(own) }
        let made = try await providerCall {
            try await provider.createSymbolicLink(named: name, in: parent, target: target)
        }
        let item = await environment.owned(made, by: owner)
        catalog.created(item)
        return item
    }

    /// link: `name` in `parent`, a second name of the file `item` (`.hardLinks`, D-396). A file
    /// not at the provider yet is made there first (empty; its queued upload then writes its
    /// bytes into the file, which every name shows). No upload call of it runs meanwhile.
    public func link(
        _ item: ProviderItem, to parent: ItemIdentifier, named name: String
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        try await writes.beginMove([item.identifier])
        defer { writes.endMove([item.identifier]) }
        try await bearUnborn(atOrUnder: [item.identifier])
        let linked = try await providerCall { try await provider.link(item.identifier, to: parent, named: name) }
        catalog.linked(linked, to: item.identifier)
        return linked
    }

    /// unlink, rmdir: the item is gone from the provider and the catalog; handles that pin its
    /// content keep their present bytes. `heir`: another name of the same file (hard links,
    /// D-396), which the open writers of this one go on writing under.
    public func delete(_ item: ProviderItem, heir: ItemIdentifier? = nil) async throws(CacheError) {
        let provider = environment.provider
        if item.kind == .file { try await uploadBeforeUnlinking(item.identifier) }
        // Like a move (D-372): no upload call for the item runs meanwhile. Then its queued upload
        // and unpublished writes go with it (D-374), else a retry would bring the file back or
        // meet the next file of that name as a conflict.
        try await writes.beginMove([item.identifier])
        defer { writes.endMove([item.identifier]) }
        let own = catalog.beginOwnChange(of: [item.identifier])  // D-403
        defer { catalog.endOwnChange(own) }
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
        if let heir, item.kind != .directory { writes.handOverStaging(from: item.identifier, to: heir) }
        writes.forget(item.identifier, subtree: item.kind == .directory)
        catalog.deleted(item.identifier)
        attributeOverrides.remove(item.identifier)
        if pins.state(of: item.identifier) != .inherited { pins.set(.inherited, for: item.identifier) }
    }

    /// One name of a file with other names goes (D-396): what was written through it and is not
    /// at the provider yet must reach the file first, else it goes with the name's write-back
    /// record and the other names never get it. Waits (real time, at most 30 s) for that upload;
    /// one that failed (offline, an error) refuses the unlink instead, the name and its bytes kept.
    private func uploadBeforeUnlinking(_ identifier: ItemIdentifier) async throws(CacheError) {
        guard !catalog.otherNames(of: identifier).isEmpty else { return }
        writes.expedite(identifier)  // not after its settle (D-405)
        let deadline = ContinuousClock.now + .seconds(30)
        while let record = writes.uploadRecord(of: identifier), record.isPending {
            if record.phase == .error {
                throw CacheError(
                    .io,
                    "\(identifier) has other names, which would lose its bytes not uploaded yet: "
                        + (record.lastError ?? "the upload failed"))
            }
            guard ContinuousClock.now < deadline else {
                throw CacheError(.timedOut, "\(identifier): its upload did not end within 30 s; not unlinked")
            }
            try? await Task.sleep(for: .milliseconds(2))
        }
    }

    /// Forgets `identifier` when it is a file the provider does not have yet (D-386): its records
    /// and the catalog's item. True when it was one.
    @discardableResult
    public func dropUnborn(_ identifier: ItemIdentifier) -> Bool {
        guard catalog.isUnborn(identifier) else { return false }
        environment.provider.forgetDeferredCreate(identifier)
        writes.forget(identifier, subtree: false)  // an unborn item is a file
        catalog.deleted(identifier)
        attributeOverrides.remove(identifier)
        return true
    }

    /// rename: `item` now `name` in `parent` (`mode`: rename(2)'s flags). `replaced`: the item at
    /// the destination, if any (gone after a `.replacing` move; moved to `item`'s old place by an
    /// `.exchange`). Returns the moved item and the identifiers re-keyed (old → new) for the
    /// tables above the cache keyed by identifier. `heir`: another name of the replaced file
    /// (hard links, D-396), which its open writers go on writing under.
    public func move(
        _ item: ProviderItem, to parent: ItemIdentifier, named name: String, mode: MoveMode, replaced: ProviderItem?,
        heir: ItemIdentifier? = nil
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
        if let replaced, mode == .replacing, replaced.kind != .directory {
            try await uploadBeforeUnlinking(replaced.identifier)
        }
        // Upload calls for the items wait, and running ones end first (D-372).
        let moving = [item.identifier] + (replaced.map { [$0.identifier] } ?? [])
        try await writes.beginMove(moving)
        defer { writes.endMove(moving) }
        // Both names are the mount's own change until the catalog recorded it (D-403).
        let own = catalog.beginOwnChange(of: [item.identifier], naming: [(parent, name)])
        defer { catalog.endOwnChange(own) }
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
            if let heir { writes.handOverStaging(from: replaced.identifier, to: heir) }
            writes.forget(replaced.identifier, subtree: replaced.kind == .directory)
        }
        let moves = catalog.moved(item, to: moved, replaced: replaced?.identifier)
        attributeOverrides.rekey(moves)
        pinsMoved(moved, moves: moves)  // D-445
        // Open writers publish, and queued uploads go, under the new identifier (D-371).
        if moved.identifier != item.identifier {
            writes.rekey(from: item.identifier, to: moved.identifier, subtree: item.kind == .directory)
        }
        return (moved, moves)
    }

    /// chmod, utimens at a provider that stores them (`.storesAttributes`).
    public func setAttributes(
        of identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        if let node = catalog.localOnlyItem(identifier) { return setLocalOnlyAttributes(node, changes) }  // D-398
        if let held = heldForUpload(identifier, changes) { return held }  // D-460
        // Like a move (D-372): no upload call for the item runs meanwhile, so none meets the
        // version this changes. Edits that started from the version before follow it (D-375).
        // A directory's uploads are its files' and change nothing of it that this sets (D-521).
        let exclusion = isDirectory(identifier) ? [] : [identifier]
        try await writes.beginMove(exclusion)
        defer { writes.endMove(exclusion) }
        let own = catalog.beginOwnChange(of: [identifier])  // D-403
        defer { catalog.endOwnChange(own) }
        // Not at the provider yet: made there first (a directory's unborn files need not be).
        if catalog.isUnborn(identifier) { try await bearUnborn(atOrUnder: [identifier]) }  // D-386
        // The version before, at once when the provider can tell it (a watched local directory:
        // one lstat, no hop to its threads).
        var before = try? provider.itemNow(for: identifier)
        if before == nil { before = try? await providerCall { try await provider.item(for: identifier) } }
        let item = try await providerCall { try await provider.setAttributes(identifier, changes) }
        return attributesSet(identifier, changes, before: before, item: item)
    }

    /// `setAttributes` on the calling thread: held by the upload that must come first, as
    /// `setAttributes` holds it (D-460); else (D-426) for an item at the provider (not unborn,
    /// not kept by the mount alone) with no upload call running, where the provider makes the
    /// change at once (`Provider.setAttributesNow`: a watched local directory). Nil: declined,
    /// nothing done (the caller uses `setAttributes`).
    public func setAttributesNow(
        of identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) -> Result<ProviderItem, CacheError>? {
        let provider = environment.provider
        guard catalog.localOnlyItem(identifier) == nil else { return nil }
        if let held = heldForUpload(identifier, changes) { return .success(held) }  // D-460
        let exclusion = isDirectory(identifier) ? [] : [identifier]  // D-521, as `setAttributes`
        guard !catalog.isUnborn(identifier),
            writes.tryBeginMove(exclusion)
        else { return nil }
        defer { writes.endMove(exclusion) }
        let own = catalog.beginOwnChange(of: [identifier])  // D-403
        defer { catalog.endOwnChange(own) }
        // The version before, as the async path finds it; without it, the async path asks.
        guard let before = try? provider.itemNow(for: identifier) else { return nil }
        let item: ProviderItem
        do {
            guard let made = try provider.setAttributesNow(identifier, changes) else { return nil }
            item = made
        } catch {
            return .failure(CacheError.from(error))
        }
        return .success(attributesSet(identifier, changes, before: before, item: item))
    }

    /// What follows a chmod or utimens made at the provider (`setAttributes` and its twin
    /// `setAttributesNow`): the queued upload and the catalog learn it.
    private func attributesSet(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges, before: ProviderItem?, item: ProviderItem
    ) -> ProviderItem {
        // A queued upload that carries a chmod or utimens held earlier must not undo this one
        // (D-385, D-460).
        writes.attributesCarried(identifier, HeldAttributes(changes))
        if let permissions = changes.permissions { catalog.permissionsSet(identifier, to: permissions) }
        // The edits that started from the version before follow it (D-375).
        writes.versionChanged(
            identifier, before: before, by: item,
            modificationTime: changes.modificationTime == nil ? nil : item.modificationTime)
        // A directory that uploads write into: what this set is what it keeps (D-521).
        if item.kind == .directory { catalog.directoryAttributesSet(item) }
        return item
    }

    /// A directory as the catalog knows it: its chmod and utimens do not wait for the uploads of
    /// the files inside (D-521).
    private func isDirectory(_ identifier: ItemIdentifier) -> Bool {
        catalog.knownItem(identifier)?.kind == .directory
    }

    /// A chmod or utimens of a file whose upload must reach the provider first (its create is
    /// queued or running, or attributes held earlier wait for their call): held by the upload's
    /// record instead of waiting for it (`LocalWrites.holdForUpload`), and shown by the catalog
    /// at once (D-460); an atime too, made after the upload (which makes a new file). Not for a
    /// file with other names (D-396: they would not show it) or a chown. Nil: not held, nothing
    /// done.
    private func heldForUpload(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) -> ProviderItem? {
        let held = HeldAttributes(changes)
        guard changes.uid == nil, changes.gid == nil, !held.isEmpty, catalog.otherNames(of: identifier).isEmpty
        else { return nil }
        let (wasHeld, shown) = writes.holdForUpload(identifier, held)
        return wasHeld ? shown : nil
    }

    /// Items re-keyed outside a move through the mount (the write-back queue's hook): `from` and,
    /// for a provider whose identifiers are paths, everything below it now has the identifier
    /// `ItemIdentifier.rebased(from:to:)` gives, in the catalog, the store and the content store.
    @discardableResult
    public func identifiersMoved(from: ItemIdentifier, to: ItemIdentifier) -> [ItemIdentifier: ItemIdentifier] {
        let subtree = catalog.knownItem(from).map { $0.kind == .directory } ?? true
        let moves = catalog.identifiersMoved(from: from, to: to)
        attributeOverrides.rekey(moves)
        pins.rekey(moves)
        // The write-back queue, forgotten items too (D-383).
        if from != to { writes.rekey(from: from, to: to, subtree: subtree) }
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
