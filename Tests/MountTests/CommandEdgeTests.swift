// `providerfs mount/unmount/status` on bad input: one clear sentence, the right exit status, and
// nothing left mounted. Stale mounts are made for real: a fixture daemon killed with SIGKILL.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// Runs the providerfs binary with a private runtime directory (its own mount registry).
func providerfs(
    _ arguments: [String], runtime: String, environment: [String: String] = [:]
) throws -> (
    status: Int32, output: String, error: String
) {
    var merged = environment
    merged["PROVIDERFS_RUNTIME_DIR"] = runtime
    return try ChildProcess.run(
        productsDirectory + "/providerfs", arguments, environment: merged, timeout: .seconds(90))
}

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct CommandEdgeTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "edges")
        writeTestFile(source + "/a.txt", Array("a\n".utf8))
    }

    @Test func badMountPointsGetOneSentenceAndExit1() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        mkdir(scratch + "/full", 0o755)
        writeTestFile(scratch + "/full/x", [1])
        writeTestFile(scratch + "/file", [1])
        let cases: [(String, String)] = [
            (scratch + "/missing", "does not exist"),
            (scratch + "/file", "is not a directory"),
            (scratch + "/full", "is not empty"),
        ]
        for (mountpoint, sentence) in cases {
            let result = try providerfs(
                ["mount", "--source", source, mountpoint, "--cache", cache], runtime: runtime)
            #expect(result.status == 1, "\(mountpoint): \(result)")
            #expect(result.error.contains(sentence), "\(result.error)")
            #expect(result.error.split(separator: "\n").count == 1, "one sentence: \(result.error)")
            #expect(MountTable.entry(at: mountpoint) == nil)
        }
        let missingSource = try providerfs(
            ["mount", "--source", scratch + "/nope", scratch + "/mnt"], runtime: runtime)
        #expect(missingSource.status == 1)
        #expect(missingSource.error.contains("does not exist"))
    }

    @Test func usageErrorsExit64() throws {
        defer { cleanup() }
        for arguments in [
            ["mount", "--source", source, scratch, "--bogus"],
            ["mount", scratch],
            ["mount", "--demo", "--source", source, scratch],
            ["mount", "--source", source],
            ["unmount"],
            ["unmount", scratch, "--frobnicate"],
            ["status", "a", "b"],
            ["download"],
        ] {
            let result = try providerfs(arguments, runtime: runtime)
            #expect(result.status == 64, "\(arguments): \(result)")
        }
    }

    @Test func alreadyMountedIsRefused() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.fixture()
        defer { mount.stop() }
        let result = try providerfs(
            ["mount", "--source", source, mount.mountpoint, "--cache", cache], runtime: runtime)
        #expect(result.status == 1)
        #expect(result.error.contains("is already mounted"), "\(result.error)")
        // The existing mount is untouched.
        #expect(try shell("cat \(quoted(mount.path("xattrs.txt")))").output == "has attributes\n")
    }

    @Test func aMountNotReadyWithinItsTimeoutIsUndoneCompletely() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        // A parent descheduled for longer than 1 ms can find the mount ready when it looks: that
        // is a success, correctly. Undo it and try again until the timeout path is taken.
        var result = try providerfs(
            ["mount", "--source", source, mountpoint, "--cache", cache, "--ready-timeout", "1ms"],
            runtime: runtime)
        for _ in 0..<10 where result.status == 0 {
            let undone = try providerfs(["unmount", mountpoint], runtime: runtime)
            #expect(undone.status == 0, "\(undone)")
            result = try providerfs(
                ["mount", "--source", source, mountpoint, "--cache", cache, "--ready-timeout", "1ms"],
                runtime: runtime)
        }
        #expect(result.status == 1, "\(result)")
        #expect(result.error.contains("was not ready within"), "\(result.error)")
        // Nothing left: no mount, no registry entry, and the mount point is usable again.
        #expect(MountTable.entry(at: mountpoint) == nil)
        let listed = try providerfs(["status", "--json"], runtime: runtime)
        #expect(!listed.output.contains(mountpoint), "\(listed.output)")
        let retry = try providerfs(
            ["mount", "--source", source, mountpoint, "--cache", cache], runtime: runtime)
        #expect(retry.status == 0, "\(retry)")
        #expect(try String(contentsOfFile: mountpoint + "/a.txt", encoding: .utf8) == "a\n")
        let unmounted = try providerfs(["unmount", mountpoint], runtime: runtime)
        #expect(unmounted.status == 0, "\(unmounted)")
        #expect(MountTable.entry(at: mountpoint) == nil)
    }

    @Test func aFullCacheDiskIsRefusedBeforeMounting() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let small = scratch + "/small"
        mkdir(small, 0o755)
        guard try shell("mount -t tmpfs -o size=2m tmpfs \(quoted(small))").status == 0 else {
            Issue.record("cannot mount a tmpfs (needs root)")
            return
        }
        defer { _ = try? shell("umount \(quoted(small))") }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        let result = try providerfs(
            ["mount", "--source", source, mountpoint, "--cache", small + "/cache"], runtime: runtime)
        #expect(result.status == 1)
        #expect(result.error.contains("is on a full disk"), "\(result.error)")
        #expect(MountTable.entry(at: mountpoint) == nil)
    }

    @Test func aStaleMountIsDetectedExplainedAndCleanedByUnmount() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // A "crashed daemon": a providerfs-typed fixture mount whose process is SIGKILLed.
        let mount = try MountedFileSystem.fixture(extraArguments: ["--subtype", "providerfs"])
        defer { mount.stop() }
        mount.child.signal(SIGKILL)
        mount.child.wait(timeout: .seconds(5))
        var info = stat()
        #expect(stat(mount.mountpoint, &info) == -1 && errno == ENOTCONN)

        // A path deep inside, given absolute, relative, or through a symbolic link from outside:
        // the advice names the mount point, never the path (issue 24).
        symlink(mount.mountpoint, scratch + "/link")
        let shell = "cd \"$1\" && exec \"$2\" \"$3\" \"$4\""
        let binary = productsDirectory + "/providerfs"
        let environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        for command in ["status", "download"] {
            let results = [
                try providerfs([command, mount.mountpoint + "/x"], runtime: runtime),
                try providerfs([command, mount.mountpoint + "/sub/dir/x"], runtime: runtime),
                try providerfs([command, scratch + "/link/sub/../x"], runtime: runtime),
                try ChildProcess.run(
                    "/bin/sh", ["-c", shell, "sh", scratch, binary, command, "link/sub/x"],
                    environment: environment),
            ]
            for result in results {
                #expect(result.status == 1)
                #expect(result.error.contains("stale ProviderFS mount"), "\(result.error)")
                #expect(
                    result.error.contains("'providerfs unmount \(mount.mountpoint)'")
                        && result.error.contains("'fusermount3 -uz \(mount.mountpoint)'"),
                    "\(command): \(result.error)")
                #expect(result.error.split(separator: "\n").count == 1, "one sentence")
            }
        }

        let unmount = try providerfs(["unmount", mount.mountpoint], runtime: runtime)
        #expect(unmount.status == 0, "\(unmount)")
        #expect(unmount.output.contains("stale"))
        #expect(MountTable.entry(at: mount.mountpoint) == nil)
        #expect(stat(mount.mountpoint, &info) == 0)
    }

    @Test func mountOntoAStaleProviderFSMountCleansItAndMounts() throws {
        // A real crash: the providerfs daemon is killed with SIGKILL, then `providerfs mount`
        // runs again on the same mount point, as an fstab `mount` or a systemd restart would.
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        let arguments = ["mount", "--source", source, mountpoint, "--cache", cache]
        defer {
            _ = try? providerfs(["unmount", mountpoint], runtime: runtime)
            if MountTable.entry(at: mountpoint) != nil { _ = try? shell("fusermount3 -uz \(quoted(mountpoint))") }
        }
        let first = try providerfs(arguments + ["--json"], runtime: runtime)
        #expect(first.status == 0, "\(first)")
        #expect(try String(contentsOfFile: mountpoint + "/a.txt", encoding: .utf8) == "a\n")
        guard let pidText = first.output.split(separator: "\"pid\":").last?.prefix(while: \.isNumber),
            let pid = Int32(pidText)
        else {
            Issue.record("no daemon pid in \(first.output)")
            return
        }
        #expect(kill(pid, SIGKILL) == 0)
        // Mount again as soon as the daemon is gone (its /dev/fuse closed: the connection is
        // dead), while the kernel may still answer a stat of the root from its attribute cache.
        let deadline = ContinuousClock.now + .seconds(10)
        func gone() -> Bool {
            guard let text = readTextFile("/proc/\(pid)/stat"), let close = text.lastIndex(of: ")") else { return true }
            return text[text.index(after: close)...].hasPrefix(" Z")
        }
        while !gone() && ContinuousClock.now < deadline { usleep(1_000) }
        #expect(gone(), "the daemon ended")
        #expect(MountTable.entry(at: mountpoint)?.fileSystemType == "fuse.providerfs")
        #expect(readTextFile(mountpoint + "/a.txt") == nil, "the mount is stale")

        let again = try providerfs(arguments, runtime: runtime)
        #expect(again.status == 0, "\(again)")
        #expect(again.error.contains("cleaned up the stale mount"), "\(again.error)")
        #expect(try String(contentsOfFile: mountpoint + "/a.txt", encoding: .utf8) == "a\n")
        // One mount at the mount point, not the dead one under the new one.
        #expect(MountTable.current().filter { $0.mountPoint == mountpoint }.count == 1)
        let status = try providerfs(["status", mountpoint, "--json"], runtime: runtime)
        #expect(status.status == 0, "\(status)")
    }

    @Test func aStaleMountOfAnotherFileSystemIsStillRefused() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // A dead FUSE daemon that is not ProviderFS (type fuse.fuse-fixture).
        let mount = try MountedFileSystem.fixture()
        defer { mount.stop() }
        mount.child.signal(SIGKILL)
        mount.child.wait(timeout: .seconds(5))
        var info = stat()
        #expect(stat(mount.mountpoint, &info) == -1 && errno == ENOTCONN)
        let result = try providerfs(
            ["mount", "--source", source, mount.mountpoint, "--cache", cache], runtime: runtime)
        #expect(result.status == 1, "\(result)")
        #expect(result.error.contains("stale mount of another file system (fuse.fuse-fixture)"), "\(result.error)")
        #expect(result.error.split(separator: "\n").count == 1, "one sentence: \(result.error)")
        // Untouched: still there, still stale.
        #expect(MountTable.entry(at: mount.mountpoint)?.fileSystemType == "fuse.fuse-fixture")
    }

    @Test func unmountOfABusyMountSaysWhyAndLazyDetaches() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.fixture(extraArguments: ["--subtype", "providerfs"])
        defer { mount.stop() }
        // A process keeps a file open on the mount.
        let holder = try ChildProcess("/bin/sh", ["-c", "exec 3< \(quoted(mount.path("xattrs.txt"))); exec sleep 30"])
        defer {
            holder.signal(SIGKILL)
            holder.wait(timeout: .seconds(5))
        }
        usleep(300_000)
        let busy = try providerfs(["unmount", mount.mountpoint], runtime: runtime)
        #expect(busy.status == 1)
        #expect(busy.error.contains("is busy"), "\(busy.error)")
        #expect(busy.error.contains("--lazy"))
        #expect(MountTable.entry(at: mount.mountpoint) != nil, "nothing changed")
        let lazy = try providerfs(["unmount", mount.mountpoint, "--lazy"], runtime: runtime)
        #expect(lazy.status == 0, "\(lazy)")
        #expect(MountTable.entry(at: mount.mountpoint) == nil)
    }

    @Test func unmountOfSomethingNotMountedOrForeignFails() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let notMounted = try providerfs(["unmount", source], runtime: runtime)
        #expect(notMounted.status == 1)
        #expect(notMounted.error.contains("is not mounted"))
        let mount = try MountedFileSystem.fixture()
        defer { mount.stop() }
        let foreign = try providerfs(["unmount", mount.mountpoint], runtime: runtime)
        #expect(foreign.status == 1)
        #expect(foreign.error.contains("is not a ProviderFS mount"), "\(foreign.error)")
        #expect(MountTable.entry(at: mount.mountpoint) != nil)
    }

    @Test func statusOutsideAMountSaysSo() throws {
        defer { cleanup() }
        let result = try providerfs(["status", source + "/a.txt"], runtime: runtime)
        #expect(result.status == 1)
        #expect(result.error.contains("is not inside a ProviderFS mount"), "\(result.error)")
        let none = try providerfs(["status", "--json"], runtime: runtime)
        #expect(none.status == 0)
        #expect(none.output == "[]\n")
    }
}

/// A mount suite that grants tokens with `providerfs token grant` through its private runtime
/// directory (one `grant` for every suite that needs one).
protocol TokenGranting {
    var runtime: String { get }
}

extension TokenGranting {
    /// `providerfs token grant PATH EXTRA…`: the access path it prints and the token's id.
    func grant(_ path: String, _ extra: [String] = []) throws -> (accessPath: String, id: String) {
        let grant = try providerfs(["token", "grant", path] + extra, runtime: runtime)
        #expect(grant.status == 0, "\(grant)")
        let lines = grant.output.split(separator: "\n").map(String.init)
        let accessPath = try #require(lines.first)
        let id = try #require(
            lines.dropFirst().first?.split(separator: ",").first.map { String($0.dropFirst("id ".count)) })
        return (accessPath, id)
    }
}
