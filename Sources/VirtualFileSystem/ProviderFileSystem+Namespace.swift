// Namespace changes through the mount (issue 14): mkdir, symlink, unlink, rmdir, rename, and the
// attribute changes that are not a size (chmod, utimens). Each goes to the provider at once (not
// queued, D-355), then the catalog follows from the provider's answer and the kernel is told
// (`catalogChanged`). unlink, rmdir and rename are coordinated first: forDeleting / forMoving
// claims through `NamespaceClaimProvider`, so presenters hear of the change before it happens.
// docs/SEMANTICS.md ("Namespace changes") lists what each answers.

import Diagnostics
import ProviderCache
import ProviderModel
import SystemSupport

extension ProviderFileSystem {
    /// rename(2)'s flags (linux/fs.h).
    static let renameNoReplace: UInt32 = 1 << 0
    static let renameExchange: UInt32 = 1 << 1

    /// Where a namespace change happens: the directory's item and, through an access path, the
    /// directory's node there.
    struct ChangeSite {
        var directory: ItemIdentifier
        var scoped: ScopedNode?
    }

    /// The directory `parent` names, checked for a change: the mount is writable, the caller may
    /// use the path (require-token mode, a read-write token for an access path), it is a
    /// directory.
    func changeSite(
        _ parent: InodeNumber, _ operation: String, context: RequestContext
    ) throws(FileSystemError) -> ChangeSite {
        // Who may use the path is decided first (require-token mode, tokens), then EROFS.
        switch resolve(parent) {
        case .plain: break
        case .scopedRoot:
            guard isWritable else { throw readOnly(operation) }
            throw FileSystemError(
                .accessDenied, "\(operation) in \(Self.scopedDirectoryName): its entries are the tokens")
        case .scoped(let node):
            let check = try enforce(node, context: context, operation: operation).check
            guard isWritable else { throw readOnly(operation) }
            guard check.writable else {
                logger.notice("\(operation) through an access path refused: a read token")
                throw FileSystemError(.accessDenied, "\(operation) through an access path of a read token")
            }
            guard case .item(let identifier) = node.role else {
                throw FileSystemError(.accessDenied, "\(operation) beside a granted file: only the file is granted")
            }
            guard node.kind == .directory else {
                throw FileSystemError(.notADirectory, "\(identifier) is not a directory")
            }
            return ChangeSite(directory: identifier, scoped: node)
        }
        try checkPlainPath(operation, context: context)
        guard isWritable else { throw readOnly(operation) }
        let node = try node(parent)
        guard node.kind == .directory else {
            throw FileSystemError(.notADirectory, "\(node.identifier) is not a directory")
        }
        return ChangeSite(directory: node.identifier, scoped: nil)
    }

    /// A name for a new or existing entry: one path component of at most 255 bytes. The `.scoped`
    /// directory's name at the root is the access paths', never a provider item's.
    func checkName(_ name: String, in site: ChangeSite, _ operation: String) throws(FileSystemError) {
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(UInt8(ascii: "/")),
            !name.utf8.contains(0)
        else { throw FileSystemError(.invalidArgument, "\(operation): '\(name)' is not a file name") }
        guard name.utf8.count <= 255 else {
            throw FileSystemError(.nameTooLong, "\(operation): name longer than 255 bytes")
        }
        if site.scoped == nil, site.directory == .root, name == Self.scopedDirectoryName, scopedAccess != nil {
            throw FileSystemError(.accessDenied, "\(operation): \(Self.scopedDirectoryName) holds the access paths")
        }
    }

    /// The item named `name` in the site's directory, or nil when there is none.
    func existingChild(named name: String, in site: ChangeSite) async throws(FileSystemError) -> ProviderItem? {
        do {
            return try await child(named: name, of: site.directory)
        } catch  where error.code == .notFound {
            return nil
        }
    }

    /// The answer to mkdir and symlink: an entry the kernel holds a reference to, as lookup's.
    func createdEntry(
        _ item: ProviderItem, parent: InodeNumber, site: ChangeSite, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        if site.scoped != nil { return try await lookup(parent: parent, name: item.name, context: context) }
        return entry(for: item, presentBytes: 0, tracked: cache.catalog.isTracked(item))
    }

    public func makeDirectory(
        parent: InodeNumber, name: String, permissions: UInt16, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        let site = try changeSite(parent, "mkdir", context: context)
        try checkName(name, in: site, "mkdir")
        let item: ProviderItem
        do {
            item = try await cache.createDirectory(
                named: name, in: site.directory, permissions: permissions & 0o7777,
                owner: newOwner(in: site.directory, context: context))
        } catch {
            throw FileSystemError(error)
        }
        return try await createdEntry(item, parent: parent, site: site, context: context)
    }

    public func makeSymbolicLink(
        parent: InodeNumber, name: String, target: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        let site = try changeSite(parent, "symlink", context: context)
        try checkName(name, in: site, "symlink")
        // What a Linux file system without symbolic links (vfat) answers.
        guard cache.providerCapabilities.contains(.symbolicLinks) else {
            throw FileSystemError(.notPermitted, "symlink: the provider has no symbolic links")
        }
        guard !target.isEmpty else { throw FileSystemError(.notFound, "symlink: an empty target") }
        guard target.utf8.count < 4096 else { throw FileSystemError(.nameTooLong, "symlink: target too long") }
        let item: ProviderItem
        do {
            item = try await cache.createSymbolicLink(
                named: name, in: site.directory, target: target, owner: newOwner(in: site.directory, context: context))
        } catch {
            throw FileSystemError(error)
        }
        return try await createdEntry(item, parent: parent, site: site, context: context)
    }

    /// mknod(2): a regular file as `create` and `release` make it (the protocol's default). A
    /// FIFO, socket or device, which a provider cannot store, is kept by the mount alone, "not
    /// synced" (D-398), after the checks mkdir makes; the kernel checked CAP_MKNOD for a device.
    /// Through an access path: EPERM, as before (D-391).
    public func makeNode(
        parent: InodeNumber, name: String, type: MknodType, permissions: UInt16, device: UInt64,
        context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        let special: SpecialNode
        switch type {
        case .regular:
            return try await makeEmptyFile(parent: parent, name: name, permissions: permissions, context: context)
        case .fifo: special = SpecialNode(.fifo)
        case .socket: special = SpecialNode(.socket)
        case .characterDevice: special = SpecialNode(.characterDevice, device: device)
        case .blockDevice: special = SpecialNode(.blockDevice, device: device)
        }
        let site = try changeSite(parent, "mknod", context: context)
        try checkName(name, in: site, "mknod")
        guard site.scoped == nil else {
            throw FileSystemError(.notPermitted, "mknod: a \(type) through an access path")
        }
        if try await existingChild(named: name, in: site) != nil {
            throw FileSystemError(.exists, "mknod: '\(name)' exists")
        }
        let item: ProviderItem
        do {
            item = try await cache.createLocalOnly(
                named: name, in: site.directory, special: special, permissions: permissions,
                owner: newOwner(in: site.directory, context: context))
        } catch {
            throw FileSystemError(error)
        }
        return try await createdEntry(item, parent: parent, site: site, context: context)
    }

    /// link(2): a second name for a file at a provider with hard links (`.hardLinks`, D-396),
    /// made there at once (a file not there yet is made first); both names are then one node,
    /// one st_ino, with st_nlink the number of names. A symbolic link is linked itself. EPERM for
    /// a directory, and at a provider without hard links (as vfat); EXDEV through an access path
    /// (as between two mounts); EEXIST for a name taken; EROFS on a read-only mount.
    public func makeHardLink(
        _ inode: InodeNumber, newParent: InodeNumber, newName: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        let site = try changeSite(newParent, "link", context: context)
        try checkName(newName, in: site, "link")
        guard site.scoped == nil, case .plain = resolve(inode) else {
            throw FileSystemError(.crossDevice, "link: through an access path")
        }
        // A node whose readers use the page cache gets no second name (one name per caching node:
        // a lookup through the other would share its pages), and an old version's node none:
        // ESTALE, and the kernel retries on the name's new node (D-435).
        try admitChange(inode, writing: false)
        if let removed = removedAttributes(inode), removed.linkCount == 0 {
            throw FileSystemError(.notFound, "link: the file was removed")
        }
        let node = try node(inode)
        guard node.kind != .directory else {
            throw FileSystemError(.notPermitted, "link: \(node.identifier) is a directory")
        }
        guard cache.providerCapabilities.contains(.hardLinks) else {
            throw FileSystemError(.notPermitted, "link: the provider has no hard links")
        }
        if try await existingChild(named: newName, in: site) != nil {
            throw FileSystemError(.exists, "link: '\(newName)' exists")
        }
        let item = try await item(of: node, maximumAge: options.cache.attributeTTL)
        // A FIFO, socket or device is the mount's alone (D-398): nothing at the provider to link.
        guard item.special == nil else {
            throw FileSystemError(.notPermitted, "link: \(node.identifier) is a node the mount keeps alone")
        }
        let linked: ProviderItem
        do {
            linked = try await cache.link(item, to: site.directory, named: newName)
        } catch {
            throw FileSystemError(error)
        }
        // The new name is another name of the node (the kernel links its inode to the new dentry).
        guard let generation = state.withLock({ $0.inodes.addName(linked.identifier, to: inode) }) else {
            return try await lookup(parent: newParent, name: newName, context: context)
        }
        let timeout = trackedTimeout(cache.catalog.isTracked(linked))
        return Entry(
            attributes: try await getAttributes(inode, context: context), generation: generation,
            attributeTimeout: timeout ?? options.attributeTimeout, entryTimeout: timeout ?? options.entryTimeout)
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError) {
        try await remove(parent: parent, name: name, directory: false, context: context)
    }

    public func removeDirectory(
        parent: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) {
        try await remove(parent: parent, name: name, directory: true, context: context)
    }

    /// unlink (`directory` false) and rmdir.
    func remove(
        parent: InodeNumber, name: String, directory: Bool, context: RequestContext
    ) async throws(FileSystemError) {
        let operation = directory ? "rmdir" : "unlink"
        let site = try changeSite(parent, operation, context: context)
        try checkName(name, in: site, operation)
        guard let item = try await existingChild(named: name, in: site) else {
            throw FileSystemError(.notFound, "\(operation): no item named '\(name)'")
        }
        if directory, item.kind != .directory {
            throw FileSystemError(.notADirectory, "rmdir: \(item.identifier) is not a directory")
        }
        if !directory, item.kind == .directory {
            throw FileSystemError(.isADirectory, "unlink: \(item.identifier) is a directory")
        }
        if site.scoped != nil, case .item(let scope)? = site.scoped?.role, item.identifier == scope {
            throw FileSystemError(.accessDenied, "\(operation): the granted item itself")
        }
        try await settleOpenContent(of: [item.identifier])
        let path = cache.catalog.path(of: item.identifier) ?? item.identifier.rawValue
        let coordination = namespaceClaims
        let claim = try await coordination.acquireNamespaceClaims(
            NamespaceClaimRequest(change: .deleting(path: path, isDirectory: directory), context: context))
        // Its open descriptors keep showing its st_ino (its number goes with it).
        let serial = cache.catalog.serialNumber(of: item.identifier)
        // A file with other names (D-396): its node, open handles and writers go on under one.
        let heir = directory ? nil : self.heir(of: item.identifier)
        do {
            try await cache.delete(item, heir: heir)
        } catch {
            coordination.finishNamespaceChange(claim, happened: false)
            throw FileSystemError(error)
        }
        state.withLock { Self.detachRemoved(item, serial: serial, heir: heir, in: &$0) }
        coordination.finishNamespaceChange(claim, happened: true)
    }

    public func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: UInt32,
        context: RequestContext
    ) async throws(FileSystemError) {
        let from = try changeSite(parent, "rename", context: context)
        let to = try changeSite(newParent, "rename", context: context)
        guard flags & ~(Self.renameNoReplace | Self.renameExchange) == 0,
            flags != Self.renameNoReplace | Self.renameExchange
        else { throw FileSystemError(.invalidArgument, "rename: flags \(flags) are not supported") }
        let mode: MoveMode =
            flags == Self.renameExchange ? .exchange : flags == Self.renameNoReplace ? .noReplace : .replacing
        // Like a file system without RENAME_EXCHANGE (ext2 before 4.x, tmpfs of old kernels).
        if mode == .exchange, !cache.providerCapabilities.contains(.exchangingMoves) {
            throw FileSystemError(.invalidArgument, "rename: the provider cannot exchange items")
        }
        try checkName(name, in: from, "rename")
        try checkName(newName, in: to, "rename")
        // One access path's token, or plain paths on both sides: an item never crosses from one to
        // the other (as between two mounts).
        guard from.scoped?.token == to.scoped?.token else {
            throw FileSystemError(.crossDevice, "rename: between an access path and another path")
        }
        guard let source = try await existingChild(named: name, in: from) else {
            throw FileSystemError(.notFound, "rename: no item named '\(name)'")
        }
        if case .item(let scope)? = from.scoped?.role, source.identifier == scope {
            throw FileSystemError(.accessDenied, "rename: the granted item itself")
        }
        // A directory never moves into itself or below itself.
        if source.kind == .directory, depth(of: to.directory, below: source.identifier) != nil {
            throw FileSystemError(.invalidArgument, "rename: \(source.identifier) would move below itself")
        }
        let destination = try await existingChild(named: newName, in: to)
        if let destination {
            // The same item under both names, or two names of one file (hard links, D-396):
            // nothing to do (POSIX).
            if destination.identifier == source.identifier { return }
            if source.kind != .directory,
                cache.catalog.otherNames(of: source.identifier).contains(destination.identifier)
            {
                return
            }
            switch mode {
            case .noReplace: throw FileSystemError(.exists, "rename: '\(newName)' exists")
            case .exchange: break
            case .replacing:
                if source.kind == .directory, destination.kind != .directory {
                    throw FileSystemError(.notADirectory, "rename: '\(newName)' is not a directory")
                }
                if source.kind != .directory, destination.kind == .directory {
                    throw FileSystemError(.isADirectory, "rename: '\(newName)' is a directory")
                }
            }
            if case .item(let scope)? = to.scoped?.role, destination.identifier == scope {
                throw FileSystemError(.accessDenied, "rename: over the granted item itself")
            }
        } else if mode == .exchange {
            throw FileSystemError(.notFound, "rename: no item named '\(newName)' to exchange with")
        }
        try await settleOpenContent(of: [source.identifier] + (destination.map { [$0.identifier] } ?? []))
        let fromPath = cache.catalog.path(of: source.identifier) ?? source.identifier.rawValue
        let directoryPath = cache.catalog.path(of: to.directory) ?? to.directory.rawValue
        let toPath = directoryPath.isEmpty ? newName : directoryPath + "/" + newName
        let coordination = namespaceClaims
        let claim = try await coordination.acquireNamespaceClaims(
            NamespaceClaimRequest(
                change: .moving(
                    from: fromPath, to: toPath, isDirectory: source.kind == .directory, exchanging: mode == .exchange),
                context: context))
        var moves: [ItemIdentifier: ItemIdentifier]
        let moved: ProviderItem
        // A replaced item's descriptors keep showing its st_ino (its number goes with it).
        let destinationSerial = destination.map { cache.catalog.serialNumber(of: $0.identifier) }
        // A replaced file with other names (D-396): its node, handles and writers go on under one.
        var heir: ItemIdentifier?
        if let destination, mode == .replacing, destination.kind != .directory {
            heir = self.heir(of: destination.identifier)
        }
        do {
            (moved, moves) = try await cache.move(
                source, to: to.directory, named: newName, mode: mode, replaced: destination, heir: heir)
        } catch {
            coordination.finishNamespaceChange(claim, happened: false)
            throw FileSystemError(error)
        }
        state.withLock { state in
            if moved.identifier != source.identifier, mode != .exchange {
                // At a provider whose identifiers are paths everything below the item moves with
                // it, also what the catalog no longer knows (an exchange forgets both subtrees)
                // while the kernel still holds it: nodes, open handles, writers (D-383).
                func follow(_ identifier: ItemIdentifier) {
                    guard moves[identifier] == nil,
                        let rebased = identifier.rebased(from: source.identifier, to: moved.identifier)
                    else { return }
                    moves[identifier] = rebased
                }
                for identifier in state.inodes.identifiers { follow(identifier) }
                for identifier in state.handles.identifiers { follow(identifier) }
                for directory in state.directories.values { follow(directory.identifier) }
            }
            if let destination {
                if mode == .exchange {
                    // The kernel swapped the two names' nodes: each node follows its item. At a
                    // provider whose identifiers are paths, the two subtrees swap identifiers.
                    if moved.identifier == destination.identifier {
                        for identifier in state.inodes.identifiers {
                            if let swapped =
                                identifier.rebased(from: source.identifier, to: destination.identifier)
                                ?? identifier.rebased(from: destination.identifier, to: source.identifier)
                            {
                                moves[identifier] = swapped
                            }
                        }
                    }
                } else {
                    // Replaced: its open descriptors keep its last attributes (and their bytes);
                    // a file with other names goes on under one (D-396).
                    Self.detachRemoved(destination, serial: destinationSerial ?? 0, heir: heir, in: &state)
                }
            }
            state.inodes.rekey(moves)
            guard !moves.isEmpty else { return }
            // Read and write handles follow their items (writers' staging copies moved with them, D-371).
            state.handles.rekey(moves)
            for (handle, directory) in state.directories {
                if let moved = moves[directory.identifier] { state.directories[handle]!.identifier = moved }
            }
            state.scoped.rekey(moves)
        }
        coordination.finishNamespaceChange(claim, happened: true)
    }

    /// The attributes of a node whose item was deleted or replaced through the mount (an
    /// unlinked open file): its last ones, with link count 0 as on a local file system.
    func removedAttributes(_ inode: InodeNumber) -> NodeAttributes? {
        guard let (item, serial) = state.withLock({ $0.removed.isEmpty ? nil : $0.removed[inode] }) else { return nil }
        var attributes = attributes(of: item, presentBytes: item.size, inode: inode, serial: serial, links: 0)
        // Open for writing when it was removed: its handles go on writing their (unlinked) staging
        // copy, and fstat shows its length and last change, as for an unlinked local file.
        if let staging = state.withLock({ $0.handles.writer(of: inode)?.staging }) {
            attributes.size = staging.size
            attributes.blocks = (staging.size + 511) / 512
            if let permissions = staging.permissions { attributes.permissions = permissions & 0o7777 }  // D-385
            if let modified = staging.modified {
                attributes.modificationTime = Timestamp(seconds: modified.seconds, nanoseconds: modified.nanoseconds)
                attributes.changeTime = attributes.modificationTime
            }
        }
        return attributes
    }

    /// The item is gone from its name: a node the kernel holds keeps answering its last
    /// attributes (`removedAttributes`), and its number is no longer handed out for the identifier.
    /// A node of a file with other names goes on under one of them, `heir`, and so do its open
    /// handles (D-396). Called with the state locked.
    static func detachRemoved(
        _ item: ProviderItem, serial: UInt64, heir: ItemIdentifier? = nil, in state: inout State
    ) {
        if let inode = state.inodes.detach(item.identifier, heir: heir) { state.removed[inode] = (item, serial) }
        // Its handles, readers and writers, go on under the heir (the cache handed the writers'
        // staging copies over).
        if let heir { state.handles.handOver(from: item.identifier, to: heir) }
    }

    /// The name a file's node, handles and writers go on under when `identifier`, one of its
    /// names, goes (hard links, D-396): the node's next name, else one the catalog knows. Nil
    /// for a file with one name.
    func heir(of identifier: ItemIdentifier) -> ItemIdentifier? {
        state.withLock { $0.inodes.heir(of: identifier) } ?? cache.catalog.otherNames(of: identifier).first
    }

    /// Before an item is deleted, replaced or moved: the content that open handles of it (or of
    /// items below it) pin is completed, so those handles read the whole version to the end (a
    /// deleted item's bytes cannot be fetched afterwards; a moved item's entry is retired when
    /// its identifier changes). A download that fails leaves the handle its present bytes.
    func settleOpenContent(of identifiers: [ItemIdentifier]) async throws(FileSystemError) {
        let open = state.withLock { state in state.handles.readers.map { ($0.identifier, $0.entry) } }
        guard !open.isEmpty else { return }
        for (identifier, entry) in open
        where identifiers.contains(where: { depth(of: identifier, below: $0) != nil }) && !entry.isMaterialized {
            do {
                try await entry.ensurePresent(0..<entry.progress.total)
            } catch  where error.code == .cancelled {
                throw FileSystemError(error)
            } catch {
                logger.notice("\(identifier): its open content could not be completed before the change: \(error)")
            }
        }
    }

    /// setattr's permissions, owner and times (never its size: `truncate`), the part of
    /// `setAttributesStep` after the size; `write`'s clearing of setuid too.
    ///
    /// chmod and the modification time go to the provider when it stores them
    /// (`.storesAttributes`), else the mount keeps them (`ProviderCache.keepAttributes`). The
    /// access time is not kept (atime reads as mtime). chown: EPERM unless it changes nothing
    /// (every node belongs to the mounting user), except where the provider stores owners.
    func changesStep(
        _ inode: InodeNumber, _ resolved: ResolvedNode, _ changes: AttributeChanges, context: RequestContext
    ) -> SetAttributesStep {
        var rest = changes
        rest.size = nil
        guard rest != AttributeChanges() else { return .needsAttributes }
        do throws(FileSystemError) {
            guard isWritable else { throw readOnly("setattr") }
            switch resolved {
            case .plain: break
            case .scopedRoot: throw FileSystemError(.notPermitted, "setattr: access-path directories are not items")
            case .scoped(let scoped):
                guard case .item = scoped.role else {
                    throw FileSystemError(.notPermitted, "setattr: access-path directories are not items")
                }
                guard try enforce(scoped, context: context, operation: "setattr").check.writable else {
                    throw FileSystemError(.accessDenied, "setattr through an access path of a read token")
                }
            }
            guard let node = try anyNode(inode, resolved, context: context, operation: "setattr") else {
                throw FileSystemError(.notPermitted, "setattr: access-path directories are not items")
            }
            var wanted = Self.itemChanges(rest)
            if ownsItems {
                // The kernel checked who may (default_permissions): only root gives a node away,
                // its owner gives it to a group of its own.
                if wanted.uid != nil || wanted.gid != nil { return .needsOwner(node, wanted) }
            } else {
                if let uid = rest.uid, uid != options.uid {
                    throw FileSystemError(.notPermitted, "chown: every node belongs to the mounting user")
                }
                if let gid = rest.gid, gid != options.gid {
                    throw FileSystemError(.notPermitted, "chown: every node belongs to the mounting user's group")
                }
                wanted.uid = nil
                wanted.gid = nil
            }
            return changeStep(node, wanted)
        } catch {
            return .answered(.failure(error))
        }
    }

    /// A chown where the provider stores owners, with the owner the node shows: a chown to the
    /// owner it has changes nothing.
    func ownedChangeStep(_ node: InodeTable.Node, _ wanted: ItemAttributeChanges, owner: ItemOwner) -> SetAttributesStep
    {
        var wanted = wanted
        if wanted.uid == owner.uid { wanted.uid = nil }
        if wanted.gid == owner.gid { wanted.gid = nil }
        return changeStep(node, wanted)
    }

    /// The change to make: none; or carried by the open edit's publish and upload (D-385), held
    /// here; or made at the provider or kept by the mount (`.needsChange`).
    func changeStep(_ node: InodeTable.Node, _ wanted: ItemAttributeChanges) -> SetAttributesStep {
        let storesAttributes = cache.providerCapabilities.contains(.storesAttributes)
        var wanted = wanted
        if !storesAttributes { wanted.accessTime = nil }  // kept nowhere: it reads as mtime
        guard wanted != ItemAttributeChanges() else { return .needsAttributes }
        var held = wanted
        held.accessTime = nil  // an edit's upload makes a new file: the atime is not carried
        if storesAttributes, node.kind == .file, wanted.uid == nil, wanted.gid == nil,
            wanted.permissions != nil || wanted.modificationTime != nil,
            cache.holdAttributes(held, of: node.identifier)
        {
            return .needsAttributes
        }
        return .needsChange(node, wanted, atProvider: storesAttributes)
    }

    /// After a change is made or kept: an explicit mtime replaces the open edit's last change,
    /// until its next one.
    func attributesChanged(_ wanted: ItemAttributeChanges, of identifier: ItemIdentifier) {
        if wanted.modificationTime != nil { cache.modificationSet(of: identifier) }
    }

    /// The async form's settling of a `SetAttributesStep`: it truncates, and asks the catalog and
    /// the provider for what `setAttributesNow` takes from memory or leaves.
    func settleAttributes(
        _ inode: InodeNumber, _ first: SetAttributesStep, _ changes: AttributeChanges, handle: FileHandleID?,
        context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        var step = first
        while true {
            switch step {
            case .answered(let result):
                return try result.get()
            case .truncates(let resolved, let size):
                _ = try await truncate(inode, resolved, to: size, handle: handle, context: context)
                step = changesStep(inode, resolved, changes, context: context)
            case .needsOwner(let node, let wanted):
                let item = try await item(of: node, maximumAge: options.cache.attributeTTL)
                step = ownedChangeStep(node, wanted, owner: shownOwner(of: cache.shown(item)))
            case .needsChange(let node, let wanted, let atProvider):
                let item = try await item(of: node, maximumAge: options.cache.attributeTTL)
                if atProvider {
                    do {
                        _ = try await cache.setAttributes(of: item.identifier, wanted)
                    } catch {
                        throw FileSystemError(error)
                    }
                } else {
                    cache.keepAttributes(wanted, for: item)
                }
                attributesChanged(wanted, of: item.identifier)
                step = .needsAttributes
            case .needsAttributes:
                return try await getAttributes(inode, context: context)
            }
        }
    }
}
