import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Downloader: lazy, shared, failing well", .timeLimit(.minutes(3)))
struct DownloaderTests {
    @Test("the first read fetches the range it needs first, then the rest follows in the background")
    func readerFirst() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("big.bin", .ramp(seed: 1, size: 4 << 20))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("big.bin"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let data = try await entry.read(offset: 3 << 20, count: 10_000)
        #expect(data.bytes == expectedBytes(fixture.provider, "big.bin", (3 << 20)..<((3 << 20) + 10_000)))
        #expect(fixture.provider.counters.fetchedRanges.first?.lowerBound == 3 << 20)
        await entry.waitForDownloadForTesting()
        #expect(entry.isMaterialized)
        #expect(cache.status(of: item.identifier)?.state == .materialized)
        // Everything was fetched once: no byte twice.
        #expect(fixture.provider.counters.bytesServed == 4 << 20)
        let all = try await entry.read(offset: 0, count: 4 << 20)
        #expect(byteDifference(all.bytes, expectedBytes(fixture.provider, "big.bin", 0..<(4 << 20))) == nil)
        cache.content.unpin(entry)
    }

    @Test("the provider hears once per download that it ended, the download's own retries included")
    func downloadEndedOncePerDownload() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("ok", .ramp(seed: 3, size: 300_000))
        fixture.provider.putFile("bad", .ramp(seed: 4, size: 300_000))
        let cache = try fixture.makeCache()
        let ok = try await cache.catalog.item(ItemIdentifier("ok"), maximumAge: nil)
        let entry = try await cache.pinContent(of: ok)
        _ = try await entry.read(offset: 0, count: 300_000)
        await entry.waitForDownloadForTesting()
        #expect(fixture.provider.counters.downloadsEnded == [.init(ItemIdentifier("ok"), succeeded: true)])

        // Every fetch of "bad" fails: maximumAttempts fetches, one failed download.
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("bad"), fault: .failAfter(offset: 0, errno: EIO), times: .untilCleared)
        )
        let bad = try await cache.catalog.item(ItemIdentifier("bad"), maximumAge: nil)
        let failing = try await cache.pinContent(of: bad)
        let fetchesBefore = fixture.provider.counters.fetchCalls
        await #expect(throws: CacheError.self) { _ = try await failing.read(offset: 0, count: 10) }
        await failing.waitForDownloadForTesting()
        #expect(fixture.provider.counters.fetchCalls - fetchesBefore == fixture.options.maximumAttempts)
        #expect(
            fixture.provider.counters.downloadsEnded == [
                .init(ItemIdentifier("ok"), succeeded: true), .init(ItemIdentifier("bad"), succeeded: false),
            ])
        cache.content.unpin(entry)
        cache.content.unpin(failing)
    }

    @Test("concurrent readers share one download")
    func sharedDownload() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 2, size: 200_000))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        fixture.provider.hold()
        // The first reader starts the one stream (over the whole file) and it parks at the gate;
        // only then do the others come, so that they all wait behind that stream. (Readers that
        // came in another order would be served in their order: one arriving behind a stream
        // that started further on makes it retarget, a second fetch, as it should.)
        var readers = [Task { try await entry.read(offset: 0, count: 1000).bytes }]
        var waited = 0
        while fixture.provider.heldCount < 1 && waited < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            waited += 1
        }
        #expect(fixture.provider.heldCount == 1)
        readers += (1..<4).map { index in
            Task { try await entry.read(offset: Int64(index) * 1000, count: 1000).bytes }
        }
        waited = 0
        while entry.waitingReaderCountForTesting < 4 && waited < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            waited += 1
        }
        #expect(entry.waitingReaderCountForTesting == 4)
        #expect(fixture.provider.heldCount == 1)
        fixture.provider.release()
        for (index, reader) in readers.enumerated() {
            let bytes = try await reader.value
            #expect(bytes == expectedBytes(fixture.provider, "f", Int64(index * 1000)..<Int64(index * 1000 + 1000)))
        }
        await entry.waitForDownloadForTesting()
        #expect(fixture.provider.counters.fetchCalls == 1, "fetched \(fixture.provider.counters.fetchedRanges)")
        #expect(fixture.provider.counters.bytesServed == 200_000)
        cache.content.unpin(entry)
    }

    @Test("a download that always fails at byte N: EIO-class failure after the retry budget, prefix kept")
    func failAfterPermanent() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("half", .ramp(seed: 3, size: 300_000))
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("half"), fault: .failAfter(offset: 150_000, errno: EIO)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("half"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let head = try await entry.read(offset: 0, count: 1000)
        #expect(head.bytes == expectedBytes(fixture.provider, "half", 0..<1000))
        let error = await #expect(throws: CacheError.self) {
            _ = try await withDeadline(.seconds(30), "a read past a permanent failure") {
                try await entry.read(offset: 200_000, count: 1000)
            }
        }
        #expect(error?.code == .downloadFailed)
        await entry.waitForDownloadForTesting()
        let present = entry.presentRanges
        #expect(present.count <= 150_000)
        #expect(!present.contains(150_000..<150_001))
        let status = cache.status(of: item.identifier)
        #expect(status?.state == .error)
        #expect(status?.lastError?.code == .downloadFailed)
        // Bytes before the fault still read, from the cache.
        let again = try await entry.read(offset: 100_000, count: 1000)
        #expect(again.bytes == expectedBytes(fixture.provider, "half", 100_000..<101_000))
        cache.content.unpin(entry)
    }

    @Test("a transient failure is retried transparently and the error clears")
    func failAfterOnce() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 4, size: 300_000))
        fixture.faults.add(
            FaultRule(
                identifier: ItemIdentifier("f"), fault: .failAfter(offset: 100_000, errno: EIO), times: .fetches(1)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let data = try await entry.read(offset: 0, count: 300_000)
        #expect(byteDifference(data.bytes, expectedBytes(fixture.provider, "f", 0..<300_000)) == nil)
        await entry.waitForDownloadForTesting()
        #expect(cache.status(of: item.identifier)?.state == .materialized)
        #expect(cache.status(of: item.identifier)?.lastError == nil)
        // The retry resumed where the failure left off: nothing before it was fetched twice.
        #expect(fixture.provider.counters.fetchedRanges.count == 2)
        #expect(fixture.provider.counters.fetchedRanges[1].lowerBound >= 64 << 10)
        cache.content.unpin(entry)
    }

    @Test("a stalled download fails with timedOut at the deadline, never hangs")
    func stall() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("stuck", .ramp(seed: 5, size: 300_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("stuck"), fault: .stall(offset: 64 << 10)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("stuck"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let done = Locked(false)
        let reader = Task {
            defer { done.withLock { $0 = true } }
            return try await entry.read(offset: 100_000, count: 1000)
        }
        // Whenever the download sleeps on a deadline, move the clock past it, until the reader
        // gives up (bounded: a hang fails the test instead of hanging it).
        var rounds = 0
        while !done.value && rounds < 5000 {
            if fixture.clock.sleeperCount > 0 { fixture.clock.advance(by: fixture.options.stallTimeout) }
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        #expect(done.value)
        let result = try await withDeadline(.seconds(30), "the stalled reader") { await reader.result }
        #expect(throws: CacheError(.timedOut, "no data from the provider for 5s")) { try result.get() }
        #expect(cache.status(of: item.identifier)?.lastError?.code == .timedOut)
        #expect(entry.presentRanges.count <= 64 << 10)
        cache.content.unpin(entry)
    }

    @Test("a stream that ends early is a failure, never a present range and never a hang")
    func truncated() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("short", .ramp(seed: 6, size: 300_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("short"), fault: .truncate(offset: 128 << 10)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("short"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        // A short stream counted as complete made the download refetch forever: bounded.
        let error = await #expect(throws: CacheError.self) {
            _ = try await withDeadline(.seconds(30), "a read of a stream that ends early") {
                try await entry.read(offset: 200_000, count: 10)
            }
        }
        #expect(error?.code == .downloadFailed)
        #expect(entry.presentRanges.count <= 128 << 10)
        #expect(fixture.provider.counters.fetchCalls == fixture.options.maximumAttempts + 0)
        cache.content.unpin(entry)
    }

    @Test("the version changing under a reader gives stale, never mixed bytes")
    func versionChange() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("doc", .ramp(seed: 7, size: 300_000))
        var options = fixture.options
        options.backgroundCompletion = false
        options.readAheadWindow = 0
        let cache = try fixture.makeCache(options: options)
        let item = try await cache.catalog.item(ItemIdentifier("doc"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let head = try await entry.read(offset: 0, count: 1000)
        #expect(head.bytes == expectedBytes(fixture.provider, "doc", 0..<1000))
        fixture.provider.putFile("doc", .ramp(seed: 8, size: 300_000))
        let error = await #expect(throws: CacheError.self) {
            _ = try await withDeadline(.seconds(30), "a read of a changed version") {
                try await entry.read(offset: 200_000, count: 1000)
            }
        }
        #expect(error?.code == .stale)
        // Bytes of the pinned version already present still read (consistent, old version).
        let cached = try await entry.read(offset: 0, count: 1000)
        #expect(cached.bytes == head.bytes)
        cache.content.unpin(entry)
        // A fresh look at the item pins the new version.
        let fresh = try await cache.catalog.item(ItemIdentifier("doc"), maximumAge: .zero)
        let newEntry = try await cache.pinContent(of: fresh)
        let data = try await newEntry.read(offset: 200_000, count: 1000)
        #expect(data.bytes == expectedBytes(fixture.provider, "doc", 200_000..<201_000))
        cache.content.unpin(newEntry)
    }

    @Test("a fault injected mid-stream as a version change also gives stale")
    func injectedVersionChange() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("v", .ramp(seed: 9, size: 300_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("v"), fault: .changeVersion(offset: 64 << 10)))
        let cache = try fixture.makeCache()
        let entry = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("v"), maximumAge: nil))
        let error = await #expect(throws: CacheError.self) {
            _ = try await withDeadline(.seconds(30), "a read meeting an injected version change") {
                try await entry.read(offset: 100_000, count: 10)
            }
        }
        #expect(error?.code == .stale)
        cache.content.unpin(entry)
    }

    @Test("cancelling one reader does not cancel the download another reader waits on")
    func cancelOneReader() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 10, size: 100_000))
        let cache = try fixture.makeCache()
        let entry = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil))
        fixture.provider.hold()
        let cancelled = Task { try await entry.read(offset: 0, count: 100) }
        let patient = Task { try await entry.read(offset: 50_000, count: 100) }
        var waited = 0
        while fixture.provider.heldCount < 1 && waited < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            waited += 1
        }
        cancelled.cancel()
        let cancelledResult = try await withDeadline(.seconds(30), "the cancelled reader") { await cancelled.result }
        #expect(throws: CacheError.self) { try cancelledResult.get() }
        fixture.provider.release()
        let bytes = try await withDeadline(.seconds(30), "the reader that was not cancelled") {
            try await patient.value.bytes
        }
        #expect(bytes == expectedBytes(fixture.provider, "f", 50_000..<50_100))
        cache.content.unpin(entry)
    }

    @Test("a restart resumes from the persisted range map and never serves unrecorded bytes")
    func restartResume() async throws {
        let store = InMemoryMetadataStore()
        let fixture = try CacheFixture(store: store)
        fixture.provider.putFile("r", .ramp(seed: 11, size: 1 << 20))
        var options = fixture.options
        options.backgroundCompletion = false
        options.readAheadWindow = 0
        let first = try fixture.makeCache(options: options)
        let item = try await first.catalog.item(ItemIdentifier("r"), maximumAge: nil)
        let entry = try await first.pinContent(of: item)
        _ = try await entry.read(offset: 0, count: 100_000)
        let persisted = entry.presentRanges
        first.content.unpin(entry)
        await first.shutdown()
        #expect(persisted.contains(0..<100_000))
        #expect(!persisted.contains(0..<(1 << 20)))

        // A crash after a pwrite but before the range map was saved leaves bytes the map does not
        // cover: simulate it with garbage after the persisted ranges.
        let contentDirectory = fixture.directory.path + "/content"
        let fd = open(contentDirectory + "/1", O_WRONLY)
        #expect(fd >= 0)
        let garbage = [UInt8](repeating: 0xEE, count: 4096)
        _ = garbage.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, off_t(persisted.ranges.last!.upperBound)) }
        close(fd)

        let before = fixture.provider.counters.fetchedRanges.count
        let second = try fixture.makeCache()
        #expect(second.status(of: item.identifier)?.state == .partial)
        #expect(second.status(of: item.identifier)?.presentBytes == persisted.count)
        let resumed = try await second.pinContent(of: try await second.catalog.item(item.identifier, maximumAge: nil))
        let all = try await resumed.read(offset: 0, count: 1 << 20)
        #expect(byteDifference(all.bytes, expectedBytes(fixture.provider, "r", 0..<(1 << 20))) == nil)
        let refetched = fixture.provider.counters.fetchedRanges[before...]
        #expect(refetched.allSatisfy { $0.lowerBound >= persisted.ranges.last!.upperBound })
        second.content.unpin(resumed)
        await second.shutdown()
    }

    @Test("listing and item metadata never fetch content")
    func metadataOnly() async throws {
        let fixture = try CacheFixture()
        fixture.provider.addDirectory("d")
        for index in 0..<20 { fixture.provider.putFile("d/f\(index)", .ramp(seed: UInt64(index), size: 1000)) }
        let cache = try fixture.makeCache()
        let children = try await cache.catalog.children(of: ItemIdentifier("d"), maximumAge: nil)
        #expect(children.count == 20)
        for child in children { _ = try await cache.catalog.item(child.identifier, maximumAge: .zero) }
        #expect(fixture.provider.counters.fetchCalls == 0)
        #expect(children.allSatisfy { cache.status(of: $0.identifier)?.state == .dataless })
    }

    @Test("entries close once idle: open descriptors are bounded by handles and downloads")
    func idleEntriesClose() async throws {
        let fixture = try CacheFixture()
        for index in 0..<50 { fixture.provider.putFile("f\(index)", .ramp(seed: UInt64(index), size: 3000)) }
        let cache = try fixture.makeCache()
        for index in 0..<50 {
            let entry = try await cache.pinContent(
                of: try await cache.catalog.item(ItemIdentifier("f\(index)"), maximumAge: nil))
            let data = try await entry.read(offset: 0, count: 3000)
            #expect(data.bytes == expectedBytes(fixture.provider, "f\(index)", 0..<3000))
            cache.content.unpin(entry)
        }
        var waited = 0
        while cache.content.openEntryCount > 0 && waited < 5000 {
            try await Task.sleep(for: .milliseconds(1))
            waited += 1
        }
        #expect(cache.content.openEntryCount == 0)
        // Closed entries keep their state: materialized, and re-reading fetches nothing.
        #expect(cache.status(of: ItemIdentifier("f7"))?.state == .materialized)
        let before = fixture.provider.counters.fetchCalls
        let again = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("f7"), maximumAge: nil))
        #expect(try await again.read(offset: 0, count: 3000).bytes == expectedBytes(fixture.provider, "f7", 0..<3000))
        #expect(fixture.provider.counters.fetchCalls == before)
        cache.content.unpin(again)
    }

    @Test("time to first byte does not grow with file size: the first fetch is sized to the read")
    func firstByteIndependentOfSize() async throws {
        var served: [Int64] = []
        for size in [Int64(1 << 20), Int64(1 << 30)] {
            let fixture = try CacheFixture()
            var options = fixture.options
            options.firstChunkSize = 128 << 10
            options.chunkSize = 1 << 20
            options.backgroundCompletion = false
            options.readAheadWindow = 0
            fixture.provider.putFile("f", .ramp(seed: 12, size: size))
            let cache = try fixture.makeCache(options: options)
            let entry = try await cache.pinContent(
                of: try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil))
            let data = try await entry.read(offset: size / 2, count: 4096)
            #expect(data.bytes == expectedBytes(fixture.provider, "f", (size / 2)..<(size / 2 + 4096)))
            await entry.waitForDownloadForTesting()
            served.append(fixture.provider.counters.bytesServed)
            cache.content.unpin(entry)
        }
        #expect(served == [128 << 10, 128 << 10])
    }
}

/// A provider whose metadata calls never answer once `hanging` is set (a dead server).
final class HangingMetadataProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    let hanging = Locked(false)
    init(base: InMemoryProvider) { self.base = base }
    private func hangIfAsked() async throws {
        if hanging.value { while true { try await Task.sleep(for: .seconds(3600)) } }
    }
    func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try await hangIfAsked()
        return try await base.item(for: identifier)
    }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await hangIfAsked()
        return try await base.children(of: identifier)
    }
}

@Suite("Metadata deadlines", .timeLimit(.minutes(3)))
struct MetadataDeadlineTests {
    @Test("a hung metadata call falls back to the cached metadata at the deadline, never hangs")
    func hungMetadata() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .bytes([1, 2, 3]))
        let provider = HangingMetadataProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        _ = try await cache.catalog.children(of: .root, maximumAge: nil)
        provider.hanging.withLock { $0 = true }
        let done = Locked(false)
        let lookup = Task {
            defer { done.withLock { $0 = true } }
            return try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        }
        var rounds = 0
        while !done.value && rounds < 5000 {
            if fixture.clock.sleeperCount > 0 { fixture.clock.advance(by: fixture.options.stallTimeout) }
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        let item = try await withDeadline(.seconds(30), "a lookup over a hung metadata call") { try await lookup.value }
        #expect(item.size == 3)
    }
}

@Suite("Cache directory hygiene")
struct CacheHygieneTests {
    @Test("content files no record names are removed at startup; named ones are kept")
    func strayFilesRemoved() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 13, size: 10_000))
        let first = try fixture.makeCache()
        let entry = try await first.pinContent(of: try await first.catalog.item(ItemIdentifier("f"), maximumAge: nil))
        _ = try await entry.read(offset: 0, count: 10_000)
        first.content.unpin(entry)
        await first.shutdown()
        try writeFile(fixture.directory.path + "/content/99", [1, 2, 3])
        _ = try fixture.makeCache()
        var info = stat()
        #expect(stat(fixture.directory.path + "/content/99", &info) != 0)
        #expect(stat(fixture.directory.path + "/content/1", &info) == 0)
    }
}

/// A provider whose next listing (once `armed`) takes its snapshot at once and returns it only
/// when released: a listing that was taken earlier but finishes later.
final class HeldListingProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    private let state = Locked<(armed: Bool, waiting: CheckedContinuation<Void, Never>?, released: Bool)>(
        (false, nil, false))
    init(base: InMemoryProvider) { self.base = base }
    func arm() { state.withLock { $0.armed = true } }
    var isHolding: Bool { state.withLock { $0.waiting != nil } }
    func release() {
        let waiting = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.released = true
            defer { state.waiting = nil }
            return state.waiting
        }
        waiting?.resume()
    }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        let snapshot = try await base.children(of: identifier)
        let hold = state.withLock { state -> Bool in
            defer { state.armed = false }
            return state.armed
        }
        if hold {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let go = state.withLock { state -> Bool in
                    if state.released { return true }
                    state.waiting = continuation
                    return false
                }
                if go { continuation.resume() }
            }
        }
        return snapshot
    }
}

@Suite("Overlapping listings")
struct OverlappingListingTests {
    @Test("a listing taken before the one already applied is dropped, not applied over it")
    func olderListingIsDropped() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("a", .bytes([1]))
        fixture.provider.putFile("b", .bytes([2]))
        let provider = HeldListingProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        #expect(try await cache.catalog.children(of: .root, maximumAge: nil).map(\.name) == ["a", "b"])
        // An older listing (still with "a") is taken at t = 6 s and held...
        fixture.clock.advance(by: .seconds(6))
        provider.arm()
        let older = Task { try await cache.catalog.children(of: .root, maximumAge: .seconds(5)) }
        var rounds = 0
        while !provider.isHolding && rounds < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        #expect(provider.isHolding)
        // ...while "a" is deleted and a newer listing (t = 7 s) is applied.
        fixture.provider.remove("a")
        fixture.clock.advance(by: .seconds(1))
        #expect(try await cache.catalog.children(of: .root, maximumAge: .zero).map(\.name) == ["b"])
        provider.release()
        _ = try await older.value
        #expect(try await cache.catalog.children(of: .root, maximumAge: nil).map(\.name) == ["b"])
        #expect(cache.catalog.knownItem(ItemIdentifier("a")) == nil)
    }
}

/// A provider that tracks changes the way a real one would, with the change under the test's
/// control: `touch()` voids every token taken before it.
final class ChangeTrackingProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = .listingChangeTracking
    private let generation = Locked<UInt64>(0)
    init(base: InMemoryProvider) { self.base = base }
    func touch() { generation.withLock { $0 += 1 } }
    func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        let token = ListingChangeToken(watch: 1, serial: 1, generation: generation.value)
        return (try await base.children(of: directory), token)
    }
    func hasChanges(since token: ListingChangeToken) -> Bool { token.generation != generation.value }
}

@Suite("Listings revalidated by change tracking")
struct ListingRevalidationTests {
    /// A cache over a change-tracking provider holding one file, "a".
    static func trackedCache() throws -> (CacheFixture, ChangeTrackingProvider, ProviderCache) {
        let fixture = try CacheFixture()
        fixture.provider.putFile("a", .bytes([1]))
        let provider = ChangeTrackingProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        return (fixture, provider, cache)
    }

    @Test("an expired listing of an unchanged directory is revalidated without a provider call, with its children")
    func unchangedListingIsRevalidated() async throws {
        let (fixture, provider, cache) = try Self.trackedCache()
        let ttl = fixture.options.directoryTTL
        _ = try await cache.catalog.children(of: .root, maximumAge: ttl)
        #expect(fixture.provider.counters.childrenCalls == 1)

        fixture.clock.advance(by: ttl + .seconds(1))
        #expect(
            cache.catalog.itemNow(ItemIdentifier("a"), maximumAge: fixture.options.attributeTTL, askingProvider: false)
                == nil)
        #expect(try await cache.catalog.children(of: .root, maximumAge: ttl).map(\.name) == ["a"])
        #expect(fixture.provider.counters.childrenCalls == 1, "unchanged: no listing")
        #expect(cache.catalog.listingAge(of: .root) == .zero, "the listing counts from the check")
        #expect(
            cache.catalog.itemNow(ItemIdentifier("a"), maximumAge: fixture.options.attributeTTL, askingProvider: false)
                != nil,
            "its children's metadata is confirmed with it")

        // A change: listed again, and the new child is there.
        fixture.provider.putFile("b", .bytes([2]))
        provider.touch()
        fixture.clock.advance(by: ttl + .seconds(1))
        #expect(try await cache.catalog.children(of: .root, maximumAge: ttl).map(\.name) == ["a", "b"])
        #expect(fixture.provider.counters.childrenCalls == 2)
    }

    @Test("a listing is taken anew after fullListingInterval even when nothing was reported")
    func fullListingIntervalBoundsTrust() async throws {
        let (fixture, _, cache) = try Self.trackedCache()
        let ttl = fixture.options.directoryTTL
        _ = try await cache.catalog.children(of: .root, maximumAge: ttl)
        // A change the tracking does not see (an mmap write, say).
        fixture.provider.putFile("b", .bytes([2]))
        var elapsed = Duration.zero
        while elapsed + ttl + .seconds(1) < fixture.options.fullListingInterval {
            fixture.clock.advance(by: ttl + .seconds(1))
            elapsed += ttl + .seconds(1)
            #expect(try await cache.catalog.children(of: .root, maximumAge: ttl).map(\.name) == ["a"])
        }
        #expect(fixture.provider.counters.childrenCalls == 1)
        fixture.clock.advance(by: ttl + .seconds(1))
        #expect(try await cache.catalog.children(of: .root, maximumAge: ttl).map(\.name) == ["a", "b"])
        #expect(fixture.provider.counters.childrenCalls == 2)
    }

    @Test("a lookup past the TTL of an unchanged directory finds its child without a listing")
    func lookupRevalidates() async throws {
        let (fixture, _, cache) = try Self.trackedCache()
        let ttl = fixture.options.directoryTTL
        #expect(try await cache.catalog.child(named: "a", of: .root)?.size == 1)
        fixture.clock.advance(by: ttl * 3)
        guard case .unknown = cache.catalog.childNow(named: "a", of: .root) else {
            Issue.record("an expired listing must not answer on its own")
            return
        }
        #expect(try await cache.catalog.child(named: "a", of: .root)?.size == 1)
        #expect(fixture.provider.counters.childrenCalls == 1)
        guard case .found = cache.catalog.childNow(named: "a", of: .root) else {
            Issue.record("the revalidated listing answers again")
            return
        }
    }
}

/// A provider whose versions read as WebDAV ETags: weak (`W/"v"`) until `strong` is set, then
/// strong (`"v"`), the same opaque text — what Apache sends for a file changed in the last
/// second and after it (D-422). The weak comparison says they name the same content.
final class WeakThenStrongTagProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    let strong = Locked(false)
    init(base: InMemoryProvider) { self.base = base }
    private func tagged(_ item: ProviderItem) -> ProviderItem {
        guard item.kind == .file else { return item }
        var item = item
        let opaque = "\"\(item.contentVersion.rawValue)\""
        item.contentVersion = ContentVersion(strong.value ? opaque : "W/" + opaque)
        return item
    }
    private static func untagged(_ version: ContentVersion) -> ContentVersion {
        var text = Substring(version.rawValue)
        if text.hasPrefix("W/") { text = text.dropFirst(2) }
        return ContentVersion(String(text.dropFirst().dropLast()))
    }
    func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        tagged(try await base.item(for: identifier))
    }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await base.children(of: identifier).map(tagged)
    }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: Self.untagged(version), range: range)
    }
    func isSameContent(_ version: ContentVersion, as other: ContentVersion) -> Bool {
        Self.untagged(version) == Self.untagged(other)
    }
}

@Suite("A version whose text changes for the same content (D-510)")
struct SameContentVersionTests {
    @Test("a weak tag turned strong keeps the held version and its cached bytes; a real change does not")
    func aWeakTagTurnedStrongKeepsTheCachedContent() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 7, size: 10_000))
        let provider = WeakThenStrongTagProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        let identifier = ItemIdentifier("f")
        _ = try await cache.catalog.children(of: .root, maximumAge: nil)
        let weak = try await cache.catalog.item(identifier, maximumAge: nil)
        #expect(weak.contentVersion.rawValue.hasPrefix("W/"))
        let entry = try await cache.pinContent(of: weak)
        _ = try await entry.read(offset: 0, count: 10_000)
        cache.content.unpin(entry)
        #expect(cache.content.presentBytes(of: weak) == 10_000)
        let fetches = fixture.provider.counters.fetchCalls

        // The tag turns strong: the item is asked for again, by lookup and by listing.
        provider.strong.withLock { $0 = true }
        let asked = try await cache.catalog.item(identifier, maximumAge: .zero)
        #expect(asked.contentVersion == weak.contentVersion, "the held version stays")
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let listed = try #require(cache.catalog.knownItem(identifier))
        #expect(listed.contentVersion == weak.contentVersion)
        #expect(cache.content.presentBytes(of: listed) == 10_000, "the cached bytes stay")
        let again = try await cache.pinContent(of: listed)
        #expect(
            try await again.read(offset: 0, count: 10_000).bytes == expectedBytes(fixture.provider, "f", 0..<10_000))
        cache.content.unpin(again)
        #expect(fixture.provider.counters.fetchCalls == fetches, "nothing fetched again")

        // Other bytes: another opaque text, a new version.
        fixture.provider.putFile("f", .ramp(seed: 8, size: 10_000))
        let changed = try await cache.catalog.item(identifier, maximumAge: .zero)
        #expect(changed.contentVersion != weak.contentVersion)
        #expect(cache.content.presentBytes(of: changed) == 0)
        await cache.shutdown()
    }
}
