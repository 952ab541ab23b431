import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

/// A cache over an InMemoryProvider (optionally behind a fault plan) with a manual clock.
final class CacheFixture: Sendable {
    let provider = InMemoryProvider()
    let faults = FaultPlan()
    let clock = ManualClock()
    let directory: TemporaryDirectory
    let store: any MetadataStore
    let options: CacheOptions

    init(options: CacheOptions = CacheFixture.defaultOptions(), store: (any MetadataStore)? = nil) throws {
        directory = try TemporaryDirectory(prefix: "providerfs-cache")
        self.store = store ?? InMemoryMetadataStore()
        self.options = options
    }

    static func defaultOptions() -> CacheOptions {
        var options = CacheOptions()
        options.chunkSize = 64 << 10
        options.firstChunkSize = 64 << 10
        options.readAheadWindow = 256 << 10
        options.retryDelay = .zero
        options.stallTimeout = .seconds(5)
        options.persistInterval = 256 << 10
        // Tests count provider calls: no listing in the background unless a test asks for it.
        options.listingRefreshAhead = nil
        return options
    }

    func makeCache(options: CacheOptions? = nil) throws -> ProviderCache {
        try ProviderCache(
            provider: FaultInjectingProvider(wrapping: provider, plan: faults), directory: directory.path, store: store,
            clock: clock, options: options ?? self.options)
    }

    deinit { directory.remove() }
}

/// The ramp content of a file the fixture's provider serves.
func expectedBytes(_ provider: InMemoryProvider, _ path: String, _ range: Range<Int64>) -> [UInt8] {
    provider.content(of: path)!.0.slice(range)
}
