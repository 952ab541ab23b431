/// A set of byte ranges, kept sorted, non-overlapping and non-adjacent (rclone's `lib/ranges`).
/// Used for the bytes of a content file that are known to be on disk.
public struct ByteRanges: Sendable, Equatable, CustomStringConvertible {
    /// Sorted, disjoint, non-empty, with a gap between neighbours.
    public private(set) var ranges: [Range<Int64>] = []

    public init() {}

    public init(_ ranges: [Range<Int64>]) {
        for range in ranges { insert(range) }
    }

    /// Total number of bytes covered.
    public var count: Int64 { ranges.reduce(0) { $0 + ($1.upperBound - $1.lowerBound) } }
    public var isEmpty: Bool { ranges.isEmpty }

    /// Adds `range`, merging with overlapping or adjacent ranges.
    public mutating func insert(_ range: Range<Int64>) {
        guard !range.isEmpty else { return }
        var lower = range.lowerBound
        var upper = range.upperBound
        // First range whose end reaches `lower` (adjacent counts).
        var start = firstIndex(endingAtOrAfter: lower)
        var end = start
        while end < ranges.count && ranges[end].lowerBound <= upper {
            lower = min(lower, ranges[end].lowerBound)
            upper = max(upper, ranges[end].upperBound)
            end += 1
        }
        if start > ranges.count { start = ranges.count }
        ranges.replaceSubrange(start..<end, with: [lower..<upper])
    }

    /// Removes `range` from the set (used when bytes are found bad or a file is cut).
    public mutating func remove(_ range: Range<Int64>) {
        guard !range.isEmpty else { return }
        var result: [Range<Int64>] = []
        for existing in ranges {
            if existing.upperBound <= range.lowerBound || existing.lowerBound >= range.upperBound {
                result.append(existing)
                continue
            }
            if existing.lowerBound < range.lowerBound { result.append(existing.lowerBound..<range.lowerBound) }
            if existing.upperBound > range.upperBound { result.append(range.upperBound..<existing.upperBound) }
        }
        ranges = result
    }

    /// True when every byte of `range` is present (an empty range is always contained).
    public func contains(_ range: Range<Int64>) -> Bool {
        guard !range.isEmpty else { return true }
        let index = firstIndex(endingAtOrAfter: range.lowerBound + 1)
        guard index < ranges.count else { return false }
        return ranges[index].lowerBound <= range.lowerBound && ranges[index].upperBound >= range.upperBound
    }

    /// The first byte of `range` that is not present, or nil when all are.
    public func firstMissing(in range: Range<Int64>) -> Int64? {
        var position = range.lowerBound
        guard !range.isEmpty else { return nil }
        let index = firstIndex(endingAtOrAfter: position + 1)
        if index < ranges.count, ranges[index].lowerBound <= position {
            position = ranges[index].upperBound
        }
        return position < range.upperBound ? position : nil
    }

    /// The missing gap that starts at `offset` (which must be missing), ending at the next present
    /// byte or at `limit`.
    public func gap(startingAt offset: Int64, limit: Int64) -> Range<Int64> {
        let index = firstIndex(endingAtOrAfter: offset + 1)
        let end = index < ranges.count ? min(ranges[index].lowerBound, limit) : limit
        return offset..<max(offset, end)
    }

    /// The missing parts of `range`.
    public func missing(in range: Range<Int64>) -> [Range<Int64>] {
        var result: [Range<Int64>] = []
        var position = range.lowerBound
        while let start = firstMissing(in: position..<range.upperBound) {
            let gap = gap(startingAt: start, limit: range.upperBound)
            result.append(gap)
            position = gap.upperBound
        }
        return result
    }

    /// Index of the first range with `upperBound >= offset`.
    private func firstIndex(endingAtOrAfter offset: Int64) -> Int {
        var low = 0
        var high = ranges.count
        while low < high {
            let middle = (low + high) / 2
            if ranges[middle].upperBound < offset { low = middle + 1 } else { high = middle }
        }
        return low
    }

    /// "0-4096,8192-12288": the persisted form (half-open, decimal).
    public var description: String {
        ranges.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ",")
    }

    /// Parses the persisted form; nil when malformed (the caller then treats nothing as present).
    public init?(parsing text: String) {
        self.init()
        guard !text.isEmpty else { return }
        for part in text.split(separator: ",") {
            let bounds = part.split(separator: "-")
            guard bounds.count == 2, let lower = Int64(bounds[0]), let upper = Int64(bounds[1]), lower >= 0,
                lower <= upper
            else { return nil }
            insert(lower..<upper)
        }
    }
}
