// The `@convention(c)` trampoline table: one capture-free closure per FUSE low-level operation.
// Each copies what it needs out of the request (`fi` is valid only during the callback), hands the
// work to `Dispatcher.respond`, and returns at once.

import CFuse3
import Diagnostics
import SystemSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

extension Dispatcher {
    // swift-format-ignore: FunctionBodyLength
    static func makeOperations() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()

        ops.`init` = { userdata, connection in
            let dispatcher = Unmanaged<Dispatcher>.fromOpaque(userdata!).takeUnretainedValue()
            if let connection {
                // Without async reads, the kernel sends buffered reads and read-ahead as
                // synchronous requests in the reader's context: a signal reaches us as
                // FUSE_INTERRUPT, so a reader waiting on a stalled download gets EINTR (or dies
                // on SIGKILL) at once instead of waiting for the download (D-285).
                connection.pointee.want &= ~UInt32(FUSE_CAP_ASYNC_READ)
                // Without async DIO an O_DIRECT read is a synchronous request in the caller's
                // context, so a signal reaches us as FUSE_INTERRUPT (and cancels the work) instead
                // of leaving the caller in uninterruptible sleep until the download ends.
                connection.pointee.want &= ~UInt32(FUSE_CAP_ASYNC_DIO)
                // O_TRUNC comes with the OPEN (no SETATTR of size 0 before it): a writable mount's
                // `open` starts an empty staging copy instead of publishing an empty version first.
                if connection.pointee.capable & UInt32(FUSE_CAP_ATOMIC_O_TRUNC) != 0 {
                    connection.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
                }
                // READDIRPLUS where the file system gives attributes (D-471), in its adaptive
                // form (D-487): the kernel asks for it for a listing's first request and after
                // its caller stat'ed an entry (`ls -l`, which stats each page's names before it
                // reads the next), plain READDIR otherwise (`ls -f`, `find`: no node, no
                // attributes for names nobody stats). libfuse turns both on whenever the
                // operation is set.
                if !dispatcher.fileSystem.givesDirectoryAttributes {
                    connection.pointee.want &= ~UInt32(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO)
                } else if connection.pointee.capable & UInt32(FUSE_CAP_READDIRPLUS) != 0 {
                    connection.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS)
                    if connection.pointee.capable & UInt32(FUSE_CAP_READDIRPLUS_AUTO) != 0 {
                        connection.pointee.want |= UInt32(FUSE_CAP_READDIRPLUS_AUTO)
                    }
                }
            }
            dispatcher.onInitialized()
        }

        ops.lookup = { request, parent, name in
            let name = decodeName(name)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, Entry) -> Int32 = { request, entry in
                var param = entry.entryParam
                return fuse_reply_entry(request, &param)
            }
            guard
                !dispatcher.answerNow(
                    request, "lookup",
                    now: { fs, context in fs.lookupNow(parent: InodeNumber(parent), name: name, context: context) },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "lookup",
                work: { fs, context throws(FileSystemError) in
                    try await fs.lookup(parent: InodeNumber(parent), name: name, context: context)
                }, reply: reply)
        }

        ops.forget = { request, inode, count in
            Dispatcher.from(request).fileSystem.forget(InodeNumber(inode), count: count)
            fuse_reply_none(request)
        }

        ops.forget_multi = { request, count, forgets in
            let fileSystem = Dispatcher.from(request).fileSystem
            if let forgets {
                for index in 0..<count {
                    fileSystem.forget(InodeNumber(forgets[index].ino), count: forgets[index].nlookup)
                }
            }
            fuse_reply_none(request)
        }

        ops.getattr = { request, inode, _ in
            let dispatcher = Dispatcher.from(request)
            // Captures nothing (the timeout is read from the request's dispatcher): no allocation.
            let reply: @Sendable (fuse_req_t, NodeAttributes) -> Int32 = { request, attributes in
                var value = attributes.statValue
                let timeout = attributes.validFor ?? Dispatcher.from(request).options.attributeTimeout
                return fuse_reply_attr(request, &value, timeout.fuseSeconds)
            }
            guard
                !dispatcher.answerNow(
                    request, "getattr",
                    now: { fs, context in fs.getAttributesNow(InodeNumber(inode), context: context) },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "getattr",
                work: { fs, context throws(FileSystemError) in
                    try await fs.getAttributes(InodeNumber(inode), context: context)
                }, reply: reply)
        }

        ops.setattr = { request, inode, attributes, toSet, fileInfo in
            let dispatcher = Dispatcher.from(request)
            let timeout = dispatcher.options.attributeTimeout.fuseSeconds
            let changes = attributeChanges(attributes, toSet: toSet)
            let handle = fileInfo.map { FileHandleID($0.pointee.fh) }
            let reply: @Sendable (fuse_req_t, NodeAttributes) -> Int32 = { request, attributes in
                var value = attributes.statValue
                return fuse_reply_attr(request, &value, timeout)
            }
            // A chown that changes nothing (tar x as root, for every file) needs no task.
            guard
                !dispatcher.answerNow(
                    request, "setattr",
                    now: { fs, context in fs.setAttributesNow(InodeNumber(inode), changes: changes, context: context) },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "setattr",
                work: { fs, context throws(FileSystemError) in
                    try await fs.setAttributes(InodeNumber(inode), changes: changes, handle: handle, context: context)
                }, reply: reply)
        }

        ops.readlink = { request, inode in
            Dispatcher.from(request).respond(request, "readlink") { fs, context throws(FileSystemError) in
                try await fs.readLink(InodeNumber(inode), context: context)
            } reply: { request, target in
                fuse_reply_readlink(request, target)
            }
        }

        ops.opendir = { request, inode, _ in
            Dispatcher.from(request).respond(request, "opendir") { fs, context throws(FileSystemError) in
                let handle = try await fs.openDirectory(InodeNumber(inode), context: context)
                return (handle, fs.listingCaching(InodeNumber(inode), handle: handle))
            } reply: { request, opened in
                var info = fuse_file_info()
                info.fh = opened.0.rawValue
                // The kernel's cache of the listing (D-472).
                info.cache_readdir = opened.1 == .none ? 0 : 1
                info.keep_cache = opened.1 == .kept ? 1 : 0
                return fuse_reply_open(request, &info)
            }
        }

        ops.readdir = { request, inode, size, offset, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            // A fuse_dirent is 24 bytes plus the name rounded up to 8: ask for about as many
            // entries as can fit; the ones that do not fit are asked for again from their cookie.
            let limit = max(1, size / 32)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, [DirectoryEntry]) -> Int32 = { request, entries in
                replyDirectory(request, entries, capacity: size)
            }
            // Entries the open listing already has: no task (D-470).
            guard
                !dispatcher.answerNow(
                    request, "readdir",
                    now: { fs, context in
                        fs.readDirectoryNow(
                            InodeNumber(inode), handle: handle, after: UInt64(offset), limit: limit, context: context)
                    }, reply: reply)
            else { return }
            dispatcher.respond(
                request, "readdir",
                work: { fs, context throws(FileSystemError) in
                    try await fs.readDirectory(
                        InodeNumber(inode), handle: handle, after: UInt64(offset), limit: limit, context: context)
                }, reply: reply)
        }

        ops.readdirplus = { request, inode, size, offset, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            // A fuse_direntplus is a fuse_entry_out (128 bytes), a fuse_dirent (24) and the name
            // rounded up to 8. Entries that do not fit are given back (`forget`) and asked for
            // again from their cookie (D-471).
            let limit = max(1, size / 160)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, [DirectoryEntryPlus]) -> Int32 = { request, entries in
                replyDirectoryPlus(request, entries, capacity: size, fileSystem: Dispatcher.from(request).fileSystem)
            }
            guard
                !dispatcher.answerNow(
                    request, "readdirplus",
                    now: { fs, context in
                        fs.readDirectoryPlusNow(
                            InodeNumber(inode), handle: handle, after: UInt64(offset), limit: limit, context: context)
                    }, reply: reply)
            else { return }
            dispatcher.respond(
                request, "readdirplus",
                work: { fs, context throws(FileSystemError) in
                    try await fs.readDirectoryPlus(
                        InodeNumber(inode), handle: handle, after: UInt64(offset), limit: limit, context: context)
                }, reply: reply)
        }

        ops.releasedir = { request, inode, fileInfo in
            Dispatcher.from(request).fileSystem.releaseDirectory(
                InodeNumber(inode), handle: FileHandleID(fileInfo!.pointee.fh))
            fuse_reply_err(request, 0)
        }

        ops.open = { request, inode, fileInfo in
            let flags = OpenFlags(rawValue: fileInfo!.pointee.flags)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, DecidedOpen) -> Int32 = { request, decided in
                var info = replyInfo(for: decided.opened, passthrough: decided.passthrough)
                let rc = fuse_reply_open(request, &info)
                dispatcher.openReplied(InodeNumber(inode), decided.opened.handle, rc: rc)
                return rc
            }
            // Most opens of known files are answered here, on the libfuse thread (D-229).
            guard
                !dispatcher.answerNow(
                    request, "open",
                    now: { fs, context in dispatcher.openNow(fs, InodeNumber(inode), flags: flags, context: context) },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "open",
                work: { fs, context throws(FileSystemError) in
                    try await dispatcher.open(fs, InodeNumber(inode), flags: flags, context: context)
                }, reply: reply)
        }

        ops.read = { request, inode, size, offset, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, ReadData) -> Int32 = { request, data in replyData(request, data) }
            guard
                !dispatcher.answerNow(
                    request, "read", replyInline: { $0.count < mappedReplyMinimum },
                    now: { fs, context in
                        fs.readNow(
                            InodeNumber(inode), handle: handle, offset: Int64(offset), count: size, context: context)
                    }, reply: reply)
            else { return }
            dispatcher.respond(
                request, "read", replyBlocks: { $0.count >= mappedReplyMinimum },
                work: { fs, context throws(FileSystemError) in
                    try await fs.read(
                        InodeNumber(inode), handle: handle, offset: Int64(offset), count: size, context: context)
                }, reply: reply)
        }

        ops.write = { request, inode, buffer, size, offset, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            let data = buffer.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, Int) -> Int32 = { request, written in
                fuse_reply_write(request, written)
            }
            // A small file's bytes go into its staging copy here: no task (D-387).
            guard
                !dispatcher.answerNow(
                    request, "write",
                    now: { fs, context in
                        fs.writeNow(
                            InodeNumber(inode), handle: handle, offset: Int64(offset), data: data, context: context)
                    },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "write",
                work: { fs, context throws(FileSystemError) in
                    try await fs.write(
                        InodeNumber(inode), handle: handle, offset: Int64(offset), data: data, context: context)
                }, reply: reply)
        }

        ops.flush = { request, inode, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            let dispatcher = Dispatcher.from(request)
            guard
                !dispatcher.answerNow(
                    request, "flush",
                    now: { fs, context in fs.flushNow(InodeNumber(inode), handle: handle, context: context) },
                    reply: { request, _ in fuse_reply_err(request, 0) })
            else { return }
            dispatcher.respondStatus(request, "flush") { fs, context throws(FileSystemError) in
                try await fs.flush(InodeNumber(inode), handle: handle, context: context)
            }
        }

        ops.fsync = { request, inode, dataOnly, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            Dispatcher.from(request).respondStatus(request, "fsync") { fs, context throws(FileSystemError) in
                try await fs.fsync(InodeNumber(inode), handle: handle, dataOnly: dataOnly != 0, context: context)
            }
        }

        // fallocate(2): allocation, and FALLOC_FL_KEEP_SIZE; punching holes, zeroing, collapsing
        // and inserting ranges are EOPNOTSUPP (glibc's posix_fallocate then writes zeros).
        ops.fallocate = { request, inode, mode, offset, length, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            guard mode & ~fallocateKeepSize == 0 else {
                fuse_reply_err(request, EOPNOTSUPP)
                return
            }
            Dispatcher.from(request).respondStatus(request, "fallocate") { fs, context throws(FileSystemError) in
                try await fs.allocate(
                    InodeNumber(inode), handle: handle, offset: Int64(offset), length: Int64(length),
                    keepSize: mode & fallocateKeepSize != 0, context: context)
            }
        }

        ops.release = { request, inode, fileInfo in
            let handle = FileHandleID(fileInfo!.pointee.fh)
            let dispatcher = Dispatcher.from(request)
            // The kernel sends RELEASE after it let go of the file: the node may change mode now.
            dispatcher.passthrough.released(handle: handle.rawValue)
            guard
                !dispatcher.answerNow(
                    request, "release", now: { fs, _ in fs.releaseNow(InodeNumber(inode), handle: handle) },
                    reply: { request, _ in fuse_reply_err(request, 0) })
            else { return }
            dispatcher.respondStatus(request, "release") { fs, _ throws(FileSystemError) in
                await fs.release(InodeNumber(inode), handle: handle)
            }
        }

        ops.create = { request, parent, name, mode, fileInfo in
            let name = decodeName(name)
            let flags = OpenFlags(rawValue: fileInfo!.pointee.flags)
            let dispatcher = Dispatcher.from(request)
            dispatcher.respond(request, "create") { fs, context throws(FileSystemError) in
                let (entry, opened) = try await fs.create(
                    parent: InodeNumber(parent), name: name, permissions: UInt16(mode & 0o7777), flags: flags,
                    context: context)
                // Only OPEN replies are passed through; a created handle is counted in the node's
                // caching mode, so no passthrough open of that node is made while it is open.
                return (entry, try await dispatcher.decidePassthrough(entry.inode, opened, servedFrom: nil))
            } reply: { request, created in
                var param = created.0.entryParam
                var info = replyInfo(for: created.1.opened, passthrough: false)
                let rc = fuse_reply_create(request, &param, &info)
                dispatcher.openReplied(created.0.inode, created.1.opened.handle, rc: rc)
                return rc
            }
        }

        ops.mkdir = { request, parent, name, mode in
            let name = decodeName(name)
            Dispatcher.from(request).respond(request, "mkdir") { fs, context throws(FileSystemError) in
                try await fs.makeDirectory(
                    parent: InodeNumber(parent), name: name, permissions: UInt16(mode & 0o7777), context: context)
            } reply: { request, entry in
                var param = entry.entryParam
                return fuse_reply_entry(request, &param)
            }
        }

        // mkfifo(3), bind(2) of a Unix socket and mknod(2) (D-391): a regular file is made; the
        // other types are the file system's to keep (D-398) or refuse (EPERM). Without this
        // operation the kernel answers ENOSYS, which tools do not expect.
        ops.mknod = { request, parent, name, mode, device in
            let name = decodeName(name)
            let type: MknodType
            switch mode & S_IFMT {
            case 0, S_IFREG: type = .regular
            case S_IFIFO: type = .fifo
            case S_IFSOCK: type = .socket
            case S_IFCHR: type = .characterDevice
            case S_IFBLK: type = .blockDevice
            default:
                fuse_reply_err(request, EINVAL)  // the kernel lets no other type through
                return
            }
            Dispatcher.from(request).respond(request, "mknod") { fs, context throws(FileSystemError) in
                try await fs.makeNode(
                    parent: InodeNumber(parent), name: name, type: type, permissions: UInt16(mode & 0o7777),
                    device: UInt64(device), context: context)
            } reply: { request, entry in
                var param = entry.entryParam
                return fuse_reply_entry(request, &param)
            }
        }

        ops.symlink = { request, target, parent, name in
            let target = decodeName(target)
            let name = decodeName(name)
            Dispatcher.from(request).respond(request, "symlink") { fs, context throws(FileSystemError) in
                try await fs.makeSymbolicLink(parent: InodeNumber(parent), name: name, target: target, context: context)
            } reply: { request, entry in
                var param = entry.entryParam
                return fuse_reply_entry(request, &param)
            }
        }

        ops.unlink = { request, parent, name in
            let name = decodeName(name)
            Dispatcher.from(request).respondStatus(request, "unlink") { fs, context throws(FileSystemError) in
                try await fs.unlink(parent: InodeNumber(parent), name: name, context: context)
            }
        }

        ops.rmdir = { request, parent, name in
            let name = decodeName(name)
            Dispatcher.from(request).respondStatus(request, "rmdir") { fs, context throws(FileSystemError) in
                try await fs.removeDirectory(parent: InodeNumber(parent), name: name, context: context)
            }
        }

        ops.rename = { request, parent, name, newParent, newName, flags in
            let name = decodeName(name)
            let newName = decodeName(newName)
            Dispatcher.from(request).respondStatus(request, "rename") { fs, context throws(FileSystemError) in
                try await fs.rename(
                    parent: InodeNumber(parent), name: name, newParent: InodeNumber(newParent), newName: newName,
                    flags: UInt32(flags), context: context)
            }
        }

        ops.link = { request, inode, newParent, newName in
            let newName = decodeName(newName)
            Dispatcher.from(request).respond(request, "link") { fs, context throws(FileSystemError) in
                try await fs.makeHardLink(
                    InodeNumber(inode), newParent: InodeNumber(newParent), newName: newName, context: context)
            } reply: { request, entry in
                var param = entry.entryParam
                return fuse_reply_entry(request, &param)
            }
        }

        ops.getxattr = { request, inode, name, size in
            let name = decodeName(name)
            let dispatcher = Dispatcher.from(request)
            let reply: @Sendable (fuse_req_t, [UInt8]) -> Int32 = { request, value in
                replyXattr(request, value, capacity: size)
            }
            // security.capability before a first write, and any other name not ours: no task.
            guard
                !dispatcher.answerNow(
                    request, "getxattr",
                    now: { fs, context in
                        fs.getExtendedAttributeNow(InodeNumber(inode), name: name, context: context)
                    },
                    reply: reply)
            else { return }
            dispatcher.respond(
                request, "getxattr",
                work: { fs, context throws(FileSystemError) in
                    try await fs.getExtendedAttribute(InodeNumber(inode), name: name, context: context)
                }, reply: reply)
        }

        ops.listxattr = { request, inode, size in
            Dispatcher.from(request).respond(request, "listxattr") { fs, context throws(FileSystemError) in
                try await fs.listExtendedAttributes(InodeNumber(inode), context: context)
            } reply: { request, names in
                // The list is the names, each followed by a NUL byte.
                var bytes: [UInt8] = []
                for name in names { bytes += Array(name.utf8) + [0] }
                return replyXattr(request, bytes, capacity: size)
            }
        }

        ops.setxattr = { request, inode, name, value, size, flags in
            let name = decodeName(name)
            let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            Dispatcher.from(request).respondStatus(request, "setxattr") { fs, context throws(FileSystemError) in
                try await fs.setExtendedAttribute(
                    InodeNumber(inode), name: name, value: bytes, flags: flags, context: context)
            }
        }

        ops.removexattr = { request, inode, name in
            let name = decodeName(name)
            Dispatcher.from(request).respondStatus(request, "removexattr") { fs, context throws(FileSystemError) in
                try await fs.removeExtendedAttribute(InodeNumber(inode), name: name, context: context)
            }
        }

        ops.statfs = { request, _ in
            Dispatcher.from(request).respond(request, "statfs") { fs, context throws(FileSystemError) in
                try await fs.statistics(context: context)
            } reply: { request, statistics in
                var value = statistics.statvfsValue
                return fuse_reply_statfs(request, &value)
            }
        }

        return ops
    }
}

/// The reply side of `open`/`create`: a fresh `fuse_file_info` (the kernel's one is gone by now)
/// carrying the handle and the page-cache policy. A passthrough handle has neither keep_cache
/// (the kernel refuses it) nor direct_io; the writev hook adds FOPEN_PASSTHROUGH and the backing id.
private func replyInfo(for opened: OpenedFile, passthrough: Bool) -> fuse_file_info {
    var info = fuse_file_info()
    info.fh = opened.handle.rawValue
    info.keep_cache = opened.keepCache && !passthrough ? 1 : 0
    info.direct_io = opened.directIO && !passthrough ? 1 : 0
    return info
}

/// An opened file and whether the kernel serves its reads (passthrough).
struct DecidedOpen: Sendable {
    var opened: OpenedFile
    var passthrough: Bool
}

extension Dispatcher {
    /// Asks `passthrough` how the kernel serves the new handle. When it cannot be opened at all
    /// (the node is open in passthrough on another file), the handle is released and the open
    /// fails with EBUSY.
    func decidePassthrough(
        _ inode: InodeNumber, _ opened: OpenedFile, servedFrom: String?
    ) async throws(FileSystemError) -> DecidedOpen {
        switch await passthrough.decide(node: inode.rawValue, handle: opened.handle.rawValue, servedFrom: servedFrom) {
        case .daemon: return DecidedOpen(opened: opened, passthrough: false)
        case .kernel: return DecidedOpen(opened: opened, passthrough: true)
        case .conflict(let reason):
            logger.info("open of \(inode) refused: \(reason)")
            await fileSystem.release(inode, handle: opened.handle)
            throw FileSystemError(.busy, reason)
        }
    }

    /// The async open and its passthrough decision (what `openNow` leaves to a task).
    func open(
        _ fileSystem: any FileSystem, _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> DecidedOpen {
        let opened = try await fileSystem.open(inode, flags: flags, context: context)
        // A direct-I/O handle is never passed through (its reads are meant for us).
        let servedFrom = opened.directIO ? nil : opened.servedFrom
        return try await decidePassthrough(inode, opened, servedFrom: servedFrom)
    }

    /// The fast path's open and its passthrough decision. A decision that cannot be made at once
    /// (a conflict `decidePassthrough` waits out for a moment) gives the handle back and leaves
    /// the whole open to the async path.
    func openNow(
        _ fastPath: any FileSystemFastPath, _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) -> Result<DecidedOpen, FileSystemError>? {
        switch fastPath.openNow(inode, flags: flags, context: context) {
        case nil: return nil
        case .failure(let error)?: return .failure(error)
        case .success(let opened)?:
            let servedFrom = opened.directIO ? nil : opened.servedFrom
            switch passthrough.decideNow(node: inode.rawValue, handle: opened.handle.rawValue, servedFrom: servedFrom) {
            case .daemon?: return .success(DecidedOpen(opened: opened, passthrough: false))
            case .kernel?: return .success(DecidedOpen(opened: opened, passthrough: true))
            case .conflict?, nil:
                // Given back at once when the file system can; otherwise the async way, so a
                // release that would wait never leaks the handle.
                if fastPath.releaseNow(inode, handle: opened.handle) == nil {
                    let fileSystem = self.fileSystem
                    Task { await fileSystem.release(inode, handle: opened.handle) }
                }
                return nil
            }
        }
    }

    /// After the OPEN/CREATE reply: if it did not reach the kernel (the request was aborted), no
    /// RELEASE will ever come, so the handle is given back here.
    func openReplied(_ inode: InodeNumber, _ handle: FileHandleID, rc: Int32) {
        guard rc == 0 else {
            logger.debug("open of \(inode): reply not delivered (\(Errno(-rc).name)); releasing \(handle)")
            passthrough.released(handle: handle.rawValue)
            let fileSystem = self.fileSystem
            Task { await fileSystem.release(inode, handle: handle) }
            return
        }
        passthrough.replyWritten(handle: handle.rawValue)
    }
}

/// The size-0 query convention of getxattr/listxattr: size 0 asks for the length; a buffer that
/// is too small gets ERANGE.
private func replyXattr(_ request: fuse_req_t, _ value: [UInt8], capacity: Int) -> Int32 {
    if capacity == 0 { return fuse_reply_xattr(request, value.count) }
    if value.count > capacity { return fuse_reply_err(request, ERANGE) }
    return value.withUnsafeBytes { bytes in
        fuse_reply_buf(request, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), value.count)
    }
}

/// Packs entries with `fuse_add_direntry` until the kernel's buffer is full.
private func replyDirectory(_ request: fuse_req_t, _ entries: [DirectoryEntry], capacity: Int) -> Int32 {
    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(capacity, 1))
    defer { buffer.deallocate() }
    var used = 0
    for entry in entries {
        var attributes = stat()
        attributes.st_ino = ino_t(entry.serialNumber)
        attributes.st_mode = entry.type.modeBits
        let needed = fuse_add_direntry(
            request, buffer + used, capacity - used, entry.name, &attributes, off_t(Int64(bitPattern: entry.cookie)))
        if needed > capacity - used { break }
        used += needed
    }
    return fuse_reply_buf(request, buffer, used)
}

/// Packs entries with `fuse_add_direntry_plus` until the kernel's buffer is full. The kernel takes
/// a reference of every node it is sent (not of "." and "..", sent without one); the lookups of
/// entries that did not fit, or of all of them when the reply did not reach the kernel, are given
/// back at once (D-471).
private func replyDirectoryPlus(
    _ request: fuse_req_t, _ entries: [DirectoryEntryPlus], capacity: Int, fileSystem: any FileSystem
) -> Int32 {
    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(capacity, 1))
    defer { buffer.deallocate() }
    var used = 0
    var sent = 0
    for plus in entries {
        var parameters: fuse_entry_param
        if let lookup = plus.lookup {
            parameters = lookup.entryParam
        } else {
            // No node: the kernel shows the name and looks it up when needed.
            parameters = fuse_entry_param()
            parameters.attr.st_ino = ino_t(plus.entry.serialNumber)
            parameters.attr.st_mode = plus.entry.type.modeBits
        }
        let needed = fuse_add_direntry_plus(
            request, buffer + used, capacity - used, plus.entry.name, &parameters,
            off_t(Int64(bitPattern: plus.entry.cookie)))
        if needed > capacity - used { break }
        used += needed
        sent += 1
    }
    let rc = fuse_reply_buf(request, buffer, used)
    for (index, plus) in entries.enumerated() where rc != 0 || index >= sent {
        if let lookup = plus.lookup { fileSystem.forget(lookup.inode, count: 1) }
    }
    return rc
}

/// Decodes setattr's `to_set` bit mask. "Now" requests are resolved here with the wall clock.
private func attributeChanges(_ attributes: UnsafeMutablePointer<stat>?, toSet: Int32) -> AttributeChanges {
    guard let attributes = attributes?.pointee else { return AttributeChanges() }
    var changes = AttributeChanges()
    let bits = toSet
    if bits & FUSE_SET_ATTR_SIZE != 0 { changes.size = Int64(attributes.st_size) }
    if bits & FUSE_SET_ATTR_MODE != 0 { changes.permissions = UInt16(attributes.st_mode & 0o7777) }
    if bits & FUSE_SET_ATTR_UID != 0 { changes.uid = attributes.st_uid }
    if bits & FUSE_SET_ATTR_GID != 0 { changes.gid = attributes.st_gid }
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    if bits & FUSE_SET_ATTR_ATIME_NOW != 0 {
        changes.accessTime = Timestamp(now)
    } else if bits & FUSE_SET_ATTR_ATIME != 0 {
        changes.accessTime = Timestamp(attributes.st_atim)
    }
    if bits & FUSE_SET_ATTR_MTIME_NOW != 0 {
        changes.modificationTime = Timestamp(now)
    } else if bits & FUSE_SET_ATTR_MTIME != 0 {
        changes.modificationTime = Timestamp(attributes.st_mtim)
    }
    return changes
}

/// Sends read bytes with fuse_reply_buf: a buffer as it is; a file range of 64 KiB or more from
/// the owner's mapping of the file (D-221), a smaller one (or an unmappable file) read first into
/// a pooled, already faulted-in buffer. (libfuse's fuse_reply_data would splice only when the pipe can hold
/// the whole reply, which for 1 MiB reads needs fs.pipe-max-size raised; otherwise it falls back
/// to mmap + pread + munmap of a fresh buffer per read, which profiles showed as page faults and
/// page clearing.)
private func replyData(_ request: fuse_req_t, _ data: ReadData) -> Int32 {
    switch data.source {
    case .memory(let buffer):
        return buffer.withUnsafeBytes { bytes in
            fuse_reply_buf(request, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), data.count)
        }
    case .file(let descriptor, let offset, let owner):
        // Straight from the page cache when the owner maps the file: the kernel copies the
        // reply from the mapping, one copy instead of pread into a buffer and then the reply.
        // Small replies skip it: a mapping made (and later unmapped, with a TLB shootdown) for
        // one small file costs more than the copy it saves.
        if data.count >= mappedReplyMinimum, let mapped = owner as? any MappedFileRanges,
            let bytes = mapped.mappedBytes(at: offset, count: data.count)
        {
            return withExtendedLifetime(owner) {
                fuse_reply_buf(request, bytes.assumingMemoryBound(to: CChar.self), data.count)
            }
        }
        let buffer = ReadBufferPool.shared.take(capacity: data.count)
        defer { ReadBufferPool.shared.put(buffer) }
        let read = withExtendedLifetime(owner) {
            buffer.withUnsafeMutableBytes {
                readFully(descriptor, into: $0.baseAddress!, count: data.count, at: offset)
            }
        }
        guard case .success(let filled) = read else { return fuse_reply_err(request, EIO) }
        return buffer.withUnsafeBytes { bytes in
            fuse_reply_buf(request, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), filled)
        }
    }
}

/// Replies at least this large are sent from the cache file's mapping.
let mappedReplyMinimum = 64 << 10

/// Page-aligned read buffers kept for reuse, so a read does not allocate, fault in and free 1 MiB.
/// At most `limit` are kept (each is as large as the largest read it served).
final class ReadBufferPool: Sendable {
    static let shared = ReadBufferPool(limit: 16)
    private let free = Locked<[AlignedBuffer]>([])
    private let limit: Int

    init(limit: Int) { self.limit = limit }

    func take(capacity: Int) -> AlignedBuffer {
        let reused = free.withLock { buffers -> AlignedBuffer? in
            guard let index = buffers.lastIndex(where: { $0.capacity >= capacity }) else { return nil }
            return buffers.remove(at: index)
        }
        return reused ?? AlignedBuffer(capacity: max(capacity, 128 << 10))
    }

    func put(_ buffer: AlignedBuffer) {
        free.withLock { buffers in
            if buffers.count < limit { buffers.append(buffer) }
        }
    }
}
