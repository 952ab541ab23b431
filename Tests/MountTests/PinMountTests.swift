// `providerfs pin`, `unpin`, `pin --inherit` and `user.providerfs.pin` on a real mount (issue 27
// item 2, D-445): a pinned folder's files become downloaded with no read, a file created in it at
// the source too; `evict` refuses them with `pinned`; `status` counts them; the state survives a
// remount; setfattr sets it (unpinned evicts, a bad value is EINVAL) and getfattr reads it back.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct PinMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "pin-mount")
        mkdir(source + "/docs", 0o755)
        mkdir(source + "/docs/sub", 0o755)
        mkdir(source + "/other", 0o755)
        writeTestFile(source + "/docs/a.txt", patternBytes(count: 200_000, seed: 41))
        writeTestFile(source + "/docs/b.txt", patternBytes(count: 100_000, seed: 42))
        writeTestFile(source + "/docs/sub/c.bin", patternBytes(count: 1 << 20, seed: 43))
        writeTestFile(source + "/other/x.txt", patternBytes(count: 50_000, seed: 44))
    }

    func attribute(_ name: String, _ path: String) -> String {
        (try? shell("getfattr --only-values -n user.providerfs.\(name) \(quoted(path))").output) ?? "?"
    }

    func blocks(_ path: String) -> Int64 {
        var info = stat()
        return stat(path, &info) == 0 ? Int64(info.st_blocks) : -1
    }

    func lines(_ text: String) -> [[String: Any]] {
        text.split(separator: "\n").map {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] ?? [:]
        }
    }

    func pins(_ mountpoint: String) throws -> [String: Any] {
        let result = try providerfs(["status", mountpoint, "--json"], runtime: runtime)
        return ((lines(result.output).first?["cache"] as? [String: Any])?["pins"] as? [String: Any]) ?? [:]
    }

    /// A mount of `source` over `kind` (over WebDAV polling every second, so that a file made in
    /// the served tree is seen within the test's waits).
    func mount(over kind: ProviderKind = .local) throws -> ServedMount {
        try layout.mount(over: kind, arguments: kind == .local ? [] : ["--poll-interval", "1s"])
    }

    @Test(arguments: ProviderKind.available)
    func aPinnedFolderIsDownloadedWithoutReadsKeptAndFollowsTheSource(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        var mounted = try mount(over: kind)
        defer { mounted.stop() }
        let files = ["docs/a.txt", "docs/b.txt", "docs/sub/c.bin"]
        for file in files { #expect(attribute("state", mounted.path(file)) == "dataless") }

        let pinned = try providerfs(["pin", mounted.path("docs"), "--json"], runtime: runtime)
        #expect(pinned.status == 0, "\(pinned)")
        let reply = try #require(lines(pinned.output).first)
        #expect(reply["pin"] as? String == "pinned" && reply["policy"] as? String == "pinned", "\(reply)")
        // No process reads them: the daemon downloads them.
        #expect(
            waitUntil { files.allSatisfy { attribute("state", mounted.path($0)) == "materialized" } },
            "\(files.map { attribute("state", mounted.path($0)) })")
        #expect(attribute("state", mounted.path("other/x.txt")) == "dataless", "outside the pin")
        #expect(attribute("pin", mounted.path("docs")) == "pinned")
        #expect(attribute("pin", mounted.path("docs/sub/c.bin")) == "inherited")
        #expect(attribute("policy", mounted.path("docs/sub/c.bin")) == "pinned")
        // du shows it within moments, not after the kernel's attribute timeout (10 s): the kernel
        // was told to drop the node's attributes once the download ended (nothing read it).
        #expect(waitUntil(.seconds(3)) { blocks(mounted.path("docs/sub/c.bin")) >= (1 << 20) / 512 })

        // evict refuses them with the reason.
        let evict = try providerfs(["evict", mounted.path("docs"), "--json"], runtime: runtime)
        #expect(evict.status == 1, "\(evict)")
        let outcomes = lines(evict.output)
        #expect(outcomes.count == 3 && outcomes.allSatisfy { $0["outcome"] as? String == "refused" }, "\(evict)")
        #expect(outcomes.allSatisfy { $0["reason"] as? String == "pinned" }, "\(evict)")
        #expect(attribute("state", mounted.path("docs/a.txt")) == "materialized")

        // A file created at the source inside the pinned folder is downloaded, unread.
        writeTestFile(source + "/docs/sub/new.bin", patternBytes(count: 300_000, seed: 45))
        #expect(
            waitUntil { attribute("state", mounted.path("docs/sub/new.bin")) == "materialized" },
            "\(attribute("state", mounted.path("docs/sub/new.bin")))")
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: mounted.path("docs/sub/new.bin")))
                == Data(patternBytes(count: 300_000, seed: 45)))

        // Moved into the pinned folder through the mount: downloaded, unread.
        #expect(rename(mounted.path("other/x.txt"), mounted.path("docs/x.txt")) == 0)
        #expect(
            waitUntil { attribute("state", mounted.path("docs/x.txt")) == "materialized" },
            "\(attribute("state", mounted.path("docs/x.txt")))")

        // status counts them.
        let status = try pins(mounted.mountpoint)
        #expect(status["pinnedItems"] as? Int == 1 && status["files"] as? Int == 5, "\(status)")
        #expect(status["downloadedFiles"] as? Int == 5, "\(status)")
        #expect(status["presentBytes"] as? Int == status["totalBytes"] as? Int, "\(status)")
        let text = try providerfs(["status", mounted.mountpoint], runtime: runtime)
        #expect(
            text.output.contains("pins:     1 pinned, 0 unpinned; 5 of 5 pinned files downloaded"), "\(text.output)")

        // The state survives a remount of the same cache.
        mounted.stop()
        mounted = try mount(over: kind)
        #expect(attribute("pin", mounted.path("docs")) == "pinned")
        #expect(attribute("state", mounted.path("docs/a.txt")) == "materialized")
        let again = try providerfs(["evict", mounted.path("docs/a.txt"), "--json"], runtime: runtime)
        #expect(lines(again.output).first?["reason"] as? String == "pinned", "\(again)")

        // Back to the parent's policy: download on read, evictable again.
        let inherit = try providerfs(["pin", "--inherit", mounted.path("docs"), "--json"], runtime: runtime)
        #expect(inherit.status == 0, "\(inherit)")
        #expect(lines(inherit.output).first?["pin"] as? String == "inherited")
        #expect(attribute("policy", mounted.path("docs/a.txt")) == "unpinned")
        let evicted = try providerfs(["evict", mounted.path("docs/a.txt")], runtime: runtime)
        #expect(evicted.status == 0, "\(evicted)")
    }

    @Test func setfattrPinsAndUnpinsAndUnpinEvicts() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        let docs = mounted.path("docs")
        let files = ["docs/a.txt", "docs/b.txt", "docs/sub/c.bin"]

        #expect(attribute("pin", docs) == "inherited")
        let set = try shell("setfattr -n user.providerfs.pin -v pinned \(quoted(docs)) && echo OK")
        #expect(set.output == "OK\n", "\(set)")
        #expect(attribute("pin", docs) == "pinned")
        #expect(waitUntil { files.allSatisfy { attribute("state", mounted.path($0)) == "materialized" } })

        // A value that is no state: EINVAL, nothing changed.
        let bad = try shell("setfattr -n user.providerfs.pin -v sometimes \(quoted(docs)) 2>&1; echo $?")
        #expect(bad.output.contains("Invalid argument"), "\(bad)")
        #expect(attribute("pin", docs) == "pinned")

        // unpinned: the state, and the files evicted by the time setfattr returns.
        let unpin = try shell("setfattr -n user.providerfs.pin -v unpinned \(quoted(docs)) && echo OK")
        #expect(unpin.output == "OK\n", "\(unpin)")
        #expect(attribute("pin", docs) == "unpinned")
        for file in files {
            #expect(attribute("state", mounted.path(file)) == "dataless", "\(file)")
            #expect(blocks(mounted.path(file)) == 0)
        }
        // Removing the attribute: inherited.
        let removed = try shell("setfattr -x user.providerfs.pin \(quoted(docs)) && echo OK")
        #expect(removed.output == "OK\n", "\(removed)")
        #expect(attribute("pin", docs) == "inherited")

        // The CLI's unpin: evicts now and says so; a file open is kept with the reason.
        _ = try providerfs(["pin", docs], runtime: runtime)
        #expect(waitUntil { files.allSatisfy { attribute("state", mounted.path($0)) == "materialized" } })
        let descriptor = open(mounted.path("docs/b.txt"), O_RDONLY)
        try #require(descriptor >= 0)
        let cli = try providerfs(["unpin", docs, "--json"], runtime: runtime)
        close(descriptor)
        #expect(cli.status == 0, "\(cli)")
        let result = try #require(lines(cli.output).first)
        #expect(result["pin"] as? String == "unpinned" && result["evicted"] as? Int == 2, "\(result)")
        let refused = result["refused"] as? [[String: Any]] ?? []
        #expect(refused.count == 1 && refused.first?["reason"] as? String == "open", "\(result)")
        #expect(attribute("state", mounted.path("docs/a.txt")) == "dataless")
        #expect(attribute("state", mounted.path("docs/b.txt")) == "materialized")
        // Download on read from now on.
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: mounted.path("docs/a.txt")))
                == Data(patternBytes(count: 200_000, seed: 41)))
    }

    @Test func pinnedContentFillingTheLimitRefusesOtherDownloadsWithENOSPCAndSaysWhy() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache, "--cache-max-size", "1M"],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        // 1.3 MB pinned under a 1 MiB limit: the limit cannot evict it.
        let pinned = try providerfs(["pin", mounted.path("docs")], runtime: runtime)
        #expect(pinned.status == 0, "\(pinned)")
        func limits() throws -> [String: Any] {
            let result = try providerfs(["status", mounted.mountpoint, "--json"], runtime: runtime)
            return ((lines(result.output).first?["cache"] as? [String: Any])?["limits"] as? [String: Any]) ?? [:]
        }
        let blocked = try waitUntil { (try limits()["blockedReason"] as? String ?? "").contains("pinned") }
        let now = try limits()
        #expect(blocked, "\(now)")
        #expect(
            attribute("state", mounted.path("docs/a.txt")) != "dataless"
                || attribute("state", mounted.path("docs/b.txt")) != "dataless")
        let read = try shell(
            "cat \(quoted(mounted.path("other/x.txt"))) >/dev/null 2>\(quoted(scratch + "/err")); echo $?")
        #expect(read.output != "0\n", "a download past the limit succeeded")
        #expect(
            (try? String(contentsOfFile: scratch + "/err", encoding: .utf8))?.contains("No space left on device")
                == true)
        let text = try providerfs(["status", mounted.mountpoint], runtime: runtime)
        #expect(text.output.contains("new downloads refused (ENOSPC)"), "\(text.output)")
        #expect(text.output.contains("pinned"), "\(text.output)")
    }

    /// `setfattr … unpinned` asks presenters first, as `providerfs unpin` does: one without
    /// accommodatePresentedItemEviction keeps its file, one that accommodates hears of it first.
    @Test func setfattrUnpinnedAsksPresentersFirst() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        let docs = mounted.path("docs")
        let files = ["docs/a.txt", "docs/b.txt", "docs/sub/c.bin"]
        func pinAll() throws {
            #expect(try shell("setfattr -n user.providerfs.pin -v pinned \(quoted(docs))").status == 0)
            #expect(waitUntil { files.allSatisfy { attribute("state", mounted.path($0)) == "materialized" } })
        }
        let environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        let providerfsPath = productsDirectory + "/providerfs"
        try pinAll()
        let vetoing = try ChildProcess(
            providerfsPath, ["present", mounted.path("docs/a.txt")], environment: environment)
        defer { stopChild(vetoing) }
        #expect(waitUntil { vetoing.standardOutput.contains(#""event":"ready""#) }, "\(vetoing.standardError)")
        #expect(try shell("setfattr -n user.providerfs.pin -v unpinned \(quoted(docs))").status == 0)
        #expect(attribute("state", mounted.path("docs/a.txt")) == "materialized", "a presenter refused: kept")
        #expect(attribute("state", mounted.path("docs/b.txt")) == "dataless")
        #expect(attribute("state", mounted.path("docs/sub/c.bin")) == "dataless")
        stopChild(vetoing)

        try pinAll()
        let accepting = try ChildProcess(
            providerfsPath, ["present", mounted.path("docs/a.txt"), "--accept-eviction"], environment: environment)
        defer { stopChild(accepting) }
        #expect(waitUntil { accepting.standardOutput.contains(#""event":"ready""#) }, "\(accepting.standardError)")
        #expect(try shell("setfattr -n user.providerfs.pin -v unpinned \(quoted(docs))").status == 0)
        #expect(accepting.standardOutput.contains("accommodatePresentedItemEviction"), "\(accepting.standardOutput)")
        for file in files { #expect(attribute("state", mounted.path(file)) == "dataless", "\(file)") }
    }
}
