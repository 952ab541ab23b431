// A provider whose metadata calls hang (a network provider that never answers): every catalog
// call that asks it — item, listing, named-child lookup — ends at the mount's stall deadline
// (`CacheOptions.stallTimeout`) with `.timedOut` (ETIMEDOUT), or with the catalog's own copy
// where the lookup policy keeps one; never a hang. Manual clock, no sleeps.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

/// Forwards to an InMemoryProvider; while `stalling`, item/children/child calls wait until
/// `release()` and ignore cancellation (a hung call, not a slow one that listens).
final class MetadataStallingProvider: Provider, Sendable {
    let base: InMemoryProvider
    private struct Gate {
        var stalling = false
        var held: [CheckedContinuation<Void, Never>] = []
        var calls = 0
    }
    private let gate = Locked(Gate())

    init(base: InMemoryProvider) { self.base = base }

    /// The base's, plus a named-child lookup (so the lookup path that asks one name is covered).
    var capabilities: ProviderCapabilities { base.capabilities.union(.namedChildLookup) }

    func stall() { gate.withLock { $0.stalling = true } }

    func release() {
        let held = gate.withLock { gate -> [CheckedContinuation<Void, Never>] in
            gate.stalling = false
            defer { gate.held = [] }
            return gate.held
        }
        for continuation in held { continuation.resume() }
    }

    /// Metadata calls that reached the gate while stalling.
    var stalledCalls: Int { gate.withLock { $0.calls } }

    private func pass() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = gate.withLock { gate -> Bool in
                guard gate.stalling else { return false }
                gate.calls += 1
                gate.held.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
    }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        await pass()
        return try await base.item(for: identifier)
    }

    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        await pass()
        return try await base.children(of: identifier)
    }

    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        await pass()
        return try await base.children(of: directory).first { $0.name == name }
    }

    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: version, range: range)
    }
}

@Suite struct StalledMetadataCallTests {
    let base = InMemoryProvider()
    let provider: MetadataStallingProvider
    let clock = ManualClock()
    let directory: TemporaryDirectory
    let options: CacheOptions
    let cache: ProviderCache

    init() throws {
        base.addDirectory("docs")
        base.putFile("docs/a.txt", .bytes(Array("a\n".utf8)))
        provider = MetadataStallingProvider(base: base)
        directory = try TemporaryDirectory(prefix: "providerfs-metadata-deadline")
        var options = CacheFixture.defaultOptions()
        options.stallTimeout = .seconds(7)
        self.options = options
        cache = try ProviderCache(
            provider: provider, directory: directory.path, store: InMemoryMetadataStore(), clock: clock,
            options: options)
    }

    func finish() async {
        provider.release()
        await cache.shutdown()
        directory.remove()
    }

    /// Runs `call` while the provider stalls; the call must still wait just before the deadline
    /// and end once the clock reaches it. Returns its outcome.
    func outcomeAtTheDeadline<T: Sendable>(
        _ call: @escaping @Sendable () async throws(CacheError) -> T
    ) async -> Result<T, CacheError>? {
        // The call's deadline timer sleeps until exactly now + stallTimeout (the clock does not
        // move until it is armed), whatever else of the cache sleeps on the clock.
        let timerDeadline = clock.now.advanced(by: options.stallTimeout)
        let stalledBefore = provider.stalledCalls
        provider.stall()
        let ended = Locked(false)
        let task = Task { () -> Result<T, CacheError> in
            defer { ended.withLock { $0 = true } }
            do throws(CacheError) { return .success(try await call()) } catch { return .failure(error) }
        }
        // The call reached the provider and its deadline timer sleeps on the clock.
        // Generous: under ThreadSanitizer in the full module run, tasks wait long for a thread.
        #expect(await clock.waitForSleeper(until: timerDeadline), "sleepers: \(clock.sleeperDeadlines)")
        let deadline = ContinuousClock.now + .seconds(120)
        while provider.stalledCalls == stalledBefore && ContinuousClock.now < deadline { await Task.yield() }
        #expect(provider.stalledCalls > stalledBefore, "the call reached the provider")
        clock.advance(by: options.stallTimeout - .milliseconds(1))
        #expect(!ended.withLock { $0 }, "ended before the deadline")
        clock.advance(by: .milliseconds(1))
        // Bounded: a call that ignores its deadline is reported, then let go (not a hung test).
        let limit = ContinuousClock.now + .seconds(120)
        while !ended.withLock({ $0 }) && ContinuousClock.now < limit { try? await Task.sleep(for: .milliseconds(1)) }
        #expect(ended.withLock { $0 }, "the call did not end at its deadline")
        provider.release()
        return await task.value
    }

    @Test func anItemNobodyKnowsFailsWithTimedOutAtTheStallDeadline() async throws {
        let outcome = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.item(ItemIdentifier("docs/a.txt"), maximumAge: .zero)
        }
        guard case .failure(let error)? = outcome else {
            Issue.record("expected a timeout, got \(String(describing: outcome))")
            return await finish()
        }
        #expect(error.code == .timedOut)
        await finish()
    }

    @Test func aListingFailsWithTimedOutAtTheStallDeadline() async throws {
        let outcome = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.children(of: ItemIdentifier("docs"), maximumAge: .zero)
        }
        guard case .failure(let error)? = outcome else {
            Issue.record("expected a timeout, got \(String(describing: outcome))")
            return await finish()
        }
        #expect(error.code == .timedOut)
        await finish()
    }

    @Test func aLookupInAnUnlistedDirectoryFailsWithTimedOutAtTheStallDeadline() async throws {
        let outcome = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.child(named: "a.txt", of: ItemIdentifier("docs"))
        }
        guard case .failure(let error)? = outcome else {
            Issue.record("expected a timeout, got \(String(describing: outcome))")
            return await finish()
        }
        #expect(error.code == .timedOut)
        await finish()
    }

    @Test func knownItemsAndListingsAreKeptWhenTheProviderStalls() async throws {
        // Known before the stall: the catalog's copies answer once the deadline passes.
        let known = try await cache.catalog.item(ItemIdentifier("docs/a.txt"), maximumAge: nil)
        let listed = try await cache.catalog.children(of: ItemIdentifier("docs"), maximumAge: nil)
        #expect(listed.map(\.name) == ["a.txt"])

        let item = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.item(ItemIdentifier("docs/a.txt"), maximumAge: .zero)
        }
        #expect(try item?.get() == known)
        let children = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.children(of: ItemIdentifier("docs"), maximumAge: .zero)
        }
        #expect(try children?.get().map(\.name) == ["a.txt"])
        await finish()
    }

    @Test func aNameTheListingLacksIsRecheckedWithinTheDeadline() async throws {
        // A name the listing lacks is asked of the provider once the listing is
        // missRefreshInterval old (still younger than directoryTTL); a hung provider leaves the
        // listing's answer (no such name), at the deadline.
        _ = try await cache.catalog.children(of: ItemIdentifier("docs"), maximumAge: nil)
        clock.advance(by: options.missRefreshInterval)
        let missing = await outcomeAtTheDeadline { [cache] () throws(CacheError) in
            try await cache.catalog.child(named: "new.txt", of: ItemIdentifier("docs"))
        }
        #expect(try missing?.get() == nil)
        await finish()
    }
}
