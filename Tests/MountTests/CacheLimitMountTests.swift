// `mount --cache-max-size` on a real mount (issue 27, D-432): reading more than the limit through
// the mount keeps the stored content within it (checked as downloads store bytes, with no command
// in between), least recently used files become placeholders, `status` shows the limits and the
// evictions, and every file still reads its bytes. Over a local directory and the same tree served
// by rclone and Apache (issue 26).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct CacheLimitMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "cache-limit-mount")
        for index in 0..<8 {
            writeTestFile(source + "/f\(index).bin", patternBytes(count: 3 << 19, seed: UInt64(30 + index)))
        }
    }

    func limits(_ mountpoint: String) throws -> [String: Any] {
        let result = try providerfs(["status", mountpoint, "--json"], runtime: runtime)
        let object = (try? JSONSerialization.jsonObject(with: Data(result.output.utf8))) as? [String: Any] ?? [:]
        return ((object["cache"] as? [String: Any])?["limits"] as? [String: Any]) ?? [:]
    }

    @Test(arguments: ProviderKind.available)
    func readingMoreThanTheLimitKeepsTheCacheWithinIt(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let limit = 4 << 20
        let mount = try layout.mount(over: kind, arguments: ["--cache-max-size", "4M"])
        defer { mount.stop() }
        for index in 0..<8 {
            let path = mount.path("f\(index).bin")
            let bytes = try Data(contentsOf: URL(fileURLWithPath: path))
            #expect(bytes == (try Data(contentsOf: URL(fileURLWithPath: source + "/f\(index).bin"))))
            // Closed: nothing is in use, so the stored content is within the limit once the
            // check that this download's bytes started has run.
            let within = try waitUntil { (try limits(mount.mountpoint)["storedBytes"] as? Int ?? Int.max) <= limit }
            let now = try limits(mount.mountpoint)
            #expect(within, "after f\(index): \(now)")
        }
        // What the disk holds, not just what the last check counted: the content files' blocks.
        let disk = try shell("du -s --block-size=1 \(quoted(scratch + "/cache/content")) | cut -f1")
        let onDisk = Int(disk.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? Int.max
        #expect(onDisk <= limit + (64 << 10), "\(onDisk) bytes in the content directory")
        let status = try limits(mount.mountpoint)
        #expect(status["maximumSize"] as? Int == limit)
        #expect((status["evictions"] as? Int ?? 0) >= 5, "\(status)")
        #expect(status["blockedReason"] == nil)
        let state = try shell("getfattr --only-values -n user.providerfs.state \(quoted(mount.path("f0.bin")))")
        #expect(state.output == "dataless", "the least recently used went first")
        let last = try shell("getfattr --only-values -n user.providerfs.state \(quoted(mount.path("f7.bin")))")
        #expect(last.output == "materialized")
        // Evicted files read their bytes again.
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: mount.path("f0.bin")))
                == (try Data(contentsOf: URL(fileURLWithPath: source + "/f0.bin"))))
        // df: the limit is the size, what is left of it the free space.
        var space = statvfs()
        #expect(statvfs(mount.mountpoint, &space) == 0)
        #expect(UInt64(space.f_blocks) * UInt64(space.f_frsize) == UInt64(limit))
        #expect(UInt64(space.f_bavail) * UInt64(space.f_frsize) <= UInt64(limit))
        let text = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(text.output.contains("limits:   max size 4 MiB"), "\(text.output)")
    }
}
