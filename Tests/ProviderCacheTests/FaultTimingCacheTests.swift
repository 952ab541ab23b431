// Timed faults against the cache's stall deadline, on one manual clock shared by the fault wrapper
// and the cache: a merely slow stream (paced in tenth-of-a-second pieces) never trips a 1 s
// deadline, a stall shorter than the deadline is waited out, and a longer one times out.

import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@Suite("Timed faults against the stall deadline")
struct FaultTimingCacheTests {
    /// Reads all of `path` through a cache whose stall deadline is 1 s, moving the shared clock
    /// by `step` whenever something sleeps on it, until the read ends (bounded: never a hang).
    private func read(
        _ fault: Fault, step: Duration
    ) async throws -> (result: Result<[UInt8], any Error>, elapsed: Duration, expected: [UInt8]) {
        let fixture = try CacheFixture()
        fixture.provider.putFile("f", .ramp(seed: 31, size: 300_000))
        var options = fixture.options
        options.stallTimeout = .seconds(1)
        options.maximumAttempts = 1
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("f"), fault: fault)])
        let cache = try ProviderCache(
            provider: FaultInjectingProvider(wrapping: fixture.provider, plan: plan, clock: fixture.clock),
            directory: fixture.directory.path, store: fixture.store, clock: fixture.clock, options: options)
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        let done = Locked(false)
        let reader = Task {
            defer { done.withLock { $0 = true } }
            return try await entry.read(offset: 0, count: 300_000).bytes
        }
        var rounds = 0
        while !done.value && rounds < 20_000 {
            if fixture.clock.sleeperCount > 0 { fixture.clock.advance(by: step) }
            try await Task.sleep(for: .milliseconds(1))
            rounds += 1
        }
        #expect(done.value, "the read never ended")
        let result = await reader.result
        cache.content.unpin(entry)
        await cache.shutdown()
        return (result, fixture.clock.now.offset, expectedBytes(fixture.provider, "f", 0..<300_000))
    }

    @Test("a slow stream (100 KB/s, 3 s for the file) never trips a 1 s stall deadline")
    func slowIsNotStalled() async throws {
        let (result, elapsed, expected) = try await read(.slow(bytesPerSecond: 100_000), step: .milliseconds(100))
        let bytes = try result.get()
        #expect(bytes.count == expected.count)
        #expect(bytes.indices.first { bytes[$0] != expected[$0] } == nil)
        #expect(elapsed >= .seconds(3))
    }

    @Test("a 500 ms stall is waited out; a 2 s stall times out at the 1 s deadline")
    func stalls() async throws {
        let short = try await read(.stall(offset: 100_000, duration: .milliseconds(500)), step: .milliseconds(100))
        #expect(try short.result.get().count == 300_000)
        let long = try await read(.stall(offset: 100_000, duration: .seconds(2)), step: .milliseconds(100))
        #expect(throws: CacheError.self) { try long.result.get() }
        if case .failure(let error as CacheError) = long.result { #expect(error.code == .timedOut) }
    }
}
