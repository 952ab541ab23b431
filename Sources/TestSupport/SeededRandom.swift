// Seeded randomness for model tests: reproducible from the seed printed on failure.

/// SplitMix64: small, fast, and good enough to drive test sequences.
public struct SeededRandom: RandomNumberGenerator, Sendable {
    public private(set) var state: UInt64
    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// The seed from `PROVIDERFS_TEST_SEED` when set (to replay a failure), else a fresh one.
    public static func seedFromEnvironment(_ variable: String = "PROVIDERFS_TEST_SEED") -> UInt64 {
        if let text = currentEnvironmentValue(variable), let seed = UInt64(text) { return seed }
        return UInt64.random(in: 1...UInt64.max)
    }
}

/// An integer from the environment (iteration counts), or `fallback`.
public func environmentInteger(_ variable: String, default fallback: Int) -> Int {
    currentEnvironmentValue(variable).flatMap { Int($0) } ?? fallback
}

func currentEnvironmentValue(_ name: String) -> String? {
    guard let value = getenv(name) else { return nil }
    return String(cString: value)
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
