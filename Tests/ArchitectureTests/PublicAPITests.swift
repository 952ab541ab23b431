import Foundation
import Testing

/// The public API of FileCoordination is listed in docs/COORDINATION.md ("Public API"), and the
/// list is the truth: the symbol graph of the built module, at minimum access level public, must
/// name exactly the symbols the list names. A symbol made public without being documented (or
/// documented after it stopped being public) fails here.
@Suite struct PublicAPITests {
    @Test func theDocumentedPublicAPIIsTheModulesPublicAPI() throws {
        let documented = try Self.documentedSymbols()
        let actual = try Self.publicSymbols()
        #expect(!actual.isEmpty)
        let undocumented = actual.subtracting(documented).sorted()
        let notPublic = documented.subtracting(actual).sorted()
        #expect(
            undocumented.isEmpty,
            "public in FileCoordination but not listed under \"Public API\" in docs/COORDINATION.md: \(undocumented)")
        #expect(
            notPublic.isEmpty,
            "listed under \"Public API\" in docs/COORDINATION.md but not public in FileCoordination: \(notPublic)")
    }

    /// The root of the package (this file is Tests/ArchitectureTests/PublicAPITests.swift).
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The first code span of every list item in the "## Public API" section of
    /// docs/COORDINATION.md, e.g. "- `FileCoordinator.cancel()`: …".
    static func documentedSymbols() throws -> Set<String> {
        let text = try String(
            contentsOf: packageRoot.appendingPathComponent("docs/COORDINATION.md"), encoding: .utf8)
        var inSection = false
        var symbols = Set<String>()
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("## ") {
                inSection = line == "## Public API"
                continue
            }
            guard inSection, line.hasPrefix("- `") else { continue }
            let rest = line.dropFirst(3)
            guard let end = rest.firstIndex(of: "`") else { continue }
            symbols.insert(String(rest[..<end]))
        }
        try #require(!symbols.isEmpty, "docs/COORDINATION.md has no \"## Public API\" list")
        return symbols
    }

    /// The public symbols of the built FileCoordination module, as dotted paths
    /// ("FileCoordinator.cancel()"), from swift-symbolgraph-extract (members the compiler
    /// synthesizes from protocol extensions, such as OptionSet's `union`, are left out).
    static func publicSymbols() throws -> Set<String> {
        // The test executable lives in the build directory, beside Modules/.
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let buildDirectory = executable.deletingLastPathComponent()
        let modules = buildDirectory.appendingPathComponent("Modules")
        try #require(
            FileManager.default.fileExists(atPath: modules.appendingPathComponent("FileCoordination.swiftmodule").path),
            "no FileCoordination.swiftmodule in \(modules.path)")
        let triple = buildDirectory.deletingLastPathComponent().lastPathComponent
        let extractor = try #require(
            Self.findInPath("swift-symbolgraph-extract"), "swift-symbolgraph-extract is not on PATH")
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("fc-api-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: output) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: extractor)
        let target = triple.contains("-linux") ? triple : "x86_64-unknown-linux-gnu"
        process.arguments = [
            "-module-name", "FileCoordination", "-target", target,
            "-I", modules.path, "-minimum-access-level", "public", "-skip-synthesized-members", "-output-dir",
            output.path,
        ]
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        let message = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(
            process.terminationStatus == 0,
            "swift-symbolgraph-extract failed: \(String(decoding: message, as: UTF8.self))")
        let data = try Data(contentsOf: output.appendingPathComponent("FileCoordination.symbols.json"))
        struct Graph: Decodable {
            struct Symbol: Decodable { var pathComponents: [String] }
            var symbols: [Symbol]
        }
        let graph = try JSONDecoder().decode(Graph.self, from: data)
        return Set(graph.symbols.map { $0.pathComponents.joined(separator: ".") })
    }

    static func findInPath(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in path.split(separator: ":") {
            let candidate = String(directory) + "/" + name
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }
}
