// Content changes through the mount (issue 14): create, open for writing (O_TRUNC included),
// write, truncate, fsync, and the last close of a writer. Every write handle holds a write claim
// from its open to its release (D-399); writes go to a staging copy shared by the item's write
// handles (`LocalWrites`); it is published as a new version atomically, under those claims, then
// uploaded by the write-back queue. docs/SEMANTICS.md, "Writes" and "Coordination".

import Diagnostics
import ProviderCache
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension ProviderFileSystem {
    public func create(
        parent: InodeNumber, name: String, permissions: UInt16, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> (Entry, OpenedFile) {
        // Who may change the directory first (require-token mode, a read token: EACCES), then
        // EROFS, then the name.
        let site = try changeSite(parent, "create", context: context)
        try checkName(name, in: site, "create")
        // Through an access path the new file's handle takes a use, like an open (D-308).
        var use: String?
        if let scoped = site.scoped {
            use = try checkToken(scoped.token, context: context, use: true, operation: "create").id
        }
        // The write claim on the new name comes first (D-399): a coordinated writer that holds
        // the name (creating it) goes first, and nothing is made when the wait fails.
        let claim: WriteClaimToken?
        do throws(FileSystemError) {
            let parentPath = cache.catalog.path(of: site.directory) ?? site.directory.rawValue
            claim = try await acquireWriteClaim(
                path: parentPath.isEmpty ? name : parentPath + "/" + name, identifier: nil, context: context)
        } catch {
            returnScopedUse(use)
            throw error
        }
        // The name is made at the provider at once, empty (D-361), or checked free there and made
        // by the first upload (D-386); O_EXCL is the provider's either way.
        let item: ProviderItem
        let created: Entry
        do {
            // Through an access path never deferred: a token's expiry leaves the empty file at the
            // provider at once, as it always did (D-386).
            item = try await cache.createFile(
                named: name, in: site.directory, permissions: permissions & 0o7777, deferring: site.scoped == nil,
                owner: newOwner(in: site.directory, context: context))
        } catch {
            releaseWriteClaim(claim)
            returnScopedUse(use)
            throw FileSystemError(error)
        }
        do throws(FileSystemError) {
            // Through an access path: the node of the new file under the token, as lookup's.
            created =
                site.scoped == nil
                ? entry(for: item, presentBytes: 0, tracked: false)
                : try await createdEntry(item, parent: parent, site: site, context: context)
        } catch {
            releaseWriteClaim(claim)
            returnScopedUse(use)
            cache.dropUnborn(item.identifier)  // create(2) failed: no trace of a deferred create
            throw error
        }
        var scoped: ScopedNode?
        if site.scoped != nil, case .scoped(let node) = resolve(created.attributes.inode) { scoped = node }
        do {
            let opened = try await openWriter(
                created.attributes.inode, identifier: item.identifier, item: item, truncating: true, context: context,
                scoped: scoped, use: use, claim: claim)
            return (created, opened)
        } catch {
            cache.dropUnborn(item.identifier)
            throw error
        }
    }

    /// open(2) with O_WRONLY, O_RDWR or O_TRUNC of a plain node, or of an access path's node
    /// (`scoped`, whose checks `scopedOpenStep` and `scopedOpenUse` made, taking `use`).
    func openForWriting(
        _ inode: InodeNumber, node: InodeTable.Node, flags: OpenFlags, context: RequestContext,
        scoped: ScopedNode? = nil, use: String? = nil
    ) async throws(FileSystemError) -> OpenedFile {
        // Not on a node whose readers use the page cache: ESTALE, and the kernel retries on a new
        // node (D-435).
        let admitted = scoped == nil && isWritable
        if admitted {
            do throws(FileSystemError) {
                try admitChange(inode, writing: true)
            } catch {
                returnScopedUse(use)
                throw error
            }
        }
        do throws(FileSystemError) {
            return try await openAdmittedForWriting(
                inode, node: node, flags: flags, context: context, scoped: scoped, use: use, admitted: admitted)
        } catch {
            if admitted { dismissWriter(inode) }
            throw error
        }
    }

    private func openAdmittedForWriting(
        _ inode: InodeNumber, node: InodeTable.Node, flags: OpenFlags, context: RequestContext,
        scoped: ScopedNode?, use: String?, admitted: Bool
    ) async throws(FileSystemError) -> OpenedFile {
        let item: ProviderItem
        let claim: WriteClaimToken?
        do throws(FileSystemError) {
            guard isWritable else { throw readOnly("open for writing") }
            // The write claim before the version is looked at (D-399): a coordinated holder
            // publishes first, so this writer starts from the newest version.
            claim = try await acquireWriteClaim(
                path: cache.catalog.path(of: node.identifier), identifier: node.identifier, context: context)
            do throws(FileSystemError) {
                item = try await self.item(of: node, maximumAge: .zero)
                guard item.kind == .file else {
                    throw FileSystemError(.invalidArgument, "\(node.identifier) is not a regular file")
                }
            } catch {
                releaseWriteClaim(claim)
                throw error
            }
        } catch {
            returnScopedUse(use)
            throw error
        }
        // O_TRUNC of an existing file is a change even when it is empty (its mtime moves).
        return try await openWriter(
            inode, identifier: node.identifier, item: item, truncating: flags.truncates, touching: flags.truncates,
            context: context, scoped: scoped, use: use, claim: claim, admitted: admitted)
    }

    /// The write claim of a write open (D-399): granted at once, or waited for FIFO behind the
    /// conflicting claims of coordinating clients (never behind the mount's own handles: one
    /// purpose) up to the claim deadline (ETIMEDOUT) or until the request is interrupted (EINTR,
    /// D-400). Nil when the claim provider takes no write claims. `path`: relative to the mount
    /// root (nil: the item's own path, else its identifier).
    func acquireWriteClaim(
        path: String?, identifier: ItemIdentifier?, context: RequestContext?
    ) async throws(FileSystemError) -> WriteClaimToken? {
        guard let writeClaims else { return nil }
        let relativePath = path ?? identifier.flatMap { cache.catalog.path(of: $0) ?? $0.rawValue } ?? ""
        let request = ReadClaimRequest(
            relativePath: relativePath, identifier: identifier ?? ItemIdentifier(relativePath),
            context: context ?? RequestContext(threadID: getpid(), uid: getuid(), gid: getgid()))
        if let token = writeClaims.acquireWriteClaimNow(request) { return token }
        return try await writeClaims.acquireWriteClaim(request)
    }

    func releaseWriteClaim(_ token: WriteClaimToken?) {
        guard let token, let writeClaims else { return }
        writeClaims.releaseWriteClaim(token)
    }

    /// A write handle on `item`'s staging file: the shared one, or through an access path its
    /// token's own (D-369). Gives `use` back when it fails.
    /// `claim`: the handle's write claim, ended at its release (or here when this fails).
    private func openWriter(
        _ inode: InodeNumber, identifier: ItemIdentifier, item: ProviderItem, truncating: Bool, touching: Bool = false,
        context: RequestContext, scoped: ScopedNode? = nil, use: String? = nil, claim: WriteClaimToken?,
        admitted: Bool = false
    ) async throws(FileSystemError) -> OpenedFile {
        let staging: StagingFile
        do {
            staging = try await cache.openWriter(
                item, truncating: truncating, touching: touching, owner: scoped?.tokenID)
        } catch {
            releaseWriteClaim(claim)
            returnScopedUse(use)
            throw FileSystemError(error)
        }
        let writer = WriteHandle(
            inode: inode, identifier: identifier, staging: staging, opener: Self.process(of: context), scoped: scoped,
            scopedUse: use, claim: claim, admitted: admitted)
        let handle = state.withLock { state in
            let handle = state.allocateHandle()
            state.handles[handle] = .write(writer)
            // A later open of this version must not keep pages cached before the publish.
            state.inodes[inode]?.pageCache = .unknown
            return handle
        }
        // Direct I/O: the writes do not go through the page cache that readers of the published
        // version share (D-363).
        return OpenedFile(handle: handle, keepCache: false, directIO: true)
    }

    func writeHandle(_ handle: FileHandleID) -> WriteHandle? {
        state.withLock { $0.handles.writer(handle) }
    }

    /// What the core of `write` and `writeNow` decides (D-512).
    enum WriteStep {
        case answered(Result<Int, FileSystemError>)
        /// A token's handle: its check, in `write` (a refusal drops the writes of a token that
        /// ended, D-369); then `privilegesStep`.
        case needsTokenCheck(WriteHandle)
        /// A write that clears setuid or setgid first (D-391): `write`'s, through setattr's core.
        case clearsPrivileges(WriteHandle, permissions: UInt16)
        /// The bytes into the staging file: `writeNow` when it takes them at once
        /// (`LocalWrites.writeNow`: within the first MiB, no copy-back, nobody holding the
        /// file), `write` waiting for it.
        case needsStaging(WriteHandle)
    }

    /// The core of `write` and `writeNow`: the handle, the offset, the token's check, the
    /// privileges a write clears.
    func writeStep(_ handle: FileHandleID, offset: Int64, context: RequestContext) -> WriteStep {
        guard let writer = writeHandle(handle) else {
            guard isWritable else { return .answered(.failure(readOnly("write"))) }
            if state.withLock({ $0.handles[handle] != nil }) {
                return .answered(
                    .failure(FileSystemError(.badHandle, "file handle \(handle) is open for reading only")))
            }
            return .answered(.failure(FileSystemError(.badHandle, "file handle \(handle) is not open")))
        }
        guard offset >= 0 else { return .answered(.failure(FileSystemError(.invalidArgument, "negative offset"))) }
        if writer.scoped != nil { return .needsTokenCheck(writer) }
        return privilegesStep(writer, context: context)
    }

    /// After the token's check: the setuid and setgid a write clears, then the bytes.
    func privilegesStep(_ writer: WriteHandle, context: RequestContext) -> WriteStep {
        if let permissions = permissionsAfterWrite(writer, context: context) {
            return .clearsPrivileges(writer, permissions: permissions)
        }
        return .needsStaging(writer)
    }

    public func write(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) async throws(FileSystemError) -> Int {
        var step = writeStep(handle, offset: offset, context: context)
        while true {
            switch step {
            case .answered(let result):
                return try result.get()
            case .needsTokenCheck(let writer):
                try await checkWriting(writer, "write", context: context)
                step = privilegesStep(writer, context: context)
            case .clearsPrivileges(let writer, let permissions):
                let changes = AttributeChanges(permissions: permissions)
                _ = try await settleAttributes(
                    inode, changesStep(inode, resolve(inode), changes, context: context), changes, handle: nil,
                    context: context)
                step = .needsStaging(writer)
            case .needsStaging(let writer):
                do {
                    try await cache.write(writer.staging, data, at: offset)
                } catch {
                    throw FileSystemError(error)
                }
                return data.count
            }
        }
    }

    /// `write` on the FUSE thread (D-387), with `writeStep`'s checks: a plain handle's bytes that
    /// its staging file takes at once. A token's handle, a write that clears privileges, bytes
    /// the staging file does not take at once: nil, for `write`.
    public func writeNow(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) -> Result<Int, FileSystemError>? {
        switch writeStep(handle, offset: offset, context: context) {
        case .answered(let result):
            return result
        case .needsTokenCheck, .clearsPrivileges:
            return nil
        case .needsStaging(let writer):
            switch cache.writeNow(writer.staging, data, at: offset) {
            case nil: return nil
            case .success: return .success(data.count)
            case .failure(let error): return .failure(FileSystemError(error))
            }
        }
    }

    /// The permissions a write by this caller leaves (D-391), nil when it changes none: a write
    /// clears setuid, and setgid when group-execute is set, unless the caller is root (standing
    /// for CAP_FSETID), as Linux's file_remove_privs does. The kernel leaves this to the file
    /// system for direct-I/O handles (FUSE_WRITE_KILL_SUIDGID), which every handle of a writable
    /// mount is (D-363); truncate(2) comes with its own mode change.
    func permissionsAfterWrite(_ writer: WriteHandle, context: RequestContext) -> UInt16? {
        guard context.uid != 0, let item = cache.catalog.knownItem(writer.identifier) else { return nil }
        let shown = cache.staged(writer.identifier)?.permissions ?? cache.shown(item).permissions
        guard shown & 0o6000 != 0 else { return nil }
        var kept = shown & ~0o4000
        if shown & 0o2010 == 0o2010 { kept &= ~0o2000 }
        return kept == shown ? nil : kept
    }

    /// setattr's size (truncate(2), ftruncate(2) when `handle` is set). Returns the attributes after.
    func truncate(
        _ inode: InodeNumber, _ resolved: ResolvedNode, to size: Int64, handle: FileHandleID?, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        guard isWritable else { throw readOnly("truncate") }
        guard size >= 0 else { throw FileSystemError(.invalidArgument, "negative size") }
        var scoped: ScopedNode?
        let node: InodeTable.Node
        switch resolved {
        case .plain: node = try self.node(inode)
        case .scopedRoot: throw FileSystemError(.isADirectory, "truncate: an access-path directory")
        case .scoped(let scopedNode):
            guard case .item(let identifier) = scopedNode.role else {
                throw FileSystemError(.isADirectory, "truncate: an access-path directory")
            }
            guard try enforce(scopedNode, context: context, operation: "truncate").check.writable else {
                logger.notice("truncate through an access path refused: a read token")
                throw FileSystemError(.accessDenied, "truncate through an access path of a read token")
            }
            scoped = scopedNode
            node = InodeTable.Node(identifier: identifier, kind: scopedNode.kind, lookupCount: 0, generation: 0)
        }
        guard node.kind == .file else { throw FileSystemError(.isADirectory, "\(node.identifier) is not a file") }
        if let handle, let writer = writeHandle(handle) {
            try await checkWriting(writer, "truncate", context: context)
            do { try await cache.truncate(writer.staging, to: size) } catch { throw FileSystemError(error) }
        } else if let staging = cache.staging(of: node.identifier, owner: scoped?.tokenID) {
            // truncate(2) while write handles are open: their staging file (published with them).
            do { try await cache.truncate(staging, to: size) } catch { throw FileSystemError(error) }
        } else {
            // truncate(2) with no writer: a writer of its own, under its own write claim (D-399),
            // published at once. Not on a node whose readers use the page cache (D-435).
            let admitted = scoped == nil
            if admitted { try admitChange(inode, writing: true) }
            let opened: OpenedFile
            do throws(FileSystemError) {
                let claim = try await acquireWriteClaim(path: nil, identifier: node.identifier, context: context)
                let item: ProviderItem
                do throws(FileSystemError) {
                    item = try await self.item(of: node, maximumAge: .zero)
                } catch {
                    releaseWriteClaim(claim)
                    throw error
                }
                opened = try await openWriter(
                    inode, identifier: node.identifier, item: item, truncating: size == 0, context: context,
                    scoped: scoped, claim: claim, admitted: admitted)
            } catch {
                if admitted { dismissWriter(inode) }
                throw error
            }
            guard let writer = writeHandle(opened.handle) else {
                throw FileSystemError(.badHandle, "truncate's handle vanished")
            }
            do {
                try await cache.truncate(writer.staging, to: size)
            } catch {
                await releaseWriter(opened.handle, context: context)
                throw FileSystemError(error)
            }
            try await closeWriter(opened.handle, context: context)
        }
        return try await getAttributes(inode, context: context)
    }

    /// fallocate(2) through a write handle (D-373): the space reserved in its staging copy (an
    /// ENOSPC comes now, not at a later write), the size extended unless `keepSize`.
    public func allocate(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, length: Int64, keepSize: Bool,
        context: RequestContext
    ) async throws(FileSystemError) {
        guard let writer = writeHandle(handle) else {
            guard isWritable else { throw readOnly("fallocate") }
            throw FileSystemError(.badHandle, "fallocate: file handle \(handle) is not open for writing")
        }
        guard offset >= 0, length > 0 else {
            throw FileSystemError(.invalidArgument, "fallocate: a negative offset or a length that is not positive")
        }
        guard offset <= Int64.max - length else {
            throw FileSystemError(.fileTooLarge, "fallocate: past the largest size")
        }
        try await checkWriting(writer, "fallocate", context: context)
        do {
            try await cache.allocate(writer.staging, offset: offset, length: length, keepSize: keepSize)
        } catch {
            throw FileSystemError(error)
        }
    }

    /// Reads through a write handle (O_RDWR): the staging file, as written so far.
    func readStaged(
        _ writer: WriteHandle, offset: Int64, count: Int, context: RequestContext
    ) async throws(FileSystemError) -> ReadData {
        guard offset >= 0, count >= 0 else { throw FileSystemError(.invalidArgument, "negative offset or count") }
        if let scoped = writer.scoped { _ = try enforce(scoped, context: context, operation: "read") }
        do { return try await writer.staging.read(offset: offset, count: count) } catch { throw FileSystemError(error) }
    }

    /// Through an access path, every write, truncate, flush and fsync of a handle asks the token
    /// (writes need a read-write one). Refused: EACCES; and when the token has ended, the
    /// handle's unpublished writes are dropped first, so that no later close publishes them
    /// (D-369).
    func checkWriting(_ writer: WriteHandle, _ operation: String, context: RequestContext) async throws(FileSystemError)
    {
        guard let scoped = writer.scoped else { return }
        do throws(FileSystemError) {
            guard try enforce(scoped, context: context, operation: operation).check.writable else {
                throw FileSystemError(.accessDenied, "\(operation) through an access path of a read token")
            }
        } catch {
            await dropIfTokenEnded(writer)
            throw error
        }
    }

    /// Drops the writer's unpublished writes when its token has ended (D-369).
    private func dropIfTokenEnded(_ writer: WriteHandle) async {
        guard let scoped = writer.scoped, scopedAccess?.hasEnded(id: scoped.tokenID) == true else { return }
        await cache.abandon(writer.staging)
    }

    /// fsync of a write handle publishes what changed (under the handle's write claim), its bytes
    /// forced to disk; a flush's publish (`durable` false) does not force those of a new file (D-381).
    func syncWriter(
        _ handle: FileHandleID, context: RequestContext?, durable: Bool = true
    ) async throws(FileSystemError) {
        guard let writer = writeHandle(handle) else {
            // fsync of a handle open for reading: what a close published unsynced is synced now
            // (D-381; `sync FILE`, dpkg's deferred fsync).
            guard durable, let identifier = state.withLock({ $0.handles.reader(handle)?.identifier }) else { return }
            do throws(CacheError) { try await cache.makeDurable(identifier) } catch {
                throw FileSystemError(error)
            }
            return
        }
        if let context { try await checkWriting(writer, durable ? "fsync" : "flush", context: context) }
        try await publishing(writer) { () throws(FileSystemError) -> PublishedVersion? in
            do throws(CacheError) {
                return try await self.cache.sync(writer.staging, durable: durable)
            } catch {
                throw FileSystemError(error)
            }
        }
    }

    /// flush (each close(2) of a write handle's descriptors) publishes what changed, so that
    /// close-to-open holds: the next open after close(2) returned reads the new version. (Not
    /// only the last writer's: the kernel sends a handle's RELEASE after close(2) has returned,
    /// so which close is the last is not known in time.)
    ///
    /// Only the opening process's flushes publish. The kernel also sends a flush when another
    /// process closes a copy of the descriptor: a child that inherited it, closing it at exec
    /// (close-on-exec) or in posix_spawn's file actions, which happens whenever a program spawns
    /// anything while it writes. Publishing then would make a version of a half-written file
    /// (D-364). Such a copy's last close is published by the release.
    func flushWriter(_ handle: FileHandleID, context: RequestContext) async throws(FileSystemError) {
        guard let writer = writeHandle(handle) else { return }
        if let opener = writer.opener, let flusher = Self.process(of: context), flusher != opener {
            logger.debug(
                "flush of write handle \(handle) by process \(flusher), not its opener \(opener): not published")
            return
        }
        try await syncWriter(handle, context: context, durable: false)
    }

    /// The process (thread group) of the request's thread; nil for internal calls or when the
    /// thread is gone.
    static func process(of context: RequestContext) -> Int32? {
        context.threadID > 0 ? ProcessInfoFiles.threadGroup(ofThread: context.threadID) : nil
    }

    /// The handle's release: the last writer of the item publishes what is left, or drops the
    /// staging file. True when `handle` was a write handle.
    /// Through an access path whose token has ended, what the handle left unpublished is
    /// dropped instead (D-369), and the use its open took ends.
    @discardableResult
    func releaseWriter(_ handle: FileHandleID, context: RequestContext? = nil) async -> Bool {
        guard let writer = writeHandle(handle) else { return false }
        await dropIfTokenEnded(writer)
        do {
            try await closeWriter(handle, context: context)
        } catch {
            logger.warning("release of write handle \(handle): \(error)")
        }
        endScopedUse(writer.scopedUse)
        return true
    }

    /// The handle's last publish, then the end of its write claim (presenters get didChange).
    private func closeWriter(_ handle: FileHandleID, context: RequestContext?) async throws(FileSystemError) {
        guard let writer = state.withLock({ $0.handles.removeWriter(handle) }) else { return }
        defer {
            releaseWriteClaim(writer.claim)
            if writer.admitted { dismissWriter(writer.inode) }
        }
        try await publishing(writer) { () throws(FileSystemError) -> PublishedVersion? in
            do throws(CacheError) {
                return try await self.cache.closeWriter(writer.staging)
            } catch {
                throw FileSystemError(error)
            }
        }
    }

    /// Runs a publish, under the write claim the handle holds since its open (D-399), then tells
    /// the kernel to forget the node's attributes and cached pages when a version was published
    /// (D-363).
    private func publishing(
        _ writer: WriteHandle, _ publish: () async throws(FileSystemError) -> PublishedVersion?
    ) async throws(FileSystemError) {
        guard try await publish() != nil else { return }
        if let invalidate = kernelInvalidation.withLock({ $0 })?.call {
            var nodes = [writer.inode]
            // Written through an access path: the item's plain node, if the kernel has one, too.
            if writer.scoped != nil, let plain = state.withLock({ $0.inodes.inode(of: writer.identifier) }) {
                nodes.append(plain)
            }
            invalidate(nodes.flatMap { [KernelInvalidation.attributes($0), .content($0)] })
        }
    }
}
