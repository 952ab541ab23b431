// Comparing large byte buffers in tests. `#expect(a == b)` on MiB-sized arrays is fast when they
// are equal, but when they differ Swift Testing describes both operands and diffs them, which
// takes tens of seconds to minutes (40 s for DirectTransferCacheTests' 3 + 5 MiB): a failure that
// looks like a hang. `#expect(byteDifference(a, b) == nil)` costs a
// memcmp either way and, on failure, prints one line: the first differing offset, the bytes there
// and both lengths.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where two byte buffers first differ.
public struct ByteDifference: Equatable, Sendable, CustomStringConvertible {
    /// The first offset at which the bytes differ, or at which the shorter buffer ends.
    public var offset: Int
    public var actualCount: Int
    public var expectedCount: Int
    /// The bytes at `offset` (nil past a buffer's end).
    public var actualByte: UInt8?
    public var expectedByte: UInt8?

    public var description: String {
        func show(_ byte: UInt8?) -> String {
            guard let byte else { return "end" }
            let hex = String(byte, radix: 16)
            return "0x" + (hex.count == 1 ? "0" + hex : hex)
        }
        return "bytes differ first at offset \(offset) (actual \(show(actualByte)), expected \(show(expectedByte))); "
            + "lengths: actual \(actualCount), expected \(expectedCount)"
    }
}

/// nil when `actual` and `expected` hold the same bytes; else where they first differ. Use it as
/// `#expect(byteDifference(actual, expected) == nil)` for any buffer that may be large.
public func byteDifference(
    _ actual: some Collection<UInt8>, _ expected: some Collection<UInt8>
) -> ByteDifference? {
    let left = Array(actual)
    let right = Array(expected)
    let common = min(left.count, right.count)
    let offset = left.withUnsafeBytes { a in
        right.withUnsafeBytes { b in firstDifferingOffset(a, b, count: common) }
    }
    guard offset < common || left.count != right.count else { return nil }
    return ByteDifference(
        offset: offset, actualCount: left.count, expectedCount: right.count,
        actualByte: offset < left.count ? left[offset] : nil, expectedByte: offset < right.count ? right[offset] : nil)
}

/// The first offset below `count` where the buffers differ, or `count`. memcmp block by block,
/// then byte by byte inside the block that differs.
private func firstDifferingOffset(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer, count: Int) -> Int {
    guard count > 0, let left = a.baseAddress, let right = b.baseAddress else { return 0 }
    let block = 64 << 10
    var start = 0
    while start < count {
        let length = min(block, count - start)
        if memcmp(left + start, right + start, length) != 0 {
            for index in start..<(start + length) where a[index] != b[index] { return index }
        }
        start += length
    }
    return count
}
