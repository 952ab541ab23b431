import Foundation
import LocalProvider
import ProviderCache
import ProviderFSCommands
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Demo source")
struct DemoSourceTests {
    @Test("ensure creates the tree once, reuses it, and its PDFs pass qpdf --check")
    func createsAndReuses() async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        let directory = parent.path + "/data/providerfs/demo"
        let demo = try DemoSource.ensure(at: directory)
        #expect(demo.sourceDirectory == directory + "/source")
        #expect(
            demo.faults == [
                FaultRule(
                    identifier: ItemIdentifier("Faults/fails-halfway.bin"), path: "Faults/fails-halfway.bin",
                    fault: .failAfter(offset: 4 << 20, errno: EIO), times: .untilCleared)
            ])
        var info = stat()
        #expect(stat(demo.sourceDirectory + "/Large/sparse-1GiB.bin", &info) == 0)
        #expect(info.st_size == 1 << 30)
        #expect(info.st_blocks * 512 < 16 << 20, "the 1 GiB file must be sparse")
        #expect(stat(demo.sourceDirectory + "/Projects/providerfs/notes/2026/11/deep/nested/leaf.txt", &info) == 0)

        // Reused, not regenerated: the same inode.
        var before = stat()
        stat(demo.sourceDirectory + "/README.txt", &before)
        _ = try DemoSource.ensure(at: directory)
        var after = stat()
        stat(demo.sourceDirectory + "/README.txt", &after)
        #expect(before.st_ino == after.st_ino)

        for name in ["overview.pdf", "errno contract.pdf", "one-page.pdf"] {
            let path = demo.sourceDirectory + "/Documents/Papers/" + name
            let (status, output) = try run("/usr/bin/qpdf", ["--check", path])
            #expect(status == 0, "qpdf --check \(name): \(output)")
            #expect(output.contains("No syntax or stream encoding errors"), "\(output)")
        }
    }

    @Test("the demo's failing item fails halfway with EIO through the cache; others read fine")
    func failingItem() async throws {
        let parent = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            parent.remove()
            cacheDirectory.remove()
        }
        let demo = try DemoSource.ensure(at: parent.path + "/demo")
        let provider = FaultInjectingProvider(
            wrapping: LocalDirectoryProvider(root: demo.sourceDirectory), plan: demo.faultPlan())
        var options = CacheOptions()
        options.retryDelay = .zero
        let cache = try ProviderCache(
            provider: provider, directory: cacheDirectory.path, store: InMemoryMetadataStore(), options: options)
        let failing = try await cache.catalog.item(ItemIdentifier(DemoSource.failingItem), maximumAge: nil)
        let entry = try await cache.pinContent(of: failing)
        let head = try await entry.read(offset: 0, count: 1 << 20)
        #expect(head.count == 1 << 20)
        let error = await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 5 << 20, count: 4096) }
        #expect(error?.code == .downloadFailed)
        #expect(cache.status(of: failing.identifier)?.state == .error)
        cache.content.unpin(entry)
        await cache.shutdown()
    }
}

/// Runs a program, returning its exit status and combined output.
func run(_ executable: String, _ arguments: [String]) throws -> (Int32, String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    try process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}
