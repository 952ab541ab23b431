// Parsing of the human forms the CLI contract uses: durations "500ms", "2s", "10m", "1h"
// and sizes "4096", "64KiB", "1MiB" (DESIGN.md §6).

/// Why a duration or size could not be parsed; `description` is one clear sentence.
public struct QuantityParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public var text: String
    public var expected: String
    public var description: String { "'\(text)' is not a valid \(expected)" }
}

/// Parses "250ms", "2s", "1.5s", "10m", "1h", "0s". A bare number is rejected: units are required
/// so that "5" never silently means five seconds to one reader and five milliseconds to another.
public func parseDuration(_ text: String) throws(QuantityParseError) -> Duration {
    let error = QuantityParseError(text: text, expected: "duration (use forms like 500ms, 2s, 10m, 1h)")
    let units: [(String, Double)] = [("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1), ("m", 60), ("h", 3600)]
    guard let unit = units.first(where: { text.hasSuffix($0.0) }) else { throw error }
    let number = text.dropLast(unit.0.count)
    guard !number.isEmpty, number.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
        let value = Double(number), value.isFinite, value >= 0, value * unit.1 < 1e9
    else { throw error }
    let nanoseconds = (value * unit.1 * 1e9).rounded()
    return .nanoseconds(Int64(nanoseconds))
}

/// Parses "4096", "64KiB", "1MiB", "2GiB", "10KB" (KB/MB/GB are decimal, KiB/MiB/GiB binary),
/// also "64k"/"1M"/"1G" (binary, as dd and fio read them).
public func parseSize(_ text: String) throws(QuantityParseError) -> Int64 {
    let error = QuantityParseError(text: text, expected: "size (use forms like 4096, 64KiB, 1MiB)")
    let units: [(String, Int64)] = [
        ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
        ("KB", 1000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("TB", 1_000_000_000_000),
        ("k", 1 << 10), ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40), ("B", 1),
    ]
    var digits = Substring(text)
    var multiplier: Int64 = 1
    if let unit = units.first(where: { text.hasSuffix($0.0) }) {
        digits = digits.dropLast(unit.0.count)
        multiplier = unit.1
    }
    guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int64(digits) else {
        throw error
    }
    let (product, overflow) = value.multipliedReportingOverflow(by: multiplier)
    guard !overflow else { throw error }
    return product
}

extension Duration {
    /// "1.5s", "250ms", "12µs": for logs and CLI output.
    public var humanReadable: String {
        let (seconds, attoseconds) = components
        let total = Double(seconds) + Double(attoseconds) / 1e18
        if total >= 1 { return formatDecimal(total) + "s" }
        if total >= 1e-3 { return formatDecimal(total * 1e3) + "ms" }
        return formatDecimal(total * 1e6) + "µs"
    }

    /// Seconds as a Double, for arithmetic with timeouts and rates.
    public var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}

private func formatDecimal(_ value: Double) -> String {
    let rounded = (value * 10).rounded() / 10
    if rounded == rounded.rounded() { return String(Int64(rounded)) }
    return String(rounded)
}

/// "1.5 GiB", "512 KiB", "17 B".
public func formatSize(_ bytes: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var index = 0
    while value >= 1024 && index < units.count - 1 {
        value /= 1024
        index += 1
    }
    return index == 0 ? "\(bytes) B" : "\(formatDecimal(value)) \(units[index])"
}
