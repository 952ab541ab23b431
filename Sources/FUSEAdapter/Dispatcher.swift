// The thin middle: decode a libfuse request, call the `FileSystem` from a Task, reply later.
// No libfuse thread waits for the file system (DESIGN.md §3); errors become errno only through
// `FileSystemError.errno`.

import CFuse3
import Diagnostics
import SystemSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// Everything a callback needs, reached through the session's userdata pointer.
final class Dispatcher: Sendable {
    let fileSystem: any FileSystem
    /// The file system's answers that need no task (nil when it has none).
    let fastPath: (any FileSystemFastPath)?
    let pending = PendingReplies()
    let options: FUSEMountOptions
    let logger: Logger
    /// FUSE passthrough: negotiation and the per-open decisions (Passthrough.swift).
    let passthrough: Passthrough
    /// Called once, from the INIT callback, when the kernel connection is established.
    let onInitialized: @Sendable () -> Void

    /// `passthrough`: tests without /dev/fuse pass their own (fake backing files); else it is made
    /// from `options`.
    init(
        fileSystem: any FileSystem, options: FUSEMountOptions, logger: Logger, passthrough: Passthrough? = nil,
        onInitialized: @escaping @Sendable () -> Void
    ) {
        self.fileSystem = fileSystem
        self.fastPath = fileSystem as? any FileSystemFastPath
        self.options = options
        self.logger = logger
        self.onInitialized = onInitialized
        self.passthrough =
            passthrough
            ?? Passthrough(
                requested: options.passthrough, logger: logger, simulatedFailure: options.simulatedBackingFailure,
                directIOMmap: options.directIOMmap)
    }

    static func from(_ request: fuse_req_t?) -> Dispatcher {
        Unmanaged<Dispatcher>.fromOpaque(fuse_req_userdata(request)!).takeUnretainedValue()
    }

    static func context(_ request: fuse_req_t) -> RequestContext {
        guard let context = fuse_req_ctx(request) else { return .kernel }
        return RequestContext(threadID: context.pointee.pid, uid: context.pointee.uid, gid: context.pointee.gid)
    }

    /// Registers the request, runs `work` in a Task and answers with `reply` or with the error's
    /// errno. `reply` returns libfuse's result, which is only logged (the kernel may have given up
    /// on the request, e.g. the caller was killed).
    func respond<T: Sendable>(
        _ raw: fuse_req_t?, _ operation: StaticString, replyBlocks: @escaping @Sendable (T) -> Bool = { _ in false },
        work: @escaping @Sendable (any FileSystem, RequestContext) async throws(FileSystemError) -> T,
        reply: @escaping @Sendable (fuse_req_t, T) -> Int32
    ) {
        guard let raw else { return }
        let request = FUSERequest(raw: raw)
        let context = Dispatcher.context(raw)
        guard let id = pending.register(request) else {
            _ = fuse_reply_err(raw, EIO)
            return
        }
        // Registered before the task starts: once the task replied, `raw` may be freed.
        fuse_req_interrupt_func(raw, interruptTrampoline, UnsafeMutableRawPointer(bitPattern: id))
        let fileSystem = self.fileSystem
        let pending = self.pending
        let logger = self.logger
        let task = Task {
            let outcome: Result<T, FileSystemError>
            do throws(FileSystemError) {
                outcome = .success(try await work(fileSystem, context))
            } catch {
                outcome = .failure(error)
            }
            let answer = { @Sendable in
                pending.complete(id) { request in
                    Dispatcher.send(outcome, to: request.raw, operation, logger: logger, reply: reply)
                }
            }
            // A reply that copies much (a read: pread from the cache file, then 1 MiB into the
            // kernel) runs on the blocking pool: on the 2-thread cooperative pool it delayed the
            // download task that the next readers wait for (D-219). A small one is sent from here:
            // the hop cost more than the copy (a cold small file, D-524).
            if case .success(let value) = outcome, replyBlocks(value) {
                await BlockingIOPool.shared.run(answer)
            } else {
                answer()
            }
        }
        pending.attach(id, task: task)
    }

    /// Answers on this (libfuse) thread when `now` can; false when it cannot and the caller must
    /// `respond` (the slow path's closure is only made then: a closure capturing the request's
    /// arguments is a heap allocation, on every LOOKUP if it were passed here). Most lookups,
    /// getattrs and reads of cached bytes end here: no task, no thread hop, no registration.
    /// An answer `replyInline` declines (a large read: the reply copies it) is sent from the
    /// blocking pool instead, so the loop thread goes back to reading requests at once (D-222).
    func answerNow<T: Sendable>(
        _ raw: fuse_req_t?, _ operation: StaticString, replyInline: (T) -> Bool = { _ in true },
        now: (any FileSystemFastPath, RequestContext) -> Result<T, FileSystemError>?,
        reply: @escaping @Sendable (fuse_req_t, T) -> Int32
    ) -> Bool {
        guard let raw, let fastPath, let outcome = now(fastPath, Dispatcher.context(raw)) else { return false }
        switch outcome {
        case .success(let value) where !replyInline(value):
            // Registered like a task's request: a reply still queued when the loop ends is
            // answered (EIO) before the session goes away, never after.
            guard let id = pending.register(FUSERequest(raw: raw)) else {
                _ = fuse_reply_err(raw, EIO)
                return true
            }
            let pending = self.pending
            let logger = self.logger
            BlockingIOPool.shared.execute {
                pending.complete(id) { request in
                    Dispatcher.send(.success(value), to: request.raw, operation, logger: logger, reply: reply)
                }
            }
        default:
            Dispatcher.send(outcome, to: raw, operation, logger: logger, reply: reply)
        }
        return true
    }

    /// Replies with the value or the error's errno; libfuse's result is only logged (the kernel
    /// may have given up on the request, e.g. the caller was killed).
    private static func send<T>(
        _ outcome: Result<T, FileSystemError>, to request: fuse_req_t, _ operation: StaticString, logger: Logger,
        reply: (fuse_req_t, T) -> Int32
    ) {
        switch outcome {
        case .success(let value):
            let rc = reply(request, value)
            if rc != 0 { logger.debug("\(operation): reply failed: \(Errno(-rc).name)") }
        case .failure(let error):
            logger.debug("\(operation): \(error)")
            _ = fuse_reply_err(request, error.errno.rawValue)
        }
    }

    /// Like `respond` for operations whose success is an empty reply.
    func respondStatus(
        _ raw: fuse_req_t?, _ operation: StaticString,
        work: @escaping @Sendable (any FileSystem, RequestContext) async throws(FileSystemError) -> Void
    ) {
        respond(raw, operation, work: work) { request, _ in fuse_reply_err(request, 0) }
    }
}

/// FUSE_INTERRUPT for a registered request: `data` carries the pending-reply id.
private let interruptTrampoline: fuse_interrupt_func_t = { request, data in
    guard let request else { return }
    let thread = fuse_req_ctx(request)?.pointee.pid ?? 0
    Dispatcher.from(request).interrupted(UInt(bitPattern: data), thread: thread)
}

extension Dispatcher {
    /// The kernel interrupted request `id` of `thread` because a signal is pending for it. A
    /// signal a program takes as a notification (SIGCHLD, SIGWINCH, …; `InterruptSignals`) does
    /// not end the wait: its handler usually counts on SA_RESTART, and the kernel would hand it
    /// our EINTR anyway. The kernel sends one interrupt per request, so the thread's pending
    /// signals are then watched until the request is answered, and a later signal that does stop
    /// (Ctrl-C, SIGTERM, SIGKILL…) still ends it (D-287).
    func interrupted(_ id: UInt, thread: Int32) {
        let pendingSignals = ProcessInfoFiles.pendingSignals(ofThread: thread)
        if InterruptSignals.endsWait(pendingSignals, atInterrupt: true) {
            pending.interrupt(id)
            return
        }
        logger.debug("interrupt of request \(id) (thread \(thread)) by a notification signal: the request goes on")
        let pending = self.pending
        Task.detached {
            while pending.isWaiting(id) {
                try? await Task.sleep(for: InterruptSignals.watchInterval)
                if InterruptSignals.endsWait(ProcessInfoFiles.pendingSignals(ofThread: thread), atInterrupt: false) {
                    pending.interrupt(id)
                    return
                }
            }
        }
    }
}

/// Which pending signals end a request's wait (D-287).
enum InterruptSignals {
    /// Signals programs install handlers for to be told of something, counting on SA_RESTART:
    /// SIGCHLD, SIGWINCH, SIGURG, SIGALRM, SIGVTALRM, SIGPROF, SIGCONT, SIGIO, and 32–64 (glibc's
    /// own thread signals and the real-time signals, used for timers and AIO).
    static let notifications: UInt64 = {
        var mask: UInt64 = 0
        for signal in [SIGCHLD, SIGWINCH, SIGURG, SIGALRM, SIGVTALRM, SIGPROF, SIGCONT, SIGIO] {
            mask |= 1 << UInt64(signal - 1)
        }
        for signal in 32...64 { mask |= 1 << UInt64(signal - 1) }
        return mask
    }()

    /// How often an ignored interrupt's thread is looked at again.
    static let watchInterval = Duration.milliseconds(50)

    /// True when `pending` (nil: the thread is gone) holds a signal that is not a notification.
    /// At the interrupt itself, also when no signal is seen at all (it was taken already, or the
    /// kernel had another reason): the interrupt is honoured as before.
    static func endsWait(_ pending: UInt64?, atInterrupt: Bool) -> Bool {
        guard let pending else { return true }
        if pending & ~notifications != 0 { return true }
        return atInterrupt && pending == 0
    }
}

// MARK: - Conversions between kernel structs and the FileSystem vocabulary

extension Timestamp {
    init(_ time: timespec) { self.init(seconds: Int64(time.tv_sec), nanoseconds: Int32(time.tv_nsec)) }
    var timespecValue: timespec { timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds)) }
}

extension Duration {
    /// Seconds as libfuse wants them for timeouts.
    var fuseSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}

extension NodeType {
    var modeBits: mode_t {
        switch self {
        case .regular: S_IFREG
        case .directory: S_IFDIR
        case .symbolicLink: S_IFLNK
        case .fifo: S_IFIFO
        case .socket: S_IFSOCK
        case .characterDevice: S_IFCHR
        case .blockDevice: S_IFBLK
        }
    }
}

extension NodeAttributes {
    var statValue: stat {
        var result = stat()
        result.st_ino = ino_t(serialNumber)  // the item's number, not the node id (D-389)
        result.st_mode = type.modeBits | mode_t(permissions & 0o7777)
        result.st_nlink = nlink_t(linkCount)
        result.st_uid = uid
        result.st_gid = gid
        result.st_size = off_t(size)
        result.st_blocks = blkcnt_t(blocks)
        result.st_blksize = blksize_t(blockSize)
        result.st_atim = accessTime.timespecValue
        result.st_mtim = modificationTime.timespecValue
        result.st_ctim = changeTime.timespecValue
        result.st_rdev = dev_t(device)
        return result
    }
}

extension Entry {
    var entryParam: fuse_entry_param {
        var result = fuse_entry_param()
        result.ino = fuse_ino_t(inode.rawValue)
        result.generation = generation
        result.attr = attributes.statValue
        result.attr_timeout = attributeTimeout.fuseSeconds
        result.entry_timeout = entryTimeout.fuseSeconds
        return result
    }
}

extension FileSystemStatistics {
    var statvfsValue: statvfs {
        var result = statvfs()
        result.f_bsize = UInt(blockSize)
        result.f_frsize = UInt(blockSize)
        result.f_blocks = fsblkcnt_t(totalBlocks)
        result.f_bfree = fsblkcnt_t(freeBlocks)
        result.f_bavail = fsblkcnt_t(availableBlocks)
        result.f_files = fsfilcnt_t(totalFiles)
        result.f_ffree = fsfilcnt_t(freeFiles)
        result.f_favail = fsfilcnt_t(freeFiles)
        result.f_namemax = UInt(maximumNameLength)
        return result
    }
}

/// Copies a C string argument (a name in a directory) into a Swift String. Names are bytes on
/// Linux; invalid UTF-8 is repaired, which can only make such a name not match (ENOENT).
@inline(__always) func decodeName(_ pointer: UnsafePointer<CChar>?) -> String {
    guard let pointer else { return "" }
    return String(cString: pointer)
}
