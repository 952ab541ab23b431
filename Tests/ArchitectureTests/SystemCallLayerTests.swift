// Syscalls through one layer (issue 25 item 6, D-516): the cache, its staging files and the local
// provider make their file and descriptor calls through SystemSupport's `SystemCalls` (EINTR
// retried, faults injectable in tests), never Glibc's directly. This test reads their Swift files
// and fails on a raw call: a name of the list below called without a receiver and without
// argument labels (their own methods of the same names all take labels).

import Foundation
import Testing

@Suite("Syscalls through one layer")
struct SystemCallLayerTests {
    static let modules = ["Sources/ProviderCache", "Sources/LocalProvider"]

    /// The calls `SystemCalls` wraps, by their Glibc names.
    static let calls: Set<String> = [
        "open", "openat", "close", "read", "write", "pread", "pwrite", "fsync", "fdatasync", "ftruncate", "truncate",
        "fstat", "fstatat", "lstat", "stat", "unlink", "unlinkat", "rename", "renameat", "renameAt2", "link", "linkat",
        "symlink", "symlinkat", "readlink", "readlinkat", "mkdir", "mkdirat", "rmdir", "fchmod", "fchmodat", "chmod",
        "futimens", "utimensat", "fchown", "fchownat", "lchown", "lseek", "access", "mknod", "fileAllocate",
        "copyFileRange",
    ]

    /// The line without its comment and with its string literals emptied.
    static func code(_ line: Substring) -> String {
        var out = ""
        var inString = false
        var escaped = false
        var previous: Character = " "
        for character in line {
            if inString {
                if escaped {
                    escaped = false
                } else if character == "\\" {
                    escaped = true
                } else if character == "\"" {
                    inString = false
                    out.append(character)
                }
                continue
            }
            if character == "/" && previous == "/" {
                out.removeLast()
                break
            }
            if character == "\"" { inString = true }
            out.append(character)
            previous = character
        }
        return out
    }

    /// Whether an argument list (the text after "(") has arguments and none has a label.
    static func unlabeled(_ text: Substring) -> Bool {
        var depth = 0
        var arguments: [String] = [""]
        for character in text {
            if "([{".contains(character) { depth += 1 }
            if ")]}".contains(character) {
                if depth == 0 { break }
                depth -= 1
            }
            if depth == 0 && character == "," {
                arguments.append("")
            } else {
                arguments[arguments.count - 1].append(character)
            }
        }
        let label = /^\s*[A-Za-z_][A-Za-z0-9_]*\s*:[^:]/
        guard arguments.count > 1 || !arguments[0].trimmingCharacters(in: .whitespaces).isEmpty else { return false }
        return !arguments.contains { $0.firstMatch(of: label) != nil }
    }

    /// `path:line: call` for every raw call.
    static func violations() throws -> [String] {
        var found: [String] = []
        let name = /(?:^|[^A-Za-z0-9_.])([A-Za-z][A-Za-z0-9]*)\(/
        for module in modules {
            let root = PackageGraphTests.packageRoot + "/" + module
            guard let files = FileManager.default.enumerator(atPath: root) else { continue }
            for case let file as String in files where file.hasSuffix(".swift") {
                let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
                for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                    let code = Self.code(line)
                    if code.contains("func ") { continue }
                    for match in code.matches(of: name) where calls.contains(String(match.output.1)) {
                        if unlabeled(code[match.range.upperBound...]) {
                            found.append("\(module)/\(file):\(number + 1): \(match.output.1)")
                        }
                    }
                }
            }
        }
        return found
    }

    @Test("the cache and the local provider call the system through SystemCalls")
    func noRawFileCalls() throws {
        #expect(
            FileManager.default.fileExists(
                atPath: PackageGraphTests.packageRoot + "/Sources/SystemSupport/SystemCalls.swift"))
        let violations = try Self.violations()
        #expect(violations.isEmpty, "call SystemCalls instead:\n\(violations.joined(separator: "\n"))")
    }

    @Test("the check finds a raw call, and leaves methods with labels and calls through SystemCalls")
    func theCheckFindsWhatItLooksFor() {
        #expect(unlabeledCall("        guard pwrite(fd, buffer, count, offset) == count else {"))
        #expect(unlabeledCall("defer { close(fd) }"))
        #expect(!unlabeledCall("defer { SystemCalls.close(fd) }"))
        #expect(!unlabeledCall("try await write(staging, bytes, at: 0)"))
        #expect(!unlabeledCall("var info = stat()"))
        #expect(!unlabeledCall("throw error(\"rename(2) failed\")"))
        #expect(!unlabeledCall("// unlink(path) is done later"))
    }

    private func unlabeledCall(_ line: String) -> Bool {
        let code = Self.code(line[...])
        return code.matches(of: /(?:^|[^A-Za-z0-9_.])([A-Za-z][A-Za-z0-9]*)\(/).contains {
            Self.calls.contains(String($0.output.1)) && Self.unlabeled(code[$0.range.upperBound...])
        }
    }
}
