// One lock type (DESIGN §3, docs/DECISIONS.md D-003): SystemSupport's `Lock` / `Locked`, a pthread
// mutex that ThreadSanitizer models. `Synchronization.Mutex` (a PI futex TSan does not see) and
// Foundation's lock classes would make a second kind, and a TSan run that says nothing about them.
// `Atomic` stays allowed: it is not a lock, and signal handlers need it. This test reads every
// Swift file of the package and fails on any other lock.

import Foundation
import Testing

@Suite("One lock type")
struct LockTypeTests {
    /// Spellings of a lock other than `Lock` / `Locked`, each matched where no identifier character
    /// comes before it.
    static let forbidden: [(spelling: String, name: String)] = [
        ("NSLock(", "NSLock"), ("NSLock ", "NSLock"), ("NSRecursiveLock", "NSRecursiveLock"),
        ("NSConditionLock", "NSConditionLock"), ("Mutex<", "Synchronization.Mutex"),
        ("Mutex(", "Synchronization.Mutex"), ("os_unfair_lock", "os_unfair_lock"),
        ("pthread_mutex_lock", "a raw pthread mutex"), ("pthread_rwlock_", "a raw pthread rwlock"),
    ]

    /// Files allowed to use what the others must not, and why.
    static let exempt: [String: String] = [
        "Sources/SystemSupport/Lock.swift": "the lock itself",
        "Sources/SystemSupport/BlockingIOPool.swift":
            "its workers sleep on a pthread condition variable, which needs its own mutex",
        "Tests/ArchitectureTests/LockTypeTests.swift": "this test names what it forbids",
    ]

    /// Whether `line` uses `spelling` as a name of its own (not the tail of a longer identifier).
    static func uses(_ spelling: String, in line: Substring) -> Bool {
        var rest = line[...]
        while let range = rest.range(of: spelling) {
            let before = range.lowerBound == line.startIndex ? nil : line[line.index(before: range.lowerBound)]
            if before.map({ !($0.isLetter || $0.isNumber || $0 == "_") }) ?? true { return true }
            rest = rest[range.upperBound...]
        }
        return false
    }

    /// `path: line: what`, for every use of a lock other than SystemSupport's.
    static func violations() throws -> [String] {
        var found: [String] = []
        for directory in ["Sources", "Tests", "Benchmarks"] {
            let root = PackageGraphTests.packageRoot + "/" + directory
            guard let files = FileManager.default.enumerator(atPath: root) else { continue }
            for case let file as String in files where file.hasSuffix(".swift") {
                let relative = directory + "/" + file
                if exempt[relative] != nil { continue }
                let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
                for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                    let code = line.split(separator: "//", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
                    for (spelling, name) in forbidden where uses(spelling, in: code) {
                        found.append("\(relative):\(number + 1): \(name)")
                    }
                }
            }
        }
        return found
    }

    @Test("no Swift file uses a lock other than SystemSupport's Lock / Locked")
    func oneLockType() throws {
        let lockFile = PackageGraphTests.packageRoot + "/Sources/SystemSupport/Lock.swift"
        #expect(FileManager.default.fileExists(atPath: lockFile), "the package was not found at \(lockFile)")
        let violations = try Self.violations()
        #expect(
            violations.isEmpty, "use SystemSupport's Lock or Locked instead:\n\(violations.joined(separator: "\n"))")
    }
}
