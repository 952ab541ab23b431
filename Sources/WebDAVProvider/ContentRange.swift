// A 206 answer's Content-Range, read by its grammar (RFC 9110 §14.4): "bytes" SP first "-" last
// "/" (complete-length | "*"), every number 1*DIGIT. A value that is not exactly that, or whose
// numbers do not fit (first > last, last past the length, a number past Int64), is no range at
// all: the GET that carried it fails (D-466), never served from a lenient reading.

/// The byte span a 206 response says its body is.
struct ContentRange: Equatable, Sendable {
    /// First and last byte (inclusive), as the header says.
    let first: Int64
    let last: Int64
    /// The whole representation's length; nil for "*".
    let total: Int64?

    /// The body's length the header announces.
    var count: Int64 { last - first + 1 }

    /// The header's value read strictly; nil when it is not a byte range of that grammar.
    init?(_ value: String) {
        var rest = Substring(value)
        guard rest.hasPrefix("bytes ") else { return nil }
        rest = rest.dropFirst(6)
        guard let dash = rest.firstIndex(of: "-"), let slash = rest.firstIndex(of: "/"), dash < slash,
            let first = Self.number(rest[..<dash]), let last = Self.number(rest[rest.index(after: dash)..<slash]),
            first <= last
        else { return nil }
        let length = rest[rest.index(after: slash)...]
        if length == "*" {
            total = nil
        } else {
            guard let total = Self.number(length), last < total else { return nil }
            self.total = total
        }
        self.first = first
        self.last = last
    }

    /// 1*DIGIT as an Int64 (no sign, no space, no overflow).
    private static func number(_ text: Substring) -> Int64? {
        guard !text.isEmpty, text.utf8.allSatisfy({ (48...57).contains($0) }) else { return nil }
        return Int64(text)
    }
}
