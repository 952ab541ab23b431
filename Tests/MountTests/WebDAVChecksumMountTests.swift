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
struct WebDAVChecksumMountTests: MountLayoutSuite {
    let layout: MountLayout
    let providerfs = productsDirectory + "/providerfs"

    init() throws {
        layout = try MountLayout(prefix: "webdav-checksum-mount")
    }

    @Test func aFalseChecksumIsEIOInStatusAndTheLogAndARetryReadsIt() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let bytes = patternBytes(count: 200 << 10, seed: 7)
        writeTestFile(source + "/report.bin", bytes)
        let upstream = try WebDAVTestServer(root: source)
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy-root", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        try proxy.tamper(.ocChecksumFlipped)
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", proxy.url, "--cache", cache, "--poll-interval", "0"],
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
        #expect(try shell("cmp -s \(quoted(file)) \(quoted(source + "/report.bin"))").status != 0)

        try proxy.tamper(.none)
        let read = try shell("cmp \(quoted(file)) \(quoted(source + "/report.bin"))", timeout: .seconds(60))
        #expect(read.status == 0, "\(read)")
    }
}
