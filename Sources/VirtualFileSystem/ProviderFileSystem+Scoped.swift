// Access paths: `MOUNTPOINT/.scoped/<token>/…` (docs/SEMANTICS.md, "Scoped access paths";
// D-305..D-309). The `.scoped` directory cannot be listed; `.scoped/<token>` is the granted
// directory itself, or for a granted file a directory holding just that file under its current
// name; everything below is resolved inside the granted item only. Every operation on such a node
// that reaches the file system asks the `ScopedAccessProvider` again (opens take a use); handles
// are direct I/O, never passed through. The kernel may keep entries and attributes of a token
// bound to no process until its deadline (capped by the mount's timeouts) and is told to forget
// them when the token ends earlier (D-345, D-346); a token bound to a process keeps entry
// timeout zero. An operation learns what its node is from `resolve` (plain, `.scoped`, or a node
// here; ScopedNodeTable.swift, D-506) and hands an access-path node to its function below, which
// checks the token (`enforce`, `checkToken`: the grant as the port gave it, D-507).

import Diagnostics
import ProviderCache
import ProviderModel
import SystemSupport

extension ScopedGrant {
    /// The granted item.
    var item: ItemIdentifier { ItemIdentifier(scope) }
}

extension ProviderFileSystem {
    var scopedDirectoryInode: InodeNumber? {
        scopedAccess == nil ? nil : state.withLock { $0.scoped.directory }
    }

    /// What `inode` is to an operation: plain, `.scoped`, or an access-path node (D-506). Each
    /// operation resolves its node once and switches on the answer.
    func resolve(_ inode: InodeNumber) -> ResolvedNode {
        guard scopedAccess != nil else { return .plain }
        return state.withLock { $0.scoped.resolve(inode) }
    }

    // MARK: Checks

    /// The token asked again, its grant as the provider gave it (D-507); a use taken when `use`,
    /// which lasts until `endUse(id)` (ended here if the answer is a refusal after all: the root,
    /// D-305). Denied → EACCES with the reason, logged; not a token → ENOENT.
    func checkToken(
        _ token: String, context: RequestContext, use: Bool = false, operation: String
    ) throws(FileSystemError) -> ScopedGrant {
        guard let scopedAccess else { throw FileSystemError(.notFound, "the mount has no access paths") }
        let decision =
            use ? scopedAccess.recordUse(token, context: context) : scopedAccess.check(token, context: context)
        switch decision {
        case .allowed(let grant):
            // The root has no name to stand under `.scoped/<token>/` (D-305).
            guard !grant.scope.isEmpty else {
                if use { scopedAccess.returnUse(id: grant.id) }
                logger.notice("\(operation) through an access path refused: a grant of the mount's root")
                throw FileSystemError(.accessDenied, "access path refused: the mount's root cannot be granted")
            }
            return grant
        case .denied(let reason):
            // Never the token: the authority logs it by id (or not at all for a guess).
            logger.notice("\(operation) through an access path refused (uid \(context.uid)): \(reason)")
            throw FileSystemError(.accessDenied, "access path refused: \(reason)")
        case .notAToken(let reason):
            // A probe (the coordinator's package marker, `.git`, …): no entry, no refusal; not
            // logged above debug, so a flood of probes fills no log (D-394).
            logger.debug("\(operation) under .scoped: no such entry (\(reason))")
            throw FileSystemError(.notFound, "no such entry under .scoped: \(reason)")
        }
    }

    /// How many levels `identifier` is below `scope` (0: the scope item itself), by the catalog's
    /// known parents; nil when it is not inside (or its ancestry is not known: refused, D-307).
    func depth(of identifier: ItemIdentifier, below scope: ItemIdentifier) -> Int? {
        var current = identifier
        var depth = 0
        while depth < 4096 {
            if current == scope { return depth }
            if current == .root { return nil }
            guard let item = cache.catalog.knownItem(current) else { return nil }
            current = item.parent
            depth += 1
        }
        return nil
    }

    /// The token re-checked and the node's item checked inside its scope. Returns the check and,
    /// for an item node, its depth below the scope item.
    @discardableResult
    func enforce(
        _ node: ScopedNode, context: RequestContext, use: Bool = false, operation: String
    ) throws(FileSystemError) -> (check: ScopedGrant, depth: Int?) {
        let check = try checkToken(node.token, context: context, use: use, operation: operation)
        guard case .item(let identifier) = node.role else { return (check, nil) }
        guard let depth = depth(of: identifier, below: check.item) else {
            logger.notice("\(operation) through an access path refused: \(identifier) is outside the token's scope")
            throw FileSystemError(.accessDenied, "access path refused: the item is outside the token's scope")
        }
        return (check, depth)
    }

    /// The node behind `inode` (resolved as `resolved`) for the operations that only name it
    /// (setattr, xattrs): a plain node, or an access-path item node after its checks; nil for
    /// `.scoped` and a token directory (no item of their own).
    func anyNode(
        _ inode: InodeNumber, _ resolved: ResolvedNode, context: RequestContext, operation: String
    ) throws(FileSystemError) -> InodeTable.Node? {
        let node: ScopedNode
        switch resolved {
        case .plain: return try self.node(inode)
        case .scopedRoot: return nil
        case .scoped(let scoped): node = scoped
        }
        try enforce(node, context: context, operation: operation)
        guard case .item(let identifier) = node.role else { return nil }
        return InodeTable.Node(identifier: identifier, kind: node.kind, lookupCount: 0, generation: 0)
    }

    // MARK: Nodes and attributes

    /// The node of `token` in `role`, made if needed, with `references` more kernel references. `check`:
    /// the token's, whose id finds its nodes when it ends (D-346) and whose scope the node keeps.
    func bindScoped(
        token: String, role: ScopedNode.Role, kind: ItemKind, references: UInt64, check: ScopedGrant
    ) -> InodeNumber {
        state.withLock { state in
            state.scoped.bind(
                token: token, role: role, kind: kind, references: references, tokenID: check.id, scope: check.item,
                numberedBy: &state.inodes)
        }
    }

    /// `.scoped`: search permission only (it cannot be listed).
    func scopedDirectoryAttributes(_ inode: InodeNumber) -> NodeAttributes {
        NodeAttributes(
            inode: inode, type: .directory, permissions: 0o111, linkCount: 1, uid: options.uid, gid: options.gid,
            size: 0, blocks: 0, accessTime: Timestamp(seconds: 0), modificationTime: Timestamp(seconds: 0),
            changeTime: Timestamp(seconds: 0), serialNumber: Self.accessPathSerial(inode))
    }

    /// The st_ino of an access path's own directories (`.scoped`, `.scoped/<token>`): their node
    /// id, which is out of the range of items' numbers (`InodeTable.reserve`, D-389).
    static func accessPathSerial(_ inode: InodeNumber) -> UInt64 { inode.rawValue }

    /// `.scoped/<token>`: a read-only directory with the granted item's times.
    func tokenDirectoryAttributes(
        _ inode: InodeNumber, scopeItem: ProviderItem, _ check: ScopedGrant
    ) -> NodeAttributes {
        var attributes = attributes(of: scopeItem, presentBytes: 0, inode: inode)
        attributes.serialNumber = Self.accessPathSerial(inode)
        attributes.type = .directory
        attributes.permissions = 0o555
        attributes.size = 0
        attributes.blocks = 0
        attributes.validFor = scopedTimeouts(check.caching).attributes
        return attributes
    }

    func scopedItemAttributes(_ inode: InodeNumber, item: ProviderItem, _ check: ScopedGrant) -> NodeAttributes {
        var attributes = attributes(of: item, presentBytes: cache.content.presentBytes(of: item), inode: inode)
        attributes.validFor = scopedTimeouts(check.caching).attributes
        return attributes
    }

    /// How long the kernel may keep an access-path node's attributes when its entries are not
    /// cached (D-342): long enough that the permission checks of a path walk and an open, and an
    /// app's fstat right after, use the attributes the LOOKUP just returned instead of a GETATTR
    /// each; short against the 100 ms within which access must end. Attributes give no access:
    /// with entry timeout zero every path walk still asks the daemon (LOOKUP), and opens and
    /// reads always reach it.
    static var scopedAttributeTimeout: Duration { .milliseconds(50) }

    /// The kernel's timeouts for what is answered through a token (D-345). A token the provider
    /// lets the kernel cache, once the kernel can be told to forget (`KernelCacheCoherent`): its
    /// time left, capped by the mount's entry and attribute timeouts (a plain, untracked node's),
    /// since an earlier end is announced and invalidated (`scopedTokenEnded`). Otherwise (bound
    /// to a process, or no way to tell the kernel): entry timeout zero, so every path walk asks
    /// again (D-306), and attributes for `scopedAttributeTimeout` (D-342).
    func scopedTimeouts(_ caching: ScopedKernelCaching) -> (entry: Duration, attributes: Duration) {
        let left: Duration?
        switch caching {
        case .never: return (.zero, Self.scopedAttributeTimeout)
        case .atMost(let duration): left = max(.zero, duration)
        case .unbounded: left = nil
        }
        guard kernelCanBeTold else { return (.zero, Self.scopedAttributeTimeout) }
        return (
            min(left ?? options.entryTimeout, options.entryTimeout),
            min(left ?? options.attributeTimeout, options.attributeTimeout)
        )
    }

    func scopedEntry(_ attributes: NodeAttributes, _ check: ScopedGrant) -> Entry {
        let timeouts = scopedTimeouts(check.caching)
        return Entry(
            attributes: attributes, generation: 1, attributeTimeout: timeouts.attributes,
            entryTimeout: timeouts.entry)
    }

    /// The item a token grants, fresh per the attribute TTL.
    func scopeItem(_ scope: ItemIdentifier) async throws(FileSystemError) -> ProviderItem {
        do throws(CacheError) {
            return try await cache.catalog.item(scope, maximumAge: options.cache.attributeTTL)
        } catch {
            throw FileSystemError(error)
        }
    }

    func scopedItem(_ node: ScopedNode) async throws(FileSystemError) -> ProviderItem {
        guard case .item(let identifier) = node.role else {
            throw FileSystemError(.invalidArgument, "not an item node")
        }
        return try await item(
            of: InodeTable.Node(identifier: identifier, kind: node.kind, lookupCount: 0, generation: 0),
            maximumAge: options.cache.attributeTTL)
    }

    // MARK: Operations

    /// getattr of `.scoped`: open to everyone, with the mount's attribute timeout.
    func scopedRootAttributes(_ inode: InodeNumber) -> NodeAttributes {
        var attributes = scopedDirectoryAttributes(inode)
        attributes.validFor = options.attributeTimeout
        return attributes
    }

    /// A link's target, if following it stays inside the granted item: absolute targets, and
    /// relative ones whose `..` climb above the granted item, are refused (EACCES).
    func scopedReadLink(_ node: ScopedNode, context: RequestContext) async throws(FileSystemError) -> String {
        guard case .item = node.role else {
            throw FileSystemError(.invalidArgument, "not a symbolic link")
        }
        let (_, depth) = try enforce(node, context: context, operation: "readlink")
        let item = try await scopedItem(node)
        guard let link = item.symbolicLinkTarget else {
            throw FileSystemError(.invalidArgument, "\(item.identifier) is not a symbolic link")
        }
        // Levels of the link's directory below the granted directory (0: `.scoped/<token>`
        // itself). The kernel resolves each `..` through the parent it knows; above level 0 is
        // `.scoped`. A granted link itself (depth 0) has no directory inside the scope.
        var level = (depth ?? 0) - 1
        var leaves = link.hasPrefix("/") || level < 0
        for component in link.split(separator: "/", omittingEmptySubsequences: true) where !leaves {
            switch component {
            case ".": continue
            case "..":
                level -= 1
                if level < 0 { leaves = true }
            default: level += 1
            }
        }
        if leaves {
            logger.notice("readlink through an access path refused: \(item.identifier)'s target leaves the scope")
            throw FileSystemError(
                .accessDenied, "access path refused: the symbolic link leads out of the token's scope")
        }
        return link
    }

    /// opendir of `.scoped`: refused, it cannot be listed.
    func scopedRootListingRefusal(_ context: RequestContext) -> FileSystemError {
        logger.notice("listing \(Self.scopedDirectoryName) refused (uid \(context.uid))")
        return FileSystemError(.accessDenied, "\(Self.scopedDirectoryName) cannot be listed")
    }

    func scopedOpenDirectory(
        _ inode: InodeNumber, _ node: ScopedNode, context: RequestContext
    ) async throws(FileSystemError) -> FileHandleID {
        guard node.kind == .directory else { throw FileSystemError(.notADirectory, "not a directory") }
        let scope = try enforce(node, context: context, operation: "opendir").check.item
        let identifier: ItemIdentifier
        if case .item(let item) = node.role { identifier = item } else { identifier = scope }
        return state.withLock { state in
            let handle = state.allocateHandle()
            state.directories[handle] = OpenDirectory(
                inode: inode, identifier: identifier, snapshot: nil, scoped: node)
            return handle
        }
    }

    func scopedReadDirectory(
        _ open: OpenDirectory, _ node: ScopedNode, handle: FileHandleID, after cookie: UInt64, limit: Int,
        context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntry] {
        let check = try enforce(node, context: context, operation: "readdir").check
        let scope = check.item
        var snapshot = open.snapshot
        if snapshot == nil || cookie == 0 {
            var children: [ProviderItem]
            let parentInode: InodeNumber
            if node.role == .token {
                children = [try await scopeItem(scope)]
                parentInode = scopedDirectoryInode ?? .root
            } else {
                do {
                    children = try await cache.catalog.children(
                        of: open.identifier, maximumAge: options.cache.directoryTTL)
                } catch {
                    throw FileSystemError(error)
                }
                let parent = cache.catalog.knownItem(open.identifier)?.parent ?? .root
                // A granted directory is `.scoped/<token>`: its parent is `.scoped`.
                parentInode =
                    open.identifier == scope
                    ? (scopedDirectoryInode ?? .root)
                    : bindScoped(
                        token: node.token, role: .item(parent), kind: .directory, references: 0,
                        check: check)
            }
            // d_ino: an item's own st_ino, an access path's synthetic directories their own (D-389).
            let itemParent =
                parentInode == (scopedDirectoryInode ?? .root) ? nil : cache.catalog.knownItem(open.identifier)?.parent
            var entries = [
                DirectoryEntry(
                    name: ".", inode: open.inode,
                    serialNumber: node.role == .token
                        ? Self.accessPathSerial(open.inode) : cache.catalog.serialNumber(of: open.identifier),
                    type: .directory, cookie: 1),
                DirectoryEntry(
                    name: "..", inode: parentInode,
                    serialNumber: itemParent.map { cache.catalog.serialNumber(of: $0) }
                        ?? Self.accessPathSerial(parentInode),
                    type: .directory, cookie: 2),
            ]
            let serials = cache.catalog.serialNumbers(of: children.map(\.identifier))
            for (child, serial) in zip(children, serials) {
                let inode = bindScoped(
                    token: node.token, role: .item(child.identifier), kind: child.kind, references: 0,
                    check: check)
                entries.append(
                    DirectoryEntry(
                        name: child.name, inode: inode, serialNumber: serial, type: NodeType(child),
                        cookie: UInt64(entries.count + 1)))
            }
            let built = entries
            state.withLock { $0.directories[handle]?.snapshot = built }
            snapshot = built
        }
        guard let snapshot, cookie < UInt64(snapshot.count) else { return [] }
        return Array(snapshot[Int(cookie)..<min(snapshot.count, Int(cookie) + max(0, limit))])
    }

    /// Ends a use an open took: its handle was released.
    func endScopedUse(_ id: String?) {
        guard let id else { return }
        scopedAccess?.endUse(id: id)
    }

    /// Gives back a use an open took: the open failed after it.
    func returnScopedUse(_ id: String?) {
        guard let id else { return }
        scopedAccess?.returnUse(id: id)
    }
}

// MARK: - Twins: one core for the immediate and the async answer

// Each access-path lookup, getattr and open has two forms (D-341): `xNow`, answered on the FUSE
// thread from memory (nil: left to the async form), and the async `x`. Both run one core, `xStep`
// (D-512): the checks in the async operation's order. It refuses, or says which item the answer
// needs (`.needs`) with what makes the answer from it; `xNow` takes that item from memory
// (`answerNow`; nil when it is not there), and `x` fetches it as the async operation always has
// (`settle`), without checking again. A token check that allows changes nothing, so when `xNow`
// leaves an answer to `x`, `x` may check again; a denial is the answer (EACCES) in both forms. An
// open takes its use in its one check of the token, before the claim and pin, and the immediate
// form gives it back when it leaves the open to `open` (D-348).

/// The item an access-path operation needs before it can answer.
enum ScopedNeed {
    /// The item a token grants.
    case scopeItem(ItemIdentifier)
    /// The item named `name` in `directory`.
    case child(named: String, of: ItemIdentifier)
    /// The item of an access-path item node.
    case item(ScopedNode)
}

/// What an access-path operation's core decides: a refusal, or the item its answer needs and
/// what makes the answer from that item.
enum ScopedStep<Answer> {
    case refused(FileSystemError)
    case needs(ScopedNeed, then: (ProviderItem) throws(FileSystemError) -> Answer)
}

/// What the checks of an open through an access path leave to do.
enum ScopedOpenStep {
    /// A file to read, its use taken: the claim, revalidation and pin come next.
    case read(ItemIdentifier, use: String)
    /// A write, or an item other than a file, whose token and scope were checked without a use:
    /// the async `open` takes the use (`scopedOpenUse`) and goes on; the immediate one declines.
    case checked(ItemIdentifier)
}

extension ProviderFileSystem {
    // MARK: Lookup

    /// A lookup in `.scoped`: the name is the token.
    func tokenLookup(_ name: String, context: RequestContext) async throws(FileSystemError) -> Entry {
        try await settle(tokenLookupStep(name, context: context))
    }

    func tokenLookupNow(_ name: String, context: RequestContext) -> Result<Entry, FileSystemError>? {
        answerNow(tokenLookupStep(name, context: context))
    }

    private func tokenLookupStep(_ name: String, context: RequestContext) -> ScopedStep<Entry> {
        scopedStep { () throws(FileSystemError) in
            if name == "." || name == ".." {
                throw FileSystemError(.invalidArgument, "'\(name)' is resolved by the kernel")
            }
            let check = try checkToken(name, context: context, operation: "lookup")
            return (
                .scopeItem(check.item),
                { item in
                    // A granted directory is the token's node itself (D-305).
                    if item.kind == .directory {
                        let inode = self.bindScoped(
                            token: name, role: .item(check.item), kind: .directory, references: 1, check: check)
                        return self.scopedEntry(self.scopedItemAttributes(inode, item: item, check), check)
                    }
                    let inode = self.bindScoped(
                        token: name, role: .token, kind: .directory, references: 1, check: check)
                    return self.scopedEntry(self.tokenDirectoryAttributes(inode, scopeItem: item, check), check)
                }
            )
        }
    }

    /// A lookup in an access-path directory: `.scoped/<token>` of a granted file holds only that
    /// file; below a granted directory, its children.
    func scopedLookup(
        _ node: ScopedNode, name: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        try await settle(scopedLookupStep(node, name: name, context: context))
    }

    func scopedLookupNow(
        _ node: ScopedNode, name: String, context: RequestContext
    ) -> Result<Entry, FileSystemError>? {
        answerNow(scopedLookupStep(node, name: name, context: context))
    }

    private func scopedLookupStep(
        _ node: ScopedNode, name: String, context: RequestContext
    ) -> ScopedStep<Entry> {
        scopedStep { () throws(FileSystemError) in
            if name == "." || name == ".." {
                throw FileSystemError(.invalidArgument, "'\(name)' is resolved by the kernel")
            }
            guard node.kind == .directory else {
                throw FileSystemError(.notADirectory, "not a directory")
            }
            let check: ScopedGrant
            let need: ScopedNeed
            switch node.role {
            case .token:
                check = try checkToken(node.token, context: context, operation: "lookup")
                need = .scopeItem(check.item)
            case .item(let identifier):
                check = try enforce(node, context: context, operation: "lookup").check
                try Self.checkChildName(name)
                need = .child(named: name, of: identifier)
            }
            return (
                need,
                { found throws(FileSystemError) in
                    if case .scopeItem = need, found.name != name {
                        throw FileSystemError(.notFound, "the access path holds only the granted item")
                    }
                    let inode = self.bindScoped(
                        token: node.token, role: .item(found.identifier), kind: found.kind, references: 1,
                        check: check)
                    return self.scopedEntry(self.scopedItemAttributes(inode, item: found, check), check)
                }
            )
        }
    }

    // MARK: Getattr

    func scopedAttributes(
        _ inode: InodeNumber, _ node: ScopedNode, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        try await settle(scopedAttributesStep(inode, node, context: context))
    }

    func scopedAttributesNow(
        _ inode: InodeNumber, _ node: ScopedNode, context: RequestContext
    ) -> Result<NodeAttributes, FileSystemError>? {
        answerNow(scopedAttributesStep(inode, node, context: context))
    }

    private func scopedAttributesStep(
        _ inode: InodeNumber, _ node: ScopedNode, context: RequestContext
    ) -> ScopedStep<NodeAttributes> {
        scopedStep { () throws(FileSystemError) in
            let check = try enforce(node, context: context, operation: "getattr").check
            if node.role == .token {
                return (.scopeItem(check.item), { self.tokenDirectoryAttributes(inode, scopeItem: $0, check) })
            }
            return (.item(node), { self.scopedItemAttributes(inode, item: $0, check) })
        }
    }

    // MARK: Open

    /// `open` of an access-path node, at once: a file to read, after `scopedOpenStep`, with the
    /// claim, revalidation and pin `openNow` takes (`openForReadingNow`). Everything else, and
    /// anything not at hand, is left to `open`, with the use given back and nothing held (D-348).
    func scopedOpenNow(
        _ inode: InodeNumber, _ node: ScopedNode, flags: OpenFlags, context: RequestContext
    ) -> Result<OpenedFile, FileSystemError>? {
        let identifier: ItemIdentifier
        let use: String
        do throws(FileSystemError) {
            guard case .read(let item, let taken) = try scopedOpenStep(node, flags: flags, context: context) else {
                return nil
            }
            (identifier, use) = (item, taken)
        } catch {
            return .failure(error)
        }
        let plain = InodeTable.Node(identifier: identifier, kind: .file, lookupCount: 0, generation: 0)
        return openForReadingNow(inode, plain, context: context, scoped: node, use: use)
    }

    /// The checks of an open through an access path, both forms' core. A file to read: the token
    /// and the scope in one check that takes the use (D-348). Anything else: the token and the
    /// scope first (EACCES, no use taken), then EISDIR for a directory and EROFS for a write on a
    /// read-only mount; `scopedOpenUse` then takes the use. A use taken must be ended with
    /// `endScopedUse` when the handle is released, or given back with `returnScopedUse` when the
    /// open fails (D-315).
    func scopedOpenStep(
        _ node: ScopedNode, flags: OpenFlags, context: RequestContext
    ) throws(FileSystemError) -> ScopedOpenStep {
        guard case .item(let identifier) = node.role else {
            throw FileSystemError(.isADirectory, "an access-path directory")
        }
        let writing = flags.wantsWrite || flags.truncates
        if node.kind == .file, !writing {
            return .read(identifier, use: try enforceTakingUse(node, identifier: identifier, context: context))
        }
        try enforce(node, context: context, operation: "open")
        if node.kind == .directory { throw FileSystemError(.isADirectory, "\(identifier) is a directory") }
        if writing, !isWritable { throw readOnly("open for writing") }
        return .checked(identifier)
    }

    /// The use of an open `scopedOpenStep` checked (D-308), then for writing EACCES for a read
    /// token (the use given back). Returns the use's id.
    func scopedOpenUse(
        _ node: ScopedNode, identifier: ItemIdentifier, writing: Bool, context: RequestContext
    ) throws(FileSystemError) -> String {
        let check = try useAfterCheck(node, identifier: identifier, context: context)
        if writing, !check.writable {
            returnScopedUse(check.id)
            logger.notice("open for writing through an access path refused: a read token")
            throw FileSystemError(.accessDenied, "open for writing through an access path of a read token")
        }
        return check.id
    }

    /// `enforce` for an open, in one check that takes the use when the token allows it (D-348):
    /// the same answers, reasons and audit entries as a check, then the scope, then a use. An
    /// item outside the scope the node was made with is refused as `enforce` refuses it (the
    /// token asked without a use, so a denial of the token comes first and no use is logged).
    /// Returns the use's id.
    private func enforceTakingUse(
        _ node: ScopedNode, identifier: ItemIdentifier, context: RequestContext
    ) throws(FileSystemError) -> String {
        guard depth(of: identifier, below: node.scope) != nil else {
            try enforce(node, context: context, operation: "open")
            // The token's scope is not the node's after all (never: a token's scope is fixed).
            return try useAfterCheck(node, identifier: identifier, context: context).id
        }
        let check = try checkToken(node.token, context: context, use: true, operation: "open")
        if check.item != node.scope, depth(of: identifier, below: check.item) == nil {
            returnScopedUse(check.id)
            logger.notice("open through an access path refused: \(identifier) is outside the token's scope")
            throw FileSystemError(.accessDenied, "access path refused: the item is outside the token's scope")
        }
        return check.id
    }

    /// The use taken after a check without one (`enforce`), and the scope checked again.
    private func useAfterCheck(
        _ node: ScopedNode, identifier: ItemIdentifier, context: RequestContext
    ) throws(FileSystemError) -> ScopedGrant {
        let check = try checkToken(node.token, context: context, use: true, operation: "open")
        guard depth(of: identifier, below: check.item) != nil else {
            returnScopedUse(check.id)
            logger.notice("open through an access path refused: \(identifier) is outside the token's scope")
            throw FileSystemError(.accessDenied, "access path refused: the item is outside the token's scope")
        }
        return check
    }

    // MARK: The core's frame

    /// `checks` run: `.needs` the item they name, with what makes the answer from it; a failed
    /// check is the answer.
    private func scopedStep<Answer>(
        _ checks: () throws(FileSystemError) -> (ScopedNeed, (ProviderItem) throws(FileSystemError) -> Answer)
    ) -> ScopedStep<Answer> {
        do throws(FileSystemError) {
            let (need, answer) = try checks()
            return .needs(need, then: answer)
        } catch {
            return .refused(error)
        }
    }

    /// The immediate form's answer: the core's, or the one made from the item it needs when that
    /// is in memory (nil: the async form fetches it).
    private func answerNow<Answer>(_ step: ScopedStep<Answer>) -> Result<Answer, FileSystemError>? {
        switch step {
        case .refused(let error): return .failure(error)
        case .needs(let need, let answer):
            guard let item = inMemory(need) else { return nil }
            return Result { () throws(FileSystemError) in try answer(item) }
        }
    }

    /// The item `need` names, from memory within the TTLs the async fetch uses (nil: fetch it).
    private func inMemory(_ need: ScopedNeed) -> ProviderItem? {
        switch need {
        case .scopeItem(let scope):
            return cache.catalog.itemNow(scope, maximumAge: options.cache.attributeTTL, askingProvider: false)
        case .child(let name, let directory):
            guard case .found(let item, _) = cache.catalog.childNow(named: name, of: directory) else { return nil }
            return item
        case .item(let node):
            // A kind that changed is the async fetch's to word (the node is detached).
            guard case .item(let identifier) = node.role,
                let item = cache.catalog.itemNow(
                    identifier, maximumAge: options.cache.attributeTTL, askingProvider: false),
                item.kind == node.kind
            else { return nil }
            return item
        }
    }

    /// The async form's answer: the core's, or the one made from the item it needs, fetched as the
    /// async operations always have (from memory too, within the same TTLs).
    private func settle<Answer>(_ step: ScopedStep<Answer>) async throws(FileSystemError) -> Answer {
        switch step {
        case .refused(let error):
            throw error
        case .needs(let need, let answer):
            let item: ProviderItem
            switch need {
            case .scopeItem(let scope): item = try await scopeItem(scope)
            case .child(let name, let directory): item = try await child(named: name, of: directory)
            case .item(let node): item = try await scopedItem(node)
            }
            return try answer(item)
        }
    }
}

// MARK: - Ends of tokens

// A token whose paths the kernel may keep (D-345) can end before the time it was given: revoked,
// expired by command, used up, released. The provider announces each end (D-346); the kernel is
// then told to forget `.scoped/<token>` (its dentry: dropping it drops the unused dentries below
// it, so the next walk from the mount point asks again and is refused) and the attributes of
// every node of the token (so a stat or a permission check through a dentry still held, by a
// cwd or an open file, asks again too, and is refused). Opens and reads always asked.
extension ProviderFileSystem {
    /// The invalidations that make the kernel forget the token `id`'s paths; empty when it holds
    /// none of them.
    func scopedInvalidations(forEnded id: String) -> [KernelInvalidation] {
        state.withLock { $0.scoped.invalidations(forEnded: id) }
    }

    /// The provider announced that the token `id` ended: the kernel is told to forget its paths.
    /// Never blocks (the adapter's notifier sends from a queue of its own).
    func scopedTokenEnded(_ id: String) {
        guard let invalidate = kernelInvalidation.withLock({ $0 })?.call else { return }
        let invalidations = scopedInvalidations(forEnded: id)
        if !invalidations.isEmpty {
            logger.debug("token \(id) ended: \(invalidations.count) kernel invalidations")
            invalidate(invalidations)
        }
    }
}
