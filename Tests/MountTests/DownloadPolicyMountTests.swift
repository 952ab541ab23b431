// Processes that must not download, on a real mount (issue 27, D-433): a program whose executable
// is named like an indexer (a copy of cat called tracker-miner-fs-3) gets EDEADLK ("Resource
// deadlock avoided") for a placeholder, and can still stat and list; once an ordinary reader has
// downloaded the file it reads it. `--download-for` lets it through; `--no-download-for` adds one.
// Over a local directory and the same tree served by rclone and Apache (issue 26).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct DownloadPolicyMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "download-policy-mount")
        writeTestFile(source + "/a.txt", Array("alpha\n".utf8))
        writeTestFile(source + "/b.txt", Array("beta\n".utf8))
        mkdir(scratch + "/bin", 0o755)
        for name in ["tracker-miner-fs-3", "my-indexer"] {
            _ = try? FileManager.default.copyItem(atPath: "/bin/cat", toPath: scratch + "/bin/" + name)
        }
    }

    func mount(over kind: ProviderKind, _ extra: [String]) throws -> ServedMount {
        try layout.mount(over: kind, arguments: extra)
    }

    @Test(arguments: ProviderKind.available)
    func anIndexerGetsEDEADLKForAPlaceholderAndReadsWhatIsHere(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(over: kind, ["--no-download-for", "my-indexer"])
        defer { mount.stop() }
        let indexer = quoted(scratch + "/bin/tracker-miner-fs-3")
        let refused = try shell("\(indexer) \(quoted(mount.path("a.txt")))")
        #expect(refused.status != 0)
        #expect(refused.error.contains("Resource deadlock avoided"), "\(refused)")
        let state = try shell("getfattr --only-values -n user.providerfs.state \(quoted(mount.path("a.txt")))")
        #expect(state.output == "dataless", "nothing was downloaded")
        #expect(try shell("ls \(quoted(mount.mountpoint)) && stat \(quoted(mount.path("a.txt")))").status == 0)
        let added = try shell("\(quoted(scratch + "/bin/my-indexer")) \(quoted(mount.path("b.txt")))")
        #expect(added.error.contains("Resource deadlock avoided"), "--no-download-for: \(added)")

        #expect(try shell("cat \(quoted(mount.path("a.txt")))").output == "alpha\n")
        let after = try shell("\(indexer) \(quoted(mount.path("a.txt")))")
        #expect(after.status == 0 && after.output == "alpha\n", "downloaded: readable by anyone, \(after)")
    }

    @Test(arguments: ProviderKind.available) func downloadForLetsADefaultThrough(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(over: kind, ["--download-for", "tracker-miner-fs-3"])
        defer { mount.stop() }
        let read = try shell("\(quoted(scratch + "/bin/tracker-miner-fs-3")) \(quoted(mount.path("b.txt")))")
        #expect(read.status == 0 && read.output == "beta\n", "\(read)")
    }
}
