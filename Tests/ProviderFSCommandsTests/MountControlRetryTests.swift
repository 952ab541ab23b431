// `providerfs download PATH` on an item in `error` retries it, as the daemon answers it
// (`MountControl.download`): the reply already says `downloading`, only the missing range is
// fetched, the error (with its byte) clears once every byte is here.

import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

@testable import ProviderFSCommands

#if canImport(Glibc)
import Glibc
#endif

@Suite("MountControl: download retries an item in error")
struct MountControlRetryTests {
    /// Polls the item until it is no longer downloading (bounded: 10 s).
    static func settled(_ control: MountControl, _ path: String) async throws -> ControlItemStatus {
        var rounds = 0
        while true {
            let status = ControlItemStatus(path: path, try await control.fileSystem.status(ofPath: path))
            if status.state != "downloading" { return status }
            rounds += 1
            try #require(rounds < 10_000, "still downloading after 10 s")
            try await Task.sleep(for: .milliseconds(1))
        }
    }

    @Test func downloadOfAnItemInErrorRetriesIt() async throws {
        let scratch = try TemporaryDirectory(prefix: "control-retry")
        defer { scratch.remove() }
        let source = scratch.path + "/source"
        mkdir(source, 0o755)
        let bytes = rampBytes(seed: 41, offset: 0, count: 300_000)
        try writeFile(source + "/f.bin", bytes)
        let plan = FaultPlan([
            FaultRule(identifier: ItemIdentifier("f.bin"), fault: .failAfter(offset: 150_000, errno: EIO))
        ])
        let fileSystem = try MountComposition.makeFileSystem(
            source: source, cacheDirectory: scratch.path + "/cache", faults: plan)
        let control = MountControl(fileSystem: fileSystem, mountpoint: "/m", source: source, started: .now)

        let first = try await control.download("f.bin")
        #expect(!first.alreadyDownloaded)
        let failed = try await Self.settled(control, "f.bin")
        #expect(failed.state == "error")
        #expect(failed.presentBytes == 150_000)
        #expect(failed.error?.errno == "EIO")
        #expect(failed.error?.offset == 150_000)
        #expect(failed.error?.text.hasPrefix("EIO: at byte 150000: ") == true, "\(String(describing: failed.error))")

        plan.clear()
        let retry = try await control.download("f.bin")
        #expect(!retry.alreadyDownloaded)
        #expect(retry.item.state == "downloading", "the reply already shows the retry")
        let done = try await Self.settled(control, "f.bin")
        #expect(done.state == "materialized")
        #expect(done.presentBytes == 300_000)
        #expect(done.error == nil)
        let again = try await control.download("f.bin")
        #expect(again.alreadyDownloaded)
        await fileSystem.shutdown()
    }
}
