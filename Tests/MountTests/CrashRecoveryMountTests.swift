// Crash recovery with a real kill -9 (issue 11, item 5), over each provider (a local directory,
// rclone, Apache): a daemon killed in the middle of a large download keeps, after a remount with the same --cache, everything it had fetched up to one
// second before the kill, and loses at most 256 MiB; what it keeps reads back right.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct CrashRecoveryMountTests {
    static let size: Int64 = 1 << 30

    /// `present` of `user.providerfs.progress` ("present/total"), nil when unreadable.
    static func presentBytes(_ path: String) -> Int64? {
        guard case .success(let bytes) = ExtendedAttributes.value("user.providerfs.progress", of: path) else {
            return nil
        }
        return String(decoding: bytes, as: UTF8.self).split(separator: "/").first.flatMap { Int64($0) }
    }

    /// Disk bytes the content files of `cache` hold (what the killed daemon had written).
    static func writtenBytes(_ cache: String) -> Int64 {
        let directory = cache + "/content"
        guard let handle = opendir(directory) else { return 0 }
        defer { closedir(handle) }
        var total: Int64 = 0
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            var info = stat()
            guard name != ".", name != "..", lstat(directory + "/" + name, &info) == 0 else { continue }
            total += Int64(info.st_blocks) * 512
        }
        return total
    }

    // One provider at a time: each case writes a gigabyte, which the others' syncs would wait for.
    @Test(.serialized, arguments: ProviderKind.available)
    func aKilledDaemonRefetchesAtMostItsLastSecondAndAtMost256MiB(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        let fixture = try SourceMount(prefix: "crash-mount", kind: kind)
        defer { fixture.stop() }
        let tree = fixture.tree
        let cache = fixture.cache
        // 1 GiB of random bytes, made in seconds (16 MiB from /dev/urandom, 64 times over): no
        // chunk of zeros, so every byte is written to the cache file and counts.
        let made = try shell(
            "head -c 16M /dev/urandom > \(quoted(tree + "/seed")) && for i in $(seq 64); do cat \(quoted(tree + "/seed")); done"
                + " > \(quoted(tree + "/big.bin")) && rm \(quoted(tree + "/seed"))"
                // Synced before the mount: ext4's ordered journal would make the daemon's first
                // fdatasync wait for this gigabyte of the test's own (seconds on a slow disk).
                + " && sync \(quoted(tree + "/big.bin"))", timeout: .seconds(120))
        #expect(made.status == 0, "\(made)")

        let first = fixture.mount
        let file = first.path("big.bin")
        let reader = try ChildProcess("/bin/sh", ["-c", "exec dd if=\(quoted(file)) of=/dev/null bs=1M status=none"])
        defer {
            reader.signal(SIGKILL)
            _ = reader.wait(timeout: .seconds(10))
        }
        // Kill once 1.5 s have passed or 60% is here, whichever comes first, so that the kill
        // lands inside the download, with the progress sampled every 20 ms before it.
        let start = ContinuousClock.now
        var samples: [(at: ContinuousClock.Instant, present: Int64)] = []
        while true {
            let present = Self.presentBytes(file) ?? 0
            samples.append((.now, present))
            if ContinuousClock.now - start >= .milliseconds(1500) || present >= Self.size * 6 / 10 { break }
            usleep(20_000)
        }
        first.child.signal(SIGKILL)
        let killedAt = ContinuousClock.now
        _ = first.child.wait(timeout: .seconds(10))
        let written = Self.writtenBytes(cache)
        // What was here one second before the kill: all of it must be kept.
        let secondBefore = samples.last { $0.at <= killedAt - .seconds(1) }?.present ?? 0
        try #require(written < Self.size, "the download ended before the kill (\(written) bytes): nothing to test")
        try #require(written >= 64 << 20, "too little was fetched before the kill (\(written) bytes)")

        // Clean up the dead mount the way a user would, then mount again over the same cache.
        _ = try shell("fusermount3 -u \(quoted(first.mountpoint)) || fusermount3 -uz \(quoted(first.mountpoint))")
        #expect(MountTable.entry(at: first.mountpoint) == nil)
        try fixture.remount()
        let second = fixture.mount
        let kept = try #require(Self.presentBytes(second.path("big.bin")))
        let lost = written - kept
        #expect(kept >= secondBefore, "kept \(kept) of \(written) bytes; \(secondBefore) were here 1 s before the kill")
        #expect(lost <= 256 << 20, "lost \(lost) bytes of \(written) (at most 256 MiB)")
        // What is kept reads back right, and the rest is fetched again.
        let compared = try shell(
            "cmp \(quoted(tree + "/big.bin")) \(quoted(second.path("big.bin")))", timeout: .seconds(120))
        #expect(compared.status == 0, "\(compared)")
        print(
            "crash recovery over \(kind): written \(written), kept \(kept), 1 s before the kill \(secondBefore), lost \(lost)"
        )
    }
}
