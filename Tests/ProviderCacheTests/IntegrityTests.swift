// Issue 11, cache side: checksummed fetches (corrupt bytes are never present, never served, never
// saved), streams that end early (a failure, never a refetch loop), and the failure an item shows
// (errno class, message and byte) — also after a restart, and retried by a full download.

import CryptoSupport
import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A provider over an InMemoryProvider whose streams are `.checksummed`: each carries the SHA-256
/// of the bytes it meant to send for its range (as a WebDAV server or the fault wrapper would),
/// while `corruption` may flip one byte at an absolute offset on the way (the next `times`
/// fetches that cross it; nil times: every one), `omitChecksum` drops the checksum, and
/// `truncateAt` ends the stream cleanly at an absolute offset.
final class ChecksummingProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    let corruption = Locked<(offset: Int64, times: Int?)?>(nil)
    let omitChecksum = Locked(false)
    let truncateAt = Locked<Int64?>(nil)

    init(base: InMemoryProvider) { self.base = base }

    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        let stream = try await base.fetchContents(of: identifier, version: version, range: range)
        let corruptAt = corruption.withLock { corruption -> Int64? in
            guard let (offset, times) = corruption, range.contains(offset) else { return nil }
            if let times { corruption = times > 1 ? (offset, times - 1) : nil }
            return offset
        }
        return ChecksummedStream(
            base: stream, start: range.lowerBound, corruptAt: corruptAt, omitChecksum: omitChecksum.value,
            truncateAt: truncateAt.value)
    }
}

/// The test stream: hands over its base's bytes (one of them flipped at `corruptAt`) and, once it
/// has returned nil at the end, the SHA-256 of the unmodified bytes.
final class ChecksummedStream: ContentStream {
    let base: any ContentStream
    let corruptAt: Int64?
    let omitChecksum: Bool
    let truncateAt: Int64?
    /// Position, the unmodified bytes so far, and the checksum once ended.
    private let state: Locked<(position: Int64, sent: [UInt8], checksum: ContentChecksum?)>

    init(base: any ContentStream, start: Int64, corruptAt: Int64?, omitChecksum: Bool, truncateAt: Int64?) {
        self.base = base
        self.corruptAt = corruptAt
        self.omitChecksum = omitChecksum
        self.truncateAt = truncateAt
        state = Locked((start, [], nil))
    }

    var capabilities: ContentStreamCapabilities { .checksummed }
    var checksum: ContentChecksum? { state.withLock { $0.checksum } }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        let position = state.withLock { $0.position }
        var limit = maximumLength
        if let truncateAt {
            guard position < truncateAt else { return nil }
            limit = Int(min(Int64(limit), truncateAt - position))
        }
        guard var chunk = try await base.next(maximumLength: limit) else {
            state.withLock { state in
                if !omitChecksum { state.checksum = ContentChecksum(.sha256, digest: SHA256.hash(state.sent)) }
            }
            return nil
        }
        state.withLock { state in
            state.sent += chunk
            state.position += Int64(chunk.count)
        }
        if let corruptAt, (position..<(position + Int64(chunk.count))).contains(corruptAt) {
            chunk[Int(corruptAt - position)] ^= 0xFF
        }
        return chunk
    }

    func close() { base.close() }
}

/// Runs `operation`, failing the test (instead of hanging it) when it takes longer than
/// `seconds` of real time.
func bounded<T: Sendable>(
    _ seconds: Int, _ what: String, _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let work = Task { try await operation() }
    let watchdog = Task {
        try await Task.sleep(for: .seconds(seconds))
        work.cancel()
    }
    defer { watchdog.cancel() }
    let result = await work.result
    if work.isCancelled && !watchdog.isCancelled {
        Issue.record("\(what) did not end within \(seconds) s")
    }
    return try result.get()
}

@Suite("Integrity: checksums, short streams, recorded failures")
struct IntegrityTests {
    /// A cache over a checksumming provider holding `name` (ramp bytes of `size`).
    static func checksummedCache(
        _ name: String, size: Int64, options: CacheOptions? = nil, store: (any MetadataStore)? = nil
    ) throws -> (CacheFixture, ChecksummingProvider, ProviderCache) {
        let fixture = try CacheFixture(store: store)
        fixture.provider.putFile(name, .ramp(seed: 21, size: size))
        let provider = ChecksummingProvider(base: fixture.provider)
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: options ?? fixture.options)
        return (fixture, provider, cache)
    }

    @Test("a checksummed stream whose bytes match is delivered, fetched once, with the right sha256")
    func matchingChecksum() async throws {
        let (fixture, _, cache) = try Self.checksummedCache("ok", size: 300_000)
        defer { withExtendedLifetime(fixture) {} }
        let entry = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("ok"), maximumAge: nil))
        let data = try await entry.read(offset: 0, count: 300_000)
        #expect(SHA256.hash(data.bytes) == SHA256.hash(expectedBytes(fixture.provider, "ok", 0..<300_000)))
        await entry.waitForDownloadForTesting()
        #expect(entry.isMaterialized)
        #expect(fixture.provider.counters.bytesServed == 300_000)
        cache.content.unpin(entry)
    }

    @Test("a corrupt byte: no byte of the fetch is present, served, materialized or saved; EIO-class with both digests")
    func corruptFetchIsNeverPresent() async throws {
        let store = InMemoryMetadataStore()
        let (fixture, provider, cache) = try Self.checksummedCache("bad", size: 300_000, store: store)
        defer { withExtendedLifetime(fixture) {} }
        provider.corruption.withLock { $0 = (123_456, nil) }
        let item = try await cache.catalog.item(ItemIdentifier("bad"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let error = try await bounded(30, "a corrupt download") {
            await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 0, count: 1000) }
        }
        #expect(error?.code == .corrupt)
        #expect(error?.message.contains("bytes 0..<300000") == true, "\(String(describing: error))")
        let expected = ContentChecksum(
            .sha256, digest: SHA256.hash(expectedBytes(fixture.provider, "bad", 0..<300_000)))
        #expect(error?.message.contains("expected \(expected)") == true, "\(String(describing: error))")
        #expect(error?.message.contains("got sha256:") == true)
        await entry.waitForDownloadForTesting()
        // Retried like a failed download, then given up: nothing present, nothing materialized.
        #expect(fixture.provider.counters.fetchCalls == fixture.options.maximumAttempts)
        #expect(entry.presentRanges.isEmpty)
        #expect(!entry.isMaterialized)
        #expect(entry.readIfPresent(offset: 0, count: 10) == nil)
        let status = cache.status(of: item.identifier)
        #expect(status?.state == .error)
        #expect(status?.lastError?.code == .corrupt)
        #expect(status?.lastError?.offset == 0, "the start of the bad fetch")
        cache.content.unpin(entry)
        await cache.shutdown()
        // Never served from the cache after a restart either: the saved map names no byte.
        #expect(try store.loadContents().allSatisfy { $0.present.isEmpty })
        let second = try fixture.makeCache()
        #expect(second.status(of: item.identifier)?.presentBytes == 0)
        #expect(second.status(of: item.identifier)?.lastError?.code == .corrupt)
        await second.shutdown()
    }

    @Test("verified bytes stay; a corrupt later fetch adds none; after the fault only the missing range is fetched")
    func verifiedBytesStayAndRetryFetchesOnlyTheGap() async throws {
        var options = CacheFixture.defaultOptions()
        options.backgroundCompletion = false
        options.readAheadWindow = 0
        let (fixture, provider, cache) = try Self.checksummedCache("doc", size: 300_000, options: options)
        defer { withExtendedLifetime(fixture) {} }
        let item = try await cache.catalog.item(ItemIdentifier("doc"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let head = try await entry.read(offset: 0, count: 1000)
        #expect(head.bytes == expectedBytes(fixture.provider, "doc", 0..<1000))
        // Ranges only: the read and the window after it, at least one first chunk (64 KiB here).
        #expect(entry.presentRanges == ByteRanges([0..<65536]))

        provider.corruption.withLock { $0 = (200_000, nil) }
        let error = try await bounded(30, "a corrupt fetch") {
            await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 150_000, count: 100_000) }
        }
        #expect(error?.code == .corrupt)
        #expect(entry.presentRanges == ByteRanges([0..<65536]), "the verified head stays, nothing else is added")
        #expect(cache.status(of: item.identifier)?.lastError?.offset == 150_000)
        #expect(try await entry.read(offset: 0, count: 1000).bytes == head.bytes)

        provider.corruption.withLock { $0 = nil }
        let before = fixture.provider.counters.fetchedRanges.count
        let all = try await entry.read(offset: 0, count: 300_000)
        #expect(SHA256.hash(all.bytes) == SHA256.hash(expectedBytes(fixture.provider, "doc", 0..<300_000)))
        #expect(Array(fixture.provider.counters.fetchedRanges[before...]) == [65536..<300_000])
        #expect(entry.isMaterialized)
        #expect(cache.status(of: item.identifier)?.lastError == nil)
        cache.content.unpin(entry)
    }

    @Test("a checksummed stream that ends without its checksum is corrupt; one that ends early delivers nothing")
    func missingChecksumOrShortStream() async throws {
        let (fixture, provider, cache) = try Self.checksummedCache("f", size: 200_000)
        defer { withExtendedLifetime(fixture) {} }
        provider.omitChecksum.withLock { $0 = true }
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let missing = try await bounded(30, "a stream without checksum") {
            await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 0, count: 10) }
        }
        #expect(missing?.code == .corrupt)
        #expect(missing?.message.contains("no checksum") == true)
        #expect(entry.presentRanges.isEmpty)

        provider.omitChecksum.withLock { $0 = false }
        provider.truncateAt.withLock { $0 = 150_000 }
        let short = try await bounded(30, "a short checksummed stream") {
            await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 0, count: 10) }
        }
        #expect(short?.code == .downloadFailed)
        #expect(entry.presentRanges.isEmpty, "the 150,000 bytes before the end were never verified")
        cache.content.unpin(entry)
    }

    @Test("a source that always stops at the same offset ends in EIO after the retry budget, never refetches forever")
    func truncatedAtAFixedOffsetEnds() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("short", .ramp(seed: 22, size: 300_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("short"), fault: .truncate(offset: 128 << 10)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("short"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let error = try await bounded(30, "a download of a truncating source") {
            await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 0, count: 300_000) }
        }
        #expect(error?.code == .downloadFailed)
        await entry.waitForDownloadForTesting()
        // The first fetch brought the bytes before the cut (progress), then two fetches at the cut
        // brought nothing: the budget of three attempts without progress ends it.
        #expect(fixture.provider.counters.fetchedRanges == [0..<300_000, (128 << 10)..<300_000, (128 << 10)..<300_000])
        #expect(entry.presentRanges == ByteRanges([0..<(128 << 10)]))
        let status = cache.status(of: item.identifier)
        #expect(status?.state == .error)
        #expect(status?.lastError?.offset == 128 << 10)
        #expect(status?.lastError?.message == "the provider ended the transfer at byte 131072 of 300000")
        cache.content.unpin(entry)
    }

    @Test("the recorded failure keeps its code, message and byte across a restart (SQLite)")
    func recordedFailureSurvivesARestart() async throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-sqlite")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let fixture = try CacheFixture(store: store)
        fixture.provider.putFile("half", .ramp(seed: 23, size: 300_000))
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("half"), fault: .failAfter(offset: 150_000, errno: EIO)))
        let first = try fixture.makeCache()
        let item = try await first.catalog.item(ItemIdentifier("half"), maximumAge: nil)
        let entry = try await first.pinContent(of: item)
        await #expect(throws: CacheError.self) { _ = try await entry.read(offset: 0, count: 300_000) }
        first.content.unpin(entry)
        await first.shutdown()
        let recorded = first.status(of: item.identifier)?.lastError
        #expect(recorded?.offset == 150_000)
        #expect(recorded?.code == .downloadFailed)

        let reopened = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let records = try reopened.loadContents()
        #expect(records.count == 1)
        #expect(records.first?.lastError == recorded)
        #expect(records.first?.present == ByteRanges([0..<150_000]))
    }

    @Test("a full download of an item in error retries it, fetching only what is missing")
    func fullDownloadRetriesAnItemInError() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("half", .ramp(seed: 24, size: 300_000))
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("half"), fault: .failAfter(offset: 150_000, errno: EIO)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("half"), maximumAge: nil)
        #expect(try await cache.startFullDownload(of: item.identifier) == .started)
        var rounds = 0
        while cache.status(of: item.identifier)?.state == .downloading && rounds < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        #expect(cache.status(of: item.identifier)?.state == .error)
        #expect(cache.status(of: item.identifier)?.lastError?.offset == 150_000)

        fixture.faults.clear()
        let before = fixture.provider.counters.fetchedRanges.count
        #expect(try await cache.startFullDownload(of: item.identifier) == .started)
        #expect(cache.status(of: item.identifier)?.state == .downloading, "the retry shows at once")
        rounds = 0
        while cache.status(of: item.identifier)?.state == .downloading && rounds < 10_000 {
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        let status = cache.status(of: item.identifier)
        #expect(status?.state == .materialized)
        #expect(status?.lastError == nil)
        #expect(Array(fixture.provider.counters.fetchedRanges[before...]) == [150_000..<300_000])
        let entry = try await cache.pinContent(of: item)
        let all = try await entry.read(offset: 0, count: 300_000)
        #expect(SHA256.hash(all.bytes) == SHA256.hash(expectedBytes(fixture.provider, "half", 0..<300_000)))
        cache.content.unpin(entry)
    }
}
