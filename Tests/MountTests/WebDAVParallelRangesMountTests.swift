// Parallel ranges through the mount (D-513): `rclone serve webdav` behind the tampering proxy, a
// 100 MiB file read cold with `cat` through `--parallel-ranges 3`. Its bytes are the served
// file's; the proxy (answering each GET 0.2 s late) saw ranged GETs of 32 MiB parts, two or three
// of them at once.

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
struct WebDAVParallelRangesMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "webdav-ranges-mount")
    }

    @Test func aColdReadOfALargeFileIsRangedGetsSeveralAtOnceAndExact() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        writeTestFile(source + "/large.bin", patternBytes(count: 100 << 20, seed: 13))
        let upstream = try WebDAVTestServer(root: source)
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy-root", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        try proxy.tamper(.slowGets)
        let mount = try MountedFileSystem.providerfs([
            "--webdav", proxy.url, "--cache", cache, "--poll-interval", "0", "--parallel-ranges", "3",
        ])
        defer { mount.stop() }

        let read = try shell(
            "cat \(quoted(mount.path("large.bin"))) | cmp - \(quoted(source + "/large.bin"))", timeout: .seconds(120))
        #expect(read.status == 0, "\(read)")
        let ranges = proxy.requestLog().compactMap { line -> (Int64, Int64)? in
            guard let field = line.split(separator: " ").first(where: { $0.hasPrefix("range=bytes=") }) else {
                return nil
            }
            let bounds = field.dropFirst("range=bytes=".count).split(separator: "-").compactMap { Int64($0) }
            return bounds.count == 2 ? (bounds[0], bounds[1]) : nil
        }
        #expect(ranges.count >= 4 && ranges.allSatisfy { $0.1 - $0.0 + 1 <= 32 << 20 }, "\(proxy.requestLog())")
        let most = proxy.mostConcurrentGets()
        #expect(most >= 2 && most <= 3, "\(most) GETs at once")
    }
}
