// The provider mount's file system: provider items as nodes, placeholders until read, reads served
// from the cache as the download brings the bytes. Read-only until writing lands (EROFS).
//
// Lock order: `ProviderFileSystem.state` is a leaf: never held while calling the cache, the claim
// provider or a content entry.

import Diagnostics
public import ProviderCache
import ProviderModel
import Synchronization
public import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Tunables of the file system (the cache has its own, in `cache`).
public struct FileSystemOptions: Sendable {
    public var cache = CacheOptions()
    /// How long the kernel may cache attributes and entries.
    public var attributeTimeout: Duration = .seconds(1)
    public var entryTimeout: Duration = .seconds(1)
    /// How long instead for items the provider tells of every change of (`Catalog.isTracked`)
    /// once the kernel can be told (`KernelCacheCoherent`): a change invalidates them at once, so
    /// this only bounds what the provider's tracking misses (D-228).
    public var trackedTimeout: Duration = .seconds(10)
    /// Ask the provider for an item's current version on every open (so an open never pins a
    /// version the provider no longer has, unless the provider is unreachable).
    public var revalidateOnOpen = true
    /// Owner shown for every node (default: the mounting user).
    public var uid: UInt32 = getuid()
    public var gid: UInt32 = getgid()
    /// Require-token mode (`--require-token`): plain paths only for the callers this policy
    /// allows, every kernel cache of plain nodes off (ProviderFileSystem+Sandbox.swift). Nil:
    /// plain paths are open to every caller the kernel lets in.
    public var plainPaths: (any PlainPathPolicy)?
    /// Processes that must not download (`--no-download-for`, DownloadPolicy.swift). Nil: all may.
    public var downloads: (any DownloadPolicy)?
    /// Let changes through: when false, or when the provider does not offer `.writing`, every
    /// change fails with EROFS (and `providerfs mount` mounts read-only for the kernel too).
    /// `providerfs mount` sets it unless `--read-only` (D-376); off here, for tests of the read path.
    public var writable = false
    /// Writable mounts: plain read handles use the kernel's page cache and passthrough, with a
    /// kernel node per version (D-435). Off: every handle is direct I/O (D-363).
    public var versionNodes = true
    public init() {}
}

/// `FileSystem` over a `ProviderCache`. See docs/SEMANTICS.md for what each operation promises.
public final class ProviderFileSystem: FileSystem {
    /// The cache (metadata, content, downloads) this file system serves from.
    public let cache: ProviderCache
    public let options: FileSystemOptions
    /// The read claims of opens (`ports.reads`).
    let claims: any ReadClaimProvider
    /// The write claims of write opens and publishes (`ports.writes`).
    let writeClaims: (any WriteClaimProvider)?
    /// The coordination of unlink, rmdir and rename (`ports.namespace`).
    let namespaceClaims: any NamespaceClaimProvider
    /// Presenters asked before a `user.providerfs.pin` eviction (`ports.evictions`).
    let evictionClaims: (any EvictionClaimProvider)?
    /// Checks the tokens of access paths; nil: the mount has no `.scoped` directory.
    let scopedAccess: (any ScopedAccessProvider)?
    /// Require-token mode: `options.plainPaths` is set (read on every lookup, without unwrapping it).
    let requiresToken: Bool
    let logger = Logger(label: "providerfs.vfs")
    let state = Locked(State())
    /// How to tell the kernel (`KernelCacheCoherent`); `kernelTold` mirrors whether there is one,
    /// read on every lookup without a lock.
    let kernelInvalidation = Locked<Callback<[KernelInvalidation]>?>(nil)
    private let kernelTold = Atomic<Bool>(false)
    /// Whether the kernel can be told to forget what it cached (`setKernelInvalidation`).
    var kernelCanBeTold: Bool { kernelTold.load(ordering: .relaxed) }

    struct OpenDirectory {
        var inode: InodeNumber
        var identifier: ItemIdentifier
        /// An access path's listing, taken at cookie 0 (ProviderFileSystem+Scoped.swift).
        var snapshot: [DirectoryEntry]?
        /// A plain path's listing, taken at cookie 0, filled as the provider lists (D-470).
        var listing: DirectoryListing?
        /// Opened through an access path: every readdir re-checks it.
        var scoped: ScopedNode?
    }

    struct State {
        var inodes = InodeTable()
        /// Open file handles, readers and writers (HandleTable.swift, D-505).
        var handles = HandleTable()
        var directories: [FileHandleID: OpenDirectory] = [:]
        var nextHandle: UInt64 = 1
        /// The access-path nodes and `.scoped` (ScopedNodeTable.swift, D-506).
        var scoped = ScopedNodeTable()
        /// Nodes whose item was deleted or replaced through the mount while the kernel still holds
        /// them (an open descriptor): their last item, answered by getattr (link count 0) until
        /// forgotten (ProviderFileSystem+Namespace.swift).
        var removed: [InodeNumber: (item: ProviderItem, serial: UInt64)] = [:]
        /// Directories whose listing the kernel may have cached since their content was last
        /// invalidated (`listingCaching`, D-472): a change of their entries invalidates it.
        var cachedListings: Set<InodeNumber> = []
        mutating func allocateHandle() -> FileHandleID {
            defer { nextHandle += 1 }
            return FileHandleID(nextHandle)
        }
    }

    /// A file system over `cache`, coordinated through `claims` (every port given here). With
    /// `scopedAccess`, the root has the hidden `.scoped` directory of access paths
    /// (docs/SEMANTICS.md, "Scoped access paths").
    public init(
        cache: ProviderCache, options: FileSystemOptions = FileSystemOptions(),
        claims: ClaimPorts = ClaimPorts(), scopedAccess: (any ScopedAccessProvider)? = nil
    ) {
        self.cache = cache
        self.options = options
        self.requiresToken = options.plainPaths != nil
        self.claims = claims.reads
        self.writeClaims = claims.writes
        self.namespaceClaims = claims.namespace
        self.evictionClaims = claims.evictions
        self.scopedAccess = scopedAccess
        if scopedAccess != nil { state.withLock { $0.scoped.directory = $0.inodes.reserve() } }
        // Tokens that end early make the kernel forget their paths (D-346).
        scopedAccess?.observeEnds { [weak self] id in self?.scopedTokenEnded(id) }
    }

    /// The name of the root's hidden directory of access paths.
    public static let scopedDirectoryName = ".scoped"

    // MARK: Nodes

    func node(_ inode: InodeNumber) throws(FileSystemError) -> InodeTable.Node {
        guard let node = state.withLock({ $0.inodes[inode] }) else { throw Self.unknownNode(inode) }
        return node
    }

    static func unknownNode(_ inode: InodeNumber) -> FileSystemError {
        FileSystemError(.notFound, "node \(inode) is not known (forgotten or never looked up)")
    }

    /// The item behind a node, refreshed per the attribute TTL; a removed item detaches the node.
    func item(of node: InodeTable.Node, maximumAge: Duration?) async throws(FileSystemError) -> ProviderItem {
        do throws(CacheError) {
            let item = try await cache.catalog.item(node.identifier, maximumAge: maximumAge)
            guard item.kind == node.kind || node.identifier == .root else {
                throw CacheError(.notFound, "\(node.identifier) was replaced by a \(item.kind) on the provider")
            }
            return item
        } catch {
            if error.code == .notFound { _ = state.withLock { $0.inodes.detach(node.identifier) } }
            throw FileSystemError(error)
        }
    }

    /// The kernel's cache timeout for an item the cache calls `tracked` (nil: the default one).
    func trackedTimeout(_ tracked: Bool) -> Duration? {
        // Require-token mode: the kernel asks again every time, so the policy decides (D-331).
        // (The root's attributes and `.scoped`, open to everyone, keep the usual timeouts.)
        if requiresToken { return .zero }
        return tracked && kernelTold.load(ordering: .relaxed) ? options.trackedTimeout : nil
    }

    /// `presentBytes`: how much of the item's current version is stored locally (st_blocks).
    /// `serial`: the st_ino to show (nil: the item's, `Catalog.serialNumber`; a removed node keeps
    /// the one it had), and `links` its st_nlink (nil: the names the catalog knows, D-396).
    func attributes(
        of item: ProviderItem, presentBytes: Int64, inode: InodeNumber, tracked: Bool = false, serial: UInt64? = nil,
        links: Int? = nil
    ) -> NodeAttributes {
        let item = cache.shown(item)  // chmod and utimens the mount keeps (ProviderCache.keepAttributes)
        // Writable: the staged length and last change while write handles are open
        // (ProviderFileSystem+Writes).
        let staged = item.kind == .file && isWritable ? cache.staged(item.identifier) : nil
        let modified = staged?.modified ?? item.modificationTime
        let shownPermissions = staged?.permissions ?? item.permissions  // a chmod the open edit holds (D-385)
        let time = Timestamp(seconds: modified.seconds, nanoseconds: modified.nanoseconds)
        let type: NodeType
        var blocks: Int64 = 0
        switch item.kind {
        case .directory: type = .directory
        case .symbolicLink: type = .symbolicLink
        case .file:
            type = NodeType(item)  // regular, or a local-only node (D-398)
            // Only bytes stored locally count, like a dataless file: 0 for a placeholder.
            blocks = (presentBytes + 511) / 512
        }
        // Read-only mount: no write bits, whatever the provider says. Writable: the provider's bits.
        let writable = isWritable
        let stagedSize = staged?.size
        // Link count 1 for directories too: the number of subdirectories is not known without
        // listing, and fts (FileManager's enumerator, find) reads nlink 2 as "no subdirectories"
        // and skips them; 1 means "unknown" to it, as on btrfs.
        // A read-only mount lets its owner into every directory (r-x at least); a writable one
        // shows what chmod set, as the provider stores it (chmod 0644 of a directory shows 0644).
        // setuid, setgid and sticky show as stored (D-391; the mount is nosuid).
        let mask: UInt16 = writable ? 0o7777 : 0o7555
        let permissions =
            item.kind == .directory && !writable ? (shownPermissions | 0o500) & mask : shownPermissions & mask
        // A file's st_nlink: how many names of it the catalog knows (hard links, D-396).
        var number = serial
        var linkCount = links ?? 1
        if number == nil || (links == nil && item.kind != .directory) {
            let known = cache.catalog.serialAndLinks(of: item.identifier)
            number = number ?? known.serial
            if links == nil, item.kind != .directory { linkCount = known.links }
        }
        let owner = shownOwner(of: item)
        // atime and ctime where the provider keeps them, else mtime; ctime never before mtime (a
        // local version's mtime is newer than the provider's ctime).
        let accessTime = item.accessTime.map { Timestamp(seconds: $0.seconds, nanoseconds: $0.nanoseconds) } ?? time
        let changeTime = max(
            item.changeTime.map { Timestamp(seconds: $0.seconds, nanoseconds: $0.nanoseconds) } ?? time, time)
        var attributes = NodeAttributes(
            inode: inode, type: type, permissions: permissions, linkCount: UInt32(linkCount),
            uid: owner.uid, gid: owner.gid,
            size: item.kind == .symbolicLink
                ? Int64(item.symbolicLinkTarget?.utf8.count ?? 0) : stagedSize ?? item.size,
            blocks: blocks, accessTime: accessTime, modificationTime: time, changeTime: changeTime,
            serialNumber: number ?? 0)
        attributes.device = item.special?.device ?? 0
        // Require-token mode: the root's attributes are everyone's, so cached as usual (nil).
        attributes.validFor = requiresToken && inode == .root ? nil : trackedTimeout(tracked)
        return attributes
    }

    func entry(for item: ProviderItem, presentBytes: Int64, tracked: Bool) -> Entry {
        let (serial, links) = cache.catalog.serialAndLinks(of: item.identifier)
        // A file with other names whose edit is kept under one of them (D-410).
        let holder = links > 1 ? cache.catalog.namesHoldingEdits(of: [item.identifier])[item.identifier] : nil
        func bindLookedUp(_ state: inout State) -> (InodeNumber, UInt64, ItemIdentifier?) {
            let (inode, generation) = state.inodes.bindLookedUp(
                item.identifier, kind: item.kind, serial: serial, holder: holder)
            return (inode, generation, state.inodes.identity(of: inode)?.identifier)
        }
        let (bound, caching) = state.withLock { state in
            let bound = bindLookedUp(&state)
            return (bound, state.inodes.cachingHandles(of: bound.0))
        }
        var (inode, generation, primary) = bound
        // Read handles of the node use the page cache: a lookup that would show another version
        // (or size) there binds a new node instead (D-435).
        if caching > 0, links <= 1,
            retireIfShowingAnother(inode, item: item, shownSize: cache.staged(item.identifier)?.size ?? item.size)
        {
            (inode, generation, primary) = state.withLock { state in
                state.inodes.forget(inode, count: 1)  // this reply names the new node
                return bindLookedUp(&state)
            }
        }
        // Another name of a file whose node goes by one of its names (D-396): the node's item,
        // which has what was written through the node (its local version, its open edit).
        var item = item
        var presentBytes = presentBytes
        if let primary, primary != item.identifier, let known = cache.catalog.knownItem(primary) {
            item = known
            presentBytes = cache.content.presentBytes(of: known)
        }
        let timeout = trackedTimeout(tracked)
        return Entry(
            attributes: attributes(
                of: item, presentBytes: presentBytes, inode: inode, tracked: tracked, serial: serial,
                links: item.kind == .directory ? 1 : links),
            generation: generation, attributeTimeout: timeout ?? options.attributeTimeout,
            entryTimeout: timeout ?? options.entryTimeout)
    }

    /// The child named `name` (compared byte for byte, as POSIX does) of a directory item, per the
    /// catalog's lookup policy (`Catalog.child(named:of:)`: listing TTL, then a recheck of a miss).
    func child(named name: String, of directory: ItemIdentifier) async throws(FileSystemError) -> ProviderItem {
        try Self.checkChildName(name)
        do {
            if let found = try await cache.catalog.child(named: name, of: directory) { return found }
        } catch {
            throw FileSystemError(error)
        }
        throw FileSystemError(.notFound, "no item named '\(name)'")
    }

    /// ENAMETOOLONG or EINVAL for a name no item can have.
    static func checkChildName(_ name: String) throws(FileSystemError) {
        guard name.utf8.count <= 255 else { throw FileSystemError(.nameTooLong, "name longer than 255 bytes") }
        guard !name.isEmpty, !name.utf8.contains(UInt8(ascii: "/")) else {
            throw FileSystemError(.invalidArgument, "'\(name)' is not a file name")
        }
    }

    public func lookup(
        parent: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        switch resolve(parent) {
        case .plain: break
        case .scopedRoot: return try await tokenLookup(name, context: context)
        case .scoped(let node): return try await scopedLookup(node, name: name, context: context)
        }
        let parentNode = try node(parent)
        switch lookupStep(parent, (parentNode.identifier, parentNode.kind), name: name, context: context) {
        case .answered(let result):
            return try result.get()
        case .needsChild(let directory):
            let item = try await child(named: name, of: directory)
            return entry(
                for: item, presentBytes: cache.content.presentBytes(of: item), tracked: cache.catalog.isTracked(item))
        }
    }

    /// What the core of `lookup` and `lookupNow` decides in a plain directory (D-512).
    enum LookupStep {
        case answered(Result<Entry, FileSystemError>)
        /// The child of that name in this directory item: `lookupNow` takes it from the catalog's
        /// memory (`Catalog.childNow`), `lookup` asks the catalog (`child(named:of:)`).
        case needsChild(of: ItemIdentifier)
    }

    /// The core of `lookup` and `lookupNow` in the plain node `parent` (`directory`): every check,
    /// in `lookup`'s order, then the answer or what it needs.
    func lookupStep(
        _ parent: InodeNumber, _ directory: (identifier: ItemIdentifier, kind: ItemKind), name: String,
        context: RequestContext
    ) -> LookupStep {
        guard directory.kind == .directory else {
            return .answered(.failure(FileSystemError(.notADirectory, "\(directory.identifier) is not a directory")))
        }
        if name == "." || name == ".." {
            return .answered(.failure(FileSystemError(.invalidArgument, "'\(name)' is resolved by the kernel")))
        }
        if parent == .root, name == Self.scopedDirectoryName, let scoped = scopedDirectoryInode {
            return .answered(
                .success(
                    Entry(
                        attributes: scopedDirectoryAttributes(scoped), generation: 1,
                        attributeTimeout: options.attributeTimeout, entryTimeout: options.entryTimeout)))
        }
        if let refusal = plainPathRefusal("lookup of '\(name)'", context: context) {
            return .answered(.failure(refusal))
        }
        do throws(FileSystemError) {
            try Self.checkChildName(name)
        } catch {
            return .answered(.failure(error))
        }
        return .needsChild(of: directory.identifier)
    }

    public func forget(_ inode: InodeNumber, count: UInt64) {
        state.withLock { state in
            if state.scoped.forget(inode, count: count) { return }
            state.inodes.forget(inode, count: count)
            if !state.removed.isEmpty, state.inodes[inode] == nil { state.removed[inode] = nil }
            if !state.cachedListings.isEmpty, state.inodes[inode] == nil { state.cachedListings.remove(inode) }
        }
    }

    public func getAttributes(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        switch resolve(inode) {
        case .plain: break
        case .scopedRoot: return scopedRootAttributes(inode)
        case .scoped(let node): return try await scopedAttributes(inode, node, context: context)
        }
        switch getAttributesStep(inode, context: context) {
        case .answered(let result):
            return try result.get()
        case .unknownNode:
            throw Self.unknownNode(inode)
        case .needsItem(let node):
            return plainAttributes(inode, node, item: try await item(of: node, maximumAge: options.cache.attributeTTL))
        }
    }

    /// What the core of `getAttributes` and `getAttributesNow` decides for a node that is not an
    /// access path's (D-512).
    enum AttributesStep {
        case answered(Result<NodeAttributes, FileSystemError>)
        /// No plain node of that number (an access path's, or none: the forms tell them apart).
        case unknownNode
        /// The node's item: `getAttributesNow` takes it from memory (`Catalog.itemNow`),
        /// `getAttributes` asks the catalog (`item(of:maximumAge:)`).
        case needsItem(InodeTable.Node)
    }

    /// The core of `getAttributes` and `getAttributesNow`: the plain-path policy (the root's
    /// attributes stay open in require-token mode: the mount point must stat), a removed node's
    /// last attributes, then the node's item.
    func getAttributesStep(_ inode: InodeNumber, context: RequestContext) -> AttributesStep {
        if requiresToken, inode != .root, case .plain = resolve(inode),
            let refusal = plainPathRefusal("getattr", context: context)
        {
            return .answered(.failure(refusal))
        }
        if let removed = removedAttributes(inode) { return .answered(.success(removed)) }
        guard let node = state.withLock({ $0.inodes[inode] }) else { return .unknownNode }
        return .needsItem(node)
    }

    /// getattr's answer for the plain node `inode` (`node`) whose item is `item`.
    func plainAttributes(_ inode: InodeNumber, _ node: InodeTable.Node, item: ProviderItem) -> NodeAttributes {
        shown(
            attributes(
                of: item, presentBytes: cache.content.presentBytes(of: item), inode: inode,
                tracked: cache.catalog.isTracked(item)), of: item, node: node)
    }

    /// `attributes` for a getattr of `node`, unless caching handles of it read another version:
    /// then the node is retired and answers what they read (D-435).
    func shown(_ attributes: NodeAttributes, of item: ProviderItem, node: InodeTable.Node) -> NodeAttributes {
        guard node.cachingHandles > 0,
            retireIfShowingAnother(attributes.inode, item: item, shownSize: attributes.size),
            let retired = removedAttributes(attributes.inode)
        else { return attributes }
        return retired
    }

    /// What the core of `setAttributes` and `setAttributesNow` decides (D-512).
    enum SetAttributesStep {
        case answered(Result<NodeAttributes, FileSystemError>)
        /// A size to set first: `truncate` (ProviderFileSystem+Writes.swift), the async form's
        /// alone; then `changesStep` with the rest.
        case truncates(ResolvedNode, to: Int64)
        /// A chown where the provider stores owners: the owner the node shows, for `ownedChangeStep`
        /// (a chown to the owner it has changes nothing, D-397).
        case needsOwner(InodeTable.Node, ItemAttributeChanges)
        /// The node's item, to make the change at the provider (`atProvider`: it stores them) or
        /// keep it in the mount (`ProviderCache.keepAttributes`); then `.needsAttributes`.
        case needsChange(InodeTable.Node, ItemAttributeChanges, atProvider: Bool)
        /// Nothing (more) to change: getattr's answer.
        case needsAttributes
    }

    /// The core of `setAttributes` and `setAttributesNow`: the plain-path policy or the token's
    /// check, the node, then the size (`.truncates`) or `changesStep`.
    func setAttributesStep(
        _ inode: InodeNumber, changes: AttributeChanges, context: RequestContext
    ) -> SetAttributesStep {
        let resolved = resolve(inode)
        do throws(FileSystemError) {
            try checkPlainNode(resolved, "setattr", context: context)
            _ = try anyNode(inode, resolved, context: context, operation: "setattr")
        } catch {
            return .answered(.failure(error))
        }
        if let size = changes.size { return .truncates(resolved, to: size) }
        return changesStep(inode, resolved, changes, context: context)
    }

    public func setAttributes(
        _ inode: InodeNumber, changes: AttributeChanges, handle: FileHandleID?, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        try await settleAttributes(
            inode, setAttributesStep(inode, changes: changes, context: context), changes, handle: handle,
            context: context)
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) async throws(FileSystemError) -> String {
        switch resolve(inode) {
        case .plain: break
        case .scopedRoot: throw FileSystemError(.invalidArgument, "not a symbolic link")
        case .scoped(let node): return try await scopedReadLink(node, context: context)
        }
        try checkPlainPath("readlink", context: context)
        let node = try node(inode)
        let item = try await item(of: node, maximumAge: options.cache.attributeTTL)
        guard let target = item.symbolicLinkTarget else {
            throw FileSystemError(.invalidArgument, "\(node.identifier) is not a symbolic link")
        }
        return target
    }

    // MARK: Directories

    public func openDirectory(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> FileHandleID {
        switch resolve(inode) {
        case .plain: break
        case .scopedRoot: throw scopedRootListingRefusal(context)
        case .scoped(let node): return try await scopedOpenDirectory(inode, node, context: context)
        }
        try checkPlainPath("opendir", context: context)
        let node = try node(inode)
        guard node.kind == .directory else {
            throw FileSystemError(.notADirectory, "\(node.identifier) is not a directory")
        }
        return state.withLock { state in
            let handle = state.allocateHandle()
            state.directories[handle] = OpenDirectory(inode: inode, identifier: node.identifier, snapshot: nil)
            return handle
        }
    }

    public func readDirectory(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntry] {
        guard let open = state.withLock({ $0.directories[handle] }) else {
            throw FileSystemError(.badHandle, "directory handle \(handle) is not open")
        }
        if let scoped = open.scoped {
            return try await scopedReadDirectory(
                open, scoped, handle: handle, after: cookie, limit: limit, context: context)
        }
        try checkPlainPath("readdir", context: context)
        // A listing is taken when reading starts (cookie 0) and kept for the handle, so cookies
        // stay valid while the directory changes on the provider (rewinddir takes a new one).
        let listing = cookie == 0 || open.listing == nil ? startListing(open, handle: handle) : open.listing!
        return try await listing.entries(after: cookie, limit: limit)
    }

    public var givesDirectoryAttributes: Bool { true }

    /// D-472: a plain directory's listing is kept by the kernel across opens while the catalog's
    /// listing stays current (tracked: every change of it is told, and `catalogChanged`
    /// invalidates the directory's content then); for one open when the provider pushes changes
    /// (the listing this open takes becomes tracked); not otherwise (each open lists again, as
    /// the listing TTL says), nor for access paths or in require-token mode (every caller is
    /// checked).
    public func listingCaching(_ inode: InodeNumber, handle: FileHandleID) -> ListingCaching {
        guard kernelCanBeTold, !requiresToken, cache.catalog.pushesChanges,
            let open = state.withLock({ $0.directories[handle] }), open.scoped == nil
        else { return .none }
        let caching: ListingCaching = cache.catalog.listingStaysCurrent(open.identifier) ? .kept : .thisOpen
        state.withLock { _ = $0.cachedListings.insert(inode) }
        return caching
    }

    /// readdirplus (D-471): the entries of `readDirectory`, each child with its lookup answer when
    /// the catalog holds its item (an entry handed over before its listing was applied has none:
    /// the kernel looks it up). Access paths give none (each lookup there checks its token).
    public func readDirectoryPlus(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntryPlus] {
        guard let open = state.withLock({ $0.directories[handle] }) else {
            throw FileSystemError(.badHandle, "directory handle \(handle) is not open")
        }
        if open.scoped != nil {
            return try await readDirectory(inode, handle: handle, after: cookie, limit: limit, context: context).map {
                DirectoryEntryPlus(entry: $0, lookup: nil)
            }
        }
        try checkPlainPath("readdirplus", context: context)
        let listing = cookie == 0 || open.listing == nil ? startListing(open, handle: handle) : open.listing!
        return withLookups(try await listing.entriesWithItems(after: cookie, limit: limit))
    }

    /// Each child's lookup answer, as `lookup` gives it (its node's lookup count taken): of the
    /// catalog's item, or (an item it does not hold yet: its listing is being applied) of the
    /// item as listed, which is what applying it will hold (the mount has no local state of an
    /// item the catalog never held; those it made are handed over only with the listing's answer).
    /// None for an item reported changed since (dirty): its lookup asks for it.
    func withLookups(_ entries: [(DirectoryEntry, ProviderItem?)]) -> [DirectoryEntryPlus] {
        entries.map { entry, listed in
            guard let listed else { return DirectoryEntryPlus(entry: entry, lookup: nil) }
            let item: ProviderItem
            switch cache.catalog.knownItemToShow(listed.identifier) {
            case .held(let known): item = known
            case .notHeld: item = listed
            // Reported changed since it was listed (another name of its file changed, D-396): the
            // kernel's lookup asks for it again, as `lookup` does.
            case .askAgain: return DirectoryEntryPlus(entry: entry, lookup: nil)
            }
            let lookup = self.entry(
                for: item, presentBytes: cache.content.presentBytes(of: item), tracked: cache.catalog.isTracked(item))
            return DirectoryEntryPlus(entry: entry, lookup: lookup)
        }
    }

    /// The open plain listing of `handle` when a read after `cookie` needs no new one (nil: the
    /// async path starts or checks it).
    func openListing(_ handle: FileHandleID, after cookie: UInt64, context: RequestContext) -> DirectoryListing? {
        guard cookie != 0, let open = state.withLock({ $0.directories[handle] }), open.scoped == nil,
            let listing = open.listing, (try? checkPlainPath("readdir", context: context)) != nil
        else { return nil }
        return listing
    }

    /// A new listing for the open directory `handle`: "." and "..", then the children as the
    /// catalog hands them over, filled by a task of its own (D-470).
    func startListing(_ open: OpenDirectory, handle: FileHandleID) -> DirectoryListing {
        let listing = DirectoryListing()
        let parentIdentifier = cache.catalog.knownItem(open.identifier)?.parent ?? .root
        // d_ino is each item's st_ino (D-389); the node ids stay the kernel's.
        let serials = cache.catalog.serialNumbers(
            of: [open.identifier, open.identifier == .root ? .root : parentIdentifier])
        let dots = state.withLock { state -> [ListedEntry] in
            let parentInode = state.inodes.bind(parentIdentifier, kind: .directory, serial: serials[1]).0
            state.directories[handle]?.listing = listing
            return [
                ListedEntry(item: nil, name: ".", inode: open.inode, serialNumber: serials[0], type: .directory),
                ListedEntry(
                    item: nil, name: "..", inode: open.identifier == .root ? .root : parentInode,
                    serialNumber: serials[1],
                    type: .directory),
            ]
        }
        listing.append(dots, publish: false)
        let directory = open.identifier
        let batches = Locked(0)
        Task {
            do throws(CacheError) {
                try await cache.catalog.children(
                    of: directory, maximumAge: options.cache.directoryTTL
                ) { [self] batch in
                    // The first batch waits for the second: a listing in one batch is answered
                    // from its final form (sorted, with what the mount changed meanwhile).
                    let count = batches.withLock { count in
                        count += 1
                        return count
                    }
                    if count == 2 { listing.publish() }
                    add(batch, to: listing, in: directory, publish: count >= 2)
                } answer: { [self] children in
                    // The end is read once the catalog holds the listing, before its save (D-486).
                    // What it adds is sorted by name (only what the batches lacked, when they came).
                    if batches.withLock({ $0 }) < 2 {
                        // Answered in one piece: from the listing's answer, as before streaming.
                        listing.restart()
                        listing.append(dots, publish: false)
                    }
                    add(children, to: listing, in: directory, publish: false, sorting: true)
                    listing.end()
                }
            } catch {
                listing.end(failure: FileSystemError(error))
            }
        }
        return listing
    }

    /// The entries of `children` of `directory` that `listing` does not have yet, added.
    /// `sorting`: sort those by name (a provider's batches come sorted, `listedBatch`).
    private func add(
        _ children: [ProviderItem], to listing: DirectoryListing, in directory: ItemIdentifier, publish: Bool,
        sorting: Bool = false
    ) {
        let unseen = listing.unseen(children.map(\.identifier))
        var new: [ProviderItem] = []
        new.reserveCapacity(children.count)
        for (child, isNew) in zip(children, unseen) where isNew { new.append(child) }
        if sorting { new.sort { $0.name < $1.name } }
        let serials = cache.catalog.serialNumbers(ofListed: new)
        // No node is made for a listed entry (D-485): d_ino is its serial number, and the kernel
        // gets a node only from a lookup or a readdirplus answer. An entry names the node it
        // already has, else its serial number (the id its node takes when one is made and no
        // other node holds that number).
        let hidesScoped = directory == .root && state.withLock { $0.scoped.directory != nil }
        let nodes = state.withLock { state in new.map { state.inodes.inode(of: $0.identifier) } }
        var entries: [ListedEntry] = []
        entries.reserveCapacity(new.count)
        for (index, child) in new.enumerated() {
            // A provider item named `.scoped` at the root is hidden by the access paths.
            if hidesScoped, child.name == Self.scopedDirectoryName { continue }
            entries.append(
                ListedEntry(
                    item: child, name: child.name, inode: nodes[index] ?? InodeNumber(serials[index]),
                    serialNumber: serials[index], type: NodeType(child)))
        }
        listing.append(entries, publish: publish)
    }

    public func releaseDirectory(_ inode: InodeNumber, handle: FileHandleID) {
        _ = state.withLock { $0.directories.removeValue(forKey: handle) }
    }

    // MARK: Files

    public func open(
        _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> OpenedFile {
        var scoped: ScopedNode?
        var use: String?
        let node: InodeTable.Node
        switch resolve(inode) {
        case .scopedRoot: throw FileSystemError(.isADirectory, "an access-path directory")
        case .scoped(let accessNode):
            // The checks `scopedOpenNow` makes (ProviderFileSystem+Scoped.swift), then the use.
            let writing = flags.wantsWrite || flags.truncates
            let identifier: ItemIdentifier
            let taken: String
            switch try scopedOpenStep(accessNode, flags: flags, context: context) {
            case .read(let item, let readUse): (identifier, taken) = (item, readUse)
            case .checked(let item):
                identifier = item
                taken = try scopedOpenUse(accessNode, identifier: item, writing: writing, context: context)
            }
            scoped = accessNode
            use = taken
            node = InodeTable.Node(identifier: identifier, kind: accessNode.kind, lookupCount: 0, generation: 0)
            if writing {
                return try await openForWriting(  // +Writes.swift
                    inode, node: node, flags: flags, context: context, scoped: accessNode, use: taken)
            }
        case .plain:
            switch plainOpenStep(inode, flags: flags, context: context) {
            case .answered(let result): return try result.get()
            case .writing(let plain):
                return try await openForWriting(inode, node: plain, flags: flags, context: context)  // +Writes.swift
            case .reading(let plain): node = plain
            }
        }
        // The claim, revalidation and pin, in `readOpenStep`'s order, each waited for.
        let request = readClaimRequest(node, context: context)
        var taken = ReadOpenProgress()
        while true {
            switch readOpenStep(node, taken, request: request, context: context) {
            case .claim:
                do throws(FileSystemError) {
                    taken.claim = try await claims.acquireReadClaim(request)
                } catch {
                    returnScopedUse(use)
                    throw error
                }
            case .item(let claim, let maximumAge):
                do throws(FileSystemError) {
                    taken.item = try await self.item(of: node, maximumAge: maximumAge)
                } catch {
                    abandonOpen(claim, use: use)
                    throw error
                }
            case .pin(let claim, let item):
                do {
                    taken.entry = try await cache.pinContent(of: item)
                } catch {
                    abandonOpen(claim, use: use)
                    throw FileSystemError(error)
                }
            case .refused(let claim, let refusal):
                abandonOpen(claim, use: use)
                throw refusal
            case .open(let claim, let item, let entry):
                return try opened(inode, node, item: item, entry: entry, claim: claim, scoped: scoped, use: use)
            }
        }
    }

    /// What the core of `open` and `openNow` decides for a plain node (D-512).
    enum OpenStep {
        case answered(Result<OpenedFile, FileSystemError>)
        /// An open for writing: `openForWriting` (ProviderFileSystem+Writes.swift), the async form's.
        case writing(InodeTable.Node)
        /// An open for reading: its claim, revalidation and pin, waited for by `open`, taken at
        /// once or declined by `openForReadingNow`.
        case reading(InodeTable.Node)
    }

    /// The core of a plain open: the plain-path policy, the node, not a directory, then writing
    /// or reading.
    func plainOpenStep(_ inode: InodeNumber, flags: OpenFlags, context: RequestContext) -> OpenStep {
        do throws(FileSystemError) {
            try checkPlainPath("open", context: context)
            let node = try self.node(inode)
            if node.kind == .directory { throw FileSystemError(.isADirectory, "\(node.identifier) is a directory") }
            return flags.wantsWrite || flags.truncates ? .writing(node) : .reading(node)
        } catch {
            return .answered(.failure(error))
        }
    }

    /// What a read open has taken so far: `readOpenStep`'s input.
    struct ReadOpenProgress {
        var claim: ReadClaimToken?
        var item: ProviderItem?
        var entry: ContentEntry?
    }

    /// What a read open does next (D-512): take its claim, then its item (revalidated), then its
    /// content pin, or stop, giving back what it holds.
    enum ReadOpenStep {
        case claim
        case item(ReadClaimToken, maximumAge: Duration)
        case pin(ReadClaimToken, ProviderItem)
        /// The item's checks refused the open: the claim and the use go back.
        case refused(ReadClaimToken, FileSystemError)
        case open(ReadClaimToken, ProviderItem, ContentEntry)
    }

    /// The core of a read open, shared by `open` (each step waited for) and `openForReadingNow`
    /// (each taken at once or declined): the order of the claim, the revalidation and the pin,
    /// and the checks between them.
    func readOpenStep(
        _ node: InodeTable.Node, _ taken: ReadOpenProgress, request: ReadClaimRequest, context: RequestContext
    ) -> ReadOpenStep {
        guard let claim = taken.claim else { return .claim }
        guard let item = taken.item else { return .item(claim, maximumAge: openMaximumAge) }
        guard let entry = taken.entry else {
            // The item's checks, once, before the pin.
            if let refusal = readOpenRefusal(node, item: item, path: request.relativePath, context: context) {
                return .refused(claim, refusal)
            }
            return .pin(claim, item)
        }
        return .open(claim, item, entry)
    }

    /// The read claim an open of `node` asks for.
    func readClaimRequest(_ node: InodeTable.Node, context: RequestContext) -> ReadClaimRequest {
        ReadClaimRequest(
            relativePath: cache.catalog.path(of: node.identifier) ?? node.identifier.rawValue,
            identifier: node.identifier, context: context)
    }

    /// How old the item an open reads may be (D-208's revalidation).
    var openMaximumAge: Duration { options.revalidateOnOpen ? .zero : options.cache.attributeTTL }

    /// An open's checks of its item: a regular file, whose bytes the download policy lets the
    /// caller fetch.
    func readOpenRefusal(
        _ node: InodeTable.Node, item: ProviderItem, path: String, context: RequestContext
    ) -> FileSystemError? {
        guard item.kind == .file else {
            return FileSystemError(.invalidArgument, "\(node.identifier) is not a regular file")
        }
        return downloadRefusal(item, path: path, context: context)
    }

    /// An open that does not go on after its claim: the claim and the use go back.
    func abandonOpen(_ claim: ReadClaimToken, use: String?) {
        claims.releaseReadClaim(claim)
        returnScopedUse(use)
    }

    /// The handle of an open whose claim is held and whose content version is pinned. On a mount
    /// with version nodes a plain handle uses the page cache when its node's pages can only be of
    /// its version (D-435); when the node caches another version it is retired and this fails
    /// with ESTALE, giving back the pin, the claim and the use.
    func opened(
        _ inode: InodeNumber, _ node: InodeTable.Node, item: ProviderItem, entry: ContentEntry, claim: ReadClaimToken,
        scoped: ScopedNode? = nil, use: String? = nil
    ) throws(FileSystemError) -> OpenedFile {
        let versioned = scoped == nil && versionNodes
        let editOpen = versioned && cache.staged(node.identifier) != nil
        var retiredNames: [ItemIdentifier] = []
        let opened = state.withLock { state -> (FileHandleID, Bool, ReadCaching)? in
            var caching = ReadCaching.direct
            if versioned, let current = state.inodes[inode] {
                caching = Self.readCaching(
                    of: current, version: item.contentVersion, editOpen: editOpen, complete: entry.isMaterialized)
                if caching == .stale {
                    retiredNames = Self.retire(inode, current: item, in: &state)
                    return nil
                }
            }
            let handle = state.allocateHandle()
            state.handles[handle] = .read(
                ReadHandle(
                    inode: inode, identifier: node.identifier, entry: entry, claim: claim, scoped: scoped,
                    scopedUse: use, caching: caching == .cached))
            // A first open keeps the (empty) cache too: dropping it would make the kernel wait,
            // uninterruptibly, on pages a concurrent open's stalled read has locked (D-366).
            let keepCache = state.inodes[inode]?.pageCache.keeps(item.contentVersion) ?? false
            if !versioned {
                state.inodes[inode]?.pageCache = .version(item.contentVersion)
            } else if caching == .cached, var current = state.inodes[inode] {
                // Direct handles leave the node's pages alone; caching ones say whose they are.
                if current.cachingHandles == 0 { current.cachedItem = item }
                current.cachingHandles += 1
                current.pageCache = .version(item.contentVersion)
                state.inodes[inode] = current
            }
            return (handle, keepCache, caching)
        }
        guard let (handle, keepCache, caching) = opened else {
            forgetNames(retiredNames)
            cache.content.unpin(entry)
            claims.releaseReadClaim(claim)
            returnScopedUse(use)
            throw FileSystemError(.stale, "\(node.identifier): its node holds another version's pages")
        }
        logger.debug("\(node.identifier): handle \(handle) reads \(entry.version) from \(entry.filePath)")
        // Complete at open: the pinned version's cache file is the content, and stays so while the
        // handle pins the entry (ContentEntry.materializedFilePath), so the kernel may read it
        // directly. A partial file never qualifies: its holes would read as zeros.
        // Through an access path: never passed through, never in the page cache, so that every
        // read reaches `read` and its token check (D-306).
        // Require-token mode: the same for plain handles, so that every read asks the policy (D-331).
        // Writable mount: cached only on a node of this version alone (D-435); else the same, so
        // that no kernel cache (one page cache and one passthrough file per node) holds bytes of a
        // version this handle did not pin (D-363).
        if scoped != nil || requiresToken || (isWritable && caching != .cached) {
            return OpenedFile(handle: handle, keepCache: false, directIO: true, servedFrom: nil)
        }
        return OpenedFile(
            handle: handle, keepCache: caching == .cached || keepCache, servedFrom: entry.materializedFilePath)
    }

    public func read(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, count: Int, context: RequestContext
    ) async throws(FileSystemError) -> ReadData {
        let open: ReadHandle
        switch readStep(handle, offset: offset, count: count, context: context) {
        case .answered(let result): return try result.get()
        case .staged(let writer):
            // A write handle (O_RDWR) reads the staging file (ProviderFileSystem+Writes.swift).
            return try await readStaged(writer, offset: offset, count: count, context: context)
        case .needsBytes(let reader): open = reader
        }
        if let failure = open.failure {
            if let data = open.entry.readIfPresent(offset: offset, count: count) { return data }
            throw FileSystemError(failure)
        }
        let data: ReadData
        do {
            data = try await open.entry.read(offset: offset, count: count)
        } catch {
            if error.code != .cancelled {
                state.withLock { $0.handles.recordFailure(error, of: handle) }
            }
            throw FileSystemError(error)
        }
        // Through an access path the read may have waited for a download: asked again, so no byte
        // is handed out after the token ended during the wait (D-343).
        if let scoped = open.scoped { _ = try enforce(scoped, context: context, operation: "read") }
        return data
    }

    /// What the core of `read` and `readNow` decides (D-512).
    enum ReadStep {
        case answered(Result<ReadData, FileSystemError>)
        /// A write handle (O_RDWR): the async form reads its staging file.
        case staged(WriteHandle)
        /// The bytes of a read handle whose checks passed: `readNow` takes them when all are on
        /// disk, `read` waits for them.
        case needsBytes(ReadHandle)
    }

    /// The core of `read` and `readNow`: the handle, the range, then the token's check through an
    /// access path or the plain-path policy.
    func readStep(_ handle: FileHandleID, offset: Int64, count: Int, context: RequestContext) -> ReadStep {
        let open: ReadHandle
        switch state.withLock({ $0.handles[handle] }) {
        case .read(let reader): open = reader
        case .write(let writer): return .staged(writer)
        case nil: return .answered(.failure(FileSystemError(.badHandle, "file handle \(handle) is not open")))
        }
        guard offset >= 0, count >= 0 else {
            return .answered(.failure(FileSystemError(.invalidArgument, "negative offset or count")))
        }
        do throws(FileSystemError) {
            if let scoped = open.scoped {
                _ = try enforce(scoped, context: context, operation: "read")
            } else {
                try checkPlainPath("read", context: context)
            }
        } catch {
            return .answered(.failure(error))
        }
        return .needsBytes(open)
    }

    // flush, fsync and release of write handles: ProviderFileSystem+Writes.swift.
    public func flush(_ inode: InodeNumber, handle: FileHandleID, context: RequestContext) async throws(FileSystemError)
    {
        try await flushWriter(handle, context: context)
    }

    public func fsync(
        _ inode: InodeNumber, handle: FileHandleID, dataOnly: Bool, context: RequestContext
    ) async throws(FileSystemError) {
        try await syncWriter(handle, context: context)
    }

    public func release(_ inode: InodeNumber, handle: FileHandleID) async {
        if await releaseWriter(handle) { return }
        releaseHandle(handle)
    }

    /// Ends a handle: unpins its content (a superseded version's file goes with the last pin)
    /// and ends its read claim. Never waits.
    func releaseHandle(_ handle: FileHandleID) {
        let removed = state.withLock { state -> ReadHandle? in
            guard let open = state.handles.removeReader(handle) else { return nil }
            if open.caching, let count = state.inodes[open.inode]?.cachingHandles, count > 0 {
                state.inodes[open.inode]?.cachingHandles = count - 1
            }
            return open
        }
        guard let open = removed else { return }
        cache.content.unpin(open.entry)
        claims.releaseReadClaim(open.claim)
        endScopedUse(open.scopedUse)
    }

    // MARK: Mutations: ProviderFileSystem+Namespace.swift (names: mkdir, symlink, unlink, rmdir,
    // rename, chmod, utimens) and ProviderFileSystem+Writes.swift (content: create, open for
    // writing, write, truncate, fsync, the last close of a writer)

    /// Whether changes are let through: `options.writable` and a provider that writes.
    public var isWritable: Bool { options.writable && cache.providerCapabilities.contains(.writing) }

    /// The provider stores owners (D-397): nodes show theirs, chown goes to the provider, and a
    /// node made through the mount belongs to its maker. Else every node is the mounting user's.
    var ownsItems: Bool { cache.providerCapabilities.contains(.storesOwnership) }

    /// The owner stat shows for `item` (already `cache.shown`).
    func shownOwner(of item: ProviderItem) -> ItemOwner {
        guard ownsItems, let owner = item.owner else { return ItemOwner(uid: options.uid, gid: options.gid) }
        return owner
    }

    /// Who a node that `context` makes in `directory` belongs to (D-397), as Linux gives it: the
    /// caller's uid, and its gid, or the directory's when the directory is setgid. Nil when the
    /// provider keeps no owners.
    func newOwner(in directory: ItemIdentifier, context: RequestContext) -> ItemOwner? {
        guard ownsItems else { return nil }
        var owner = ItemOwner(uid: context.uid, gid: context.gid)
        if let parent = cache.catalog.knownItem(directory).map(cache.shown), parent.permissions & 0o2000 != 0 {
            owner.gid = shownOwner(of: parent).gid
        }
        return owner
    }

    func readOnly(_ operation: String) -> FileSystemError {
        FileSystemError(.readOnlyFileSystem, "\(operation): the provider mount is read-only")
    }

    // MARK: Extended attributes

    /// The xattr names ProviderFS answers (all in the `user.` namespace, so getfattr shows them).
    public enum AttributeName {
        public static let state = "user.providerfs.state"
        public static let progress = "user.providerfs.progress"
        public static let version = "user.providerfs.version"
        public static let error = "user.providerfs.error"
        /// The name the local edit was kept under when it met a newer provider version (issue 14).
        public static let conflict = "user.providerfs.conflict"
        /// The item's own pin state: pinned, unpinned or inherited; settable (D-445).
        public static let pin = "user.providerfs.pin"
        /// The effective policy, pinned or unpinned (read only, D-445).
        public static let policy = "user.providerfs.policy"
    }

    func status(of node: InodeTable.Node) throws(FileSystemError) -> ItemStatus {
        guard let status = cache.status(of: node.identifier) else {
            throw FileSystemError(.notFound, "\(node.identifier) is no longer on the provider")
        }
        return status
    }

    /// The value of one of our xattrs. The adapter implements the size query (size 0 → length)
    /// and ERANGE (buffer too small) from the returned bytes.
    public func getExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) -> [UInt8] {
        let resolved = resolve(inode)
        try checkPlainNode(resolved, "getxattr", context: context)
        guard let node = try anyNode(inode, resolved, context: context, operation: "getxattr") else {
            throw FileSystemError(.noAttribute, "no attribute \(name)")
        }
        // A name not the mount's: none, whatever the item's state (as getExtendedAttributeNow).
        guard name.hasPrefix("user.providerfs.") else { throw FileSystemError(.noAttribute, "no attribute \(name)") }
        let status = try status(of: node)
        if status.kind != .symbolicLink, status.state != .localOnly, let value = pinAttribute(name, of: node.identifier)
        {
            return Array(value.utf8)
        }
        let value: String
        switch name {
        case AttributeName.state: value = status.state.rawValue
        case AttributeName.progress: value = "\(status.presentBytes)/\(status.totalBytes)"
        case AttributeName.version: value = status.version.rawValue
        case AttributeName.error:
            guard let error = status.lastError else { throw FileSystemError(.noAttribute, "no error recorded") }
            value = Self.describe(error)
        case AttributeName.conflict:
            guard let name = status.upload?.conflictName else { throw FileSystemError(.noAttribute, "no conflict") }
            value = name
        default:
            throw FileSystemError(.noAttribute, "no attribute \(name)")
        }
        return Array(value.utf8)
    }

    /// "EIO: at byte 4194304: message" (or "EIO: message" when no byte was recorded), as
    /// `user.providerfs.error` and `providerfs status` show a recorded failure: the errno its
    /// readers got first, so "ERRNO: " stays the prefix readers parse (D-276).
    public static func describe(_ error: RecordedError) -> String {
        let errno = FileSystemError(CacheError(error.code, error.message)).errno.name
        guard let offset = error.offset else { return "\(errno): \(error.message)" }
        return "\(errno): at byte \(offset): \(error.message)"
    }

    public func listExtendedAttributes(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> [String] {
        let resolved = resolve(inode)
        try checkPlainNode(resolved, "listxattr", context: context)
        guard let node = try anyNode(inode, resolved, context: context, operation: "listxattr") else { return [] }
        let status = try status(of: node)
        var names = [AttributeName.state, AttributeName.progress, AttributeName.version]
        if status.lastError != nil { names.append(AttributeName.error) }
        if status.upload?.conflictName != nil { names.append(AttributeName.conflict) }
        if status.kind != .symbolicLink, status.state != .localOnly {
            names += [AttributeName.pin, AttributeName.policy]
        }
        return names
    }

    /// Only `user.providerfs.pin` is settable (D-445); any other name: EROFS.
    public func setExtendedAttribute(
        _ inode: InodeNumber, name: String, value: [UInt8], flags: Int32, context: RequestContext
    ) async throws(FileSystemError) {
        let resolved = resolve(inode)
        try checkPlainNode(resolved, "setxattr", context: context)
        let node = try anyNode(inode, resolved, context: context, operation: "setxattr")
        guard name == AttributeName.pin, let node else { throw readOnly("setxattr") }
        try await setPinAttribute(try Self.pinState(from: value), of: node, flags: flags, context: context)
    }

    /// Removing `user.providerfs.pin` makes the item inherit (D-445); any other name: EROFS.
    public func removeExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) {
        let resolved = resolve(inode)
        try checkPlainNode(resolved, "removexattr", context: context)
        let node = try anyNode(inode, resolved, context: context, operation: "removexattr")
        guard name == AttributeName.pin, let node else { throw readOnly("removexattr") }
        try await setPinAttribute(.inherited, of: node, flags: 0, context: context)
    }

    // MARK: File system

    /// Space figures of the cache directory's file system (where downloads land), or with
    /// `--cache-max-size` the limit as the size and what is left of it (at most what the file
    /// system has) as free; file counts are the items known (0 for a caller require-token mode
    /// refuses: statfs stays open to everyone, for `df` of the mount point, but tells it nothing
    /// about the items).
    public func statistics(context: RequestContext) async throws(FileSystemError) -> FileSystemStatistics {
        var info = statvfs()
        guard statvfs(cache.directory, &info) == 0 else {
            throw FileSystemError(.io, "statvfs \(cache.directory): \(Errno.current.message)")
        }
        var (total, free, available) = (UInt64(info.f_blocks), UInt64(info.f_bfree), UInt64(info.f_bavail))
        if let limits = cache.limitsStatus, let maximum = limits.maximumSize, info.f_frsize > 0 {
            let block = Int64(info.f_frsize)
            let left = UInt64(max(0, maximum - limits.storedBytes) / block)
            total = UInt64(maximum / block)
            free = min(free, left)
            available = min(available, left)
        }
        return FileSystemStatistics(
            blockSize: UInt64(info.f_frsize), totalBlocks: total, freeBlocks: free, availableBlocks: available,
            totalFiles: mayUsePlainPaths(context) ? UInt64(cache.catalog.itemCount) : 0,
            freeFiles: 0,
            maximumNameLength: 255)
    }

    public func shutdown() async {
        // Write handles still open: their staging is published (the write-back resumes later).
        for handle in state.withLock({ $0.handles.writers.map(\.handle) }) { await releaseWriter(handle) }
        let open = state.withLock { state -> [ReadHandle] in
            let open = state.handles.removeReaders()
            state.directories = [:]
            return open
        }
        for file in open {
            cache.content.unpin(file.entry)
            claims.releaseReadClaim(file.claim)
        }
        await cache.shutdown()
    }

    // MARK: Status (for the daemon and tests)

    /// The state of the item at `path` (relative to the mount root; "" or "/" is the root),
    /// walking the path with lookups that do not add kernel references.
    public func status(ofPath path: String) async throws(FileSystemError) -> ItemStatus {
        var current = ItemIdentifier.root
        for component in path.split(separator: "/") where component != "." {
            current = try await child(named: String(component), of: current).identifier
        }
        if current == .root {
            _ = try await item(
                of: InodeTable.Node(identifier: .root, kind: .directory, lookupCount: 0, generation: 0),
                maximumAge: options.cache.attributeTTL)
        }
        guard let status = cache.status(of: current) else { throw FileSystemError(.notFound, "\(path) is gone") }
        return status
    }

    /// Number of open read handles (tests).
    public var openFileCount: Int { state.withLock { $0.handles.readers.count } }
}

// MARK: - Answers without waiting

/// Lookups and getattrs the cached metadata answers within its TTLs, and reads of bytes already on
/// disk, are answered on the FUSE thread; everything else (and every error the async path words
/// better) returns nil and goes the async way. Same rules as the async methods, by construction:
/// both ask the cache with the same maximum ages.
extension ProviderFileSystem: FileSystemFastPath {
    /// A readdir past cookie 0 whose entries the open listing has (or that reads its end): no
    /// task (D-470).
    public func readDirectoryNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntry], FileSystemError>? {
        openListing(handle, after: cookie, context: context)?.entriesNow(after: cookie, limit: limit)
    }

    public func readDirectoryPlusNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntryPlus], FileSystemError>? {
        openListing(handle, after: cookie, context: context)?.entriesWithItemsNow(after: cookie, limit: limit)
            .map { $0.map(withLookups) }
    }

    public func lookupNow(
        parent: InodeNumber, name: String, context: RequestContext
    ) -> Result<Entry, FileSystemError>? {
        guard let parentNode = state.withLock({ $0.inodes.identity(of: parent) }) else {
            // Not a plain node: an access path's, or unknown (the async path words it).
            switch resolve(parent) {
            case .plain: return nil
            case .scopedRoot: return tokenLookupNow(name, context: context)
            case .scoped(let node): return scopedLookupNow(node, name: name, context: context)
            }
        }
        switch lookupStep(parent, parentNode, name: name, context: context) {
        case .answered(let result):
            return result
        case .needsChild(let directory):
            switch cache.catalog.childNow(named: name, of: directory) {
            case .found(let item, let tracked):
                return .success(
                    entry(for: item, presentBytes: cache.content.presentBytes(of: item), tracked: tracked))
            case .absent:
                return .failure(FileSystemError(.notFound, "no item named '\(name)'"))
            case .unknown:
                return nil
            }
        }
    }

    /// setattr on the FUSE thread, with `setAttributesStep`'s checks and decisions: a plain
    /// node's change that is nothing (a chown to the owner it has, D-382, D-397), or that an open
    /// edit with a publish to come carries (D-385), or that `ProviderCache.setAttributesNow`
    /// answers at once: held by the upload that must come first (D-460), or made by a provider
    /// that answers at once (D-426); then getattr's answer at once. A size, a real chown, an
    /// access path's node (its token's checks), attributes the mount keeps: nil.
    public func setAttributesNow(
        _ inode: InodeNumber, changes: AttributeChanges, context: RequestContext
    ) -> Result<NodeAttributes, FileSystemError>? {
        guard case .plain = resolve(inode) else { return nil }
        var step = setAttributesStep(inode, changes: changes, context: context)
        while true {
            switch step {
            case .answered(let result):
                return result
            case .truncates:
                return nil
            case .needsOwner(let node, let wanted):
                guard let item = cache.catalog.itemNow(node.identifier, maximumAge: options.cache.attributeTTL),
                    item.kind == node.kind || node.identifier == .root
                else { return nil }
                step = ownedChangeStep(node, wanted, owner: shownOwner(of: cache.shown(item)))
            case .needsChange(let node, let wanted, let atProvider):
                // A removed node's item and the root's are the async path's to find.
                guard atProvider, wanted.uid == nil, wanted.gid == nil, inode != .root, removedAttributes(inode) == nil,
                    let outcome = cache.setAttributesNow(of: node.identifier, wanted)
                else { return nil }
                if case .failure(let error) = outcome { return .failure(FileSystemError(error)) }
                attributesChanged(wanted, of: node.identifier)
                step = .needsAttributes
            case .needsAttributes:
                return getAttributesNow(inode, context: context)
            }
        }
    }

    /// getxattr of a name other than the mount's own (`user.providerfs.*`) on a plain node,
    /// without the token requirement: ENODATA, as the async path answers after its checks. The
    /// kernel asks `security.capability` before the first write of every descriptor: `tar x` paid
    /// a task and a thread hop for it per file.
    public func getExtendedAttributeNow(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) -> Result<[UInt8], FileSystemError>? {
        guard !requiresToken, !name.hasPrefix("user.providerfs."), state.withLock({ $0.inodes[inode] != nil })
        else { return nil }
        return .failure(FileSystemError(.noAttribute, "no attribute \(name)"))
    }

    /// setattr's permissions and mtime as the provider takes them (and its owner and group:
    /// `changeAttributes` keeps them only where the provider stores owners, D-397).
    /// `keepingAccessTime` false: without the atime (what an open edit holds).
    static func itemChanges(_ changes: AttributeChanges, keepingAccessTime: Bool = true) -> ItemAttributeChanges {
        ItemAttributeChanges(
            permissions: changes.permissions.map { $0 & 0o7777 },
            modificationTime: changes.modificationTime.map {
                ItemTime(seconds: $0.seconds, nanoseconds: $0.nanoseconds)
            }, uid: changes.uid, gid: changes.gid,
            accessTime: keepingAccessTime
                ? changes.accessTime.map { ItemTime(seconds: $0.seconds, nanoseconds: $0.nanoseconds) } : nil)
    }

    public func getAttributesNow(
        _ inode: InodeNumber, context: RequestContext
    ) -> Result<NodeAttributes, FileSystemError>? {
        switch getAttributesStep(inode, context: context) {
        case .answered(let result):
            return result
        case .unknownNode:
            guard case .scoped(let node) = resolve(inode) else { return nil }
            return scopedAttributesNow(inode, node, context: context)
        case .needsItem(let node):
            // From memory, or from a provider that answers at once (`itemNow`: an lstat in a
            // watched local directory, D-380); otherwise a stale item is revalidated by the async
            // path, off the FUSE thread. (A directory the mount just changed is stale, and the
            // kernel asks for its attributes before every LOOKUP in it: `tar x` paid a task and a
            // thread hop per file.) A kind that changed is the async path's to word.
            guard
                let item = cache.catalog.itemNow(node.identifier, maximumAge: options.cache.attributeTTL),
                item.kind == node.kind || node.identifier == .root
            else { return nil }
            return .success(plainAttributes(inode, node, item: item))
        }
    }

    /// An open for reading whose claim is granted at once, whose revalidation the cache or the
    /// provider answers at once (`Catalog.itemNow`: D-208's revalidation still happens) and
    /// whose content entry exists or is opened from the local disk (D-229), after
    /// `plainOpenStep`'s checks. Anything else is left to `open`, with nothing held.
    public func openNow(
        _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) -> Result<OpenedFile, FileSystemError>? {
        guard state.withLock({ $0.inodes[inode] != nil }) else {
            guard case .scoped(let scoped) = resolve(inode) else { return nil }
            return scopedOpenNow(inode, scoped, flags: flags, context: context)
        }
        // Require-token mode: every open of a plain node is the async path's, which asks the policy.
        guard !requiresToken else { return nil }
        switch plainOpenStep(inode, flags: flags, context: context) {
        case .answered(let result): return result
        case .writing: return nil
        case .reading(let node): return openForReadingNow(inode, node, context: context)
        }
    }

    /// `open`'s claim, revalidation and pin of an open for reading (`readOpenStep`), each taken
    /// at once; nil when one is not at hand, with nothing held and the use (`scoped`'s) given
    /// back.
    func openForReadingNow(
        _ inode: InodeNumber, _ node: InodeTable.Node, context: RequestContext, scoped: ScopedNode? = nil,
        use: String? = nil
    ) -> Result<OpenedFile, FileSystemError>? {
        let request = readClaimRequest(node, context: context)
        var taken = ReadOpenProgress()
        while true {
            switch readOpenStep(node, taken, request: request, context: context) {
            case .claim:
                taken.claim = claims.acquireReadClaimNow(request)
                if taken.claim == nil {
                    returnScopedUse(use)
                    return nil
                }
            case .item(let claim, let maximumAge):
                // A kind that changed is `open`'s to word. The download policy is asked here too,
                // by the core's checks before the pin (D-523): it is synchronous and short.
                guard let item = cache.catalog.itemNow(node.identifier, maximumAge: maximumAge),
                    item.kind == node.kind
                else {
                    abandonOpen(claim, use: use)
                    return nil
                }
                taken.item = item
            case .pin(let claim, let item):
                taken.entry = cache.pinContentNow(of: item)
                if taken.entry == nil {
                    abandonOpen(claim, use: use)
                    return nil
                }
            case .refused(let claim, let refusal):
                abandonOpen(claim, use: use)
                return .failure(refusal)
            case .open(let claim, let item, let entry):
                do throws(FileSystemError) {
                    return .success(
                        try opened(inode, node, item: item, entry: entry, claim: claim, scoped: scoped, use: use))
                } catch {
                    return .failure(error)
                }
            }
        }
    }

    /// `release`, which never waits.
    public func releaseNow(_ inode: InodeNumber, handle: FileHandleID) -> Result<Void, FileSystemError>? {
        if let writer = writeHandle(handle) {
            // A plain writer's release that publishes nothing (the flush before it did): here
            // (D-387). One that publishes, or a token's (its use ends, its checks): async.
            guard writer.scoped == nil, cache.closeWriterNow(writer.staging) else { return nil }
            state.withLock { _ = $0.handles.removeWriter(handle) }
            releaseWriteClaim(writer.claim)  // never waits
            if writer.admitted { dismissWriter(writer.inode) }
            return .success(())
        }
        releaseHandle(handle)
        return .success(())
    }

    /// `flush` has nothing to do on a read-only mount.
    public func flushNow(
        _ inode: InodeNumber, handle: FileHandleID, context: RequestContext
    ) -> Result<Void, FileSystemError>? {
        writeHandle(handle) == nil ? .success(()) : nil  // a writer's flush may publish: async
    }

    public func readNow(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, count: Int, context: RequestContext
    ) -> Result<ReadData, FileSystemError>? {
        switch readStep(handle, offset: offset, count: count, context: context) {
        case .answered(let result): return result
        case .staged: return nil
        case .needsBytes(let open):
            guard let data = open.entry.readIfPresent(offset: offset, count: count) else { return nil }
            return .success(data)
        }
    }
}

extension NodeType {
    init(_ kind: ItemKind) {
        switch kind {
        case .file: self = .regular
        case .directory: self = .directory
        case .symbolicLink: self = .symbolicLink
        }
    }

    /// The type of `item`: its kind's, or a local-only node's (D-398).
    init(_ item: ProviderItem) {
        switch item.special?.kind {
        case .fifo?: self = .fifo
        case .socket?: self = .socket
        case .characterDevice?: self = .characterDevice
        case .blockDevice?: self = .blockDevice
        case nil: self.init(item.kind)
        }
    }
}

extension FileSystemError {
    /// The file system's reading of a cache failure (docs/SEMANTICS.md, errno contract).
    public init(_ error: CacheError) {
        let code: Code
        switch error.code {
        case .notFound: code = .notFound
        // Gone while a handle still needed bytes: the read fails as a failed download (EIO).
        case .deletedRemotely: code = .downloadFailed
        case .downloadFailed: code = .downloadFailed
        case .timedOut: code = .timedOut
        case .unreachable: code = .providerUnreachable
        case .stale: code = .stale
        case .wrongKind: code = .notADirectory
        case .accessDenied: code = .accessDenied
        case .noSpace: code = .noSpace
        case .cancelled: code = .interrupted
        case .invalidName: code = .invalidArgument
        case .nameTooLong: code = .nameTooLong
        case .io: code = .io
        // Bytes that did not match their checksum were never delivered: a failed download (EIO).
        case .corrupt: code = .downloadFailed
        case .exists: code = .exists
        case .notEmpty: code = .notEmpty
        case .unsupported: code = .unsupported
        case .tooLarge: code = .fileTooLarge
        }
        self.init(code, error.message, cause: error)
    }
}

/// Catalog changes become kernel invalidations (D-228): the entry's name in its directory and the
/// node's attributes, for what the kernel may hold (nodes it was handed and not forgotten).
extension ProviderFileSystem: KernelCacheCoherent {
    public func setKernelInvalidation(_ invalidate: (@Sendable ([KernelInvalidation]) -> Void)?) {
        kernelInvalidation.withLock { $0 = invalidate.map(Callback.init) }
        if invalidate != nil {
            cache.catalog.observeChanges { [weak self] changes in self?.catalogChanged(changes) }
            kernelTold.store(true, ordering: .relaxed)
        } else {
            kernelTold.store(false, ordering: .relaxed)
            cache.catalog.observeChanges(nil)
        }
    }

    func catalogChanged(_ changes: [CatalogChange]) {
        guard let invalidate = kernelInvalidation.withLock({ $0 })?.call else { return }
        // Names of whole directories come from the cache, before the file system's lock (the
        // cache is never called with it held).
        var everything = false
        var wholeDirectories: [ItemIdentifier: [(name: String, identifier: ItemIdentifier)]] = [:]
        for change in changes {
            switch change {
            case .entry, .attributes: break
            case .entries(let directory): wholeDirectories[directory] = cache.catalog.cachedChildNames(of: directory)
            case .everything: everything = true
            }
        }
        var items: [(parent: ItemIdentifier, name: String)] = []
        if everything {
            let known = state.withLock { state in state.inodes.nodes.values.map(\.identifier) }
            for identifier in known where identifier != .root {
                if let item = cache.catalog.knownItem(identifier) { items.append((item.parent, item.name)) }
            }
        }
        let invalidations = state.withLock { state -> [KernelInvalidation] in
            var result: [KernelInvalidation] = []
            // The directory's listing, if the kernel may keep one (D-472): its pages go.
            func forgetListing(_ directory: InodeNumber) {
                if !state.cachedListings.isEmpty, state.cachedListings.remove(directory) != nil {
                    result.append(.content(directory))
                }
            }
            func add(_ directory: ItemIdentifier, _ name: String, _ identifier: ItemIdentifier?) {
                if let parent = state.inodes.inode(of: directory) {
                    result.append(.entry(parent: parent, name: name))
                    forgetListing(parent)
                }
                if let identifier, let node = state.inodes.inode(of: identifier) { result.append(.attributes(node)) }
            }
            for change in changes {
                switch change {
                case .entry(let directory, let name, let identifier): add(directory, name, identifier)
                case .attributes(let identifier):
                    if let node = state.inodes.inode(of: identifier) { result.append(.attributes(node)) }
                case .entries(let directory):
                    if let node = state.inodes.inode(of: directory) { forgetListing(node) }
                    for child in wholeDirectories[directory] ?? [] { add(directory, child.name, child.identifier) }
                case .everything: break
                }
            }
            if everything {
                for inode in state.inodes.nodes.keys where inode != .root { result.append(.attributes(inode)) }
                for inode in state.cachedListings { result.append(.content(inode)) }
                state.cachedListings.removeAll()
                for item in items {
                    if let parent = state.inodes.inode(of: item.parent) {
                        result.append(.entry(parent: parent, name: item.name))
                    }
                }
            }
            return result
        }
        if !invalidations.isEmpty { invalidate(invalidations) }
    }
}
