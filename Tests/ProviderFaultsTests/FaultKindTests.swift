// Every fault kind through FaultInjectingProvider with a manual clock (no sleeps): the bytes and
// errors a consumer sees, `times` counted in downloads (and fetches), directory scope, metadata
// faults, and the store file (round trip, a consumed download, a corrupt file set aside).

import CryptoSupport
import Foundation
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

private let fileSize: Int64 = 300_000
private let v = ContentVersion("v")

/// An in-memory tree: `dir/sub/f`, `dir/g`, `top`, each `fileSize` ramp bytes.
private func makeBase() -> InMemoryProvider {
    let base = InMemoryProvider()
    base.addDirectory("dir")
    base.addDirectory("dir/sub")
    base.putFile("dir/sub/f", .ramp(seed: 1, size: fileSize))
    base.putFile("dir/g", .ramp(seed: 2, size: fileSize))
    base.putFile("top", .ramp(seed: 3, size: fileSize))
    return base
}

private func version(_ base: InMemoryProvider, _ path: String) -> ContentVersion { base.content(of: path)!.1 }

private func expected(_ base: InMemoryProvider, _ path: String, _ range: Range<Int64>) -> [UInt8] {
    base.content(of: path)!.0.slice(range)
}

/// Reads a stream to its end in chunks of `chunk`; the bytes, and the error that ended it (if any).
private func drain(_ stream: any ContentStream, chunk: Int = 65536) async -> (bytes: [UInt8], error: ProviderError?) {
    var bytes: [UInt8] = []
    do {
        while let next = try await stream.next(maximumLength: chunk) { bytes += next }
        return (bytes, nil)
    } catch {
        return (bytes, ProviderError.from(error))
    }
}

/// Fetches all of `path` through `provider`.
private func fetchAll(
    _ provider: FaultInjectingProvider, _ base: InMemoryProvider, _ path: String
) async throws -> (bytes: [UInt8], error: ProviderError?) {
    let stream = try await provider.fetchContents(
        of: ItemIdentifier(path), version: version(base, path), range: 0..<fileSize)
    defer { stream.close() }
    return await drain(stream)
}

/// The first offset where two buffers differ (nil: equal), for messages on big buffers.
private func firstDifference(_ a: [UInt8], _ b: [UInt8]) -> Int? {
    for index in 0..<min(a.count, b.count) where a[index] != b[index] { return index }
    return a.count == b.count ? nil : min(a.count, b.count)
}

@Suite("Fault kinds, with a manual clock")
struct FaultKindTests {
    @Test("no rule: the base stream itself, direct transfer and all")
    func noRuleIsUntouched() async throws {
        let base = makeBase()
        let plan = FaultPlan()
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        #expect(plan.isEmpty)
        let stream = try await provider.fetchContents(
            of: ItemIdentifier("top"), version: version(base, "top"), range: 0..<10)
        #expect(String(describing: type(of: stream)) == "InMemoryStream")
        // A rule about another item leaves this one's stream untouched too.
        plan.add(FaultRule(identifier: ItemIdentifier("dir/g"), fault: .truncate(offset: 1)))
        let other = try await provider.fetchContents(
            of: ItemIdentifier("top"), version: version(base, "top"), range: 0..<10)
        #expect(String(describing: type(of: other)) == "InMemoryStream")
    }

    @Test(
        "--fail-at: the bytes before the offset, then the error its errno names",
        arguments: [
            ("EIO", ProviderError.Code.io), ("ECONNRESET", .io), ("EACCES", .accessDenied),
            ("ENETUNREACH", .unreachable),
            ("ECONNREFUSED", .unreachable), ("ETIMEDOUT", .timedOut),
        ])
    func failAt(name: String, code: ProviderError.Code) async throws {
        let base = makeBase()
        let errno = try #require(Errno(parsing: name)).rawValue
        let plan = FaultPlan([
            FaultRule(identifier: ItemIdentifier("top"), fault: .failAfter(offset: 100_000, errno: errno))
        ])
        let (bytes, error) = try await fetchAll(FaultInjectingProvider(wrapping: base, plan: plan), base, "top")
        #expect(bytes.count == 100_000)
        #expect(firstDifference(bytes, expected(base, "top", 0..<100_000)) == nil)
        #expect(error?.code == code)
        #expect(error?.errno == errno)
    }

    @Test("--fail-at 0 fails before any byte; at the last byte, all but one arrive")
    func failAtEdges() async throws {
        let base = makeBase()
        for (offset, count) in [(Int64(0), 0), (fileSize - 1, Int(fileSize) - 1)] {
            let plan = FaultPlan([
                FaultRule(identifier: ItemIdentifier("top"), fault: .failAfter(offset: offset, errno: EIO))
            ])
            let (bytes, error) = try await fetchAll(FaultInjectingProvider(wrapping: base, plan: plan), base, "top")
            #expect(bytes.count == count)
            #expect(error?.code == .io)
        }
    }

    @Test("--stall without a duration: nothing past the offset until cancelled")
    func stallUntilCancelled() async throws {
        let base = makeBase()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .stall(offset: 1000))])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan, clock: ManualClock())
        let stream = try await provider.fetchContents(
            of: ItemIdentifier("top"), version: version(base, "top"), range: 0..<fileSize)
        let first = try await stream.next(maximumLength: 4096)
        #expect(first?.count == 1000)
        let reader = Task { try await stream.next(maximumLength: 4096) }
        reader.cancel()
        let result = await reader.result
        #expect(throws: CancellationError.self) { try result.get() }
    }

    @Test("a stalled stream goes on once its fault is cleared (a read after `fault clear` is not held)")
    func stallEndsWhenCleared() async throws {
        let base = makeBase()
        let clock = ManualClock()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .stall(offset: 5000))])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan, clock: clock)
        let reader = Task { try await fetchAll(provider, base, "top") }
        #expect(await clock.waitForSleepers(atLeast: 1))
        // Still stalled however long it waits while the fault is there.
        for _ in 0..<10 {
            clock.advance(by: .seconds(60))
            #expect(await clock.waitForSleepers(atLeast: 1))
        }
        #expect(plan.clear() == 1)
        clock.advance(by: .milliseconds(50))
        let (bytes, error) = try await withDeadline(.seconds(30), "the stream after clear") { try await reader.value }
        #expect(error == nil)
        #expect(firstDifference(bytes, expected(base, "top", 0..<fileSize)) == nil)
    }

    @Test("--stall 2s: stops at the offset for 2 s of the injected clock, then goes on")
    func stallForADuration() async throws {
        let base = makeBase()
        let clock = ManualClock()
        let plan = FaultPlan([
            FaultRule(identifier: ItemIdentifier("top"), fault: .stall(offset: 5000, duration: .seconds(2)))
        ])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan, clock: clock)
        let reader = Task { try await fetchAll(provider, base, "top") }
        #expect(await clock.waitForSleepers(atLeast: 1))
        clock.advance(by: .milliseconds(1999))
        // Still stalled: it sleeps again (the stall looks every 50 ms whether it was cleared).
        #expect(await clock.waitForSleepers(atLeast: 1))
        clock.advance(by: .milliseconds(1))
        let (bytes, error) = try await reader.value
        #expect(error == nil)
        #expect(firstDifference(bytes, expected(base, "top", 0..<fileSize)) == nil)
    }

    @Test("--truncate-at: a clean, early end")
    func truncate() async throws {
        let base = makeBase()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .truncate(offset: 123_456))])
        let (bytes, error) = try await fetchAll(FaultInjectingProvider(wrapping: base, plan: plan), base, "top")
        #expect(error == nil)
        #expect(bytes.count == 123_456)
        #expect(firstDifference(bytes, expected(base, "top", 0..<123_456)) == nil)
    }

    @Test("--change-version-at: versionChanged at the byte")
    func changeVersion() async throws {
        let base = makeBase()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .changeVersion(offset: 70_000))])
        let (bytes, error) = try await fetchAll(FaultInjectingProvider(wrapping: base, plan: plan), base, "top")
        #expect(bytes.count == 70_000)
        #expect(error?.code == .versionChanged)
    }

    @Test("--corrupt: 4096 bytes flipped at the offset, checksummed with the unmodified bytes' SHA-256")
    func corrupt() async throws {
        let base = makeBase()
        for offset: Int64 in [0, 65_000, fileSize - 100] {
            let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .corrupt(offset: offset))])
            let provider = FaultInjectingProvider(wrapping: base, plan: plan)
            let range: Range<Int64> = 1000..<fileSize
            let stream = try await provider.fetchContents(
                of: ItemIdentifier("top"), version: version(base, "top"), range: range)
            #expect(stream.capabilities == .checksummed)
            #expect(stream.checksum == nil)
            let (bytes, error) = await drain(stream, chunk: 10_000)
            #expect(error == nil)
            let original = expected(base, "top", range)
            #expect(bytes.count == original.count)
            var flipped = original
            let start = max(offset, range.lowerBound) - range.lowerBound
            let end = min(offset + 4096, range.upperBound) - range.lowerBound
            if start < end { for index in Int(start)..<Int(end) { flipped[index] ^= 0xFF } }
            #expect(firstDifference(bytes, flipped) == nil, "offset \(offset)")
            #expect(stream.checksum == ContentChecksum(.sha256, digest: SHA256.hash(original)))
            #expect(stream.checksum != ContentChecksum(.sha256, digest: SHA256.hash(bytes)) || start >= end)
        }
    }

    @Test("--slow: paced on the injected clock, in chunks of at most a tenth of a second's worth")
    func slow() async throws {
        let base = makeBase()
        let clock = ManualClock()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .slow(bytesPerSecond: 100_000))])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan, clock: clock)
        let stream = try await provider.fetchContents(
            of: ItemIdentifier("top"), version: version(base, "top"), range: 0..<fileSize)
        let chunks = Locked<[Int]>([])
        let reader = Task {
            while let chunk = try await stream.next(maximumLength: 1 << 20) {
                chunks.withLock { $0.append(chunk.count) }
            }
        }
        // 300,000 bytes at 100,000 B/s: 30 chunks of 10,000 bytes, 100 ms each.
        var advanced = 0
        while chunks.withLock({ $0.count }) < 30 && advanced < 100 {
            #expect(await clock.waitForSleepers(atLeast: 1))
            clock.advance(by: .milliseconds(100))
            advanced += 1
            let expectedChunks = advanced
            // Wait until the chunk the sleep released has been taken.
            var spins = 0
            while chunks.withLock({ $0.count }) < expectedChunks && spins < 10_000 {
                await Task.yield()
                spins += 1
            }
        }
        try await reader.value
        #expect(advanced == 30)
        #expect(chunks.withLock { $0 }.allSatisfy { $0 <= 10_000 })
        #expect(chunks.withLock { $0 }.reduce(0, +) == Int(fileSize))
        #expect(clock.now.offset == .seconds(3))
    }

    @Test("--offline: every call about the item throws unreachable; the root's: every call")
    func offline() async throws {
        let base = makeBase()
        let plan = FaultPlan()
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        plan.add(FaultRule(identifier: ItemIdentifier("dir/g"), fault: .offline))
        await #expect(throws: ProviderError(.unreachable, "provider is offline (injected fault)")) {
            _ = try await provider.item(for: ItemIdentifier("dir/g"))
        }
        await #expect(throws: ProviderError.self) {
            _ = try await provider.fetchContents(
                of: ItemIdentifier("dir/g"), version: version(base, "dir/g"), range: 0..<1)
        }
        await #expect(throws: ProviderError.self) {
            _ = try await provider.child(named: "g", of: ItemIdentifier("dir"))
        }
        #expect(try await provider.children(of: ItemIdentifier("dir")).count == 2)
        #expect(try await provider.item(for: ItemIdentifier("top")).name == "top")
        plan.add(FaultRule(identifier: .root, fault: .offline))
        await #expect(throws: ProviderError.self) { _ = try await provider.item(for: ItemIdentifier("top")) }
        await #expect(throws: ProviderError.self) { _ = try await provider.children(of: .root) }
    }
}

@Suite("Fault times, scope and metadata")
struct FaultScopeTests {
    @Test("--times N counts downloads: every fetch of a download (its retries) is faulted, the next download is not")
    func timesCountDownloads() async throws {
        let base = makeBase()
        let plan = FaultPlan([
            FaultRule(
                identifier: ItemIdentifier("top"), fault: .failAfter(offset: 10, errno: EIO), times: .downloads(2))
        ])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        let top = ItemIdentifier("top")
        let topVersion = version(base, "top")
        for download in 1...3 {
            // Three attempts of one download.
            for _ in 0..<3 {
                let (_, error) = try await fetchAll(provider, base, "top")
                #expect((error != nil) == (download <= 2), "download \(download)")
            }
            if download <= 2 {
                #expect(plan.states.first?.running == 1)
                #expect(plan.states.first?.remaining == 2 - download)
            }
            provider.downloadEnded(of: top, version: topVersion, succeeded: download > 2)
        }
        #expect(plan.isEmpty, "the rule goes once its downloads are used and ended")
        #expect(base.counters.downloadsEnded.count == 3, "the base still hears every end")
    }

    @Test("a download the rule caught stays faulted until it ends, though its count is used up")
    func runningDownloadKeepsItsFault() async throws {
        let base = makeBase()
        let plan = FaultPlan([
            FaultRule(identifier: ItemIdentifier("top"), fault: .truncate(offset: 5), times: .downloads(1))
        ])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        #expect(try await fetchAll(provider, base, "top").bytes.count == 5)
        #expect(plan.states.first?.remaining == 0)
        #expect(try await fetchAll(provider, base, "top").bytes.count == 5)
        // Another item's download is not this one's.
        #expect(try await fetchAll(provider, base, "dir/g").bytes.count == Int(fileSize))
        provider.downloadEnded(of: ItemIdentifier("top"), version: version(base, "top"), succeeded: false)
        #expect(plan.isEmpty)
        #expect(try await fetchAll(provider, base, "top").bytes.count == Int(fileSize))
    }

    @Test("a download that ends before the fault's byte is not counted: the next one meets the fault")
    func unstruckDownloadsAreNotCounted() async throws {
        let base = makeBase()
        let plan = FaultPlan([
            FaultRule(
                identifier: ItemIdentifier("top"), fault: .failAfter(offset: 200_000, errno: EIO), times: .downloads(1))
        ])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        let top = ItemIdentifier("top")
        let stream = try await provider.fetchContents(of: top, version: version(base, "top"), range: 0..<100_000)
        #expect(await drain(stream).error == nil)
        provider.downloadEnded(of: top, version: version(base, "top"), succeeded: true)
        #expect(plan.states.first?.remaining == 1)
        #expect(try await fetchAll(provider, base, "top").error?.code == .io)
        provider.downloadEnded(of: top, version: version(base, "top"), succeeded: false)
        #expect(plan.isEmpty)
    }

    @Test(".fetches(N) counts single fetches; .untilCleared holds until cleared")
    func fetchesAndUntilCleared() async throws {
        let base = makeBase()
        let plan = FaultPlan([
            FaultRule(identifier: ItemIdentifier("top"), fault: .truncate(offset: 5), times: .fetches(1))
        ])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        #expect(try await fetchAll(provider, base, "top").bytes.count == 5)
        #expect(try await fetchAll(provider, base, "top").bytes.count == Int(fileSize))
        plan.add(FaultRule(identifier: ItemIdentifier("top"), fault: .truncate(offset: 7)))
        for _ in 0..<3 {
            #expect(try await fetchAll(provider, base, "top").bytes.count == 7)
            provider.downloadEnded(of: ItemIdentifier("top"), version: version(base, "top"), succeeded: false)
        }
        #expect(plan.clear(ItemIdentifier("top")) == 1)
        #expect(try await fetchAll(provider, base, "top").bytes.count == Int(fileSize))
    }

    @Test("a fault on a directory strikes everything inside it, learned from listings or asked of the base")
    func directoryScope() async throws {
        let base = makeBase()
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("dir"), fault: .truncate(offset: 9))])
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        // Never listed: the wrapper asks the base for the parents.
        #expect(try await fetchAll(provider, base, "dir/sub/f").bytes.count == 9)
        #expect(try await fetchAll(provider, base, "dir/g").bytes.count == 9)
        #expect(try await fetchAll(provider, base, "top").bytes.count == Int(fileSize))
        // The root: everything.
        plan.clear()
        plan.add(FaultRule(identifier: .root, fault: .truncate(offset: 3)))
        #expect(try await fetchAll(provider, base, "top").bytes.count == 3)
    }

    @Test("--metadata: lookups, listings and getattr of the item and what is inside fail (or stall); itemNow declines")
    func metadataFaults() async throws {
        let base = makeBase()
        base.answersImmediately = true
        let clock = ManualClock()
        let plan = FaultPlan()
        let provider = FaultInjectingProvider(wrapping: base, plan: plan, clock: clock)
        _ = try await provider.children(of: .root)
        #expect(try provider.itemNow(for: ItemIdentifier("dir/g")) != nil)
        // Without --metadata a content fault leaves metadata alone.
        plan.add(FaultRule(identifier: ItemIdentifier("dir"), fault: .failAfter(offset: 0, errno: EACCES)))
        #expect(try await provider.item(for: ItemIdentifier("dir/g")).name == "g")
        plan.clear()
        plan.add(
            FaultRule(identifier: ItemIdentifier("dir"), fault: .failAfter(offset: 0, errno: EACCES), metadata: true))
        let error = await #expect(throws: ProviderError.self) {
            _ = try await provider.item(for: ItemIdentifier("dir/g"))
        }
        #expect(error?.code == .accessDenied && error?.errno == EACCES)
        await #expect(throws: ProviderError.self) { _ = try await provider.children(of: ItemIdentifier("dir")) }
        await #expect(throws: ProviderError.self) {
            _ = try await provider.trackedChildren(of: ItemIdentifier("dir/sub"))
        }
        await #expect(throws: ProviderError.self) { _ = try await provider.child(named: "dir", of: .root) }
        #expect(try provider.itemNow(for: ItemIdentifier("dir/g")) == nil)
        #expect(try provider.itemNow(for: ItemIdentifier("top")) != nil)
        #expect(try await provider.children(of: .root).count == 2, "the root's listing is not about dir")

        // A metadata stall waits for its duration on the injected clock.
        plan.clear()
        plan.add(
            FaultRule(
                identifier: ItemIdentifier("top"), fault: .stall(offset: 0, duration: .seconds(5)), metadata: true))
        let lookup = Task { try await provider.item(for: ItemIdentifier("top")) }
        #expect(await clock.waitForSleepers(atLeast: 1))
        clock.advance(by: .seconds(5))
        #expect(try await lookup.value.name == "top")
    }

    @Test("the same fault gives the same bytes every run")
    func deterministic() async throws {
        let base = makeBase()
        var runs: [[UInt8]] = []
        for _ in 0..<3 {
            let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("top"), fault: .corrupt(offset: 777))])
            runs.append(try await fetchAll(FaultInjectingProvider(wrapping: base, plan: plan), base, "top").bytes)
        }
        #expect(firstDifference(runs[0], runs[1]) == nil && firstDifference(runs[1], runs[2]) == nil)
    }
}

@Suite("Stored faults")
struct FaultStoreTests {
    @Test("rules, their paths and a consumed download survive a reload; clearing sticks")
    func roundTrip() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.path + "/faults.json"
        let seed = [
            FaultRule(identifier: ItemIdentifier("top"), path: "top", fault: .failAfter(offset: 4, errno: ECONNRESET))
        ]
        let plan = FaultPlan.stored(at: path, seed: seed)
        #expect(plan.all == seed)
        let rules = [
            FaultRule(
                identifier: ItemIdentifier("dir/g"), path: "dir/g",
                fault: .stall(offset: 9, duration: .milliseconds(1500)), times: .downloads(3), metadata: true),
            FaultRule(identifier: ItemIdentifier("dir"), path: "dir", fault: .stall(offset: 0)),
            FaultRule(identifier: ItemIdentifier("a"), path: "a", fault: .truncate(offset: 1), times: .fetches(2)),
            FaultRule(identifier: ItemIdentifier("b"), path: "b", fault: .changeVersion(offset: 2)),
            FaultRule(identifier: ItemIdentifier("c"), path: "c", fault: .corrupt(offset: 3)),
            FaultRule(identifier: ItemIdentifier("d"), path: "d", fault: .slow(bytesPerSecond: 1 << 20)),
            FaultRule(identifier: .root, path: "", fault: .offline, times: .downloads(1)),
        ]
        for rule in rules { plan.add(rule) }
        // One download of dir/g consumed.
        let base = makeBase()
        let provider = FaultInjectingProvider(wrapping: base, plan: plan)
        plan.clear(path: "top")
        plan.clear(path: "")
        _ = try await fetchAll(provider, base, "dir/g").bytes
        provider.downloadEnded(of: ItemIdentifier("dir/g"), version: version(base, "dir/g"), succeeded: false)

        let reloaded = FaultPlan.stored(at: path, seed: seed)
        #expect(reloaded.all == Array(rules.dropLast()))
        #expect(reloaded.states.first?.remaining == 2)
        #expect(reloaded.states.first?.used == 1)
        reloaded.clear()
        #expect(FaultPlan.stored(at: path, seed: seed).all.isEmpty, "a cleared seed stays cleared")
        // No temporary file is left behind.
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(names == ["faults.json"])
    }

    @Test(
        "a corrupt store file is logged, kept aside, and the plan starts empty",
        arguments: [
            "not json", "{\"version\": 1, \"faults\": [{\"fault\": \"explode\"}]}", "{\"version\": 99, \"faults\": []}",
            "{\"version\": 1, \"faults\": [{\"identifier\": \"a\", \"fault\": \"failAt\", \"at\": -5, \"errno\": \"EIO\", \"count\": \"untilCleared\", \"used\": 0, \"metadata\": false}]}",
            "{\"version\": 1, \"faults\": [{\"identifier\": \"a\", \"fault\": \"failAt\", \"at\": 5, \"errno\": \"ENOPE\", \"count\": \"untilCleared\", \"used\": 0, \"metadata\": false}]}",
            "",
        ])
    func corruptStore(contents: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.path + "/faults.json"
        try Data(contents.utf8).write(to: URL(fileURLWithPath: path))
        let log = Locked<[String]>([])
        let seed = [FaultRule(identifier: ItemIdentifier("x"), fault: .offline)]
        let plan = FaultPlan.stored(at: path, seed: seed, log: { message in log.withLock { $0.append(message) } })
        #expect(plan.all.isEmpty, "a bad file is not a missing one: no seed")
        #expect(log.withLock { $0 }.count == 1)
        #expect(log.withLock { $0 }.first?.contains("kept as") == true)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
        #expect(names.count == 2 && names[1].hasPrefix("faults.json.bad-"), "\(names)")
        let aside = try String(contentsOfFile: directory.path + "/" + names[1], encoding: .utf8)
        #expect(aside == contents)
        // The fresh store is valid from now on.
        plan.add(FaultRule(identifier: ItemIdentifier("y"), path: "y", fault: .truncate(offset: 1)))
        #expect(FaultPlan.stored(at: path).all.map(\.path) == ["y"])
    }
}
