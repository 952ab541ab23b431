// fuse-fixture MOUNTPOINT [--tree DIR] [--slow-delay DURATION] [--max-threads N] [--subtype NAME] [--debug]
//              [--backing-files DIR [--backing-open-fails ERRNO]] [--no-passthrough]
//
// Serves an in-memory copy of DIR (plus `slow.txt`, whose reads wait --slow-delay, and
// `xattrs.txt`, which carries extended attributes) through FUSEAdapter in the foreground. The
// mount tests use it to test the adapter without a provider. With --backing-files, the files are
// also written to DIR and opens offer them for FUSE passthrough; --backing-open-fails makes every
// backing registration fail with ERRNO (as for a daemon without CAP_SYS_ADMIN). Prints "READY"
// when mounted; exits 0 when unmounted or on SIGTERM/SIGINT/SIGHUP.

import Diagnostics
import FUSEAdapter
import SystemSupport
import TestSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

func fail(_ message: String) -> Never {
    var text = Array("fuse-fixture: \(message)\n".utf8)
    _ = text.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
    exit(64)
}

func runFixture() async -> Int32 {
    var arguments = Array(CommandLine.arguments.dropFirst())
    var tree: [String: InMemoryNode] = [:]
    var slowDelay = Duration.milliseconds(300)
    var maxThreads = 10
    var mountpoint: String?
    var debug = false
    var subtype = "fuse-fixture"
    var backingDirectory: String?
    var backingFailure: Int32?
    var passthrough = true
    while !arguments.isEmpty {
        let argument = arguments.removeFirst()
        switch argument {
        case "--tree":
            guard !arguments.isEmpty else { fail("--tree needs a directory") }
            tree = InMemoryNode.load(directory: arguments.removeFirst())
        case "--slow-delay":
            guard !arguments.isEmpty, let value = try? parseDuration(arguments.removeFirst()) else {
                fail("--slow-delay needs a duration")
            }
            slowDelay = value
        case "--subtype":
            guard !arguments.isEmpty else { fail("--subtype needs a name") }
            subtype = arguments.removeFirst()
        case "--debug":
            debug = true
        case "--backing-files":
            guard !arguments.isEmpty else { fail("--backing-files needs a directory") }
            backingDirectory = arguments.removeFirst()
        case "--backing-open-fails":
            guard !arguments.isEmpty, let error = Errno(parsing: arguments.removeFirst()) else {
                fail("--backing-open-fails needs an errno name")
            }
            backingFailure = error.rawValue
        case "--no-passthrough":
            passthrough = false
        case "--max-threads":
            guard !arguments.isEmpty, let value = Int(arguments.removeFirst()) else {
                fail("--max-threads needs a number")
            }
            maxThreads = value
        default:
            guard mountpoint == nil, !argument.hasPrefix("--") else { fail("unexpected argument '\(argument)'") }
            mountpoint = argument
        }
    }
    // With --debug, the adapter's own lines (passthrough negotiation, …) join libfuse's trace.
    if debug { LoggingSystem.bootstrap(sink: FileDescriptorLogSink(fd: 2), level: .info) }
    guard let mountpoint else {
        fail(
            "usage: fuse-fixture MOUNTPOINT [--tree DIR] [--slow-delay D] [--max-threads N] [--subtype NAME] "
                + "[--debug] [--backing-files DIR [--backing-open-fails ERRNO]] [--no-passthrough]")
    }
    tree["slow.txt"] = .file(Array(String(repeating: "slow\n", count: 100).utf8))
    tree["xattrs.txt"] = .file(
        Array("has attributes\n".utf8),
        extendedAttributes: [
            "user.providerfs.state": Array("materialized".utf8),
            "user.test.big": [UInt8](repeating: UInt8(ascii: "x"), count: 3000),
        ])
    let fileSystem = InMemoryFileSystem(root: tree, slowReadDelay: slowDelay, backingDirectory: backingDirectory)
    var options = FUSEMountOptions(
        fileSystemName: "fuse-fixture", subtype: subtype, maxThreads: maxThreads, debug: debug,
        passthrough: passthrough)
    options.simulatedBackingFailure = backingFailure
    let server = FUSEServer(fileSystem: fileSystem, mountpoint: mountpoint, options: options) {
        var line = Array("READY\n".utf8)
        _ = line.withUnsafeMutableBytes { write(1, $0.baseAddress, $0.count) }
    }
    do {
        let end = try await server.run()
        var line = Array("EXIT signal=\(end.signal ?? 0) abandoned=\(end.abandonedRequests)\n".utf8)
        _ = line.withUnsafeMutableBytes { write(1, $0.baseAddress, $0.count) }
        return 0
    } catch {
        var line = Array("fuse-fixture: \(error)\n".utf8)
        _ = line.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
        return 1
    }
}

exit(await runFixture())
