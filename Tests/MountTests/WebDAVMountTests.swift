// `providerfs mount --webdav URL` end to end: the real binary over a real `rclone serve webdav` on
// 127.0.0.1 (started here, stopped by its PID whatever happens), read and written with ordinary
// tools. Without rclone the suite fails unless PROVIDERFS_SKIP_WEBDAV_TESTS=1.

import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(
    .enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"),
    .enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "webdav-mount")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/big.bin", patternBytes(count: 6 << 20, seed: 21))
        writeTestFile(source + "/docs/name with spaces #1 ü.txt", Array("spaces and more\n".utf8))
    }

    func requireRclone() -> Bool {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return false
        }
        return true
    }

    /// Waits up to `timeout` until `path` holds `bytes` (an upload runs in the background).
    func eventually(_ path: String, holds bytes: [UInt8], timeout: Duration = .seconds(30)) -> Bool {
        let expected = scratch + "/expected-\(bytes.count)"
        writeTestFile(expected, bytes)
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? shell("cmp -s \(quoted(expected)) \(quoted(path))"))?.status == 0 { return true }
            usleep(100_000)
        }
        return false
    }

    @Test func readsByteExactAndUploadsWhatIsWritten() throws {
        guard requireFUSE(), requireRclone() else { return }
        defer { cleanup() }
        let server = try WebDAVTestServer(root: source)
        defer { server.stop() }
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", server.url, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let s = quoted(source)
        #expect(
            try shell("cd \(m) && find . | LC_ALL=C sort").output
                == (try shell("cd \(s) && find . | LC_ALL=C sort").output))
        #expect(try shell("stat -c '%s' \(m)/big.bin").output == "\(6 << 20)\n")
        // Ranges first (each a ranged GET), then the whole file.
        for (skip, count) in [(5000, 3), (0, 1), (6143, 1), (1024, 100)] {
            let ours = try shell("dd if=\(m)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            let theirs = try shell("dd if=\(s)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            #expect(ours.status == 0 && ours.output == theirs.output, "skip=\(skip) count=\(count)")
        }
        #expect(try shell("cmp \(m)/big.bin \(s)/big.bin").status == 0)
        #expect(try shell("cat \(quoted(mount.path("docs/name with spaces #1 ü.txt")))").output == "spaces and more\n")

        // A new file and a new directory written through the mount reach the server.
        let written = patternBytes(count: 700_000, seed: 5)
        writeTestFile(scratch + "/local.bin", written)
        #expect(try shell("mkdir \(m)/made && cp \(quoted(scratch))/local.bin \(m)/made/'new file?.bin'").status == 0)
        #expect(eventually(source + "/made/new file?.bin", holds: written))
        #expect(try shell("printf 'short\\n' > \(m)/note.txt").status == 0)
        #expect(eventually(source + "/note.txt", holds: Array("short\n".utf8)))
        // Staging names never show, on the server or in the mount.
        #expect(try shell("find \(s) \(m) -name '.providerfs-upload-*'").output.isEmpty)
    }

    /// The conflict path over WebDAV (D-417): a file rewritten on the server while a writer has it
    /// open through the mount, and a name taken on the server before a new file's upload. Both
    /// versions are kept: the server's under the name, the mount's edit as the conflict copy.
    @Test func anEditMetByAServerChangeBecomesAConflictCopy() throws {
        guard requireFUSE(), requireRclone() else { return }
        defer { cleanup() }
        writeTestFile(source + "/notes.txt", Array("base\n".utf8))
        let server = try WebDAVTestServer(root: source)
        defer { server.stop() }
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", server.url, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        #expect(try shell("cat \(quoted(mount.path("notes.txt")))").output == "base\n")
        let edit = try shell(
            """
            python3 - \(quoted(mount.mountpoint)) \(quoted(source)) <<'PY'
            import os, sys
            mnt, src = sys.argv[1], sys.argv[2]
            fd = os.open(mnt + "/notes.txt", os.O_WRONLY | os.O_TRUNC)
            with open(src + "/notes.txt", "w") as f:
                f.write("theirs: written on the server\\n")
            os.write(fd, b"ours: written through the mount\\n")
            os.close(fd)
            fd = os.open(mnt + "/new.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with open(src + "/new.txt", "w") as f:
                f.write("theirs: new on the server\\n")
            os.write(fd, b"ours: new through the mount\\n")
            os.close(fd)
            PY
            """)
        #expect(edit.status == 0, "\(edit.output) \(edit.error)")
        for (name, theirs, ours) in [
            ("notes", "theirs: written on the server\n", "ours: written through the mount\n"),
            ("new", "theirs: new on the server\n", "ours: new through the mount\n"),
        ] {
            let deadline = ContinuousClock.now + .seconds(30)
            var copies: [Substring] = []
            while ContinuousClock.now < deadline {
                copies = try shell("ls -1 \(quoted(source))").output.split(separator: "\n")
                    .filter { $0.hasPrefix("\(name) (conflict ") && $0.hasSuffix(").txt") }
                if !copies.isEmpty { break }
                usleep(100_000)
            }
            #expect(copies.count == 1, "\(name): \(copies)")
            guard let copy = copies.first else { continue }
            #expect(try shell("cat \(quoted(source + "/" + name + ".txt"))").output == theirs, "\(name)")
            #expect(try shell("cat \(quoted(source + "/" + copy))").output == ours, "\(name)")
        }
    }

    /// `--user` and `--password-file`: the server's basic authentication passes, and the password
    /// is nowhere on the daemon's command line.
    @Test func authenticatesWithAPasswordFileKeptOffTheCommandLine() throws {
        guard requireFUSE(), requireRclone() else { return }
        defer { cleanup() }
        let password = "s3cret pass"
        let server = try WebDAVTestServer(root: source, kind: .rclone(user: "alice", password: password))
        defer { server.stop() }
        writeTestFile(scratch + "/password", Array((password + "\n").utf8))
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", server.url, "--user", "alice", "--password-file", scratch + "/password", "--cache", cache],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        #expect(try shell("cat \(quoted(mount.path("docs/name with spaces #1 ü.txt")))").output == "spaces and more\n")
        let commandLine = readTextFile("/proc/\(mount.child.pid)/cmdline") ?? ""
        #expect(commandLine.contains("--password-file") && !commandLine.contains("s3cret"))
        #expect(!(readTextFile(mount.child.standardErrorPath) ?? "").contains("s3cret"))

        // A wrong password fails the mount, saying why.
        writeTestFile(scratch + "/wrong", Array("nope".utf8))
        #expect(throws: MountFailure.self) {
            try MountedFileSystem.providerfs(
                [
                    "--webdav", server.url, "--user", "alice", "--password-file", scratch + "/wrong", "--cache",
                    scratch + "/cache2",
                ], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        }
    }
}
