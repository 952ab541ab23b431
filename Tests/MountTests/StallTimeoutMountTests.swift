// `providerfs mount --stall-timeout DURATION`: the deadline after which a download that delivers
// nothing fails its readers with ETIMEDOUT is the mount's option, not the 30 s default. The source
// is a FUSE fixture whose reads of "slow…" files wait far longer than that deadline.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct StallTimeoutMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "stall-mount")
    }

    @Test func aStalledReadFailsWithETIMEDOUTAtTheMountsDeadline() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        writeTestFile(source + "/slow-stalled.bin", patternBytes(count: 256 << 10, seed: 3))
        writeTestFile(source + "/quick.txt", Array("quick\n".utf8))
        // Every read of the slow file waits 4 s in the source: with a 300 ms stall deadline the
        // download must fail long before the first byte could arrive.
        let slowSource = try MountedFileSystem.fixture(tree: source, extraArguments: ["--slow-delay", "4s"])
        defer { slowSource.stop() }
        let mount = try MountedFileSystem.providerfs(
            ["--source", slowSource.mountpoint, "--cache", cache, "--stall-timeout", "300ms"],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }

        let start = ContinuousClock.now
        // Bounded well below the source's own delay times a few retries: a read that waits for
        // the source instead of failing at the deadline is killed and fails the test at once.
        let stalled = try shell("cat \(quoted(mount.path("slow-stalled.bin"))) > /dev/null", timeout: .seconds(10))
        let elapsed = ContinuousClock.now - start
        #expect(stalled.status != 0, "\(stalled)")
        #expect(stalled.error.contains("Connection timed out"), "\(stalled)")
        // The mount's deadline, not the source's 4 s delay (nor the 30 s default).
        #expect(elapsed < .milliseconds(3000), "the read failed after \(elapsed)")
        let error = try shell(
            "getfattr --only-values -n user.providerfs.error \(quoted(mount.path("slow-stalled.bin")))")
        #expect(error.output.contains("ETIMEDOUT"), "\(error)")
        // Other items are not held up by the stalled one.
        #expect(try shell("cat \(quoted(mount.path("quick.txt")))").output == "quick\n")
    }

    @Test func aStallTimeoutThatIsNotADurationIsAUsageError() throws {
        defer { cleanup() }
        let result = try shell(
            "\(quoted(productsDirectory + "/providerfs")) mount --source \(quoted(scratch)) \(quoted(scratch + "/m"))"
                + " --stall-timeout soon")
        #expect(result.status == 64, "\(result)")
        #expect(result.error.contains("--stall-timeout"), "\(result)")
        let zero = try shell(
            "\(quoted(productsDirectory + "/providerfs")) mount --source \(quoted(scratch)) \(quoted(scratch + "/m"))"
                + " --stall-timeout 0s")
        #expect(zero.status == 64, "\(zero)")
        #expect(zero.error.contains("at least 1ms"), "\(zero)")
    }
}
