// Write-back in one home (issue 25, docs/DECISIONS.md D-440): staging (Sources/ProviderCache/
// Staging/) and the write-back queue (WriteBack/) reach the catalog and the content store only
// through their own ports (StagingPorts.swift, WriteBackPorts.swift), never through `Catalog` or
// `ContentStore` themselves, and no file of ProviderCache grows past 800 lines. This test reads
// the sources.

import Foundation
import Testing

@Suite("Write-back in one home")
struct WriteHomeTests {
    static let cache = "Sources/ProviderCache"
    static let lineLimit = 800

    /// The Swift files under `directory` (package-relative), recursively.
    static func swiftFiles(under directory: String) -> [String] {
        let root = PackageGraphTests.packageRoot + "/" + directory
        guard let files = FileManager.default.enumerator(atPath: root) else { return [] }
        return files.compactMap { $0 as? String }.filter { $0.hasSuffix(".swift") }.map { directory + "/" + $0 }
            .sorted()
    }

    /// The code of `file` (package-relative), line by line, without `//` comments.
    static func codeLines(of file: String) throws -> [Substring] {
        let text = try String(contentsOfFile: PackageGraphTests.packageRoot + "/" + file, encoding: .utf8)
        return text.split(separator: "\n", omittingEmptySubsequences: false).map {
            $0.split(separator: "//", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        }
    }

    /// Whether `line` uses `word` with no identifier character before it, nor after it unless
    /// `word` ends in punctuation ("catalog." is a receiver, "Catalog" a type).
    static func uses(_ word: String, in line: Substring) -> Bool {
        func isName(_ character: Character) -> Bool { character.isLetter || character.isNumber || character == "_" }
        var rest = line[...]
        while let range = rest.range(of: word) {
            let before = range.lowerBound == line.startIndex ? nil : line[line.index(before: range.lowerBound)]
            let after = range.upperBound == line.endIndex ? nil : line[range.upperBound]
            let endsInName = word.last.map(isName) ?? false
            if !(before.map(isName) ?? false), !endsInName || !(after.map(isName) ?? false) { return true }
            rest = rest[range.upperBound...]
        }
        return false
    }

    /// `path:line: word` for every use of one of `words` in `files`.
    static func uses(of words: [String], in files: [String]) throws -> [String] {
        var found: [String] = []
        for file in files {
            for (number, line) in try codeLines(of: file).enumerated() {
                for word in words where uses(word, in: line) { found.append("\(file):\(number + 1): \(word)") }
            }
        }
        return found
    }

    /// The files of `LocalWrites`, by part: its host (LocalWrites*.swift) and the two folders,
    /// without the ports themselves and the content store's own staging extension.
    static func parts() -> (host: [String], staging: [String], writeBack: [String]) {
        let host = swiftFiles(under: cache).filter { !$0.dropFirst(cache.count + 1).contains("/") }
            .filter { $0.hasPrefix(cache + "/LocalWrites") }
        let notPorts = { (file: String) in
            !file.hasSuffix("Ports.swift") && !file.hasSuffix("ContentStore+Staging.swift")
        }
        return (
            host, swiftFiles(under: cache + "/Staging").filter(notPorts),
            swiftFiles(under: cache + "/WriteBack").filter(notPorts)
        )
    }

    @Test("staging and the write-back reach the catalog and the content store only through their ports")
    func throughTheirPorts() throws {
        let (host, staging, writeBack) = Self.parts()
        #expect(host.contains(Self.cache + "/LocalWrites.swift"), "LocalWrites.swift was not found: \(host)")
        #expect(staging.count >= 3 && writeBack.count >= 4, "the folders were not found: \(staging) \(writeBack)")
        let concrete = try Self.uses(
            of: ["Catalog", "ContentStore", "catalog.", "content."], in: host + staging + writeBack)
        #expect(concrete.isEmpty, "use the part's port (D-440):\n\(concrete.joined(separator: "\n"))")
        let crossed =
            try Self.uses(of: ["writeBackCatalog", "writeBackContent"], in: staging)
            + Self.uses(of: ["stagingCatalog", "stagingContent"], in: writeBack)
        #expect(crossed.isEmpty, "a part uses the other part's port (D-440):\n\(crossed.joined(separator: "\n"))")
    }

    @Test("no file of ProviderCache is over 800 lines")
    func filesStaySmall() throws {
        let files = Self.swiftFiles(under: Self.cache)
        #expect(files.count > 20, "ProviderCache's sources were not found")
        var long: [String] = []
        for file in files {
            let text = try String(contentsOfFile: PackageGraphTests.packageRoot + "/" + file, encoding: .utf8)
            let lines = text.split(separator: "\n", omittingEmptySubsequences: false).count - 1
            if lines > Self.lineLimit { long.append("\(file): \(lines) lines") }
        }
        #expect(long.isEmpty, "split by what the code does (issue 25):\n\(long.joined(separator: "\n"))")
    }
}
