// FUSE passthrough (docs/SEMANTICS.md "Passthrough", decisions D-261…D-264): reads of a file that
// was complete in the cache when it was opened are done by the kernel on the cache file and never
// reach the daemon; anything else still goes through it. "Reached the daemon" is counted in
// libfuse's own request trace (PROVIDERFS_FUSE_DEBUG=1 / `--debug`: one line per request with its
// opcode and node), after dropping the page cache so that nothing is served from memory.
// These run on `--read-only` mounts; a writable mount's readers use passthrough and the page cache
// on a node of their version alone (D-435, VersionNodeMountTests). The backing file is the cache's,
// whatever the provider: the first two run over the same tree served by rclone and Apache too
// (issue 26); the others are about the demo's partial file, a mount option, and a source change
// the local directory reports at once.

import FUSEAdapter
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// FUSE READ requests the daemon received for `node`, from libfuse's trace in its stderr.
func readRequests(_ mount: MountedFileSystem, node: String) -> Int {
    mount.child.standardError.split(separator: "\n").count {
        $0.contains("opcode: READ (15), nodeid: \(node),")
    }
}

/// The node number of a path on the mount (st_ino is the FUSE node id).
func nodeNumber(_ path: String) throws -> String {
    try shell("stat -c %i \(quoted(path))").output.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// Forgets the cached pages of `path` (the FUSE file's, and with root the whole page cache), so
/// that the next read must be served by the daemon or by passthrough, not from memory. Only pages:
/// dropping dentries and inodes too (drop_caches 3) would make the kernel forget the node, and
/// its next lookup would get a new node number.
func dropPageCache(_ path: String) throws {
    let script =
        "import os; fd = os.open(os.sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)"
    #expect(try shell("python3 -c \(quoted(script)) \(quoted(path))").status == 0)
    if getuid() == 0 { _ = try shell("sync; echo 1 > /proc/sys/vm/drop_caches") }
}

/// Everything left to read from `fd`.
func readAll(_ fd: Int32) -> [UInt8] {
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count <= 0 { return result }
        result += buffer[0..<count]
    }
}

/// Waits (up to 10 s) until the daemon has received a RELEASE for every handle of `node` it
/// opened (libfuse's trace shows as many RELEASE as OPEN requests; only for nodes whose opens all
/// succeeded): the kernel sends RELEASE after a close returns, and the next open of the node is
/// decided by what is still open.
func waitUntilReleased(_ mount: MountedFileSystem, node: String) -> Bool {
    let deadline = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < deadline {
        let lines = mount.child.standardError.split(separator: "\n")
        let opens = lines.count { $0.contains("opcode: OPEN (14), nodeid: \(node),") }
        let releases = lines.count { $0.contains("opcode: RELEASE (18), nodeid: \(node),") }
        if opens == releases {
            usleep(50_000)  // the trace line is written just before the release is handled
            return true
        }
        usleep(20_000)
    }
    return false
}

/// Waits (up to 10 s) until `user.providerfs.state` of `path` is `state`.
func waitForState(_ path: String, _ state: String) -> Bool {
    let deadline = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < deadline {
        if case .success(let bytes) = ExtendedAttributes.value("user.providerfs.state", of: path),
            String(decoding: bytes, as: UTF8.self) == state
        {
            return true
        }
        usleep(20_000)
    }
    return false
}

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct PassthroughMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "passthrough")
        writeTestFile(source + "/big.bin", patternBytes(count: 6 << 20, seed: 21))
    }

    func mount(over kind: ProviderKind = .local, _ extra: [String] = []) throws -> ServedMount {
        try layout.mount(over: kind, arguments: ["--read-only"] + extra, environment: ["PROVIDERFS_FUSE_DEBUG": "1"])
    }

    var sourceSum: String {
        get throws { try shell("sha256sum < \(quoted(source))/big.bin").output }
    }

    @Test(arguments: ProviderKind.available)
    func aFileCompleteAtOpenIsReadByTheKernelNotTheDaemon(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let served = try mount(over: kind)
        defer { served.stop() }
        let mount = served.mount
        let file = mount.path("big.bin")
        let node = try nodeNumber(file)
        // First read: the file is a placeholder, so it is downloaded through the daemon.
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(
            mount.child.standardError.contains("passthrough: negotiated"),
            "this kernel did not negotiate FUSE passthrough: \(mount.child.standardError.suffix(2000))")
        #expect(readRequests(mount, node: node) > 0)
        #expect(waitForState(file, "materialized"))

        // Reopened once complete: with the page cache gone, every byte still arrives, and not one
        // READ reaches the daemon (the kernel reads the cache file).
        try dropPageCache(file)
        #expect(waitUntilReleased(mount, node: node))
        let before = readRequests(mount, node: node)
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(try shell("cmp \(quoted(file)) \(quoted(source))/big.bin").status == 0)
        // Several handles of one node at once share one backing registration.
        let together = try shell(
            "sha256sum < \(quoted(file)) & sha256sum < \(quoted(file)) & sha256sum < \(quoted(file)) & wait")
        #expect(together.output == String(repeating: try sourceSum, count: 3), "\(together)")
        let script = """
            import os, random, sys
            random.seed(5)
            a = open(sys.argv[1], 'rb'); b = open(sys.argv[2], 'rb')
            for _ in range(300):
                off = random.randrange(0, 6 << 20); n = random.randrange(1, 200000)
                a.seek(off); b.seek(off)
                if a.read(n) != b.read(n): print('mismatch', off, n); sys.exit(1)
            print('ok')
            """
        #expect(try shell("python3 -c \(quoted(script)) \(quoted(file)) \(quoted(source))/big.bin").output == "ok\n")
        #expect(readRequests(mount, node: node) == before, "reads of a complete file reached the daemon")
        // The daemon's state is unchanged by reads it never saw.
        #expect(waitForState(file, "materialized"))
        #expect(mount.stop() == 0)
        #expect(mount.child.standardError.contains("opens were served by the kernel from the cache file"))
    }

    @Test(arguments: ProviderKind.available)
    func aFileOpenedBeforeItWasCompleteKeepsItsNodeOnTheDaemon(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let served = try mount(over: kind)
        defer { served.stop() }
        let mount = served.mount
        let file = mount.path("big.bin")
        let node = try nodeNumber(file)
        // Handle A is opened while the file is a placeholder and stays open while B is opened
        // after the file is complete. The kernel allows no passthrough open of a node that has a
        // caching open, so B must go through the daemon (and must not fail). Once A is closed,
        // C is passed through.
        let a = open(file, O_RDONLY | O_CLOEXEC)
        #expect(a >= 0)
        var closed = false
        defer { if !closed { close(a) } }
        #expect(byteDifference(readAll(a), patternBytes(count: 6 << 20, seed: 21)) == nil)
        #expect(waitForState(file, "materialized"))

        try dropPageCache(file)
        let beforeB = readRequests(mount, node: node)
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(readRequests(mount, node: node) > beforeB, "B should be read through the daemon")

        close(a)
        closed = true
        try dropPageCache(file)
        #expect(waitUntilReleased(mount, node: node))
        let beforeC = readRequests(mount, node: node)
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(readRequests(mount, node: node) == beforeC, "C should be passed through")
        #expect(!mount.child.standardError.contains("(bug)"))
    }

    @Test func aPartlyDownloadedFileIsReadThroughTheDaemonAndItsHolesAreNeverServed() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // The demo's failing item stops at 4 MiB of 8 (EIO after the retry budget): a partial file.
        let mount = try MountedFileSystem.providerfs(
            ["--demo", "--read-only"],
            environment: [
                "PROVIDERFS_RUNTIME_DIR": runtime, "XDG_DATA_HOME": scratch + "/data",
                "XDG_CACHE_HOME": cache, "PROVIDERFS_FUSE_DEBUG": "1",
            ])
        defer { mount.stop() }
        let file = mount.path("Faults/fails-halfway.bin")
        let original = scratch + "/data/providerfs/demo/source/Faults/fails-halfway.bin"
        let node = try nodeNumber(file)
        #expect(try shell("cat \(quoted(file)) > /dev/null").status != 0)
        #expect(waitForState(file, "error"))
        try dropPageCache(file)
        let before = readRequests(mount, node: node)
        let head = "bs=1048576 count=3 status=none"
        #expect(
            try shell("dd if=\(quoted(file)) \(head) | sha256sum").output
                == (try shell("dd if=\(quoted(original)) \(head) | sha256sum").output))
        #expect(readRequests(mount, node: node) > before, "a partial file must be read through the daemon")
        // Past the present bytes: the daemon tries the provider again and fails (EIO), where a
        // passed-through sparse file would have returned zeros.
        let tail = try shell("dd if=\(quoted(file)) bs=1048576 skip=6 count=1 status=none | od -An -tx1 | head -2")
        #expect(tail.error.contains("Input/output error"), "\(tail)")
    }

    @Test func withNoPassthroughEveryReadReachesTheDaemonAsBefore() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let served = try mount(["--no-passthrough"])
        defer { served.stop() }
        let mount = served.mount
        let file = mount.path("big.bin")
        let node = try nodeNumber(file)
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(waitForState(file, "materialized"))
        #expect(mount.child.standardError.contains("passthrough: off for this mount"))
        try dropPageCache(file)
        let before = readRequests(mount, node: node)
        #expect(try shell("sha256sum < \(quoted(file))").output == (try sourceSum))
        #expect(readRequests(mount, node: node) > before)
    }

    @Test func aNewVersionCannotBeOpenedWhileAnOldOneIsPassedThrough() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let served = try mount()
        defer { served.stop() }
        let mount = served.mount
        let file = mount.path("big.bin")
        let node = try nodeNumber(file)
        #expect(try shell("cat \(quoted(file)) > /dev/null").status == 0)
        #expect(waitForState(file, "materialized"))
        #expect(waitUntilReleased(mount, node: node))
        // `old` reads the old version through passthrough; the source changes; a new open pins
        // the new version, which the kernel cannot serve on the same node at the same time: EBUSY
        // (after a short grace for releases in flight). Once `old` is closed, the new one opens.
        let old = open(file, O_RDONLY | O_CLOEXEC)
        #expect(old >= 0)
        var closed = false
        defer { if !closed { close(old) } }
        let appended = open(source + "/big.bin", O_WRONLY | O_APPEND | O_CLOEXEC)
        #expect(write(appended, "appended", 8) == 8)
        close(appended)
        let refused = try shell("cat \(quoted(file)) > /dev/null")
        #expect(refused.status != 0)
        #expect(refused.error.contains("Device or resource busy"), "\(refused)")
        #expect(
            byteDifference(readAll(old), patternBytes(count: 6 << 20, seed: 21)) == nil,
            "the old handle reads the old version")
        close(old)
        closed = true
        let deadline = ContinuousClock.now + .seconds(10)
        var size = try shell("wc -c < \(quoted(file))")
        while size.status != 0 && ContinuousClock.now < deadline {
            usleep(50_000)
            size = try shell("wc -c < \(quoted(file))")
        }
        #expect(size.output == "\((6 << 20) + 8)\n", "\(size)")
    }
}

/// The adapter's side, against the in-memory fixture (no provider, no cache): files offered for
/// passthrough are read by the kernel; when the kernel refuses backing files (EPERM for a daemon
/// without CAP_SYS_ADMIN, simulated), the same reads go through the daemon and the mount works.
@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct PassthroughAdapterTests {
    func run(_ extra: [String], _ body: (MountedFileSystem, String) throws -> Void) throws {
        let tree = try AdapterMountTests.makeTree()
        defer { removeTreeWithinFileSystem(tree) }
        let backing = try makeTemporaryDirectory(prefix: "backing")
        defer { removeTreeWithinFileSystem(backing) }
        let mount = try MountedFileSystem.fixture(
            tree: tree, extraArguments: ["--debug", "--backing-files", backing] + extra)
        defer { mount.stop() }
        try body(mount, tree)
    }

    @Test func filesOfferedForPassthroughAreReadByTheKernel() throws {
        guard requireFUSE() else { return }
        try run([]) { mount, tree in
            let node = try nodeNumber(mount.path("big.bin"))
            #expect(
                try shell("sha256sum < \(quoted(mount.path("big.bin")))").output
                    == (try shell("sha256sum < \(quoted(tree))/big.bin").output))
            #expect(mount.child.standardError.contains("passthrough: negotiated"), "\(mount.child.standardError)")
            #expect(readRequests(mount, node: node) == 0)
            // Files the fixture does not offer (slow.txt) are still read through the daemon.
            #expect(try shell("cat \(quoted(mount.path("slow.txt")))").output.hasPrefix("slow\n"))
            #expect(readRequests(mount, node: try nodeNumber(mount.path("slow.txt"))) > 0)
        }
    }

    @Test func whenTheKernelRefusesBackingFilesReadsGoThroughTheDaemon() throws {
        guard requireFUSE() else { return }
        try run(["--backing-open-fails", "EPERM"]) { mount, tree in
            let file = mount.path("big.bin")
            let node = try nodeNumber(file)
            for _ in 0..<2 {
                try dropPageCache(file)
                #expect(
                    try shell("sha256sum < \(quoted(file))").output
                        == (try shell("sha256sum < \(quoted(tree))/big.bin").output))
            }
            #expect(readRequests(mount, node: node) > 0)
            let log = mount.child.standardError
            #expect(
                log.contains("passthrough: not used: the kernel refused to register a backing file (EPERM)"), "\(log)")
            #expect(log.components(separatedBy: "passthrough: not used").count == 2, "logged once: \(log)")
            #expect(try shell("cat \(quoted(mount.path("hello.txt")))").output == "hello, world\n")
        }
    }

    @Test func withoutPassthroughTheHooksAreNotInstalled() throws {
        guard requireFUSE() else { return }
        try run(["--no-passthrough"]) { mount, tree in
            let file = mount.path("big.bin")
            try dropPageCache(file)
            #expect(
                try shell("sha256sum < \(quoted(file))").output
                    == (try shell("sha256sum < \(quoted(tree))/big.bin").output))
            #expect(readRequests(mount, node: try nodeNumber(file)) > 0)
            #expect(mount.child.standardError.contains("passthrough: off for this mount"))
            #expect(!mount.child.standardError.contains("passthrough: negotiated"))
        }
    }
}
