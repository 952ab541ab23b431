// The harnesses that judge the write path (issue 14), judged themselves: TestSupport's differential
// tester and fsx-style random I/O checker must find nothing between two plain temporary
// directories (many seeds), and must find a subject that is wrong on purpose (one errno flipped,
// one byte of a read changed, a file planted, a byte or a size changed behind the checker's back).
// Here rather than in a target of their own: these are unit tests of TestSupport, and this target
// already depends on it.
//
// Replay: PROVIDERFS_DIFF_SEED=<seed> PROVIDERFS_DIFF_SEQUENCES=1 PROVIDERFS_DIFF_STEPS=<n>
//         swift test --filter DifferentialHarnessTests
//         (PROVIDERFS_FSX_SEED / PROVIDERFS_FSX_RUNS / PROVIDERFS_FSX_OPERATIONS for the checker)

import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Passes every operation to `base`, and lets a test change a result.
final class TamperingRunner: FileOperationRunner {
    let base: DirectoryRunner
    var results: [(FileOperation, StepResult)] = []
    let tamper: (Int, FileOperation, StepResult) -> StepResult

    init(root: String, tamper: @escaping (Int, FileOperation, StepResult) -> StepResult = { $2 }) {
        base = DirectoryRunner(root: root)
        self.tamper = tamper
    }

    var root: String { base.root }
    func closeAll() { base.closeAll() }

    func perform(_ operation: FileOperation) -> StepResult {
        let result = tamper(results.count, operation, base.perform(operation))
        results.append((operation, result))
        return result
    }
}

// Seconds of synchronous file I/O per test: off the cooperative pool, which the control server's
// request tasks (ControlServerTests) and every awaiting test need (two threads on CI).
@Suite("Differential tester and random I/O checker on plain directories", .blockingThreads)
struct DifferentialHarnessTests {
    /// Two fresh temporary directories, removed after `body`.
    func withTwoRoots<T>(_ body: (String, String) throws -> T) throws -> T {
        let scratch = try TemporaryDirectory(prefix: "differential")
        defer { scratch.remove() }
        mkdir(scratch.path + "/reference", 0o755)
        mkdir(scratch.path + "/subject", 0o755)
        return try body(scratch.path + "/reference", scratch.path + "/subject")
    }

    @Test("two temporary directories agree on every step and tree, for many seeds, and the sequences reach the edges")
    func temporaryDirectoriesAgree() throws {
        let baseSeed = SeededRandom.seedFromEnvironment("PROVIDERFS_DIFF_SEED")
        let sequences = environmentInteger("PROVIDERFS_DIFF_SEQUENCES", default: 20)
        let steps = environmentInteger("PROVIDERFS_DIFF_STEPS", default: 250)
        var errnos: Set<Int32> = []
        var kinds: Set<String> = []
        var nonEmptyReads = 0
        var renamed = 0
        var linkTargets = 0
        for index in 0..<sequences {
            let seed = baseSeed &+ UInt64(index)
            let report = try withTwoRoots { reference, subject in
                let recorder = TamperingRunner(root: subject)
                let report = DifferentialTester.run(
                    seed: seed, steps: steps, reference: DirectoryRunner(root: reference), subject: recorder)
                for (operation, result) in recorder.results {
                    switch result {
                    case .failed(let code): errnos.insert(code)
                    case .bytes(let bytes) where !bytes.isEmpty: nonEmptyReads += 1
                    case .status(let status): kinds.insert(status.kind.rawValue)
                    case .target: linkTargets += 1
                    case .done: if case .rename = operation { renamed += 1 }
                    default: break
                    }
                }
                return report
            }
            #expect(report.passed, "\(report)")
            if !report.passed { break }
        }
        // The sequences are not all ENOENT: they collide, go through files and past NAME_MAX.
        if sequences >= 10 && steps >= 200 {
            for code in [ENOENT, EEXIST, ENOTDIR, EISDIR, ENAMETOOLONG, ENOTEMPTY, EINVAL, EBADF] {
                #expect(errnos.contains(code), "no step failed with \(Errno(code).name) (base seed \(baseSeed))")
            }
            #expect(kinds.isSuperset(of: ["regular", "directory", "symbolicLink"]), "\(kinds)")
            #expect(nonEmptyReads > 50, "only \(nonEmptyReads) reads returned bytes")
            #expect(renamed > 10, "only \(renamed) renames succeeded")
            // Successful readlinks over 20 × 250 random steps: median 28, 14 the least of 150
            // random base seeds, and once 10 in CI; a threshold in the tail made the suite flaky.
            #expect(linkTargets >= 5, "only \(linkTargets) readlinks succeeded")
        }
    }

    @Test("a sequence depends on its seed only; excluded kinds never appear")
    func sequencesAreReproducible() {
        let first = FileOperationGenerator.sequence(seed: 42, count: 500)
        #expect(first == FileOperationGenerator.sequence(seed: 42, count: 500))
        #expect(first != FileOperationGenerator.sequence(seed: 43, count: 500))
        #expect(Array(first.prefix(100)) == FileOperationGenerator.sequence(seed: 42, count: 100))
        #expect(first.contains { $0.kind == .link })
        let without = FileOperationGenerator.sequence(seed: 42, count: 500, excluding: [.link, .symlink])
        #expect(!without.contains { $0.kind == .link || $0.kind == .symlink })
    }

    @Test("one errno flipped on the subject is the reported divergence, with seed, both results and replay")
    func aFlippedErrnoIsCaught() throws {
        var flippedAt: Int?
        let report = try withTwoRoots { reference, subject in
            let subjectRunner = TamperingRunner(root: subject) { index, _, result in
                guard flippedAt == nil, result == .failed(ENOENT) else { return result }
                flippedAt = index
                return .failed(EIO)
            }
            return DifferentialTester.run(
                seed: 7, steps: 300, reference: DirectoryRunner(root: reference), subject: subjectRunner)
        }
        let step = try #require(flippedAt)
        let divergence = try #require(report.divergence, "\(report)")
        #expect(divergence.step == step)
        #expect(divergence.reference == .failed(ENOENT))
        #expect(divergence.subject == .failed(EIO))
        #expect(report.operations.count == step + 1)
        let text = report.description
        #expect(text.contains("seed 7"))
        #expect(text.contains("-1 ENOENT") && text.contains("-1 EIO"))
        #expect(text.contains("PROVIDERFS_DIFF_SEED=7"))
        #expect(text.contains("#\(step) \(divergence.operation)"))
    }

    @Test("the same flip declared as a known deviation passes, and its uses are counted in the report")
    func aKnownDeviationIsCountedNeverSilent() throws {
        let reason = "test: this subject says EIO for ENOENT"
        let report = try withTwoRoots { reference, subject in
            let subjectRunner = TamperingRunner(root: subject) { _, _, result in
                result == .failed(ENOENT) ? .failed(EIO) : result
            }
            return DifferentialTester.run(
                seed: 7, steps: 300, reference: DirectoryRunner(root: reference), subject: subjectRunner,
                deviations: [
                    .errno(ENOENT, becomes: EIO, for: Set(FileOperation.Kind.allCases), reason: reason),
                    .excluding([.link], reason: "test: no hard links"),
                ])
        }
        #expect(report.passed, "\(report)")
        #expect(!report.operations.contains { $0.kind == .link })
        let used = try #require(report.deviationsUsed.first { $0.reason == reason })
        #expect(used.steps > 0)
        #expect(report.description.contains("known deviation used \(used.steps)×: \(reason)"))
    }

    @Test("one byte changed in a read is caught, with the first differing offset")
    func aChangedByteIsCaught() throws {
        var changedAt: Int?
        let report = try withTwoRoots { reference, subject in
            let subjectRunner = TamperingRunner(root: subject) { index, _, result in
                guard changedAt == nil, case .bytes(var bytes) = result, bytes.count > 10 else { return result }
                changedAt = index
                bytes[10] ^= 0x40
                return .bytes(bytes)
            }
            return DifferentialTester.run(
                seed: 11, steps: 400, reference: DirectoryRunner(root: reference), subject: subjectRunner)
        }
        let step = try #require(changedAt)
        let divergence = try #require(report.divergence, "\(report)")
        #expect(divergence.step == step)
        #expect(divergence.description.contains("bytes differ first at offset 10"), "\(divergence)")
    }

    @Test("a subject whose renamed file comes out as a copy (a new st_ino) is caught at that rename")
    func aChangedIdentityIsCaught() throws {
        var copiedAt: Int?
        let report = try withTwoRoots { reference, subject in
            let subjectRunner = TamperingRunner(root: subject) { index, operation, result in
                // The renamed file replaced by a copy of itself: same bytes and mode, new inode.
                guard copiedAt == nil, case .rename(_, let to, .plain) = operation, result == .done else {
                    return result
                }
                let path = subject + "/" + to
                var info = stat()
                guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG,
                    let bytes = try? readFile(path)
                else { return result }
                try? writeFile(path + ".copy", bytes)
                chmod(path + ".copy", info.st_mode & 0o7777)
                rename(path + ".copy", path)
                copiedAt = index
                return result
            }
            return DifferentialTester.run(
                seed: 7, steps: 400, reference: DirectoryRunner(root: reference), subject: subjectRunner)
        }
        let step = try #require(copiedAt, "the sequence renamed no file")
        let difference = try #require(report.identityDifference, "\(report)")
        #expect(difference.step == step)
        #expect(difference.problem.contains("st_ino"), "\(difference.problem)")
        #expect(!report.passed && report.description.contains("identity differs after step #\(step)"))
    }

    @Test("a file planted in the subject is found by a listing or by the final tree comparison")
    func aPlantedFileIsCaught() throws {
        for seed: UInt64 in [3, 5] {
            let report = try withTwoRoots { reference, subject in
                try writeFile(subject + "/planted", Array("extra".utf8))
                return DifferentialTester.run(
                    seed: seed, steps: 60, reference: DirectoryRunner(root: reference),
                    subject: DirectoryRunner(root: subject))
            }
            #expect(!report.passed)
            #expect(report.description.contains("planted"), "\(report)")
        }
        // With no steps at all, only the tree comparison can see it.
        let report = try withTwoRoots { reference, subject in
            try writeFile(subject + "/a/planted", Array("extra".utf8))
            return DifferentialTester.run(
                seed: 1, steps: 0, reference: DirectoryRunner(root: reference), subject: DirectoryRunner(root: subject))
        }
        #expect(report.divergence == nil)
        #expect(report.treeDifferences == ["a: unexpected directory", "a/planted: unexpected regular"])
    }

    @Test("tree snapshots compare kinds, bytes, link targets and modes")
    func treeDifferences() throws {
        try withTwoRoots { reference, subject in
            for root in [reference, subject] {
                try writeFile(root + "/d/file", Array("same".utf8))
                symlink("d/file", root + "/link")
            }
            try writeFile(subject + "/d/file", Array("samE".utf8))
            unlink(subject + "/link")
            symlink("elsewhere", subject + "/link")
            chmod(subject + "/d", 0o700)
            let lines = FileTreeSnapshot.capture(subject).differences(from: FileTreeSnapshot.capture(reference))
            #expect(lines.count == 3, "\(lines)")
            #expect(lines.contains { $0.hasPrefix("d: mode 0700") })
            #expect(lines.contains { $0.hasPrefix("d/file: bytes differ first at offset 3") })
            #expect(lines.contains("link: target elsewhere, expected d/file"))
            let withoutModes = FileTreeSnapshot.capture(subject).differences(
                from: FileTreeSnapshot.capture(reference), comparePermissions: false)
            #expect(withoutModes.count == 2)
        }
    }

    // MARK: Random I/O checker

    @Test("the random I/O checker finds nothing wrong with a file in a temporary directory, for many seeds")
    func randomIOAgreesOnATemporaryFile() throws {
        let baseSeed = SeededRandom.seedFromEnvironment("PROVIDERFS_FSX_SEED")
        let runs = environmentInteger("PROVIDERFS_FSX_RUNS", default: 4)
        let operations = environmentInteger("PROVIDERFS_FSX_OPERATIONS", default: 1000)
        let scratch = try TemporaryDirectory(prefix: "fsx")
        defer { scratch.remove() }
        var counts: [String: Int] = [:]
        for index in 0..<runs {
            let path = scratch.path + "/file-\(index)"
            let report = RandomIOChecker.run(
                path: path, seed: baseSeed &+ UInt64(index),
                options: RandomIOOptions(operations: operations, maximumFileSize: 2 << 20))
            #expect(report.passed, "\(report)")
            if !report.passed { break }
            #expect(byteDifference(try readFile(path), report.expectedContents) == nil)
            counts.merge(report.counts, uniquingKeysWith: +)
        }
        if runs * operations >= 2000 {
            for name in [
                "write", "write past the end (hole)", "read", "truncate down", "truncate up", "fsync", "reopen",
                "mapped read", "whole-file read",
            ] {
                #expect(counts[name, default: 0] > 5, "\(name): \(counts)")
            }
        }
    }

    @Test("a byte changed behind the checker's back is found; the report names seed, operation and history")
    func randomIOFindsAChangedByte() throws {
        let scratch = try TemporaryDirectory(prefix: "fsx")
        defer { scratch.remove() }
        let path = scratch.path + "/file"
        // One byte in the middle flipped every 50 operations from #100 on (a single flip may be
        // overwritten or truncated away before anything reads it).
        var tamperedAt: Int?
        let report = RandomIOChecker.run(
            path: path, seed: 99, options: RandomIOOptions(operations: 2000, maximumFileSize: 1 << 20)
        ) { index in
            guard index >= 100, index % 50 == 0 else { return }
            var info = stat()
            guard stat(path, &info) == 0, info.st_size > 0 else { return }
            let other = open(path, O_RDWR)
            defer { close(other) }
            var byte: UInt8 = 0
            let offset = off_t(info.st_size / 2)
            guard pread(other, &byte, 1, offset) == 1 else { return }
            byte ^= 0xFF
            guard pwrite(other, &byte, 1, offset) == 1 else { return }
            if tamperedAt == nil { tamperedAt = index }
        }
        let first = try #require(tamperedAt)
        #expect(!report.passed)
        #expect(report.operationsRun > first + 1)
        let text = report.description
        #expect(text.contains("seed 99"), "\(text)")
        #expect(text.contains("last operations:"))
        #expect(text.contains("PROVIDERFS_FSX_SEED=99"))
        #expect(report.history.count == 24)
    }

    @Test("a size changed behind the checker's back is found by the fstat check")
    func randomIOFindsAChangedSize() throws {
        let scratch = try TemporaryDirectory(prefix: "fsx")
        defer { scratch.remove() }
        let path = scratch.path + "/file"
        let report = RandomIOChecker.run(
            path: path, seed: 5, options: RandomIOOptions(operations: 500, maximumFileSize: 1 << 20)
        ) { index in
            if index == 50 { truncate(path, 3 << 20) }
        }
        #expect(!report.passed)
        #expect(report.operationsRun > 51, "\(report)")
        #expect(report.failure.map { $0.contains("3145728") || $0.contains("expected") } == true, "\(report)")
    }
}
