// Offline start (issue 27, item 4; D-434): a mount whose --source directory is missing starts from
// the stored metadata of its --cache directory: names are listed, a downloaded file reads
// byte-exact, a file never downloaded fails with ENETUNREACH, `status` says unreachable, mkdir is
// ENETUNREACH, a new file and an append are queued and reach the source once the directory is
// back. A first mount of a missing directory is still refused. The same over WebDAV with the
// server down (D-511).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct OfflineStartMountTests: MountLayoutSuite {
    let layout: MountLayout
    let moved: String
    let environment: [String: String]
    let kept = patternBytes(count: 300_000, seed: 41)
    let other = patternBytes(count: 200_000, seed: 42)

    init() throws {
        layout = try MountLayout(prefix: "offline-start")
        moved = layout.scratch + "/moved"
        environment = layout.environment
        mkdir(source + "/dir", 0o755)
        writeTestFile(source + "/dir/kept.bin", kept)
        writeTestFile(source + "/dir/other.bin", other)
    }

    @Test func aMissingSourceStartsFromStoredMetadataAndCatchesUpWhenBack() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        do {
            let first = try MountedFileSystem.providerfs(
                ["--source", source, "--cache", cache], environment: environment)
            defer { first.stop() }
            #expect(fileBytes(first.path("dir/kept.bin")) == kept)
            let listed = try shell("ls \(quoted(first.path("dir")))")
            #expect(listed.output == "kept.bin\nother.bin\n", "\(listed)")
        }
        // The disk is unplugged: the source directory is gone from its path.
        #expect(rename(source, moved) == 0)

        let mount = try MountedFileSystem.providerfs(["--source", source, "--cache", cache], environment: environment)
        defer { mount.stop() }
        let listed = try shell("ls \(quoted(mount.path("dir")))")
        #expect(listed.status == 0 && listed.output == "kept.bin\nother.bin\n", "\(listed)")
        #expect(fileBytes(mount.path("dir/kept.bin")) == kept)
        let failed = try shell("cat \(quoted(mount.path("dir/other.bin"))) > /dev/null")
        #expect(failed.status != 0 && failed.error.contains("Network is unreachable"), "\(failed)")
        let status = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(status.status == 0 && status.output.contains("provider: unreachable"), "\(status)")
        #expect(status.output.contains("offline since"), "\(status)")
        let json = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        #expect(json.output.contains("\"offlineSince\":\""), "\(json)")

        // A new file is accepted and queued.
        let written = patternBytes(count: 70_000, seed: 43)
        // Written in place (not atomically: a rename of the new file would need the provider).
        #expect(throws: Never.self) { try Data(written).write(to: URL(fileURLWithPath: mount.path("dir/new.bin"))) }
        #expect(fileBytes(mount.path("dir/new.bin")) == written)
        // A write to a downloaded file is queued too; a namespace change needs the provider.
        let appended = try shell("printf more >> \(quoted(mount.path("dir/kept.bin")))")
        #expect(appended.status == 0, "\(appended)")
        let made = try shell("mkdir \(quoted(mount.path("dir/sub")))")
        #expect(made.status != 0 && made.error.contains("Network is unreachable"), "\(made)")

        // The disk is back: the queued file reaches it, the other file reads, status is reachable.
        #expect(rename(moved, source) == 0)
        #expect(waitForSource(source + "/dir/new.bin", written, timeout: .seconds(60)), "the queued file never arrived")
        #expect(waitForSource(source + "/dir/kept.bin", kept + Array("more".utf8), timeout: .seconds(60)))
        #expect(fileBytes(mount.path("dir/other.bin")) == other)
        let back = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(back.status == 0 && back.output.contains("provider: reachable"), "\(back)")
        #expect(!back.output.contains("offline since"), "\(back)")
    }

    @Test func aFirstMountOfAMissingSourceIsRefused() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        let missing = scratch + "/typo"
        let refused = try providerfs(
            ["mount", "--source", missing, "--cache", cache, mountpoint, "--foreground"], runtime: runtime)
        #expect(refused.status != 0)
        #expect(refused.error.contains("the source \(missing) does not exist"), "\(refused)")
        #expect(MountTable.entry(at: mountpoint) == nil)
        // Nor does a cache that caches another source let it start.
        let first = try MountedFileSystem.providerfs(["--source", source, "--cache", cache], environment: environment)
        first.stop()
        let other = try providerfs(
            ["mount", "--source", missing, "--cache", cache, mountpoint, "--foreground"], runtime: runtime)
        #expect(other.status != 0)
        #expect(other.error.contains("the source \(missing) does not exist"), "\(other)")
        #expect(MountTable.entry(at: mountpoint) == nil)
    }

    /// The same over WebDAV (D-511): a mount whose server cannot be reached starts from the
    /// stored metadata of a cache that has cached this URL; a first mount, or a cache of another
    /// URL, is refused with the reason.
    @Test(arguments: ProviderKind.available.filter { $0 != .local })
    func anUnreachableServerStartsFromStoredMetadataAndCatchesUpWhenBack(over kind: ProviderKind) throws {
        defer { cleanup() }  // the suite's layout: this test mounts a fixture of its own
        guard requireFUSE() else { return }
        let fixture = try SourceMount(prefix: "offline-start-webdav", kind: kind)
        defer { fixture.stop() }
        let server = try #require(fixture.server)
        mkdir(fixture.source("dir"), 0o755)
        writeTestFile(fixture.source("dir/kept.bin"), kept)
        writeTestFile(fixture.source("dir/other.bin"), other)
        // Owned as the server's own files are (Apache's workers run as nobody under root).
        var owner = stat()
        #expect(stat(fixture.tree, &owner) == 0)
        for name in ["dir", "dir/kept.bin", "dir/other.bin"] {
            #expect(chown(fixture.source(name), owner.st_uid, owner.st_gid) == 0)
        }
        #expect(fileBytes(fixture.path("dir/kept.bin")) == kept)
        fixture.mount.stop()

        // The server is down (a laptop without network): the mount starts all the same.
        server.stop()
        try fixture.remount()
        let mount = fixture.mount
        let runtime = fixture.runtime
        let listed = try shell("ls \(quoted(mount.path("dir")))")
        #expect(listed.status == 0 && listed.output == "kept.bin\nother.bin\n", "\(listed)")
        #expect(fileBytes(mount.path("dir/kept.bin")) == kept)
        let failed = try shell("cat \(quoted(mount.path("dir/other.bin"))) > /dev/null")
        #expect(failed.status != 0 && failed.error.contains("Network is unreachable"), "\(failed)")
        let status = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(status.output.contains("provider: unreachable (offline since"), "\(status)")
        let written = patternBytes(count: 70_000, seed: 44)
        #expect(throws: Never.self) { try Data(written).write(to: URL(fileURLWithPath: mount.path("dir/new.bin"))) }
        #expect(fileBytes(mount.path("dir/new.bin")) == written)

        // A mount of another URL over this cache, or of this URL over a new cache, is refused.
        let mountpoint = fixture.scratch + "/mnt2"
        mkdir(mountpoint, 0o755)
        for (url, cache) in [
            ("http://127.0.0.1:\(server.port)/elsewhere/", fixture.cache),
            (server.url, fixture.scratch + "/new-cache"),
        ] {
            let refused = try providerfs(
                ["mount", "--webdav", url, "--cache", cache, mountpoint, "--foreground"], runtime: runtime)
            #expect(refused.status != 0 && refused.error.contains("cannot use the WebDAV server"), "\(refused)")
            #expect(MountTable.entry(at: mountpoint) == nil)
        }

        // The server is back on its port: the queued file reaches it, the other file reads.
        try server.start(samePort: true)
        let arrived = waitForSource(fixture.source("dir/new.bin"), written, timeout: .seconds(60))
        let report = arrived ? "" : (try providerfs(["status", mount.mountpoint], runtime: runtime)).output
        #expect(arrived, "the queued file never arrived: \(report)\n\(mount.child.standardError.suffix(3000))")
        #expect(fileBytes(mount.path("dir/other.bin")) == other)
        let back = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(back.output.contains("provider: reachable"), "\(back)")
    }
}
