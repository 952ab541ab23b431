// The demo provider's source tree, created on first use of `providerfs mount --demo`: nested
// folders, small text files, real (generated) PDFs, a 1 GiB sparse-friendly file that makes lazy
// download visible, and one item whose download always fails halfway (a fault rule, not a
// broken file). Nothing binary is kept in git: everything is generated here.

import Foundation
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

enum DemoSource {
    /// Bump when the tree changes; an older demo source is then regenerated.
    static let version = "1"
    /// The item that fails halfway, by its identifier (its path inside the source).
    static let failingItem = "Unreliable/fails-halfway.bin"
    static let failingSize = 8 << 20

    /// Creates the demo tree at `path` unless a current one is there.
    static func ensure(at path: String) throws {
        let marker = path + ".version"
        if readTextFile(marker) == version + "\n", access(path, F_OK) == 0 { return }
        let staging = path + ".partial"
        removeTree(staging)
        try makeDirectories(staging, mode: 0o755)
        try populate(staging)
        removeTree(path)
        guard rename(staging, path) == 0 else { throw SystemCallError("rename \(staging)") }
        try Data((version + "\n").utf8).write(to: URL(fileURLWithPath: marker))
    }

    /// The faults the demo provider runs with: the failing item fails at 50% on every download.
    static func faults() -> FaultPlan {
        FaultPlan([
            FaultRule(
                identifier: ItemIdentifier(failingItem), fault: .failAfter(offset: Int64(failingSize / 2), errno: EIO))
        ])
    }

    static func populate(_ root: String) throws {
        func file(_ relative: String, _ text: String) throws {
            try write(root + "/" + relative, Array(text.utf8))
        }
        for directory in [
            "Documents/Projects/2026", "Documents/PDFs", "Photos", "Media", "Unreliable",
        ] {
            try makeDirectories(root + "/" + directory)
        }
        try file(
            "README.txt",
            """
            Welcome to the ProviderFS demo provider.

            Everything here is a placeholder until you read it: `ls -l` shows real sizes, `du` shows
            nothing stored. Reading downloads only what is read, then the rest in the background.

              getfattr -d <file>                state, progress, version, last error
              providerfs status <file>          the same, readable
              providerfs download <file>        materialize with a progress bar
              cat Media/large-1GiB.bin | head -c 100      first bytes of 1 GiB, at once
              cat Unreliable/fails-halfway.bin  fails with "Input/output error" at 50%

            """)
        try file(
            "Documents/notes.txt",
            "Notes\n=====\n\n- ProviderFS mounts a provider with FUSE.\n- Items are placeholders.\n")
        try file(
            "Documents/todo.md", "# To do\n\n- [x] mount the demo\n- [ ] read a PDF\n- [ ] download the big file\n")
        try file("Documents/Projects/2026/plan.txt", "Plan for 2026: read lazily, cache durably, coordinate always.\n")
        try file("Photos/Summer trip – café.txt", "A name with spaces, a dash and an accent.\n")
        try file("Photos/日本語のメモ.txt", "Unicode names work too.\n")
        try write(
            root + "/Documents/PDFs/welcome.pdf", pdf(title: "Welcome to ProviderFS", lines: ["A real PDF, generated."])
        )
        try write(
            root + "/Documents/PDFs/report-2026.pdf",
            pdf(title: "Quarterly report", lines: (1...30).map { "Line \($0): placeholders until opened." }))
        try write(
            root + "/Documents/PDFs/manual.pdf",
            pdf(title: "ProviderFS manual", lines: ["mount", "status", "download", "unmount"]))
        for index in 1...20 {
            try file(
                "Documents/Projects/2026/item-\(index).txt",
                "Item \(index)\n" + String(repeating: "text ", count: index * 50) + "\n")
        }

        // 1 GiB, mostly a hole: a marker every 128 MiB, so reads at any offset show something.
        let large = root + "/Media/large-1GiB.bin"
        let fd = open(large, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SystemCallError("open \(large)") }
        defer { close(fd) }
        guard ftruncate(fd, 1 << 30) == 0 else { throw SystemCallError("ftruncate \(large)") }
        for block in 0..<8 {
            let text = Array("ProviderFS demo: this is byte \(block << 27) of a 1 GiB file.\n".utf8)
            guard text.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, off_t(block << 27)) }) == text.count
            else {
                throw SystemCallError("pwrite \(large)")
            }
        }

        guard let random = FileHandle(forReadingAtPath: "/dev/urandom") else {
            throw SystemCallError("open /dev/urandom")
        }
        defer { try? random.close() }
        try write(root + "/" + failingItem, Array(random.readData(ofLength: failingSize)))
    }

    static func write(_ path: String, _ bytes: [UInt8]) throws {
        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else {
            throw SystemCallError("create \(path)", .current)
        }
    }

    /// A one-page PDF with a title and lines of text (Helvetica), with a correct xref table.
    static func pdf(title: String, lines: [String]) -> [UInt8] {
        func escaped(_ text: String) -> String {
            text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "(", with: "\\(")
                .replacingOccurrences(of: ")", with: "\\)")
        }
        var content = "BT /F1 24 Tf 72 720 Td (\(escaped(title))) Tj ET\n"
        for (index, line) in lines.enumerated() {
            content += "BT /F1 11 Tf 72 \(690 - index * 14) Td (\(escaped(line))) Tj ET\n"
        }
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>",
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
            "<< /Length \(content.utf8.count) >>\nstream\n\(content)endstream",
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            "<< /Title (\(escaped(title))) /Producer (ProviderFS demo) >>",
        ]
        var output = "%PDF-1.4\n"
        var offsets: [Int] = []
        for (index, object) in objects.enumerated() {
            offsets.append(output.utf8.count)
            output += "\(index + 1) 0 obj\n\(object)\nendobj\n"
        }
        let xref = output.utf8.count
        output += "xref\n0 \(objects.count + 1)\n0000000000 65535 f \n"
        for offset in offsets {
            let digits = String(offset)
            output += String(repeating: "0", count: 10 - digits.count) + digits + " 00000 n \n"
        }
        output += "trailer\n<< /Size \(objects.count + 1) /Root 1 0 R /Info 6 0 R >>\nstartxref\n\(xref)\n%%EOF\n"
        return Array(output.utf8)
    }

    /// `rm -rf` of a directory we created (never follows symbolic links).
    static func removeTree(_ path: String) {
        _ = try? FileManager.default.removeItem(atPath: path)
    }
}
