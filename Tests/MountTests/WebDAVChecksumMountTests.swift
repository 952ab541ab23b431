// A server's checksum through the mount (D-495): `rclone serve webdav` behind the tampering proxy,
// which states the file's true OC-Checksum and flips a byte of the body on the way. `cat` gets
// EIO, the failure is in `user.providerfs.error`, in `providerfs status` and in the log; once the
// server answers right again, `cat` gets every byte.

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
struct WebDAVChecksumMountTests {
    let scratch: String
    let served: String
    let providerfs = productsDirectory + "/providerfs"

    init() throws {
        scratch = try makeTemporaryDirectory(prefix: "webdav-checksum-mount")
        served = scratch + "/served"
        mkdir(served, 0o755)
    }

    @Test func aFalseChecksumIsEIOInStatusAndTheLogAndARetryReadsIt() throws {
        guard requireFUSE() else { return }
        defer { removeTreeWithinFileSystem(scratch) }
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let bytes = patternBytes(count: 200 << 10, seed: 7)
        writeTestFile(served + "/report.bin", bytes)
        let upstream = try WebDAVTestServer(root: served)
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy-root", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        try proxy.tamper(.ocChecksumFlipped)
        let runtime = scratch + "/run"
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", proxy.url, "--cache", scratch + "/cache", "--poll-interval", "0"],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        let file = mount.path("report.bin")

        let failed = try shell("cat \(quoted(file)) > /dev/null", timeout: .seconds(60))
        #expect(failed.status != 0 && failed.error.contains("Input/output error"), "\(failed)")
        let error = try shell("getfattr --only-values -n user.providerfs.error \(quoted(file))")
        #expect(error.output.hasPrefix("EIO: at byte 0: "), "\(error)")
        #expect(error.output.contains("do not match their checksum: expected sha1:"), "\(error)")
        let status = try shell("PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) \(quoted(providerfs)) status \(quoted(file))")
        #expect(status.output.contains("do not match their checksum"), "\(status)")
        // The daemon in the foreground logs to its standard error.
        #expect(mount.child.standardError.contains("do not match their checksum"), "\(mount.child.standardError)")
        #expect(try shell("cmp -s \(quoted(file)) \(quoted(served + "/report.bin"))").status != 0)

        try proxy.tamper(.none)
        let read = try shell("cmp \(quoted(file)) \(quoted(served + "/report.bin"))", timeout: .seconds(60))
        #expect(read.status == 0, "\(read)")
    }
}
