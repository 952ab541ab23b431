// What the kernel reads in reply to an OPEN: the file system's keep-cache and direct-I/O answers
// must reach it as FOPEN_KEEP_CACHE / FOPEN_DIRECT_IO, and a handle passed through carries
// FOPEN_PASSTHROUGH and neither of them. No /dev/fuse: a real libfuse session (no mount) reads its
// requests from one end of a SOCK_SEQPACKET socket pair and writes its replies there, through the
// same hooks as a mount (Passthrough's `received`/`send`); the test is the kernel at the other
// end. Everything between the request and the bytes the kernel reads is production code:
// libfuse's parsing, the OPEN callback, the file system (a scripted one), `replyInfo`,
// `fuse_reply_open` and the passthrough rewrite.

import CFuse3
import Diagnostics
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

@testable import FUSEAdapter

#if canImport(Glibc)
import Glibc
#endif

@Suite("The adapter's OPEN reply reaches the kernel with the file system's answer", .timeLimit(.minutes(3)))
struct OpenReplyTests {
    @Test(
        "keep_cache and direct_io as the file system answered; a passthrough handle has neither",
        arguments: [true, false])
    func openFlagsReachTheKernel(answeredAtOnce: Bool) async throws {
        let fileSystem = ScriptedFileSystem()
        fileSystem.immediate = answeredAtOnce
        let cases: [(inode: UInt64, file: ScriptedFileSystem.File, flags: UInt32)] = [
            (2, ScriptedFileSystem.File(servedFrom: nil, keepCache: true), FUSEKernelABI.fopenKeepCache),
            (3, ScriptedFileSystem.File(servedFrom: nil, keepCache: false), 0),
            (
                4, ScriptedFileSystem.File(servedFrom: nil, directIO: true, keepCache: false),
                FUSEKernelABI.fopenDirectIO
            ),
            (
                5, ScriptedFileSystem.File(servedFrom: nil, directIO: true, keepCache: true),
                FUSEKernelABI.fopenDirectIO | FUSEKernelABI.fopenKeepCache
            ),
            (6, ScriptedFileSystem.File(servedFrom: "/cache/6", keepCache: true), FUSEKernelABI.fopenPassthrough),
        ]
        for (inode, file, _) in cases { fileSystem.set(InodeNumber(inode), file) }
        let session = try UnmountedSession(fileSystem: fileSystem)
        defer { session.close() }
        try await session.initialize()
        for (inode, file, expected) in cases {
            let reply = try await session.open(node: inode)
            #expect(reply.error == 0, "open of \(inode) (\(file)): error \(reply.error)")
            #expect(
                reply.flags == expected,
                "open of \(inode) (\(file)): the kernel reads open_flags 0x\(String(reply.flags, radix: 16)), expected 0x\(String(expected, radix: 16))"
            )
        }
    }
}

/// A libfuse session over a socket pair, driven one request at a time by the test.
final class UnmountedSession: @unchecked Sendable {
    // Confined to the test's task.
    let session: OpaquePointer
    /// The kernel's end: requests are written here, replies read from here.
    let kernel: Int32
    let userdata: UnsafeMutableRawPointer
    let fakeKernel: FakeKernel
    var unique: UInt64 = 1

    init(fileSystem: any FileSystem) throws {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw Errno.current
        }
        kernel = fds[0]
        let fakeKernel = FakeKernel()
        self.fakeKernel = fakeKernel
        let logger = Logger(label: "open-reply")
        let passthrough = Passthrough(
            requested: true, logger: logger, backing: fakeKernel.backing, conflictRetries: 1, conflictRetryDelay: .zero)
        passthrough.attach(deviceFD: fds[1])
        let dispatcher = Dispatcher(
            fileSystem: fileSystem, options: FUSEMountOptions(), logger: logger, passthrough: passthrough
        ) {}
        let userdata = Unmanaged.passRetained(dispatcher).toOpaque()
        self.userdata = userdata
        var ops = Dispatcher.makeOperations()
        let argv = [strdup("open-reply-test")]
        defer { argv.forEach { free($0) } }
        var cArguments = argv + [nil]
        let made = cArguments.withUnsafeMutableBufferPointer { buffer -> OpaquePointer? in
            var arguments = cfuse_args_init(1, buffer.baseAddress)
            defer { fuse_opt_free_args(&arguments) }
            return fuse_session_new(&arguments, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata)
        }
        guard let made else {
            Unmanaged<Dispatcher>.fromOpaque(userdata).release()
            Glibc.close(fds[0])
            Glibc.close(fds[1])
            throw TestSupportError("fuse_session_new failed")
        }
        session = made
        var io = fuse_custom_io()
        // The mount's own hooks (FUSEServer): replies pass through Passthrough as a mount's do.
        io.read = passthroughReadHook
        io.writev = passthroughWritevHook
        let rc = fuse_session_custom_io(session, &io, fds[1])
        guard rc == 0 else { throw TestSupportError("fuse_session_custom_io: \(Errno(-rc))") }
    }

    func close() {
        fuse_session_destroy(session)  // closes the session's end
        Unmanaged<Dispatcher>.fromOpaque(userdata).release()
        Glibc.close(kernel)
    }

    /// Writes `request`, has the session receive and process it, and returns the reply.
    func exchange(_ request: [UInt8]) async throws -> [UInt8] {
        let written = request.withUnsafeBytes { write(kernel, $0.baseAddress, $0.count) }
        guard written == request.count else { throw TestSupportError("request write: \(Errno.current)") }
        var buffer = fuse_buf()
        let received = fuse_session_receive_buf(session, &buffer)
        defer { free(buffer.mem) }
        guard received > 0 else { throw TestSupportError("fuse_session_receive_buf: \(received)") }
        fuse_session_process_buf(session, &buffer)
        // The reply comes at once (answered on this thread) or from a task: wait, bounded (with
        // room for a task queued behind a loaded run's other tests).
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            var reply = [UInt8](repeating: 0, count: 4096)
            let count = reply.withUnsafeMutableBytes { recv(kernel, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count > 0 { return Array(reply[0..<count]) }
            try await Task.sleep(for: .milliseconds(1))
        }
        throw TestSupportError("no reply within 30 s")
    }

    func nextUnique() -> UInt64 {
        defer { unique += 1 }
        return unique
    }

    /// INIT, offering FUSE_PASSTHROUGH as a 6.9 kernel does.
    func initialize() async throws {
        var request = [UInt8](repeating: 0, count: FUSEKernelABI.inHeaderSize + 64)
        request.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(raw.count), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.opcodeInit, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: nextUnique(), toByteOffset: 8, as: UInt64.self)
            let body = FUSEKernelABI.inHeaderSize
            raw.storeBytes(of: 7, toByteOffset: body, as: UInt32.self)
            raw.storeBytes(of: 40, toByteOffset: body + 4, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.initExt, toByteOffset: body + FUSEKernelABI.initInFlags, as: UInt32.self)
            raw.storeBytes(
                of: FUSEKernelABI.passthroughInFlags2, toByteOffset: body + FUSEKernelABI.initInFlags2, as: UInt32.self)
        }
        let reply = try await exchange(request)
        let error = reply.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: Int32.self) }
        guard reply.count > FUSEKernelABI.outHeaderSize, error == 0 else {
            throw TestSupportError("INIT failed: \(reply.count) bytes, error \(error)")
        }
    }

    /// OPEN (read-only) of `node`: the reply's error and, on success, its open_flags.
    func open(node: UInt64) async throws -> (error: Int32, flags: UInt32) {
        var request = [UInt8](repeating: 0, count: FUSEKernelABI.inHeaderSize + 8)
        request.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: UInt32(raw.count), toByteOffset: 0, as: UInt32.self)
            raw.storeBytes(of: FUSEKernelABI.opcodeOpen, toByteOffset: 4, as: UInt32.self)
            raw.storeBytes(of: nextUnique(), toByteOffset: 8, as: UInt64.self)
            raw.storeBytes(of: node, toByteOffset: 16, as: UInt64.self)
        }
        let reply = try await exchange(request)
        guard reply.count >= FUSEKernelABI.outHeaderSize else { throw TestSupportError("short reply") }
        let error = reply.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: Int32.self) }
        guard error == 0 else { return (error, 0) }
        guard reply.count >= FUSEKernelABI.outHeaderSize + FUSEKernelABI.openOutSize else {
            throw TestSupportError("OPEN reply of \(reply.count) bytes")
        }
        let flags = reply.withUnsafeBytes {
            $0.loadUnaligned(fromByteOffset: FUSEKernelABI.outHeaderSize + FUSEKernelABI.openOutFlags, as: UInt32.self)
        }
        return (0, flags)
    }
}
