// Eviction (issue 27, `providerfs evict`): a file's stored content goes (files and records), the
// item reads as a placeholder and downloads again; refused for what only this machine has and for
// content in use; never revived by a range-map save or a restart.

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

@Suite struct EvictionTests {
    /// Files in the cache's content directory.
    func contentFiles(_ cache: ProviderCache) -> Int { cache.content.usage().files }

    @Test("a downloaded file is evicted: its file and record go, it reads as dataless, and downloads again")
    func evictsAndDownloadsAgain() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 7, size: 300_000))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let first = try await readAll(cache, item)
        #expect(first == expectedBytes(fixture.provider, "f", 0..<300_000))
        let entry = try await cache.pinContent(of: item)
        await entry.waitForDownloadForTesting()
        cache.content.unpin(entry)
        await cache.content.flushPendingPersists()
        #expect(cache.status(of: item.identifier)?.state == .materialized)
        #expect(contentFiles(cache) == 1)
        let fetchesBefore = fixture.provider.counters.fetchCalls

        let result = try await cache.evict(item.identifier)
        guard case .evicted(let freed) = result else {
            Issue.record("not evicted: \(result)")
            return
        }
        #expect(freed >= 300_000, "the file's allocated blocks")
        #expect(cache.status(of: item.identifier)?.state == .dataless)
        #expect(cache.status(of: item.identifier)?.presentBytes == 0)
        #expect(contentFiles(cache) == 0)
        #expect(try await cache.evict(item.identifier) == .alreadyPlaceholder)

        #expect(try await readAll(cache, item) == first)
        #expect(fixture.provider.counters.fetchCalls > fetchesBefore, "fetched again")
    }

    @Test("an evicted file stays evicted across a restart: no record comes back from a queued save")
    func noRecordRevives() async throws {
        let store = InMemoryMetadataStore()
        let fixture = try CacheFixture(store: store)
        fixture.provider.putFile("f", .ramp(seed: 8, size: 200_000))
        var cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        _ = try await readAll(cache, item)
        // The range map's save is queued (persistDelay on the manual clock), not done.
        guard case .evicted = try await cache.evict(item.identifier) else {
            Issue.record("not evicted")
            return
        }
        await cache.shutdown()
        #expect(try store.loadContents().filter { $0.identifier == item.identifier }.isEmpty)
        cache = try fixture.makeCache()
        let again = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        #expect(cache.status(of: again.identifier)?.state == .dataless)
        #expect(try await readAll(cache, again) == expectedBytes(fixture.provider, "f", 0..<200_000))
        await cache.shutdown()
    }

    @Test("refused while a handle has it open or a download runs; evicted once neither")
    func refusedWhileInUse() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 9, size: 400_000))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        _ = try await readAll(cache, item)
        let entry = try await cache.pinContent(of: item)
        #expect(try await cache.evict(item.identifier) == .refused(.open))
        #expect(cache.status(of: item.identifier)?.presentBytes ?? 0 > 0, "nothing removed")
        cache.content.unpin(entry)

        fixture.provider.putFile("g", .ramp(seed: 10, size: 400_000))
        let other = try await cache.catalog.item(ItemIdentifier("g"), maximumAge: nil)
        fixture.provider.hold()
        #expect(try await cache.startFullDownload(of: other.identifier) == .started)
        #expect(try await cache.evict(other.identifier) == .refused(.downloading))
        fixture.provider.release()
        let downloading = try await cache.pinContent(of: other)
        await downloading.waitForDownloadForTesting()
        cache.content.unpin(downloading)
        #expect(await eventually { cache.status(of: other.identifier)?.state == .materialized })
        #expect(
            await eventually {
                (try? await cache.evict(other.identifier)).map { if case .evicted = $0 { true } else { false } }
                    ?? false
            })
        guard case .evicted = try await cache.evict(item.identifier) else {
            Issue.record("not evicted once closed")
            return
        }
    }

    @Test("a directory is not a file; an unknown item is notFound")
    func notAFile() async throws {
        let fixture = try CacheFixture()
        fixture.provider.addDirectory("d")
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.item(ItemIdentifier("d"), maximumAge: nil)
        #expect(try await cache.evict(ItemIdentifier("d")) == .refused(.notAFile))
        await #expect(throws: CacheError.self) { _ = try await cache.evict(ItemIdentifier("nothing")) }
    }

    @Test(
        "a file written through the mount: refused until uploaded (open while a writer has it); then evicted, and read again from the provider's version of the same bytes"
    )
    func writtenThroughTheMount() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("w", .bytes(Array("old".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("w"), maximumAge: nil)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("new bytes".utf8), at: 0)
        #expect(try await cache.evict(item.identifier) == .refused(.open))
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(try await cache.evict(item.identifier) == .refused(.notUploaded))
        let local = try #require(cache.catalog.knownItem(item.identifier))
        #expect(try await readAll(cache, local) == Array("new bytes".utf8))
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        guard case .evicted = try await cache.evict(item.identifier) else {
            Issue.record("not evicted after the upload")
            return
        }
        let after = try await cache.catalog.item(item.identifier, maximumAge: nil)
        #expect(after.contentVersion == fixture.provider.base.content(of: "w")?.1, "the provider's version")
        #expect(after.size == 9)
        #expect(cache.status(of: item.identifier)?.state == .dataless)
        #expect(try await readAll(cache, after) == Array("new bytes".utf8))
    }
}
