// Offline start (issue 27, item 4; D-434): a mount whose --source directory is missing starts from
// the stored metadata of its --cache directory: names are listed, a downloaded file reads
// byte-exact, a file never downloaded fails with ENETUNREACH, `status` says unreachable, mkdir is
// ENETUNREACH, a new file and an append are queued and reach the source once the directory is
// back. A first mount of a missing directory is still refused.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct OfflineStartMountTests {
    let scratch: String
    let source: String
    let moved: String
    let cache: String
    let runtime: String
    let environment: [String: String]
    let kept = patternBytes(count: 300_000, seed: 41)
    let other = patternBytes(count: 200_000, seed: 42)

    init() throws {
        scratch = try makeTemporaryDirectory(prefix: "offline-start")
        source = scratch + "/source"
        moved = scratch + "/moved"
        cache = scratch + "/cache"
        runtime = scratch + "/run"
        environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        mkdir(source, 0o755)
        mkdir(source + "/dir", 0o755)
        writeTestFile(source + "/dir/kept.bin", kept)
        writeTestFile(source + "/dir/other.bin", other)
    }

    func cleanup() { removeTreeWithinFileSystem(scratch) }

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
}
