// FIFOs, sockets and devices made through the mount (issue 23, D-398): a provider cannot store
// them, so the mount keeps them in its catalog alone, "not synced" (`ItemStatus.State.localOnly`),
// for good: never uploaded, persisted across remounts, moved along with a directory that holds
// them, and in the way of an rmdir of it. Their I/O is the kernel's (a FIFO's open and its bytes
// never reach the file system; the mount is nodev, so a device does not open).

import Diagnostics
public import ProviderModel

extension ProviderCache {
    /// mknod(2) of a FIFO, socket or device: `name` in `parent`, in the catalog alone. The caller
    /// checked that the name is free. Where the provider defers creates (`deferCreateNow`) it
    /// checks the name as for a file (EEXIST for a name the source has, one it does not show
    /// included; ENAMETOOLONG for a path it could not hold, D-393) and moves the directory's
    /// mtime; the deferred create is then forgotten at once. Elsewhere the directory's mtime is
    /// set at the provider (best effort). `.exists` when the catalog has a node of that name.
    public func createLocalOnly(
        named name: String, in parent: ItemIdentifier, special: SpecialNode, permissions: UInt16,
        owner: ItemOwner?
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        var deferred: DeferredCreate?
        do { deferred = try provider.deferCreateNow(named: name, in: parent) } catch { throw CacheError.from(error) }
        if let deferred { provider.forgetDeferredCreate(deferred.identifier) }
        let now = wallClockTime()
        var item = ProviderItem(
            identifier: Self.localIdentifier(named: name, in: parent), parent: parent, name: name, kind: .file,
            size: 0, modificationTime: now, contentVersion: ContentVersion("local-only"),
            permissions: permissions & 0o7777, owner: owner, special: special)
        item.accessTime = now
        item.changeTime = now
        guard catalog.createdUnborn(item, directory: deferred?.directory) else {
            throw CacheError(.exists, "'\(name)' exists")
        }
        if deferred == nil { await touchDirectory(parent) }
        return item
    }

    /// The identifier of a local-only node: a path below its directory's, as the provider's
    /// identifiers are and as the catalog's re-keying of a moved directory assumes
    /// (`ItemIdentifier.rebased`), so the node moves with the directory that holds it.
    static func localIdentifier(named name: String, in parent: ItemIdentifier) -> ItemIdentifier {
        ItemIdentifier(parent == .root ? name : parent.rawValue + "/" + name)
    }

    /// The local-only node `identifier`, nil for any other item.
    public func localOnlyItem(_ identifier: ItemIdentifier) -> ProviderItem? { catalog.localOnlyItem(identifier) }

    /// chmod, chown, utimens of a local-only node: kept in the catalog. A chown clears setuid and
    /// setgid, as Linux's does (the permissions asked with it come after).
    func setLocalOnlyAttributes(_ item: ProviderItem, _ changes: ItemAttributeChanges) -> ProviderItem {
        var changed = item
        if changes.uid != nil || changes.gid != nil {
            let owner = item.owner ?? ItemOwner(uid: 0, gid: 0)
            changed.owner = ItemOwner(uid: changes.uid ?? owner.uid, gid: changes.gid ?? owner.gid)
            changed.permissions &= ~0o6000
        }
        if let permissions = changes.permissions { changed.permissions = permissions & 0o7777 }
        if let time = changes.modificationTime { changed.modificationTime = time }
        if let time = changes.accessTime { changed.accessTime = time }
        changed.changeTime = wallClockTime()
        catalog.changedLocalOnly(changed)
        return changed
    }

    /// rename of a local-only node: in the catalog alone. `replaced` (checked by the caller: not
    /// a directory) goes first: a provider item is deleted there, a local-only one dropped. Not
    /// atomic at the provider, which never sees the node. No exchange (`.unsupported`).
    func moveLocalOnly(
        _ item: ProviderItem, to parent: ItemIdentifier, named name: String, mode: MoveMode, replaced: ProviderItem?
    ) async throws(CacheError) -> (item: ProviderItem, moves: [ItemIdentifier: ItemIdentifier]) {
        guard mode != .exchange else {
            throw CacheError(.unsupported, "a FIFO, socket or device kept by the mount cannot be exchanged")
        }
        if let replaced, replaced.identifier != item.identifier {
            if replaced.special == nil {
                try await delete(replaced)
            } else {
                _ = dropUnborn(replaced.identifier)
            }
        }
        var moved = item
        moved.identifier = Self.localIdentifier(named: name, in: parent)
        moved.parent = parent
        moved.name = name
        moved.changeTime = wallClockTime()  // a rename changes the node's ctime, as Linux's does
        let moves = catalog.moved(item, to: moved, replaced: nil)
        attributeOverrides.rekey(moves)
        await touchDirectory(item.parent)
        if parent != item.parent { await touchDirectory(parent) }
        return (moved, moves)
    }

    /// unlink of a local-only node: gone from the catalog, its directory's mtime moved.
    func deleteLocalOnly(_ item: ProviderItem) async {
        _ = dropUnborn(item.identifier)
        await touchDirectory(item.parent)
    }

    /// The directory's mtime to now at the provider, where it stores times: what a change of its
    /// entries the provider never sees (a local-only node's) does to a directory. Best effort.
    private func touchDirectory(_ directory: ItemIdentifier) async {
        let provider = environment.provider
        guard provider.capabilities.contains(.storesAttributes) else { return }
        do {
            let item = try await provider.setAttributes(
                directory, ItemAttributeChanges(modificationTime: wallClockTime()))
            _ = catalog.apply(item)
        } catch {
            environment.logger.notice("\(directory): its mtime could not follow a local-only change: \(error)")
        }
    }
}
