// The cache's immediate twins against their async forms on the same state (the way the
// coordinator's `grantIfImmediate` is checked against `submit`): `Catalog.itemNow` vs
// `Catalog.item`, `Catalog.childNow` vs `Catalog.child`, `pinContentNow` vs `pinContent`. Whenever
// the immediate form answers, the async one, asked next on the same instance, answers the same.
// Plus the content store's status queries (`activity`, `usage`).
//
// Replay: PROVIDERFS_TEST_SEED=<seed> swift test --filter CacheTwinTests

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@Suite("Cache twins and content-store queries")
struct CacheTwinTests {
    @Test("itemNow, childNow and pinContentNow answer only what item, child and pinContent answer")
    func immediateAnswersAreTheAsyncOnes() async throws {
        let seed = SeededRandom.seedFromEnvironment()
        var random = SeededRandom(seed: seed)
        let fixture = try CacheFixture()
        let provider = fixture.provider
        provider.addDirectory("d")
        let names = ["a", "b", "c", "d/e", "d/f"]
        for name in ["a", "d/e"] { provider.putFile(name, .ramp(seed: 1, size: 5_000)) }
        // Straight over the in-memory provider (`.immediateMetadata`); the fault wrapper's `itemNow` is
        // checked against `item(for:)` by ImmediateMetadataTwinTests.
        let cache = try ProviderCache(
            provider: provider, directory: fixture.directory.path, store: fixture.store, clock: fixture.clock,
            options: fixture.options)
        let catalog = cache.catalog
        var answered: [String: Int] = [:]
        var contentSeed: UInt64 = 1
        func pick<T>(_ choices: [T]) -> T { choices[Int(random.next() % UInt64(choices.count))] }
        func note(_ what: String, _ equal: Bool, _ detail: @autoclosure () -> String) {
            if !equal { Issue.record("\(what): \(detail()) — seed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed))") }
        }
        // At least 400 steps, and on until every twin has answered (a seed can take a while to
        // reach, say, a pin at once), up to 4,000.
        let twins = ["item", "child", "child miss", "pin"]
        for step in 0..<4_000 {
            if step >= 400 && twins.allSatisfy({ answered[$0, default: 0] > 0 }) { break }
            let name = pick(names)
            let identifier = ItemIdentifier(name)
            let parent: ItemIdentifier = name.hasPrefix("d/") ? ItemIdentifier("d") : .root
            let leaf = String(name.split(separator: "/").last!)
            switch random.next() % 9 {
            case 0: fixture.clock.advance(by: pick([.milliseconds(300), .milliseconds(700), .seconds(2), .seconds(6)]))
            case 1:
                contentSeed += 1
                if random.next() % 3 == 0 {
                    provider.remove(name)
                } else {
                    provider.putFile(name, .ramp(seed: contentSeed, size: Int64(random.next() % 9_000)))
                }
            case 2: provider.answersImmediately.toggle()
            case 3: _ = try? await catalog.children(of: parent, maximumAge: fixture.options.directoryTTL)
            case 4:
                let maximumAge = pick([Duration?.none, .zero, .seconds(1)])
                let asking = random.next() % 2 == 0
                guard let immediate = catalog.itemNow(identifier, maximumAge: maximumAge, askingProvider: asking)
                else { break }
                answered["item", default: 0] += 1
                let async = try? await catalog.item(identifier, maximumAge: maximumAge)
                note(
                    "step \(step): item \(name) age \(String(describing: maximumAge))", async == immediate,
                    "immediate \(immediate), async \(String(describing: async))")
            case 5:
                let immediate = catalog.childNow(named: leaf, of: parent)
                let async: Result<ProviderItem?, CacheError>
                do {
                    if case .unknown = immediate { continue }
                    async = .success(try await catalog.child(named: leaf, of: parent))
                } catch {
                    async = .failure(error)
                }
                switch immediate {
                case .unknown: continue
                case .found(let item, _):
                    answered["child", default: 0] += 1
                    note("step \(step): child \(name)", (try? async.get()) == item, "immediate \(item), async \(async)")
                case .absent:
                    answered["child miss", default: 0] += 1
                    note("step \(step): missing child \(name)", (try? async.get()) == .some(nil), "async \(async)")
                }
            default:
                guard let item = catalog.knownItem(identifier), item.kind == .file,
                    let immediate = cache.pinContentNow(of: item)
                else { break }
                answered["pin", default: 0] += 1
                let async = try? await cache.pinContent(of: item)
                note("step \(step): pin \(name)", async === immediate, "another entry (or none) from the async pin")
                if let async { cache.content.unpin(async) }
                if random.next() % 2 == 0 { _ = try? await immediate.read(offset: 0, count: 100) }
                cache.content.unpin(immediate)
            }
        }
        for twin in twins {
            #expect(
                answered[twin, default: 0] > 0,
                "the immediate \(twin) never answered: the check is empty (seed \(seed))")
        }
        await cache.shutdown()
    }

    @Test("activity shows downloads with their progress and failures with their error; usage counts disk bytes")
    func activityAndUsage() async throws {
        let fixture = try CacheFixture()
        fixture.provider.putFile("big", .ramp(seed: 1, size: 1 << 20))
        fixture.provider.putFile("gone", .ramp(seed: 2, size: 1000))
        let cache = try fixture.makeCache()
        #expect(cache.contentActivity().isEmpty)
        let empty = cache.content.usage()
        #expect(empty.files == 0)

        fixture.provider.hold()
        let big = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("big"), maximumAge: nil))
        big.startBackgroundDownload()
        let downloading = cache.contentActivity().filter { $0.state == .downloading }
        #expect(downloading.map(\.identifier) == [ItemIdentifier("big")])
        #expect(downloading.first?.totalBytes == 1 << 20)
        fixture.provider.release()
        await big.waitForDownloadForTesting()
        #expect(!cache.contentActivity().contains { $0.state == .downloading })
        let usage = cache.content.usage()
        #expect(usage.usedBytes - empty.usedBytes >= 1 << 20)
        #expect(usage.files == 1)
        #expect(usage.availableBytes > 0)

        let gone = try await cache.pinContent(of: try await cache.catalog.item(ItemIdentifier("gone"), maximumAge: nil))
        fixture.provider.remove("gone")
        await #expect(throws: CacheError.self) { _ = try await gone.read(offset: 0, count: 10) }
        let failed = cache.contentActivity().filter { $0.state == .error }
        #expect(failed.map(\.identifier) == [ItemIdentifier("gone")])
        #expect(failed.first?.lastError != nil)
        cache.content.unpin(gone)
        cache.content.unpin(big)
        await cache.shutdown()
    }
}
