// Access paths contained (issue 25, docs/DECISIONS.md D-505, D-506): the file handles of
// `ProviderFileSystem`, readers and writers, are in one table (HandleTable.swift); no other file of
// VirtualFileSystem keeps a table keyed by handle number but the directory handles'. The access-path
// nodes are in their own table (ScopedNodeTable.swift), which alone holds `ScopedNode`s by number or
// key, and an operation learns what its node is from `resolve` (one `ResolvedNode`), not by looking
// into that table. This test reads the sources.

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

    @Test("access-path nodes are in their own table, reached through resolve")
    func scopedNodeTable() throws {
        let files = WriteHomeTests.swiftFiles(under: Self.module)
        let table = Self.module + "/ScopedNodeTable.swift"
        #expect(files.contains(table), "ScopedNodeTable.swift was not found: \(files)")
        let others = files.filter { $0 != table }
        // Tables of access-path nodes outside their file, or a look into the table but `resolve`'s.
        let resolver = Self.module + "/ProviderFileSystem+Scoped.swift"
        let found =
            try WriteHomeTests.uses(of: ["ScopedNode]", "ScopedKey:", "scopedByKey", "scopedByTokenID"], in: others)
            + WriteHomeTests.uses(of: ["scoped.resolve(", "scopedTarget("], in: others.filter { $0 != resolver })
        #expect(
            found.isEmpty,
            "keep access-path nodes in ScopedNodeTable, resolved once (D-506):\n\(found.joined(separator: "\n"))")
    }
}
