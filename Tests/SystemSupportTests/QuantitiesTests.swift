import SystemSupport
import Testing

@Suite struct QuantitiesTests {
    @Test(arguments: [
        ("500ms", Duration.milliseconds(500)), ("2s", .seconds(2)), ("10m", .seconds(600)), ("1h", .seconds(3600)),
        ("1.5s", .milliseconds(1500)), ("0s", .zero), ("250us", .microseconds(250)),
    ])
    func parsesDurations(text: String, expected: Duration) throws {
        #expect(try parseDuration(text) == expected)
    }

    @Test(arguments: ["", "5", "s", "-1s", "1x", "1.2.3s", "ms", "1e3s", " 1s", "99999999999h"])
    func rejectsBadDurations(text: String) {
        #expect(throws: QuantityParseError.self) { try parseDuration(text) }
    }

    @Test(arguments: [
        ("4096", Int64(4096)), ("64KiB", 65536), ("1MiB", 1_048_576), ("2GiB", 2_147_483_648), ("10KB", 10_000),
        ("1M", 1_048_576), ("0", 0),
    ])
    func parsesSizes(text: String, expected: Int64) throws {
        #expect(try parseSize(text) == expected)
    }

    @Test(arguments: ["", "KiB", "-4", "1.5MiB", "12XB", "99999999999TiB", "4 KiB"])
    func rejectsBadSizes(text: String) {
        #expect(throws: QuantityParseError.self) { try parseSize(text) }
    }

    @Test func formatsSizes() {
        #expect(formatSize(17) == "17 B")
        #expect(formatSize(1536) == "1.5 KiB")
        #expect(formatSize(1 << 30) == "1 GiB")
    }
}
