// `providerfs evict` on a real mount (issue 27): a downloaded file becomes a placeholder again
// (xattr state, st_blocks, the cache's disk use) and reads the same bytes (over each provider); an open file, and one
// with a presenter that does not accommodate evictions, are refused with the reason and exit 1;
// a presenter that accepts hears of it first; a directory is evicted file by file.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct EvictMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "evict-mount")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/big.bin", patternBytes(count: 3 << 20, seed: 21))
        writeTestFile(source + "/docs/a.txt", patternBytes(count: 200_000, seed: 22))
        writeTestFile(source + "/docs/b.txt", patternBytes(count: 100_000, seed: 23))
    }

    func state(_ path: String) throws -> String {
        try shell("getfattr --only-values -n user.providerfs.state \(quoted(path))").output
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

    @Test(arguments: ProviderKind.available)
    func aDownloadedFileIsAPlaceholderAgainAndReadsTheSameBytes(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try layout.mount(over: kind)
        defer { mount.stop() }
        let big = mount.path("big.bin")
        let expected = try Data(contentsOf: URL(fileURLWithPath: source + "/big.bin"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: big)) == expected)
        #expect(try state(big) == "materialized")
        #expect(blocks(big) >= Int64(expected.count / 512))
        let before = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        let usedBefore = ((lines(before.output).first?["cache"] as? [String: Any])?["usedBytes"] as? Int) ?? 0

        let evicted = try providerfs(["evict", big, "--json"], runtime: runtime)
        #expect(evicted.status == 0, "\(evicted)")
        let result = try #require(lines(evicted.output).first)
        #expect(result["outcome"] as? String == "evicted")
        #expect((result["freedBytes"] as? Int ?? 0) >= expected.count)
        #expect(result["state"] as? String == "dataless")
        #expect(try state(big) == "dataless")
        #expect(blocks(big) == 0, "du shows what is local")
        let after = try providerfs(["status", mount.mountpoint, "--json"], runtime: runtime)
        let usedAfter = ((lines(after.output).first?["cache"] as? [String: Any])?["usedBytes"] as? Int) ?? 0
        // The metadata store beside the content may grow meanwhile (its journal): 90 % at least.
        #expect(usedBefore - usedAfter >= expected.count * 9 / 10, "\(usedBefore) → \(usedAfter)")

        // Again: nothing to do, exit 0.
        let again = try providerfs(["evict", big], runtime: runtime)
        #expect(again.status == 0 && again.output.contains("already a placeholder"), "\(again)")
        // Read again: downloaded again, the same bytes.
        #expect(try Data(contentsOf: URL(fileURLWithPath: big)) == expected)
        #expect(try state(big) == "materialized")

        // A directory: every file under it; a file written through the mount too, once uploaded.
        writeTestFile(mount.path("docs/new.txt"), Array("written through the mount\n".utf8))
        #expect(
            waitUntil {
                (try? Data(contentsOf: URL(fileURLWithPath: source + "/docs/new.txt")))
                    == Data("written through the mount\n".utf8)
            })
        _ = try Data(contentsOf: URL(fileURLWithPath: mount.path("docs/a.txt")))
        var newInfo = stat()
        #expect(stat(mount.path("docs/new.txt"), &newInfo) == 0)
        let folder = try providerfs(["evict", mount.path("docs"), "--json"], runtime: runtime)
        #expect(folder.status == 0, "\(folder)")
        let outcomes = Dictionary(
            lines(folder.output).map {
                (URL(fileURLWithPath: $0["path"] as? String ?? "").lastPathComponent, $0["outcome"] as? String ?? "")
            }, uniquingKeysWith: { first, _ in first })
        #expect(outcomes == ["a.txt": "evicted", "b.txt": "alreadyPlaceholder", "new.txt": "evicted"], "\(folder)")
        #expect(try state(mount.path("docs/new.txt")) == "dataless")
        var evictedInfo = stat()
        #expect(stat(mount.path("docs/new.txt"), &evictedInfo) == 0 && evictedInfo.st_ino == newInfo.st_ino)
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: mount.path("docs/new.txt")))
                == Data("written through the mount\n".utf8))
    }

    @Test func anOpenFileAndAVetoingPresenterAreRefusedAnAcceptingOneHearsOfIt() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mount.stop() }
        let big = mount.path("big.bin")
        _ = try Data(contentsOf: URL(fileURLWithPath: big))

        // Open: refused, nothing removed, exit 1 with the reason.
        let descriptor = open(big, O_RDONLY)
        try #require(descriptor >= 0)
        let open = try providerfs(["evict", big], runtime: runtime)
        #expect(open.status == 1, "\(open)")
        #expect(open.output.contains("not evicted: open"), "\(open)")
        #expect(try state(big) == "materialized")
        close(descriptor)

        // A presenter without accommodatePresentedItemEviction vetoes (rule 34).
        let environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        let providerfsPath = productsDirectory + "/providerfs"
        let vetoing = try ChildProcess(providerfsPath, ["present", big], environment: environment)
        defer { stopChild(vetoing) }
        #expect(waitUntil { vetoing.standardOutput.contains(#""event":"ready""#) }, "\(vetoing.standardError)")
        let vetoed = try providerfs(["evict", big, "--json"], runtime: runtime)
        #expect(vetoed.status == 1, "\(vetoed)")
        let refusal = try #require(lines(vetoed.output).first)
        #expect(refusal["outcome"] as? String == "refused")
        #expect((refusal["reason"] as? String ?? "").contains("accommodatePresentedItemEviction"), "\(refusal)")
        #expect(try state(big) == "materialized")
        stopChild(vetoing)

        // One that accepts hears of it before the content goes, and ends.
        let accepting = try ChildProcess(
            providerfsPath, ["present", big, "--accept-eviction"], environment: environment)
        defer { stopChild(accepting) }
        #expect(waitUntil { accepting.standardOutput.contains(#""event":"ready""#) }, "\(accepting.standardError)")
        let accepted = try providerfs(["evict", big], runtime: runtime)
        #expect(accepted.status == 0, "\(accepted)")
        #expect(accepting.standardOutput.contains("accommodatePresentedItemEviction"), "\(accepting.standardOutput)")
        #expect(try state(big) == "dataless")
        #expect(accepting.wait(timeout: .seconds(10)) == 0, "the presenter ended: \(accepting.standardOutput)")
    }
}
