// The cache's limits (issue 27, D-432): least recently used content that is clean, closed and
// not downloading is evicted to stay within `maximumSize`, `minimumFree` and `maximumAge`; what
// is in use may exceed them; what cannot be evicted and fills a limit refuses new downloads with
// ENOSPC.

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

@Suite struct CacheLimitTests {
    static func options(_ change: (inout CacheOptions) -> Void) -> CacheOptions {
        var options = CacheFixture.defaultOptions()
        options.limitCheckPeriod = .seconds(3600)
        change(&options)
        return options
    }

    func present(_ cache: ProviderCache, _ name: String) -> Int64 {
        cache.status(of: ItemIdentifier(name))?.presentBytes ?? -1
    }

    @Test(
        "over --cache-max-size the least recently used closed files go, and as downloads store bytes, without being asked"
    )
    func leastRecentlyUsedFirst() async throws {
        let fixture = try CacheFixture(options: Self.options { $0.maximumSize = 500_000 })
        for index in 1...5 { fixture.provider.putFile("f\(index)", .ramp(seed: UInt64(index), size: 200_000)) }
        let cache = try fixture.makeCache()
        for index in 1...5 {
            let item = try await cache.catalog.item(ItemIdentifier("f\(index)"), maximumAge: nil)
            #expect(try await readAll(cache, item) == expectedBytes(fixture.provider, "f\(index)", 0..<200_000))
            let entry = try await cache.pinContent(of: item)
            await entry.waitForDownloadForTesting()
            cache.content.unpin(entry)
            fixture.clock.advance(by: .seconds(1))
        }
        // Each download stored 200,000 bytes, more than limitCheckBytes: the checks ran on their own.
        #expect(
            await eventually {
                present(cache, "f1") == 0 && present(cache, "f2") == 0 && present(cache, "f3") == 0
            }, "\((1...5).map { present(cache, "f\($0)") })")
        #expect(present(cache, "f4") == 200_000 && present(cache, "f5") == 200_000)
        await cache.checkLimits()
        let status = try #require(cache.limitsStatus)
        #expect(status.storedBytes <= 500_000)
        #expect(status.evictions == 3)
        #expect(status.blockedReason == nil)
        // f4 used again: f5 is now the older one.
        let f4 = try await cache.catalog.item(ItemIdentifier("f4"), maximumAge: nil)
        _ = try await readAll(cache, f4)
        fixture.clock.advance(by: .seconds(1))
        let f1 = try await cache.catalog.item(ItemIdentifier("f1"), maximumAge: nil)
        _ = try await readAll(cache, f1)
        let again = try await cache.pinContent(of: f1)
        await again.waitForDownloadForTesting()
        cache.content.unpin(again)
        await cache.checkLimits()
        #expect(present(cache, "f5") == 0 && present(cache, "f4") == 200_000 && present(cache, "f1") == 200_000)
        await cache.shutdown()
    }

    @Test("an open file may exceed the limit; the others go; nothing is refused")
    func openContentExceeds() async throws {
        let fixture = try CacheFixture(options: Self.options { $0.maximumSize = 300_000 })
        fixture.provider.putFile("small", .ramp(seed: 1, size: 100_000))
        fixture.provider.putFile("big", .ramp(seed: 2, size: 600_000))
        let cache = try fixture.makeCache()
        let small = try await cache.catalog.item(ItemIdentifier("small"), maximumAge: nil)
        _ = try await readAll(cache, small)
        fixture.clock.advance(by: .seconds(1))
        let big = try await cache.catalog.item(ItemIdentifier("big"), maximumAge: nil)
        let open = try await cache.pinContent(of: big)
        _ = try await open.read(offset: 0, count: 600_000)
        await open.waitForDownloadForTesting()
        await cache.checkLimits()
        #expect(present(cache, "big") == 600_000, "open: kept")
        #expect(present(cache, "small") == 0, "closed: evicted")
        #expect(cache.limitsStatus?.blockedReason == nil)
        cache.content.unpin(open)
        // Given back while over the limit: evicted now.
        #expect(await eventually { present(cache, "big") == 0 })
        await cache.shutdown()
    }

    @Test("writes not uploaded that fill the limit refuse new downloads with ENOSPC, until they are uploaded")
    func unevictableContentRefusesDownloads() async throws {
        let fixture = try WriteFixture()
        fixture.options = Self.options { $0.maximumSize = 100_000 }
        fixture.provider.base.putFile("w", .bytes([]))
        fixture.provider.base.putFile("other", .ramp(seed: 3, size: 50_000))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("w"), maximumAge: nil)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, [UInt8](repeating: 7, count: 150_000), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        await cache.checkLimits()
        let reason = try #require(cache.limitsStatus?.blockedReason)
        #expect(reason.contains("cannot be evicted"))
        let other = try await cache.catalog.item(ItemIdentifier("other"), maximumAge: nil)
        await #expect(throws: CacheError(.noSpace, "other cannot be downloaded: \(reason)")) {
            _ = try await cache.pinContent(of: other)
        }
        #expect(cache.pinContentNow(of: other) == nil, "the fast twin declines as well")
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        await cache.checkLimits()
        #expect(cache.limitsStatus?.blockedReason == nil)
        #expect(
            try await readAll(cache, other) == Array(fixture.provider.base.content(of: "other")!.0.slice(0..<50_000)))
        await cache.shutdown()
    }

    @Test("--cache-max-age: content unused that long goes; --cache-min-free: content goes while the disk is short")
    func ageAndFreeSpace() async throws {
        let fixture = try CacheFixture(options: Self.options { $0.maximumAge = .seconds(60) })
        fixture.provider.putFile("old", .ramp(seed: 4, size: 100_000))
        fixture.provider.putFile("new", .ramp(seed: 5, size: 100_000))
        let cache = try fixture.makeCache()
        let old = try await cache.catalog.item(ItemIdentifier("old"), maximumAge: nil)
        _ = try await readAll(cache, old)
        fixture.clock.advance(by: .seconds(50))
        let new = try await cache.catalog.item(ItemIdentifier("new"), maximumAge: nil)
        _ = try await readAll(cache, new)
        fixture.clock.advance(by: .seconds(20))
        await cache.checkLimits()
        #expect(present(cache, "old") == 0)
        #expect(present(cache, "new") == 100_000)
        await cache.shutdown()

        let free = Locked<Int64>(1 << 40)
        let spaceFixture = try CacheFixture(options: Self.options { $0.minimumFree = 1 << 30 })
        spaceFixture.provider.putFile("a", .ramp(seed: 6, size: 100_000))
        let short = try ProviderCache(
            provider: spaceFixture.provider, directory: spaceFixture.directory.path, store: spaceFixture.store,
            clock: spaceFixture.clock, options: spaceFixture.options, freeSpace: { _ in free.withLock { $0 } })
        let a = try await short.catalog.item(ItemIdentifier("a"), maximumAge: nil)
        _ = try await readAll(short, a)
        await short.checkLimits()
        #expect(present(short, "a") == 100_000, "plenty of space: kept")
        free.withLock { $0 = 1 << 20 }
        await short.checkLimits()
        #expect(present(short, "a") == 0, "short of space: evicted")
        #expect(short.limitsStatus?.blockedReason?.contains("--cache-min-free") == true)
        free.withLock { $0 = 1 << 40 }
        await short.checkLimits()
        #expect(short.limitsStatus?.blockedReason == nil)
        await short.shutdown()
    }
}
