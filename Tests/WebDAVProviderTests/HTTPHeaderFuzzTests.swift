// Seeded fuzzing of what the WebDAV provider reads out of a server's headers and status lines
// (issue 26, "Bad input": fuzz the header parsers). Each reader meets values drawn from its
// grammar and the same values mutated (bytes replaced, inserted, removed, cut short; numbers past
// Int64; control bytes; non-ASCII), and is judged against an oracle that does not share its
// code: a regular expression of the grammar plus the range rules, and for dates glibc's timegm.
// A trap anywhere fails the run. (The XML parser has its own hostile documents in
// MultiStatusTests and WebDAVBadInputTests.)
//
// Replay: PROVIDERFS_TEST_SEED=<seed> swift test --filter HTTPHeaderFuzzTests
// (PROVIDERFS_FUZZ_ROUNDS: values per reader, default 3,000).

import Foundation
import ProviderModel
import TestSupport
import Testing

@testable import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite struct HTTPHeaderFuzzTests {
    let seed = SeededRandom.seedFromEnvironment()
    let rounds = environmentInteger("PROVIDERFS_FUZZ_ROUNDS", default: 3000)

    /// What a failure prints to replay it.
    var replay: String { "replay: PROVIDERFS_TEST_SEED=\(seed)" }

    /// `text` with up to three random edits.
    static func mutated(_ text: String, _ random: inout SeededRandom) -> String {
        var bytes = Array(text.utf8)
        let alphabet = Array(" -/*,\"<>:;=0123456789WGMTbytesJanFebHTTP\t\r\n".utf8) + [0, 0x7F, 0xC3, 0xA9, 0xFF]
        for _ in 0..<Int.random(in: 0...3, using: &random) {
            let choice = Int.random(in: 0..<6, using: &random)
            if choice == 0, !bytes.isEmpty {
                bytes[Int.random(in: 0..<bytes.count, using: &random)] = alphabet.randomElement(using: &random)!
            } else if choice == 1 {
                bytes.insert(
                    alphabet.randomElement(using: &random)!, at: Int.random(in: 0...bytes.count, using: &random))
            } else if choice == 2, !bytes.isEmpty {
                bytes.remove(at: Int.random(in: 0..<bytes.count, using: &random))
            } else if choice == 3 {
                let huge = Array(
                    ["99999999999999999999", "9223372036854775808", "-1", "+7", "00"].randomElement(
                        using: &random)!.utf8)
                bytes.insert(contentsOf: huge, at: Int.random(in: 0...bytes.count, using: &random))
            } else if choice == 4, !bytes.isEmpty {
                bytes.removeLast(Int.random(in: 1...bytes.count, using: &random))
            } else if choice == 5, !bytes.isEmpty {
                let at = Int.random(in: 0..<bytes.count, using: &random)
                bytes.insert(bytes[at], at: at)  // a separator doubled
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The capture groups of `pattern` matched against the whole of `text`, or nil.
    static func groups(_ pattern: String, _ text: String) -> [String?]? {
        let expression = try! NSRegularExpression(pattern: pattern, options: [.dotMatchesLineSeparators])
        let whole = NSRange(text.startIndex..., in: text)
        guard let match = expression.firstMatch(in: text, options: [.anchored], range: whole),
            match.range == whole
        else { return nil }
        return (1..<match.numberOfRanges).map { index in
            Range(match.range(at: index), in: text).map { String(text[$0]) }
        }
    }

    // MARK: Content-Range

    /// RFC 9110 §14.4, judged by a regular expression and the range rules.
    static func oracleContentRange(_ value: String) -> ContentRange.Oracle? {
        guard let parts = groups(#"bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)"#, value),
            let first = parts[0].flatMap({ Int64($0) }), let last = parts[1].flatMap({ Int64($0) }), first <= last
        else { return nil }
        if parts[2] == "*" { return .init(first: first, last: last, total: nil) }
        guard let total = parts[2].flatMap({ Int64($0) }), last < total else { return nil }
        return .init(first: first, last: last, total: total)
    }

    @Test func contentRangeIsReadByItsGrammar() {
        var random = SeededRandom(seed: seed)
        var accepted = 0
        for _ in 0..<rounds {
            let first = Int64.random(in: 0...(Bool.random(using: &random) ? 4096 : 1 << 40), using: &random)
            let last = first + Int64.random(in: 0...(1 << 30), using: &random)
            let total = Bool.random(using: &random) ? "*" : String(last + 1 + Int64.random(in: 0...9, using: &random))
            let valid = "bytes \(first)-\(last)/\(total)"
            for value in [valid, Self.mutated(valid, &random)] {
                let parsed = ContentRange(value).map {
                    ContentRange.Oracle(first: $0.first, last: $0.last, total: $0.total)
                }
                #expect(
                    parsed == Self.oracleContentRange(value), "Content-Range '\(value.debugDescription)'; \(replay)")
                if parsed != nil { accepted += 1 }
            }
        }
        #expect(accepted >= rounds, "the grammar's own values are accepted; \(replay)")
    }

    // MARK: Dates

    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// An IMF-fixdate (with the day of one or two digits and runs of spaces allowed, as the
    /// reader allows), as glibc's timegm reads its fields.
    static func oracleDate(_ text: String) -> Int64? {
        let month = months.joined(separator: "|")
        guard
            let parts = groups(
                #" *[^ ]+ +([0-9]{1,2}) +("# + month + #") +([0-9]{4}) +([0-9]{2}):([0-9]{2}):([0-9]{2}) +GMT *"#, text),
            let day = parts[0].flatMap({ Int32($0) }), let monthIndex = parts[1].flatMap({ months.firstIndex(of: $0) }),
            let year = parts[2].flatMap({ Int32($0) }), let hour = parts[3].flatMap({ Int32($0) }),
            let minute = parts[4].flatMap({ Int32($0) }), let second = parts[5].flatMap({ Int32($0) }),
            (1...31).contains(day), (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second),
            (1...9999).contains(year)
        else { return nil }
        var fields = tm()
        fields.tm_year = year - 1900
        fields.tm_mon = Int32(monthIndex)
        fields.tm_mday = day
        fields.tm_hour = hour
        fields.tm_min = minute
        fields.tm_sec = second
        return Int64(timegm(&fields))
    }

    /// `seconds` as a server writes Last-Modified.
    static func imfDate(_ seconds: Int64) -> String {
        var time = time_t(seconds)
        var fields = tm()
        gmtime_r(&time, &fields)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(days[Int(fields.tm_wday)]), \(two(fields.tm_mday)) \(months[Int(fields.tm_mon)]) "
            + "\(fields.tm_year + 1900) \(two(fields.tm_hour)):\(two(fields.tm_min)):\(two(fields.tm_sec)) GMT"
    }

    @Test func lastModifiedIsReadByItsGrammarAndAgreesWithTimegm() {
        var random = SeededRandom(seed: seed)
        for _ in 0..<rounds {
            // From 1970 to 9999.
            let seconds = Int64.random(in: 0...253_402_300_799, using: &random)
            let valid = Self.imfDate(seconds)
            #expect(MultiStatus.httpDate(valid) == seconds, "'\(valid)'; \(replay)")
            let value = Self.mutated(valid, &random)
            #expect(
                MultiStatus.httpDate(value) == Self.oracleDate(value),
                "Last-Modified '\(value.debugDescription)'; \(replay)")
        }
    }

    // MARK: Status lines

    @Test func statusLinesAreReadByTheirGrammar() {
        var random = SeededRandom(seed: seed)
        for _ in 0..<rounds {
            let code = Int.random(in: 100...599, using: &random)
            let valid = "HTTP/1.1 \(code) " + ["OK", "Not Found", "Multi-Status", ""].randomElement(using: &random)!
            #expect(MultiStatus.statusCode(valid) == code, "'\(valid)'; \(replay)")
            let value = Self.mutated(valid, &random)
            let oracle = Self.groups(" *HTTP/[^ ]* +([0-9]{3})( .*)?", value).flatMap { $0[0].flatMap { Int($0) } }
                .flatMap { (100...599).contains($0) ? $0 : nil }
            #expect(MultiStatus.statusCode(value) == oracle, "status line '\(value.debugDescription)'; \(replay)")
        }
    }

    // MARK: Lock tokens, DAV classes, ETags, Retry-After, names

    @Test func theOtherHeadersNeverGiveAValueOutsideTheirRules() {
        var random = SeededRandom(seed: seed)
        let retry = HTTPRetry()
        for _ in 0..<rounds {
            let token = "opaquelocktoken:" + UUID(uuid: random.uuidBytes()).uuidString.lowercased()
            #expect(WebDAVProvider.lockToken("<\(token)>") == token)
            let lock = Self.mutated("<\(token)>", &random)
            if let read = WebDAVProvider.lockToken(lock) {
                // It goes into an If header between angle brackets: nothing that could end it.
                #expect(
                    !read.isEmpty && !read.contains { $0 == "<" || $0 == ">" || $0.isNewline }, "'\(lock)'; \(replay)")
            }

            _ = WebDAVProvider.complianceClasses(Self.mutated("1, 2, 3, access-control", &random))  // no trap

            let tag = Self.mutated((Bool.random(using: &random) ? "W/" : "") + "\"\(random.next())\"", &random)
            let version = ContentVersion(tag)
            #expect(WebDAVProvider.sameVersion(version, version), "'\(tag)'; \(replay)")
            let weak = ContentVersion("W/" + tag)
            #expect(
                WebDAVProvider.sameVersion(version, weak) == WebDAVProvider.sameVersion(weak, version),
                "the weak comparison is symmetric: '\(tag)'; \(replay)")

            let after = Self.mutated(String(Int.random(in: 0...100_000, using: &random)), &random)
            for attempt in 1...4 {
                if let wait = retry.delay(after: attempt, method: "GET", outcome: .status(503, retryAfter: after)) {
                    #expect(wait >= .zero && wait <= retry.maximumDelay, "Retry-After '\(after)'; \(replay)")
                }
            }

            var name = ""
            for _ in 0..<Int.random(in: 1...12, using: &random) {
                name.unicodeScalars.append(
                    [
                        Unicode.Scalar(UInt8.random(in: 0x20...0x7E, using: &random)), "é", "#", "%", "?", " ",
                        "\u{1F600}",
                    ]
                    .randomElement(using: &random)!)
            }
            #expect(WebDAVLocation.percentDecoded(WebDAVLocation.percentEncoded(name)) == name, "'\(name)'; \(replay)")
            let garbled = Self.mutated(WebDAVLocation.percentEncoded(name), &random)
            if let decoded = WebDAVLocation.percentDecoded(garbled) {
                #expect(WebDAVLocation.percentDecoded(WebDAVLocation.percentEncoded(decoded)) == decoded)
            }
        }
    }
}

extension ContentRange {
    /// The fields alone, for comparing with the oracle.
    struct Oracle: Equatable {
        var first: Int64
        var last: Int64
        var total: Int64?
    }
}

extension SeededRandom {
    /// Sixteen random bytes, as `UUID(uuid:)` takes them.
    mutating func uuidBytes() -> uuid_t {
        let high = next()
        let low = next()
        return withUnsafeBytes(of: (high, low)) { raw in
            raw.load(as: uuid_t.self)
        }
    }
}
