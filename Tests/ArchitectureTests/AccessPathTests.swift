// Access paths contained (issue 25, docs/DECISIONS.md D-505): the file handles of
// `ProviderFileSystem`, readers and writers, are in one table (HandleTable.swift); no other file of
// VirtualFileSystem keeps a table keyed by handle number but the directory handles'. This test
// reads the sources.

import Foundation
import Testing

@Suite("Access paths contained")
struct AccessPathTests {
    static let module = "Sources/VirtualFileSystem"

    @Test("file handles, read and write, are in one table")
    func oneHandleTable() throws {
        let files = WriteHomeTests.swiftFiles(under: Self.module)
        #expect(files.contains(Self.module + "/HandleTable.swift"), "HandleTable.swift was not found: \(files)")
        var tables: [String] = []
        for file in files where !file.hasSuffix("/HandleTable.swift") {
            for (number, line) in try WriteHomeTests.codeLines(of: file).enumerated()
            where line.contains("[FileHandleID:") && !line.contains("directories") {
                tables.append("\(file):\(number + 1): \(line.trimmingCharacters(in: .whitespaces))")
            }
        }
        #expect(tables.isEmpty, "keep file handles in HandleTable (D-505):\n\(tables.joined(separator: "\n"))")
    }
}
