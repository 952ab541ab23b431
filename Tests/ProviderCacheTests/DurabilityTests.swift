// The range map names only synced bytes: the cache file's sync is a seam (`ProviderCache.init(
// fileSync:)`), so a test records what the file held at each sync and every range map saved, in
// one order, and checks each saved map against the sync before it; and a failing sync leaves the
// saved map as it was.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What happened to the cache file and the store, in order.
enum DurabilityEvent: Sendable {
    /// A sync that succeeded, with the ranges whose bytes the file held correctly at that moment.
    case synced(ByteRanges)
    /// A sync that was made to fail.
    case syncFailed
    /// A range map written to the store.
    case saved(ByteRanges)
}

/// A metadata store that logs every content record it saves, then keeps it in memory.
final class RecordingStore: MetadataStore {
    let base = InMemoryMetadataStore()
    let log: Locked<[DurabilityEvent]>
    init(log: Locked<[DurabilityEvent]>) { self.log = log }
    func loadItems() throws -> [StoredItem] { try base.loadItems() }
    func saveItems(_ items: [StoredItem]) throws { try base.saveItems(items) }
    func deleteItems(_ identifiers: [ItemIdentifier]) throws { try base.deleteItems(identifiers) }
    func loadContents() throws -> [ContentRecord] { try base.loadContents() }
    func saveContent(_ record: ContentRecord) throws {
        // Logged under the same lock as the save, so the log's order is the store's.
        try log.withLock { log in
            try base.saveContent(record)
            log.append(.saved(record.present))
        }
    }
    func deleteContent(identifier: ItemIdentifier, version: ContentVersion) throws {
        try base.deleteContent(identifier: identifier, version: version)
    }
}

/// The ranges of the file at `descriptor` whose bytes equal `expected` (holes read as zeros).
func correctRanges(_ descriptor: Int32, expected: [UInt8]) -> ByteRanges {
    var actual = [UInt8](repeating: 0, count: expected.count)
    let count = actual.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, expected.count, 0) }
    var ranges = ByteRanges()
    var start: Int?
    for index in 0..<max(0, count) {
        if actual[index] == expected[index] {
            if start == nil { start = index }
        } else if let begun = start {
            ranges.insert(Int64(begun)..<Int64(index))
            start = nil
        }
    }
    if let begun = start { ranges.insert(Int64(begun)..<Int64(max(0, count))) }
    return ranges
}

@Suite("Durability: range-map saves and the cache file's sync")
struct DurabilityTests {
    static let size: Int64 = 2 << 20

    /// A cache over `fixture`'s provider with the recording store and a sync seam that records
    /// what the file holds (and fails while `failing` is set).
    static func recordedCache(
        options: CacheOptions, failing: Locked<Bool>
    ) throws -> (CacheFixture, RecordingStore, ProviderCache, [UInt8]) {
        let log = Locked<[DurabilityEvent]>([])
        let store = RecordingStore(log: log)
        let fixture = try CacheFixture(options: options, store: store)
        fixture.provider.putFile("big", .ramp(seed: 31, size: size))
        let expected = expectedBytes(fixture.provider, "big", 0..<size)
        let cache = try ProviderCache(
            provider: fixture.provider, directory: fixture.directory.path, store: store, clock: fixture.clock,
            options: options,
            fileSync: { descriptor in
                if failing.value {
                    log.withLock { $0.append(.syncFailed) }
                    return Errno(EIO)
                }
                let correct = correctRanges(descriptor, expected: expected)
                if let error = fileDataSync(descriptor) { return error }
                log.withLock { $0.append(.synced(correct)) }
                return nil
            })
        return (fixture, store, cache, expected)
    }

    @Test("every saved range map names only bytes the file held at the sync before it")
    func savedMapsNameOnlySyncedBytes() async throws {
        var options = CacheFixture.defaultOptions()
        options.persistInterval = 128 << 10
        let failing = Locked(false)
        let (fixture, store, cache, _) = try Self.recordedCache(options: options, failing: failing)
        defer { withExtendedLifetime(fixture) {} }
        let entry = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("big"), maximumAge: nil))
        _ = try await entry.read(offset: 0, count: 4096)
        await entry.waitForDownloadForTesting()
        #expect(entry.isMaterialized)
        cache.content.unpin(entry)
        await cache.shutdown()

        let events = store.log.value
        var lastSynced: ByteRanges?
        var saves = 0
        for (index, event) in events.enumerated() {
            switch event {
            case .synced(let correct): lastSynced = correct
            case .syncFailed: Issue.record("no sync was made to fail")
            case .saved(let map):
                saves += 1
                guard let synced = lastSynced else {
                    Issue.record("event \(index): a range map \(map) was saved before any sync")
                    continue
                }
                // Reported by count and first offset (a broken order names thousands of pieces).
                let unsynced = map.ranges.flatMap { synced.missing(in: $0) }
                let count = unsynced.reduce(Int64(0)) { $0 + Int64($1.count) }
                #expect(
                    count == 0,
                    "event \(index): saved \(map) names \(count) bytes not on disk at the sync before it, from byte \(unsynced.first?.lowerBound ?? 0)"
                )
            }
        }
        // Saves ran beside the download (by bytes), not only at its end.
        #expect(saves >= 4, "\(saves) saves")
        guard case .saved(let final) = events.last(where: { if case .saved = $0 { true } else { false } }) else {
            Issue.record("nothing saved")
            return
        }
        #expect(final == ByteRanges([0..<Self.size]))
    }

    @Test("a failing fdatasync leaves the saved range map unchanged; the next good sync saves it")
    func failingSyncSavesNothing() async throws {
        var options = CacheFixture.defaultOptions()
        options.backgroundCompletion = false
        options.readAheadWindow = 0
        options.persistInterval = 128 << 10
        let failing = Locked(false)
        let (fixture, store, cache, expected) = try Self.recordedCache(options: options, failing: failing)
        defer { withExtendedLifetime(fixture) {} }
        let entry = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("big"), maximumAge: nil))
        _ = try await entry.read(offset: 0, count: 100_000)
        await entry.waitForDownloadForTesting()
        await cache.content.flushPendingPersists()
        let saved = try store.loadContents().first?.present
        let first = try #require(saved)
        #expect(first.contains(0..<100_000) && !first.contains(0..<500_000))

        failing.withLock { $0 = true }
        // 1 MiB more, with saves due every 64 KiB: each sync fails, the download goes on.
        let more = try await bounded(30, "a download whose syncs fail") {
            try await entry.read(offset: 500_000, count: 1 << 20)
        }
        // A MiB compared by its first differing offset, never by a diff of two arrays.
        let read = more.bytes
        let wanted = expected[500_000..<(500_000 + (1 << 20))]
        let mismatch =
            read.count == wanted.count ? read.indices.first { read[$0] != wanted[wanted.startIndex + $0] } : 0
        #expect(mismatch == nil, "read \(read.count) bytes; first difference at \(mismatch ?? -1) past 500000")
        await entry.waitForDownloadForTesting()
        await cache.content.flushPendingPersists()
        #expect(store.log.value.contains { if case .syncFailed = $0 { true } else { false } })
        #expect(try store.loadContents().first?.present == first, "the saved map is unchanged")
        var expectedPresent = first
        expectedPresent.insert(500_000..<(500_000 + (1 << 20)))
        #expect(entry.presentRanges == expectedPresent)

        failing.withLock { $0 = false }
        await cache.shutdown()
        cache.content.unpin(entry)
        #expect(try store.loadContents().first?.present == expectedPresent)
    }
}
