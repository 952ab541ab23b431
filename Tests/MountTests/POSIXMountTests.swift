// What pjdfstest found where bindfs does better, through the kernel (issue 23 item 4, D-391):
// mkfifo, mknod and bind(2) of a Unix socket answer EPERM (ENOSYS before: the adapter had no
// MKNOD), mknod(2) of a regular file makes it, and setuid/setgid/sticky bits show and are set as
// the source stores them. docs/TESTING.md "POSIX conformance" says how to run pjdfstest itself.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// 0 or the errno of a call that returns -1 on failure.
private func outcome(_ call: () -> Int32) -> Int32 {
    errno = 0
    return call() == 0 ? 0 : errno
}

private func lstatInfo(_ path: String) -> stat? {
    var info = stat()
    return lstat(path, &info) == 0 ? info : nil
}

/// Polls `condition` until it holds or `limit` passes (the condition is checked once more at the end).
private func eventually(_ limit: Duration = .seconds(20), _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct POSIXMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "posix")
    }

    func mount(over kind: ProviderKind = .local, _ extra: [String] = []) throws -> ServedMount {
        try layout.mount(over: kind, arguments: extra)
    }

    @Test(arguments: ProviderKind.available)
    func fifosSocketsAndDevicesAreKeptByTheMountAndRegularMknodWorks(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(over: kind)
        defer { mount.stop() }
        // Kept by the mount alone (D-398); a device needs CAP_MKNOD, which the kernel checks.
        let root = geteuid() == 0
        #expect(outcome { mkfifo(mount.path("fifo"), 0o644) } == 0)
        #expect(outcome { mknod(mount.path("fifo2"), S_IFIFO | 0o640, 0) } == 0)
        #expect(outcome { mknod(mount.path("char"), S_IFCHR | 0o644, dev_t(0x103)) } == (root ? 0 : EPERM))
        #expect(outcome { mknod(mount.path("block"), S_IFBLK | 0o644, dev_t(0x700)) } == (root ? 0 : EPERM))
        // bind(2) of a Unix socket makes its node with MKNOD.
        let bind = try shell(
            """
            python3 -c 'import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(sys.argv[1]); print("bound")
            except OSError as e:
                print(e.errno)' \(quoted(mount.path("socket")))
            """)
        #expect(bind.status == 0, "\(bind.error)")
        #expect(bind.output == "bound\n", "\(bind.output)")
        let expected: [(String, mode_t, dev_t)] =
            [("fifo", S_IFIFO | 0o644, 0), ("fifo2", S_IFIFO | 0o640, 0), ("socket", S_IFSOCK, 0)]
            + (root ? [("char", S_IFCHR | 0o644, 0x103), ("block", S_IFBLK | 0o644, 0x700)] : [])
        for (name, mode, device) in expected {
            let info = lstatInfo(mount.path(name))
            #expect(info.map { $0.st_mode & S_IFMT } == mode & S_IFMT, "\(name)")
            if mode & S_IFMT != S_IFSOCK { #expect(info.map { $0.st_mode & 0o7777 } == mode & 0o7777, "\(name)") }
            #expect(info?.st_rdev == device, "\(name)")
            #expect(lstatInfo(source + "/" + name) == nil, "\(name): never at the source")
        }
        #expect(outcome { mkfifo(mount.path("fifo"), 0o644) } == EEXIST)
        // mknod(2) of a regular file: an empty file with its mode (0644 survives any usual umask).
        #expect(outcome { mknod(mount.path("plain"), S_IFREG | 0o644, 0) } == 0)
        let made = try #require(lstatInfo(mount.path("plain")))
        #expect(made.st_mode & S_IFMT == S_IFREG && made.st_mode & 0o7777 == 0o644 && made.st_size == 0)
        // Uploaded (later, over WebDAV, where the server keeps no mode: docs/WEBDAV.md "Metadata").
        #expect(
            eventually(.seconds(60)) {
                lstatInfo(source + "/plain").map { $0.st_size == 0 && (kind != .local || $0.st_mode & 0o7777 == 0o644) }
                    == true
            })
        #expect(outcome { mknod(mount.path("plain"), S_IFREG | 0o644, 0) } == EEXIST)
    }

    /// Local only: a WebDAV server stores no mode bits, so there is no stored setuid to show.
    @Test func setuidSetgidAndStickyShowAsStoredAndChmodSetsThem() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        writeTestFile(source + "/tool", Array("#!/bin/sh\n".utf8))
        chmod(source + "/tool", 0o6755)
        writeTestFile(source + "/plain", Array("x".utf8))
        mkdir(source + "/shared", 0o755)
        let mount = try mount(["--allow-other"])  // the other user's write and fstat below
        defer { mount.stop() }
        #expect(lstatInfo(mount.path("tool")).map { $0.st_mode & 0o7777 } == 0o6755)
        #expect(outcome { chmod(mount.path("plain"), 0o4711) } == 0)
        #expect(outcome { chmod(mount.path("shared"), 0o1777) } == 0)
        #expect(lstatInfo(mount.path("plain")).map { $0.st_mode & 0o7777 } == 0o4711)
        #expect(lstatInfo(mount.path("shared")).map { $0.st_mode & 0o7777 } == 0o1777)
        #expect(lstatInfo(source + "/plain").map { $0.st_mode & 0o7777 } == 0o4711)
        #expect(lstatInfo(source + "/shared").map { $0.st_mode & 0o7777 } == 0o1777)
        // A write by another user (a descriptor root opened, then written after setuid: the
        // scratch directories are 0700) clears setuid, and setgid with group execute (every handle
        // of a writable mount is direct I/O: the kernel leaves this to the file system); root's
        // write keeps them.
        writeTestFile(source + "/shared-tool", Array("x".utf8))
        chmod(source + "/shared-tool", 0o6777)
        let other = try shell(
            """
            python3 -c 'import os, sys
            fd = os.open(sys.argv[1], os.O_WRONLY)
            os.setgid(65534); os.setuid(65534); os.write(fd, b"y")
            print(oct(os.fstat(fd).st_mode & 0o7777)); os.close(fd)' \(quoted(mount.path("shared-tool")))
            """)
        #expect(other.output == "0o777\n", "\(other.output) \(other.error)")
        #expect(eventually { lstatInfo(source + "/shared-tool").map { $0.st_mode & 0o7777 } == 0o777 })
        #expect(outcome { chmod(mount.path("shared-tool"), 0o6777) } == 0)
        let byRoot = try shell(
            "printf z >> \(quoted(mount.path("shared-tool"))) && stat -c %a \(quoted(mount.path("shared-tool")))")
        #expect(byRoot.output == "6777\n", "\(byRoot.output) \(byRoot.error)")
        // The mount is nosuid: the bits are shown, never acted on.
        let options = try shell("findmnt -n -o OPTIONS --mountpoint \(quoted(mount.mountpoint))")
        #expect(options.output.split(separator: ",").contains("nosuid"), "\(options.output)")
    }
}
