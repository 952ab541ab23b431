// Package.swift declares exactly the package modules each target's sources import (docs/ARCHITECTURE.md
// draws that graph): a dependency nothing imports, or an import the manifest does not declare, fails.
// Executable targets a test target depends on are built for it to run, not imported: they are left
// out of the comparison.

import Foundation
import Testing

@Suite("Package.swift")
struct PackageGraphTests {
    /// One target of the manifest: kind, declared dependencies, and where its sources are.
    struct Target {
        var kind: String
        var dependencies: Set<String>
        var path: String
    }

    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    /// The manifest's targets, read from its text (each `.target(name: ...)` up to the next one).
    static func targets() throws -> [String: Target] {
        let manifest = try String(contentsOfFile: packageRoot + "/Package.swift", encoding: .utf8)
        let starts = manifest.matches(of: /\.(target|testTarget|executableTarget|systemLibrary)\(/)
        var targets: [String: Target] = [:]
        for (index, start) in starts.enumerated() {
            let end = index + 1 < starts.count ? starts[index + 1].range.lowerBound : manifest.endIndex
            let text = manifest[start.range.lowerBound..<end]
            guard let name = text.firstMatch(of: /name:\s*"([^"]+)"/)?.1 else { continue }
            var dependencies: Set<String> = []
            if let list = text.firstMatch(of: /dependencies:\s*\[([^\]]*)\]/)?.1 {
                dependencies = Set(list.matches(of: /"([^"]+)"/).map { String($0.1) })
            }
            let kind = String(start.1)
            let path =
                text.firstMatch(of: /path:\s*"([^"]+)"/).map { String($0.1) }
                ?? (kind == "testTarget" ? "Tests/" : "Sources/") + name
            targets[String(name)] = Target(kind: kind, dependencies: dependencies, path: path)
        }
        return targets
    }

    /// The modules imported by the Swift files under `path`.
    static func imports(under path: String) throws -> Set<String> {
        var modules: Set<String> = []
        let root = packageRoot + "/" + path
        guard let files = FileManager.default.enumerator(atPath: root) else { return [] }
        for case let file as String in files where file.hasSuffix(".swift") {
            let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
            for match in text.matches(of: /(?m)^(?:@testable\s+)?(?:public\s+|package\s+|internal\s+)?import\s+(\w+)/) {
                modules.insert(String(match.1))
            }
        }
        return modules
    }

    @Test("every target declares exactly the package modules it imports")
    func declaredIsImported() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "the manifest was not read: \(targets.keys.sorted())")
        #expect(targets["VirtualFileSystem"]?.dependencies.contains("FileCoordination") == false, "D-215")
        for (name, target) in targets where target.kind != "systemLibrary" {
            let imported = try Self.imports(under: target.path).intersection(targets.keys)
            let built = target.dependencies.filter { targets[$0]?.kind == "executableTarget" }
            let declared = target.dependencies.subtracting(built)
            #expect(
                declared == imported,
                """
                \(name): declared but not imported \(declared.subtracting(imported).sorted()), \
                imported but not declared \(imported.subtracting(declared).sorted())
                """)
        }
    }
}
