// Small PDF files built byte by byte for tests (the validator's, the reading-list app's): a
// correct cross-reference table unless a test asks for a broken one.

/// A PDF to build.
public struct TestPDF: Sendable {
    /// Pages to make; each shows "page N".
    public var pages = 1
    /// Write xref offsets that point at the wrong bytes (qpdf reconstructs the table: a repair).
    public var wrongOffsets = false
    /// Replace the first page's content stream with bytes that claim FlateDecode but are not.
    public var brokenContent = false
    /// The header's version.
    public var version = "1.7"
    /// Bytes added to every page's content stream (as a comment), to make big files.
    public var padding = 0

    public init(
        pages: Int = 1, wrongOffsets: Bool = false, brokenContent: Bool = false, version: String = "1.7",
        padding: Int = 0
    ) {
        self.pages = pages
        self.wrongOffsets = wrongOffsets
        self.brokenContent = brokenContent
        self.version = version
        self.padding = padding
    }

    public func bytes() -> [UInt8] {
        var objects: [String] = []
        objects.append("<< /Type /Catalog /Pages 2 0 R >>")
        let pageIDs = (0..<pages).map { 4 + 2 * $0 }
        let kids = pageIDs.map { "\($0) 0 R" }.joined(separator: " ")
        objects.append("<< /Type /Pages /Kids [\(kids)] /Count \(pages) >>")
        objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
        for index in 0..<pages {
            let contentID = pageIDs[index] + 1
            objects.append(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                    + "/Contents \(contentID) 0 R >>")
            if brokenContent && index == 0 {
                let garbage = "this is not zlib data at all"
                objects.append(
                    "<< /Length \(garbage.utf8.count) /Filter /FlateDecode >>\nstream\n\(garbage)\nendstream")
            } else {
                var content = "BT /F1 24 Tf 72 700 Td (page \(index + 1)) Tj ET"
                if padding > 0 { content += "\n%" + String(repeating: "x", count: padding) }
                objects.append("<< /Length \(content.utf8.count) >>\nstream\n\(content)\nendstream")
            }
        }
        var out = Array("%PDF-\(version)\n%\u{e2}\u{e3}\u{cf}\u{d3}\n".utf8)
        var offsets: [Int] = []
        for (index, object) in objects.enumerated() {
            offsets.append(out.count)
            out += Array("\(index + 1) 0 obj\n\(object)\nendobj\n".utf8)
        }
        let xref = out.count
        var table = "xref\n0 \(objects.count + 1)\n0000000000 65535 f \n"
        for offset in offsets {
            let written = wrongOffsets ? offset + 7 : offset
            table += String(repeating: "0", count: 10 - String(written).count) + "\(written) 00000 n \n"
        }
        table += "trailer\n<< /Size \(objects.count + 1) /Root 1 0 R >>\nstartxref\n\(xref)\n%%EOF\n"
        out += Array(table.utf8)
        return out
    }

    /// A PDF with no pages at all (a valid file, an empty document).
    public static func withoutPages() -> [UInt8] {
        let objects = ["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [] /Count 0 >>"]
        var out = Array("%PDF-1.7\n".utf8)
        var offsets: [Int] = []
        for (index, object) in objects.enumerated() {
            offsets.append(out.count)
            out += Array("\(index + 1) 0 obj\n\(object)\nendobj\n".utf8)
        }
        let xref = out.count
        var table = "xref\n0 3\n0000000000 65535 f \n"
        for offset in offsets {
            table += String(repeating: "0", count: 10 - String(offset).count) + "\(offset) 00000 n \n"
        }
        table += "trailer\n<< /Size 3 /Root 1 0 R >>\nstartxref\n\(xref)\n%%EOF\n"
        return out + Array(table.utf8)
    }
}
