// Session lifecycle: fuse_session_new → signal handlers → mount → multi-threaded loop → drain the
// deferred replies → unmount → FileSystem.shutdown → destroy. Runs on a dedicated thread so the
// Swift cooperative pool (2 threads on 2 cores) never loses a thread to the loop.

import CFuse3
import Diagnostics
import Foundation
import Synchronization
import SystemSupport
public import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// How the kernel mount is set up.
public struct FUSEMountOptions: Sendable {
    /// Shown as the mount's source in mountinfo, `mount` and `df` (e.g. the provider's source).
    public var fileSystemName: String
    /// The type suffix: the mount shows as `fuse.<subtype>`.
    public var subtype: String
    /// Let other users (and root) in. Needs `user_allow_other` in /etc/fuse.conf for non-root.
    public var allowOther: Bool
    /// Mount read-only in the kernel (writes then fail with EROFS before reaching the daemon).
    public var readOnly: Bool
    /// libfuse worker threads. 1 (the default): libfuse's single-threaded loop, which suits
    /// callbacks that never block (they answer from memory or hand the work to a task; large read
    /// replies go to the blocking pool) and answers a stream of lookups 10–30 % faster than the
    /// multi-threaded loop, whose idle threads take turns (D-222). More: the multi-threaded loop
    /// with up to that many threads, for file systems whose callbacks may block.
    public var maxThreads: Int
    /// How long the kernel may cache attributes returned by getattr/setattr.
    public var attributeTimeout: Duration
    /// When set, written to /sys/class/bdi/<dev>/read_ahead_kb after mounting (root only): 1 MiB
    /// read requests instead of 128 KiB for buffered sequential reads (swift-fuse-notes §3).
    public var readAheadKiB: Int?
    /// libfuse's own request trace on stderr (`-d`).
    public var debug: Bool
    /// FUSE passthrough: reads of a handle the file system opened with `OpenedFile.servedFrom`
    /// are done by the kernel on that file (Linux ≥ 6.9, daemon with CAP_SYS_ADMIN). When the
    /// kernel or the privileges do not allow it, reads go through the daemon as without it. False
    /// leaves libfuse's I/O untouched.
    public var passthrough: Bool
    /// Ask the kernel for FUSE_DIRECT_IO_ALLOW_MMAP (Linux ≥ 6.6): mmap(MAP_SHARED) of a handle the
    /// file system opened with direct I/O goes through the node's page cache instead of failing
    /// with ENODEV. A writable mount needs it: every handle there is direct I/O (D-363, D-376).
    public var directIOMmap: Bool
    /// Tests only: every backing-file registration fails with this errno instead of reaching the
    /// kernel, as it does for a daemon without CAP_SYS_ADMIN (EPERM).
    public var simulatedBackingFailure: Int32?
    /// Further `-o` options passed to libfuse as they are.
    public var extraOptions: [String]

    /// The defaults documented in docs/SEMANTICS.md.
    public init(
        fileSystemName: String = "providerfs", subtype: String = "providerfs", allowOther: Bool = false,
        readOnly: Bool = false, maxThreads: Int = 1, attributeTimeout: Duration = .seconds(1),
        readAheadKiB: Int? = 1024, debug: Bool = false, passthrough: Bool = true, directIOMmap: Bool = false,
        extraOptions: [String] = []
    ) {
        self.directIOMmap = directIOMmap
        self.fileSystemName = fileSystemName
        self.subtype = subtype
        self.allowOther = allowOther
        self.readOnly = readOnly
        self.maxThreads = maxThreads
        self.attributeTimeout = attributeTimeout
        self.readAheadKiB = readAheadKiB
        self.debug = debug
        self.passthrough = passthrough
        self.extraOptions = extraOptions
    }

    /// The `-o` list given to `fuse_session_new`.
    var optionString: String {
        var options = [
            "fsname=" + escapeOption(fileSystemName), "subtype=" + escapeOption(subtype), "default_permissions",
        ]
        if allowOther { options.append("allow_other") }
        if readOnly { options.append("ro") }
        options += extraOptions
        return options.joined(separator: ",")
    }
}

/// libfuse's option parser splits on commas; a literal comma is written `\,`.
private func escapeOption(_ value: String) -> String {
    value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
}

/// Why a session could not be started. `description` is one sentence for the user.
public struct FUSEServerError: Error, Sendable, CustomStringConvertible {
    /// The sentence shown to the user.
    public var message: String
    /// An error with that sentence.
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// How a session ended.
public struct FUSEExit: Sendable, Equatable {
    /// The signal that ended it (SIGTERM, SIGINT, SIGHUP), or nil when it was unmounted.
    public var signal: Int32?
    /// Requests still unanswered when the loop ended; each got EIO.
    public var abandonedRequests: Int
}

/// Serves one `FileSystem` at one mount point until it is unmounted or the process is signalled.
///
/// Only one server may run per process: the termination-signal handlers are process-wide.
public final class FUSEServer: Sendable {
    /// Where the file system is mounted.
    public let mountpoint: String
    private let options: FUSEMountOptions
    private let fileSystem: any FileSystem
    private let logger = Logger(label: "fuse")
    private let onReady: @Sendable () -> Void

    /// `onReady` runs once, off the loop threads, after the kernel finished the INIT handshake.
    public init(
        fileSystem: any FileSystem, mountpoint: String, options: FUSEMountOptions = FUSEMountOptions(),
        onReady: @escaping @Sendable () -> Void = {}
    ) {
        self.fileSystem = fileSystem
        self.mountpoint = mountpoint
        self.options = options
        self.onReady = onReady
    }

    /// Mounts and serves on a dedicated thread; returns when the session has ended and is unmounted.
    public func run() async throws(FUSEServerError) -> FUSEExit {
        let result: Result<FUSEExit, FUSEServerError> = await withCheckedContinuation { continuation in
            let thread = Thread { [self] in
                do throws(FUSEServerError) {
                    continuation.resume(returning: .success(try runOnCurrentThread()))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
            thread.name = "fuse-loop"
            thread.start()
        }
        return try result.get()
    }

    /// Mounts and serves on the calling thread (which must not be a Swift concurrency thread).
    public func runOnCurrentThread() throws(FUSEServerError) -> FUSEExit {
        let readAhead = options.readAheadKiB
        let mountpoint = self.mountpoint
        let logger = self.logger
        let onReady = self.onReady
        let dispatcher = Dispatcher(fileSystem: fileSystem, options: options, logger: logger) {
            // INIT runs on a loop thread; what follows may take a moment, so it goes elsewhere.
            Thread.detachNewThread {
                if let readAhead { raiseReadAhead(mountpoint: mountpoint, kib: readAhead, logger: logger) }
                onReady()
            }
        }

        var arguments = ["providerfs", "-o", options.optionString]
        if options.debug { arguments.append("-d") }
        let argv = arguments.map { strdup($0) }
        defer { argv.forEach { free($0) } }
        var cArguments = argv + [nil]
        var ops = Dispatcher.makeOperations()
        let userdata = Unmanaged.passRetained(dispatcher).toOpaque()
        defer { Unmanaged<Dispatcher>.fromOpaque(userdata).release() }

        let session = cArguments.withUnsafeMutableBufferPointer { buffer -> OpaquePointer? in
            var fuseArguments = cfuse_args_init(Int32(arguments.count), buffer.baseAddress)
            defer { fuse_opt_free_args(&fuseArguments) }
            return fuse_session_new(&fuseArguments, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata)
        }
        guard let session else {
            throw FUSEServerError("libfuse refused the mount options '\(options.optionString)'")
        }
        defer { fuse_session_destroy(session) }

        installTerminationHandlers(session: session)
        defer { removeTerminationHandlers() }

        // libfuse opens /dev/fuse itself (directly as root, through fusermount3 otherwise) and
        // only prints why it failed: say it plainly when the device is the problem.
        if access("/dev/fuse", R_OK | W_OK) != 0 {
            let reason = Errno.current.message
            throw FUSEServerError(
                "cannot mount at \(mountpoint): /dev/fuse is not usable (\(reason)); FUSE needs read and write "
                    + "access to it (Debian makes it crw-rw-rw-; a container needs --device /dev/fuse)")
        }
        guard fuse_session_mount(session, mountpoint) == 0 else {
            throw FUSEServerError(
                "cannot mount at \(mountpoint): libfuse could not mount it (its reason is in the daemon's log)")
        }
        logger.info("mounted at \(mountpoint) with -o \(options.optionString)")
        // Requests and replies pass through our hooks from here on (the kernel's INIT is queued
        // but not read before the loop starts), so the INIT reply can offer passthrough and mmap
        // of direct I/O handles.
        if options.passthrough || options.directIOMmap {
            installPassthroughHooks(session: session, passthrough: dispatcher.passthrough)
        }
        if !options.passthrough {
            logger.info("passthrough: off for this mount; reads go through the daemon")
        }

        // From here the file system may tell the kernel what changed (D-228).
        let coherent = fileSystem as? any KernelCacheCoherent
        let notifier = coherent.map { _ in KernelNotifier(session: session, logger: logger) }
        if let coherent, let notifier { coherent.setKernelInvalidation { notifier.send($0) } }

        let loopResult: Int32
        if options.maxThreads <= 1 {
            // This thread reads and answers; a termination signal is forwarded to it and
            // interrupts its read (no SA_RESTART), after which the loop sees the exit flag.
            loopResult = fuse_session_loop(session)
        } else {
            let config = fuse_loop_cfg_create()
            defer { fuse_loop_cfg_destroy(config) }
            fuse_loop_cfg_set_clone_fd(config, 0)
            fuse_loop_cfg_set_max_threads(config, UInt32(options.maxThreads))
            loopResult = fuse_session_loop_mt(session, config)
        }
        let received = signalReceived.load(ordering: .relaxed)
        let signal: Int32? = received != 0 ? received : (loopResult > 0 ? loopResult : nil)
        logger.info("loop ended (\(signal.map { "signal \($0)" } ?? "unmounted, rc \(loopResult)"))")

        // Answer what is left while the session is alive, then unmount, then let the file system
        // flush with no request able to arrive.
        let abandoned = dispatcher.pending.shutdown(error: EIO)
        coherent?.setKernelInvalidation(nil)
        if let counts = notifier?.stop() {
            logger.info("kernel invalidations: \(counts.sent) sent, \(counts.failed) refused")
        }
        if options.passthrough { logger.info(dispatcher.passthrough.summary) }
        fuse_session_unmount(session)
        let semaphore = DispatchSemaphore(value: 0)
        let fileSystem = self.fileSystem
        Task {
            await fileSystem.shutdown()
            semaphore.signal()
        }
        semaphore.wait()
        return FUSEExit(signal: signal, abandonedRequests: abandoned)
    }
}

/// Routes the session's /dev/fuse reads and writes through `Passthrough` (libfuse 3.14 has no
/// passthrough API; `fuse_session_custom_io` after mounting only stores the hooks and the fd).
private func installPassthroughHooks(session: OpaquePointer, passthrough: Passthrough) {
    var io = fuse_custom_io()
    io.read = passthroughReadHook
    io.writev = passthroughWritevHook
    let fd = fuse_session_fd(session)
    let rc = fuse_session_custom_io(session, &io, fd)
    if rc == 0 {
        passthrough.attach(deviceFD: fd)
    } else {
        passthrough.disable("libfuse refused the I/O hooks (\(Errno(-rc).name))")
    }
}

/// read(2) of one request; `userdata` is the session's, the Dispatcher.
let passthroughReadHook: @convention(c) (Int32, UnsafeMutableRawPointer?, Int, UnsafeMutableRawPointer?) -> Int = {
    fd, buffer, length, userdata in
    let count = read(fd, buffer, length)
    if count > 0, let buffer, let userdata {
        // errno is only read by libfuse when count is -1, so the bookkeeping may touch it.
        Unmanaged<Dispatcher>.fromOpaque(userdata).takeUnretainedValue().passthrough.received(
            UnsafeRawPointer(buffer), count: count)
    }
    return count
}

/// writev(2) of one reply, possibly rewritten; keeps writev's errno for libfuse.
let passthroughWritevHook:
    @convention(c) (Int32, UnsafeMutablePointer<iovec>?, Int32, UnsafeMutableRawPointer?) -> Int = {
        fd, iov, count, userdata in
        guard let iov, let userdata else { return writev(fd, iov, count) }
        return Unmanaged<Dispatcher>.fromOpaque(userdata).takeUnretainedValue().passthrough.send(fd, iov, count)
    }

/// Writes read_ahead_kb for the mount's backing device info. Failure only costs throughput.
private func raiseReadAhead(mountpoint: String, kib: Int, logger: Logger) {
    let canonical = mountPointPath(mountpoint)
    guard let entry = MountTable.entry(at: canonical) else {
        logger.warning("read_ahead_kb: \(canonical) not found in mountinfo")
        return
    }
    let path = "/sys/class/bdi/\(entry.device)/read_ahead_kb"
    let fd = open(path, O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else {
        logger.info("read_ahead_kb: cannot open \(path): \(Errno.current.name) (kernel default kept)")
        return
    }
    defer { close(fd) }
    let text = Array("\(kib)\n".utf8)
    if text.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) < 0 {
        logger.info("read_ahead_kb: write \(path): \(Errno.current.name) (kernel default kept)")
    } else {
        logger.info("read_ahead_kb = \(kib) for \(entry.device)")
    }
}

// MARK: - Termination signals

// libfuse's own handlers only install over SIG_DFL (a background job inherits SIGINT ignored) and
// rely on the loop thread being the one that receives the signal; in a Swift process any pool
// thread may get it. These handlers mark the session as exiting and forward the signal to the loop
// thread, whose interrupted read (single-threaded loop) or sem_wait (multi-threaded loop) then
// sees the exit flag (swift-fuse-notes §4, pitfall 10).

// The session and loop thread the handler acts on, as atomics: written before the handlers are
// installed and cleared after they are removed, read by a handler on any thread. Lock-free atomics
// are async-signal-safe; locks are not.
private let signalSession = Atomic<UInt>(0)
private let signalLoopThread = Atomic<UInt>(0)
/// The last termination signal received (0: none), read by the loop thread after the loop ends.
private let signalReceived = Atomic<Int32>(0)

private let terminationSignals: [Int32] = [SIGINT, SIGTERM, SIGHUP]

private let terminationHandler: @convention(c) (Int32) -> Void = { signal in
    guard let session = OpaquePointer(bitPattern: signalSession.load(ordering: .acquiring)) else { return }
    signalReceived.store(signal, ordering: .relaxed)
    fuse_session_exit(session)
    let loopThread = pthread_t(signalLoopThread.load(ordering: .acquiring))
    if pthread_equal(pthread_self(), loopThread) == 0 {
        pthread_kill(loopThread, signal)
    }
}

private func installTerminationHandlers(session: OpaquePointer) {
    signalLoopThread.store(UInt(pthread_self()), ordering: .releasing)
    signalSession.store(UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(session))), ordering: .releasing)
    var action = sigaction()
    action.__sigaction_handler.sa_handler = terminationHandler
    sigemptyset(&action.sa_mask)
    action.sa_flags = 0  // no SA_RESTART: the loop thread's read or sem_wait must return EINTR
    for signal in terminationSignals { sigaction(signal, &action, nil) }
    Glibc.signal(SIGPIPE, SIG_IGN)
    // A parent may have spawned us with these blocked (Foundation.Process from a pool thread).
    var set = sigset_t()
    sigemptyset(&set)
    for signal in terminationSignals { sigaddset(&set, signal) }
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
}

private func removeTerminationHandlers() {
    for signal in terminationSignals { Glibc.signal(signal, SIG_DFL) }
    signalSession.store(0, ordering: .releasing)
}
