// Kernel caches kept by invalidation (D-228): items of a source whose changes are pushed
// (LocalDirectoryProvider on a local file system) are cached by the kernel for `trackedTimeout`
// instead of the mount's 1 s, and a change in the source reaches `stat` and `cat` through the
// kernel's invalidation, not a timer. "Reached the daemon" is counted in libfuse's request trace
// (PROVIDERFS_FUSE_DEBUG=1), as in PassthroughMountTests. Local only: a WebDAV server pushes no
// changes (they arrive by the poll or `refresh`, WebDAVRemoteChangeMountTests).

import Foundation
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

// Its bodies block (shell, usleep): off the cooperative pool, whose two threads on a two-core CI
// machine would otherwise starve every async test for as long as this suite runs.
@Suite(.serialized, .enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct KernelCacheMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "kernelcache")
        mkdir(source + "/d", 0o755)
        writeTestFile(source + "/d/a.txt", Array("hello\n".utf8))
        writeTestFile(source + "/d/b.txt", Array("bee\n".utf8))
    }

    /// Requests for `nodes` in the daemon's trace, counted once a marker request (a getxattr of
    /// the root) made after everything before it has shown up in the trace.
    func requests(_ mount: MountedFileSystem, _ patterns: [String]) throws -> Int {
        func count(_ pattern: String) -> Int {
            mount.child.standardError.split(separator: "\n").count { $0.contains(pattern) }
        }
        let marker = "opcode: GETXATTR (22), nodeid: 1,"
        let markers = count(marker)
        _ = try shell("getfattr -n user.providerfs.state \(quoted(mount.mountpoint)) 2>&1")
        let deadline = ContinuousClock.now + .seconds(10)
        while count(marker) <= markers && ContinuousClock.now < deadline { usleep(2_000) }
        #expect(count(marker) > markers, "the marker request reached the trace")
        return patterns.reduce(0) { $0 + count($1) }
    }

    /// Polls `condition` every 5 ms for up to 3 s (a third of `trackedTimeout`, three times the
    /// mount's own timeout): true once it holds.
    func eventually(_ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = ContinuousClock.now + .seconds(3)
        while ContinuousClock.now < deadline {
            if try condition() { return true }
            usleep(5_000)
        }
        return try condition()
    }

    @Test func trackedItemsStayInTheKernelUntilTheSourceChangesThenTheChangeIsSeenAtOnce() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime, "PROVIDERFS_FUSE_DEBUG": "1"])
        defer { mount.stop() }
        let a = mount.path("d/a.txt")
        let b = mount.path("d/b.txt")
        func size(_ path: String) throws -> String {
            try shell("stat -c %s \(quoted(path))").output.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(try size(a) == "6")
        #expect(try size(b) == "4")
        let directory = try nodeNumber(mount.path("d"))
        let aNode = try nodeNumber(a)
        let patterns = [
            "opcode: LOOKUP (1), nodeid: \(directory),", "opcode: GETATTR (3), nodeid: \(aNode),",
        ]
        // Past the mount's 1 s timeouts: only the tracked timeout keeps the names and attributes.
        usleep(1_500_000)
        let before = try requests(mount, patterns)
        #expect(try size(a) == "6")
        #expect(try size(b) == "4")
        #expect(try requests(mount, patterns) == before, "served by the kernel, nothing reached the daemon")

        // Written in the source: seen by stat and cat without waiting for any timeout.
        writeTestFile(source + "/d/a.txt", Array("hello, changed\n".utf8))
        #expect(try eventually { try size(a) == "15" })
        #expect(try shell("cat \(quoted(a))").output == "hello, changed\n")
        #expect(try requests(mount, patterns) > before, "the kernel asked again")

        // Deleted, created and renamed in the source.
        unlink(source + "/d/b.txt")
        #expect(try eventually { try shell("stat \(quoted(b)) 2>&1").status != 0 })
        writeTestFile(source + "/d/c.txt", Array("sea\n".utf8))
        #expect(try shell("cat \(quoted(mount.path("d/c.txt")))").output == "sea\n")
        rename(source + "/d/a.txt", source + "/d/renamed.txt")
        #expect(try eventually { try shell("stat \(quoted(a)) 2>&1").status != 0 })
        #expect(try shell("cat \(quoted(mount.path("d/renamed.txt")))").output == "hello, changed\n")
        #expect(try shell("ls \(quoted(mount.path("d")))").output == "c.txt\nrenamed.txt\n")
    }
}
