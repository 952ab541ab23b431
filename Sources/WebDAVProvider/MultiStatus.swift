// PROPFIND's answer, the 207 Multi-Status document (RFC 4918 §13, §14.16), read with
// FoundationXML's XMLParser as it arrives (MultiStatusStream.swift, D-478) and defended against
// hostile input: a size limit and no DTD at all (so no entity expansion and no external entity is
// ever fetched), both checked on the bytes before the parser sees them, a depth limit and an
// element count limit while parsing, and a length limit on each text value. Elements are matched
// by namespace and local name: a `getetag` in another namespace is not the DAV: one.

import Foundation
public import ProviderModel
import SystemSupport

#if canImport(FoundationXML)
import FoundationXML
#endif

/// One `<D:response>`: the href and the properties its 200 propstat carried.
public struct MultiStatusEntry: Sendable, Equatable {
    /// The href, as sent (percent-encoded).
    public var href: String
    /// The response's own status when it has no propstat (e.g. "HTTP/1.1 404 Not Found"), else nil.
    public var status: Int?
    public var isCollection = false
    public var contentLength: Int64?
    /// `getlastmodified` as seconds since the epoch (RFC 1123 date), when present and valid.
    public var lastModified: Int64?
    /// `getetag` as sent, quotes (and a weak validator's `W/`) included.
    public var etag: String?
    /// A collection's `getctag` (CalendarServer's namespace, as SabreDAV servers send it): a
    /// value that changes whenever a child's content or metadata does (D-518). At most
    /// `MultiStatus.maximumPropertyLength` bytes, else nil.
    public var ctag: String?
    /// ownCloud's `oc:checksums` (`<oc:checksum>SHA1:… MD5:…</oc:checksum>`) of a file: the
    /// known algorithms of a value of that grammar; others, and a value longer than
    /// `MultiStatus.maximumPropertyLength`, are ignored (D-519).
    public var checksums: [ContentChecksum] = []

    public init(href: String) { self.href = href }
}

/// Why a Multi-Status document was refused; the message says what was wrong.
public struct MultiStatusError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
}

/// The limits the parser holds hostile documents to.
public struct MultiStatusLimits: Sendable {
    /// Bytes of the whole document (a Depth 1 listing of 10,000 entries is about 5 MB). Parsed
    /// as it arrives, so it is not held: memory holds the entries (D-478).
    public var maximumBytes = 256 << 20
    /// Nesting depth of elements (a real 207 nests 6 or 7 deep).
    public var maximumDepth = 32
    /// Elements in all.
    public var maximumElements = 4_000_000
    /// Characters of one text value (an href, an ETag, a date).
    public var maximumTextLength = 16 << 10
    public init() {}
}

public enum MultiStatus {
    /// The longest `getctag` or `oc:checksum` value taken (a real one is under 200 bytes); a
    /// longer one is ignored, not an error.
    public static let maximumPropertyLength = 1024
    /// Checksums taken from one response's `oc:checksums` (one per algorithm is all there is).
    static let maximumChecksums = 8

    /// The responses of `document`. Throws `MultiStatusError` for a document that is too large,
    /// carries a DTD, nests too deep, is not well-formed XML, or is not a DAV: multistatus. The
    /// same parse as a streamed PROPFIND's (`MultiStatusStream`), fed all at once.
    public static func parse(
        _ document: [UInt8], limits: MultiStatusLimits = MultiStatusLimits()
    ) throws(MultiStatusError) -> [MultiStatusEntry] {
        let entries = Locked<[MultiStatusEntry]>([])
        let stream = MultiStatusStream(limits: limits, capacity: .max) { entry in
            entries.withLock { $0.append(entry) }
            return true
        }
        _ = document.withUnsafeBytes { stream.feed($0) }
        stream.finish(complete: true)
        try stream.parse()
        return entries.withLock { $0 }
    }

    /// Whether `bytes` holds `<!DOCTYPE` or `<!ENTITY` (any case), the start of a DTD.
    static func containsDeclaration<Bytes: RandomAccessCollection<UInt8>>(_ bytes: Bytes) -> Bool
    where Bytes.Index == Int {
        let doctype = Array("<!DOCTYPE".utf8)
        let entity = Array("<!ENTITY".utf8)
        var index = bytes.startIndex
        while index + 2 < bytes.endIndex {
            if bytes[index] == UInt8(ascii: "<"), bytes[index + 1] == UInt8(ascii: "!") {
                for keyword in [doctype, entity] where index + keyword.count <= bytes.endIndex {
                    var matches = true
                    for offset in 2..<keyword.count where bytes[index + offset] & 0xDF != keyword[offset] {
                        matches = false
                        break
                    }
                    if matches { return true }
                }
            }
            index += 1
        }
        return false
    }

    /// The status code of an HTTP status line ("HTTP/1.1 404 Not Found" → 404).
    /// Three digits, 100 to 599, after "HTTP/…" and before the reason phrase (no sign, no other
    /// spelling of the number: HTTPHeaderFuzzTests holds it to that grammar).
    static func statusCode(_ line: String) -> Int? {
        let parts = line.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/"), let code = digits(parts[1], count: 3...3),
            (100...599).contains(code)
        else { return nil }
        return code
    }

    /// An RFC 1123 date ("Sun, 06 Nov 1994 08:49:37 GMT") as seconds since the epoch: a day of
    /// one or two digits, a four-digit year, two digits each for the time, nothing signed.
    public static func httpDate(_ text: String) -> Int64? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 6, parts[5] == "GMT", let day = digits(parts[1], count: 1...2),
            let year = digits(parts[3], count: 4...4)
        else {
            return nil
        }
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard let monthIndex = months.firstIndex(of: String(parts[2])) else { return nil }
        let time = parts[4].split(separator: ":", omittingEmptySubsequences: false)
        guard time.count == 3, let hour = digits(time[0], count: 2...2), let minute = digits(time[1], count: 2...2),
            let second = digits(time[2], count: 2...2),
            (1...31).contains(day), (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second),
            (1...9999).contains(year)
        else { return nil }
        // Days from the civil date (Howard Hinnant's algorithm), no time zone database involved.
        let month = monthIndex + 1
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146097 + dayOfEra - 719468
        return Int64(days) * 86400 + Int64(hour * 3600 + minute * 60 + second)
    }

    /// `count` ASCII digits as a number, else nil.
    private static func digits(_ text: Substring, count: ClosedRange<Int>) -> Int? {
        guard count.contains(text.utf8.count), text.utf8.allSatisfy({ (48...57).contains($0) }) else { return nil }
        return Int(text)
    }
}

/// The XMLParser delegate: a small state machine over the DAV: elements, handing each response
/// to `entry` as it closes.
final class MultiStatusReader: NSObject, XMLParserDelegate {
    let limits: MultiStatusLimits
    /// False stops the parse (`stopped`).
    let entry: (MultiStatusEntry) -> Bool
    var failure: MultiStatusError?
    /// `entry` said stop.
    var stopped = false
    var sawMultiStatus = false
    var closedRoot = false

    /// The DAV: local names open from the root down ("" for an element of another namespace).
    private var path: [String] = []
    private var elements = 0
    private var text = ""
    private var textTooLong = false
    private var current: MultiStatusEntry?
    /// The properties of the propstat being read, applied only if its status is 200.
    private var pending = MultiStatusEntry(href: "")
    private var propstatStatus: Int?
    private var sawPropstat = false

    init(limits: MultiStatusLimits, entry: @escaping (MultiStatusEntry) -> Bool) {
        self.limits = limits
        self.entry = entry
    }

    private func fail(_ parser: XMLParser, _ message: String) {
        if failure == nil { failure = MultiStatusError(description: message) }
        parser.abortParsing()
    }

    func parser(
        _ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?, qualifiedName: String?,
        attributes: [String: String] = [:]
    ) {
        elements += 1
        guard elements <= limits.maximumElements else {
            return fail(parser, "the Multi-Status document has more than \(limits.maximumElements) elements")
        }
        guard path.count < limits.maximumDepth else {
            return fail(parser, "the Multi-Status document nests deeper than \(limits.maximumDepth) elements")
        }
        let name = Self.localName(elementName, namespaceURI)
        if path.isEmpty {
            guard name == "multistatus" else {
                return fail(parser, "the document's root is not a DAV: multistatus")
            }
            sawMultiStatus = true
        }
        path.append(name)
        text = ""
        textTooLong = false
        switch name {
        case "response" where path.count == 2:
            current = MultiStatusEntry(href: "")
            sawPropstat = false
        case "propstat" where path.count == 3:
            pending = MultiStatusEntry(href: "")
            propstatStatus = nil
            sawPropstat = true
        case "collection"
        where path.count == 6 && path[1] == "response" && path[2] == "propstat" && path[3] == "prop"
            && path[4] == "resourcetype":
            pending.isCollection = true
        default: break
        }
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        guard !textTooLong else { return }
        if text.utf8.count + string.utf8.count > limits.maximumTextLength {
            textTooLong = true
            return fail(
                parser, "a text value of the Multi-Status document is longer than \(limits.maximumTextLength) bytes")
        }
        text += string
    }

    func parser(_ parser: XMLParser, foundCDATA CDATABlock: Data) {
        self.parser(parser, foundCharacters: String(decoding: CDATABlock, as: UTF8.self))
    }

    func parser(
        _ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName: String?
    ) {
        guard let name = path.last else { return fail(parser, "the Multi-Status document has content after its root") }
        guard name == Self.localName(elementName, namespaceURI) else {
            return fail(parser, "the Multi-Status document is not well-formed XML (</\(elementName)> closes <\(name)>)")
        }
        if path.count == 1 { closedRoot = true }
        let value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        let depth = path.count
        switch name {
        case "href" where depth == 3 && path[1] == "response":
            current?.href = value
        case "status" where depth == 3 && path[1] == "response":
            current?.status = MultiStatus.statusCode(value)
        case "status" where depth == 4 && path[2] == "propstat":
            propstatStatus = MultiStatus.statusCode(value)
        case "getcontentlength" where isProperty(depth):
            pending.contentLength = Int64(value).flatMap { $0 >= 0 ? $0 : nil }
        case "getlastmodified" where isProperty(depth):
            pending.lastModified = MultiStatus.httpDate(value)
        case "getetag" where isProperty(depth):
            pending.etag = value.isEmpty ? nil : value
        case "cs:getctag" where isProperty(depth):
            pending.ctag = value.isEmpty || value.utf8.count > MultiStatus.maximumPropertyLength ? nil : value
        case "oc:checksum" where depth == 6 && path[4] == "oc:checksums" && isProperty(5):
            // Ignored as a whole when it is not of OC-Checksum's grammar (ResponseChecksum).
            if value.utf8.count <= MultiStatus.maximumPropertyLength,
                let checksums = ResponseChecksum.ownCloudChecksums(value)
            {
                pending.checksums = Array((pending.checksums + checksums).prefix(MultiStatus.maximumChecksums))
            }
        case "propstat" where depth == 3:
            if propstatStatus == 200, current != nil {
                if pending.isCollection { current!.isCollection = true }
                if let length = pending.contentLength { current!.contentLength = length }
                if let modified = pending.lastModified { current!.lastModified = modified }
                if let etag = pending.etag { current!.etag = etag }
                if let ctag = pending.ctag { current!.ctag = ctag }
                if !pending.checksums.isEmpty { current!.checksums = pending.checksums }
            }
        case "response" where depth == 2:
            if var response = current, !response.href.isEmpty {
                if sawPropstat { response.status = nil }
                if !entry(response) {
                    stopped = true
                    current = nil
                    return fail(parser, "the reader of the Multi-Status document stopped it")
                }
            }
            current = nil
        default: break
        }
        path.removeLast()
        text = ""
    }

    /// The names the reader tells apart: DAV: elements by their local name, the two properties
    /// of other namespaces it reads (D-518, D-519) prefixed, anything else "".
    private static func localName(_ elementName: String, _ namespaceURI: String?) -> String {
        switch namespaceURI {
        case "DAV:": elementName
        case "http://calendarserver.org/ns/" where elementName == "getctag": "cs:getctag"
        case "http://owncloud.org/ns" where elementName == "checksums" || elementName == "checksum":
            "oc:" + elementName
        default: ""
        }
    }

    /// Whether an element ending at `depth` is a property of a propstat's prop.
    private func isProperty(_ depth: Int) -> Bool {
        depth == 5 && path[1] == "response" && path[2] == "propstat" && path[3] == "prop"
    }

    // A DTD is refused before parsing; these are the second line of defence.
    func parser(_ parser: XMLParser, foundInternalEntityDeclarationWithName name: String, value: String?) {
        fail(parser, "the Multi-Status document declares an entity")
    }

    func parser(
        _ parser: XMLParser, foundExternalEntityDeclarationWithName name: String, publicID: String?, systemID: String?
    ) {
        fail(parser, "the Multi-Status document declares an external entity")
    }

    func parser(_ parser: XMLParser, resolveExternalEntityName name: String, systemID: String?) -> Data? {
        fail(parser, "the Multi-Status document refers to an external entity")
        return nil
    }
}
