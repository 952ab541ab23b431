// The control socket of a real mount (docs/CONTROL.md): `providerfs status MOUNTPOINT` reports
// transfers, errors, cache space, uptime and the provider; `providerfs download` materializes in
// the daemon with progress and says "already downloaded" the second time; another user's process
// is refused; a dead daemon is named as such.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct ControlMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "control-mount")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/big.bin", patternBytes(count: 6 << 20, seed: 11))
        writeTestFile(source + "/docs/a.txt", Array("a\n".utf8))
        writeTestFile(source + "/docs/b.txt", Array("b\n".utf8))
    }

    func json(_ text: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }

    func lines(_ text: String) -> [[String: Any]] {
        text.split(separator: "\n").map { json(String($0)) }
    }

    @Test func statusOfAMountPointShowsTransfersErrorsCacheUptimeAndTheProvider() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(
            ["--demo"],
            environment: [
                "PROVIDERFS_RUNTIME_DIR": runtime, "XDG_DATA_HOME": scratch + "/data",
                "XDG_CACHE_HOME": cache,
            ])
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)

        let quiet = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        #expect(quiet.status == 0, "\(quiet)")
        let first = json(quiet.output)
        #expect(first["mountpoint"] as? String == mount.mountpoint)
        #expect((first["pid"] as? Int).map(Int32.init) == mount.child.pid)
        #expect((first["transfers"] as? [Any])?.isEmpty == true)
        #expect((first["errors"] as? [Any])?.isEmpty == true)
        let provider = first["provider"] as? [String: Any] ?? [:]
        #expect(provider["reachable"] as? Bool == true, "\(provider)")
        let cache = first["cache"] as? [String: Any] ?? [:]
        #expect((cache["usedBytes"] as? Int ?? 0) > 0, "the metadata store is in the cache directory")
        #expect((cache["freeBytes"] as? Int ?? 0) > 0)
        let uptime = first["uptimeSeconds"] as? Double ?? -1
        #expect(uptime >= 0 && uptime < 600)

        // A failed download: the item is listed with its errno and the bytes it got.
        let failing = try shell("cat \(m)/Faults/fails-halfway.bin > /dev/null")
        #expect(failing.status != 0)
        let busy = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        #expect(busy.status == 0, "\(busy)")
        let report = json(busy.output)
        let errors = report["errors"] as? [[String: Any]] ?? []
        let failed = try #require(
            errors.first { $0["path"] as? String == "Faults/fails-halfway.bin" }, "\(busy.output)")
        #expect(failed["state"] as? String == "error")
        let error = failed["error"] as? [String: Any] ?? [:]
        #expect(error["errno"] as? String == "EIO", "\(failed)")
        #expect(error["errnoValue"] as? Int == Int(EIO))
        #expect(!(error["message"] as? String ?? "").isEmpty)
        // The byte where it failed: the demo item fails at 4 MiB.
        #expect(error["offset"] as? Int == 4 << 20, "\(failed)")
        #expect((failed["presentBytes"] as? Int ?? 0) > 0 && (failed["presentBytes"] as? Int ?? 0) < 8 << 20)

        let text = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(text.status == 0)
        #expect(text.output.contains("provider: reachable"), "\(text.output)")
        #expect(text.output.contains("Faults/fails-halfway.bin  EIO: at byte 4194304: "), "\(text.output)")

        // Downloading the failing item fails as a command (exit 1, errno in the sentence).
        let download = try providerfs(["download", mount.path("Faults/fails-halfway.bin")], runtime: runtime)
        #expect(download.status == 1, "\(download)")
        #expect(download.error.contains("EIO"), "\(download.error)")
        // An item inside the mount keeps its xattr-based status.
        let item = try providerfs(["status", mount.path("Faults/fails-halfway.bin"), "--json"], runtime: runtime)
        #expect(item.output.contains("\"state\":\"error\""), "\(item.output)")
    }

    /// Over the slow source itself and rclone serving it (Apache's workers must own the tree they
    /// serve, which a FUSE fixture's cannot be given).
    @Test(arguments: ProviderKind.available.filter { $0 != .apache })
    func aSlowDownloadIsATransferWithProgressAndDownloadFollowsIt(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // The source is itself a FUSE mount whose reads of "slow…" files wait 200 ms each, served
        // one at a time (--max-threads 1): a request is at most 1 MiB, so the 8 MiB file takes at
        // least 1.6 s to download (about 4 s measured), and it is seen moving.
        let tree = scratch + "/tree"
        mkdir(tree, 0o755)
        let bytes = patternBytes(count: 8 << 20, seed: 12)
        writeTestFile(tree + "/slow-big.bin", bytes)
        let slowSource = try MountedFileSystem.fixture(
            tree: tree, extraArguments: ["--slow-delay", "200ms", "--max-threads", "1"])
        defer { slowSource.stop() }
        let mount = try ServedMount(
            tree: slowSource.mountpoint, kind: kind, arguments: ["--cache", cache],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        let file = mount.path("slow-big.bin")
        #expect(try shell("head -c 100 \(quoted(file)) | wc -c").output.trimmingCharacters(in: .whitespaces) == "100\n")
        let busy = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        let transfers = json(busy.output)["transfers"] as? [[String: Any]] ?? []
        let moving = try #require(transfers.first { $0["path"] as? String == "slow-big.bin" }, "\(busy.output)")
        #expect(moving["state"] as? String == "downloading", "\(moving)")
        let present = moving["presentBytes"] as? Int ?? 0
        #expect(present >= 100 && present < 8 << 20, "\(moving)")
        #expect(moving["totalBytes"] as? Int == 8 << 20)
        let text = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(text.output.contains("slow-big.bin  downloading  "), "\(text.output)")

        // `download` joins the running download and follows it to the end.
        let download = try providerfs(["download", file], runtime: runtime)
        #expect(download.status == 0, "\(download)")
        #expect(download.output.contains("slow-big.bin: downloading 8 MiB"), "\(download.output)")
        #expect(download.output.contains("slow-big.bin: 100% (8 MiB) done"), "\(download.output)")
        let done = json(try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime).output)
        #expect((done["transfers"] as? [Any])?.isEmpty == true, "\(done)")
        #expect(
            try shell("sha256sum < \(quoted(file))").output
                == (try shell("sha256sum < \(quoted(tree + "/slow-big.bin"))").output))
    }

    /// Over a local directory and the same tree served by rclone and Apache (issue 26), with
    /// `status` naming the provider reachable and `refresh` of a file changed at the source.
    @Test(arguments: ProviderKind.available)
    func downloadMaterializesInTheDaemonWithProgressAndOnlyOnce(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try layout.mount(over: kind)
        defer { mount.stop() }
        let file = mount.path("big.bin")

        let download = try providerfs(["download", file], runtime: runtime)
        #expect(download.status == 0, "\(download)")
        #expect(download.output.contains("big.bin: downloading 6 MiB"), "\(download.output)")
        #expect(download.output.contains("big.bin: 100% (6 MiB) done"), "\(download.output)")
        let status = try providerfs(["status", file, "--json"], runtime: runtime)
        #expect(status.output.contains("\"state\":\"materialized\""), "\(status.output)")
        #expect(status.output.contains("\"progress\":\"6291456/6291456\""), "\(status.output)")
        // The daemon holds every byte (the cache file is complete) before anything read it here.
        #expect(
            try shell("sha256sum < \(quoted(file))").output
                == (try shell("sha256sum < \(quoted(source + "/big.bin"))").output))

        let again = try providerfs(["download", file], runtime: runtime)
        #expect(again.status == 0, "\(again)")
        #expect(again.output == "\(file): already downloaded (6 MiB)\n", "\(again.output)")
        let againJSON = try providerfs(["download", file, "--json"], runtime: runtime)
        let result = json(againJSON.output)
        #expect(result["alreadyDownloaded"] as? Bool == true, "\(againJSON.output)")
        #expect(result["bytes"] as? Int == 6 << 20)
        #expect(result["state"] as? String == "materialized")

        // A folder: each file, through the same socket, relative to the mount root.
        let folder = try providerfs(["download", mount.path("docs"), "--json"], runtime: runtime)
        #expect(folder.status == 0, "\(folder)")
        let results = lines(folder.output)
        #expect(results.map { $0["path"] as? String } == [mount.path("docs/a.txt"), mount.path("docs/b.txt")])
        #expect(results.allSatisfy { $0["state"] as? String == "materialized" && $0["error"] == nil })

        let report = json(try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime).output)
        #expect((report["transfers"] as? [Any])?.isEmpty == true, "\(report)")
        let provider = report["provider"] as? [String: Any] ?? [:]
        #expect(provider["reachable"] as? Bool == true, "\(provider)")

        // A file changed at the source: `refresh` asks the provider again, and it reads anew.
        writeTestFile(source + "/docs/a.txt", Array("a, changed\n".utf8))
        mount.adopt("docs/a.txt")
        let refreshed = try providerfs(["refresh", mount.path("docs/a.txt"), "--json"], runtime: runtime)
        #expect(refreshed.status == 0, "\(refreshed)")
        let answer = json(refreshed.output)
        #expect(answer["outcome"] as? String == "present" && answer["size"] as? Int == 11, "\(refreshed.output)")
        #expect(try shell("cat \(quoted(mount.path("docs/a.txt")))").output == "a, changed\n")

        let missing = try providerfs(["download", mount.path("nope.bin")], runtime: runtime)
        #expect(missing.status == 1)
        let outside = try providerfs(["download", source + "/big.bin"], runtime: runtime)
        #expect(outside.status == 1)
        #expect(outside.error.contains("is not inside a ProviderFS mount"), "\(outside.error)")
    }

    @Test func anotherUsersProcessIsRefusedByTheDaemon() throws {
        guard requireFUSE(), getuid() == 0 else { return }  // becoming another user needs root (CI)
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        // For this test only, everyone can reach the socket: the credential check alone refuses.
        let socket = try #require(
            try shell("ls \(quoted(runtime))/mounts/*.control.sock").output.split(separator: "\n").first.map(
                String.init))
        for directory in [scratch, runtime, runtime + "/mounts"] { chmod(directory, 0o755) }
        chmod(socket, 0o666)
        let binary = quoted(productsDirectory + "/providerfs")
        let refused = try shell(
            "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) setpriv --reuid=65534 --regid=65534 --clear-groups "
                + "\(binary) status \(quoted(mount.mountpoint))")
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.error.contains("refused this user"), "\(refused.error)")
        #expect(refused.error.split(separator: "\n").count == 1, "one sentence")
        #expect(mount.child.standardError.contains("refused a control connection from pid"))
        #expect(mount.child.standardError.contains("uid 65534"))
        // The owner is still served.
        #expect(try providerfs(["status", mount.mountpoint], runtime: runtime).status == 0)
    }

    @Test func statusOfADeadDaemonsMountPointSaysItIsNotRunning() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.fixture(extraArguments: ["--subtype", "providerfs"])
        defer { mount.stop() }
        mount.child.signal(SIGKILL)
        mount.child.wait(timeout: .seconds(5))
        let status = try providerfs(["status", mount.mountpoint], runtime: runtime)
        #expect(status.status == 1)
        #expect(status.error.contains("is not running"), "\(status.error)")
        #expect(status.error.contains("providerfs unmount \(mount.mountpoint)"), "\(status.error)")
    }
}
