// docs/DECISIONS.md can be searched for the current rule: its index lists every `## D-` entry with
// its status, every entry belongs to one area of the by-area table, and an entry that supersedes,
// replaces, undoes or amends another leaves that one a `Status:` line naming it. Scripts/decisions-index
// writes the index; this test fails when someone added an entry without running it, or changed a
// rule without marking the old one.

import Foundation
import Testing

@Suite("docs/DECISIONS.md")
struct DecisionLogTests {
    struct Entry {
        var id: String
        var title: String
        var body: String
        var number: Int { Int(id.dropFirst(2).prefix { $0.isNumber }) ?? -1 }
    }

    static let text: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        return (try? String(contentsOfFile: root + "/docs/DECISIONS.md", encoding: .utf8)) ?? ""
    }()

    /// Every `## D-<n> <title>` section, in file order.
    static func entries(_ text: String) -> [Entry] {
        var entries: [Entry] = []
        var body: [Substring] = []
        func close() {
            guard !entries.isEmpty else { return }
            entries[entries.count - 1].body = body.joined(separator: "\n")
        }
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if let match = line.wholeMatch(of: /## (D-\d+[a-z]?) (.+)/) {
                close()
                entries.append(Entry(id: String(match.1), title: String(match.2), body: ""))
                body = []
            } else if line.hasPrefix("# ") || line.hasPrefix("## ") {
                close()
                body = []
            } else {
                body.append(line)
            }
        }
        close()
        return entries
    }

    /// "superseded by D-n" / "amended by D-n and D-m" from the entry's Status line (text in
    /// parentheses left out), or "current".
    static func status(_ body: String) -> String {
        let lines = body.split(separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(where: { $0.drop { $0 == "-" || $0 == " " }.hasPrefix("Status:") }) else {
            return "current"
        }
        var paragraph = String(lines[start].drop { $0 == "-" || $0 == " " }.dropFirst("Status:".count))
        for line in lines[(start + 1)...] {
            if line.trimmingCharacters(in: .whitespaces).isEmpty || line.hasPrefix("- ")
                || line.firstMatch(of: /^\w+:/) != nil
            {
                break
            }
            paragraph += " " + line
        }
        while let inner = paragraph.firstMatch(of: /\([^()]*\)/) { paragraph.removeSubrange(inner.range) }
        let sentence = paragraph.split(separator: ". ", maxSplits: 1).first.map(String.init) ?? paragraph
        guard let kind = sentence.firstMatch(of: /^\s*(superseded|amended)\b/)?.1 else { return "unknown" }
        let ids = sentence.matches(of: /D-\d+[a-z]?/).map { String($0.0) }
        return "\(kind) by " + ids.joined(separator: " and ")
    }

    /// GitHub's anchor of a heading.
    static func anchor(_ heading: String) -> String {
        String(
            heading.lowercased().unicodeScalars.filter {
                CharacterSet.alphanumerics.contains($0) || $0 == "-" || $0 == "_" || $0 == " "
            }
        ).replacingOccurrences(of: " ", with: "-")
    }

    @Test func theIndexListsEveryEntryWithItsStatus() throws {
        let entries = Self.entries(Self.text)
        #expect(entries.count > 200, "docs/DECISIONS.md not found or not parsed")
        let rows = Self.text.split(separator: "\n").filter { $0.hasPrefix("| [D-") }.map(String.init)
        let expected = entries.map { entry in
            "| [\(entry.id)](#\(Self.anchor(entry.id + " " + entry.title))) | \(entry.title) | \(Self.status(entry.body)) |"
        }
        for (row, wanted) in zip(rows, expected) where row != wanted {
            Issue.record("index row \(row)\nshould be  \(wanted)\n(run Scripts/decisions-index)")
            break
        }
        #expect(rows.count == expected.count, "the index has \(rows.count) rows for \(expected.count) entries")
        let numbers = entries.map { ($0.number, $0.id) }
        #expect(
            numbers.map(\.0) == numbers.map(\.0).sorted(),
            "entries are not in id order: \(zip(numbers, numbers.dropFirst()).first { $0.0.0 > $0.1.0 }.map { "\($0.1.1) after \($0.0.1)" } ?? "")"
        )
    }

    @Test func everyEntryIsInOneArea() {
        var ranges: [ClosedRange<Int>] = []
        var inTable = false
        for line in Self.text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("| ids | area |") {
                inTable = true
                continue
            }
            guard inTable else { continue }
            guard line.hasPrefix("|") else { break }
            guard let ids = line.split(separator: "|").first, !ids.contains("---") else { continue }
            for part in ids.split(separator: ",") {
                let bounds = part.matches(of: /D-(\d+)/).compactMap { Int($0.1) }
                if let low = bounds.first, let high = bounds.last, low <= high { ranges.append(low...high) }
            }
        }
        #expect(!ranges.isEmpty, "no by-area table")
        for entry in Self.entries(Self.text) {
            let count = ranges.filter { $0.contains(entry.number) }.count
            #expect(count == 1, "\(entry.id) is in \(count) areas of the by-area table")
        }
    }

    @Test func aReplacedOrAmendedEntrySaysSo() {
        let entries = Self.entries(Self.text)
        let byID = Dictionary(entries.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        for entry in entries {
            let status = Self.status(entry.body)
            #expect(status != "unknown", "\(entry.id): a Status line must say superseded or amended by D-n")
            for named in status.matches(of: /D-\d+[a-z]?/) {
                #expect(byID[String(named.0)] != nil, "\(entry.id): its Status names \(named.0), which has no entry")
            }
            for declared in entry.body.matches(of: /\b(?:[Ss]upersedes|[Rr]eplaces|[Uu]ndoes|[Aa]mends) (D-\d+[a-z]?)/)
            {
                let other = String(declared.1)
                guard other != entry.id, let target = byID[other] else { continue }
                let names = Self.status(target.body).matches(of: /D-\d+[a-z]?/).map { String($0.0) }
                #expect(
                    names.contains(entry.id),
                    "\(entry.id) says \"\(declared.0)\", but \(other) has no Status line naming \(entry.id)")
            }
        }
    }

    /// The rules above catch what they are for (checked on a small log, so that a parser that
    /// reads nothing cannot pass).
    @Test func theRulesCatchAMissingStatus() {
        let log = """
            ## D-001 First rule
            - Rule: a.

            ## D-002 Second rule
            - Undoes D-001.
            """
        let entries = Self.entries(log)
        #expect(entries.map(\.id) == ["D-001", "D-002"])
        #expect(Self.status(entries[0].body) == "current")
        let marked = Self.entries(
            log.replacingOccurrences(of: "- Rule: a.", with: "Status: superseded by D-002 (why).\n- Rule: a."))
        #expect(Self.status(marked[0].body) == "superseded by D-002")
        #expect(
            Self.anchor("D-389 st_ino is the item's serial number; the FUSE node id")
                == "d-389-st_ino-is-the-items-serial-number-the-fuse-node-id")
    }
}
