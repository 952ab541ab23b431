import ProviderCache
import TestSupport
import Testing

@Suite("ByteRanges")
struct ByteRangesTests {
    @Test("insert merges overlapping and adjacent ranges, keeps gaps")
    func insertMerges() {
        var ranges = ByteRanges()
        ranges.insert(10..<20)
        ranges.insert(30..<40)
        #expect(ranges.ranges == [10..<20, 30..<40])
        ranges.insert(20..<25)
        #expect(ranges.ranges == [10..<25, 30..<40])
        ranges.insert(5..<35)
        #expect(ranges.ranges == [5..<40])
        ranges.insert(0..<0)
        #expect(ranges.ranges == [5..<40])
        #expect(ranges.count == 35)
    }

    @Test("contains, firstMissing, gap and missing")
    func queries() {
        let ranges = ByteRanges([0..<100, 200..<300])
        #expect(ranges.contains(0..<100))
        #expect(ranges.contains(250..<260))
        #expect(!ranges.contains(99..<101))
        #expect(!ranges.contains(100..<101))
        #expect(ranges.contains(150..<150))
        #expect(ranges.firstMissing(in: 0..<300) == 100)
        #expect(ranges.firstMissing(in: 200..<300) == nil)
        #expect(ranges.firstMissing(in: 250..<400) == 300)
        #expect(ranges.gap(startingAt: 100, limit: 1000) == 100..<200)
        #expect(ranges.gap(startingAt: 300, limit: 1000) == 300..<1000)
        #expect(ranges.missing(in: 50..<350) == [100..<200, 300..<350])
    }

    @Test("remove splits ranges")
    func remove() {
        var ranges = ByteRanges([0..<100])
        ranges.remove(40..<60)
        #expect(ranges.ranges == [0..<40, 60..<100])
        ranges.remove(0..<1000)
        #expect(ranges.isEmpty)
    }

    @Test("the persisted text form round-trips; malformed text is refused")
    func parsing() {
        let ranges = ByteRanges([0..<4096, 8192..<12288])
        #expect(ranges.description == "0-4096,8192-12288")
        #expect(ByteRanges(parsing: ranges.description) == ranges)
        #expect(ByteRanges(parsing: "") == ByteRanges())
        #expect(ByteRanges(parsing: "5-3") == nil)
        #expect(ByteRanges(parsing: "a-b") == nil)
        #expect(ByteRanges(parsing: "1-2-3") == nil)
    }

    @Test("random inserts and removes agree with a byte map")
    func randomAgainstBitmap() {
        let seed = SeededRandom.seedFromEnvironment()
        var random = SeededRandom(seed: seed)
        for _ in 0..<200 {
            var ranges = ByteRanges()
            var bitmap = [Bool](repeating: false, count: 256)
            for _ in 0..<20 {
                let lower = Int64.random(in: 0..<256, using: &random)
                let upper = Int64.random(in: lower...256, using: &random)
                let inserting = Bool.random(using: &random) || Bool.random(using: &random)
                if inserting { ranges.insert(lower..<upper) } else { ranges.remove(lower..<upper) }
                for index in Int(lower)..<Int(upper) { bitmap[index] = inserting }
            }
            #expect(ranges.count == Int64(bitmap.filter { $0 }.count), "seed \(seed)")
            let probeLower = Int64.random(in: 0..<256, using: &random)
            let probeUpper = Int64.random(in: probeLower...256, using: &random)
            let expected = (Int(probeLower)..<Int(probeUpper)).allSatisfy { bitmap[$0] }
            #expect(ranges.contains(probeLower..<probeUpper) == expected, "seed \(seed)")
            let firstMissing = (Int(probeLower)..<Int(probeUpper)).first { !bitmap[$0] }.map(Int64.init)
            #expect(ranges.firstMissing(in: probeLower..<probeUpper) == firstMissing, "seed \(seed)")
            // Disjoint, sorted, non-adjacent.
            for (a, b) in zip(ranges.ranges, ranges.ranges.dropFirst()) { #expect(a.upperBound < b.lowerBound) }
        }
    }
}
