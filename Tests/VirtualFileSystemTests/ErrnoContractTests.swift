// The errno contract (docs/SEMANTICS.md, "Errno contract") as the code must keep it. The table is
// read from the document itself, so the two cannot drift:
// - every row names a FileSystemError.Code here, and that code's errno is the row's;
// - every code has exactly one errno in the "every code" table, and `FileSystemError.errno` agrees;
// - every row that can happen at the file-system level is made to happen (a real stall on the
//   manual clock, a real version change, a real offline provider...), and the errno the call
//   throws is the row's. A mapping swapped in FileSystemError.errno (a stall as EIO, a version
//   change as EIO) fails both the table check and the scenario.

import Foundation
import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// One row of a markdown table in docs/SEMANTICS.md.
struct SemanticsRow: CustomStringConvertible {
    var cells: [String]
    var description: String { "| " + cells.joined(separator: " | ") + " |" }
}

enum SemanticsDocument {
    static let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("docs/SEMANTICS.md").path

    /// The body rows of the first table after the line `heading` (header and separator skipped).
    static func table(after heading: String) throws -> [SemanticsRow] {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let start = lines.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces) == heading }) else {
            throw TableError("no line '\(heading)' in \(path)")
        }
        guard let first = lines[start...].firstIndex(where: { $0.hasPrefix("|") }) else {
            throw TableError("no table after '\(heading)'")
        }
        var rows: [SemanticsRow] = []
        for line in lines[first...] {
            guard line.hasPrefix("|") else { break }
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).dropFirst().dropLast()
                .map { $0.trimmingCharacters(in: .whitespaces) }
            rows.append(SemanticsRow(cells: cells))
        }
        // Header, then the |---| separator.
        guard rows.count >= 2, rows[1].cells.allSatisfy({ $0.allSatisfy { "-: ".contains($0) } }) else {
            throw TableError("the table after '\(heading)' has no header")
        }
        return Array(rows.dropFirst(2))
    }

    struct TableError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }
}

/// How each situation of the errno table shows in the code, and whether this file makes it happen.
struct ErrnoSituation: Sendable {
    /// A phrase that picks the row out of the table's "situation" column.
    var key: String
    var code: FileSystemError.Code
    /// The file-system-level scenario that produces it; nil with a reason when it cannot happen
    /// at this level (yet).
    var scenario: Scenario?
    var elsewhere: String?

    typealias Scenario = @Sendable () async throws -> FileSystemError?
}

@Suite("Errno contract", .timeLimit(.minutes(3)))
struct ErrnoContractTests {
    static let heading = "### Errno contract"

    /// Every row of the table, by a phrase of its situation.
    static let situations: [ErrnoSituation] = [
        ErrnoSituation(key: "download failure", code: .downloadFailed, scenario: downloadFails),
        ErrnoSituation(key: "delivers nothing for `stallTimeout`", code: .timedOut, scenario: stall),
        ErrnoSituation(key: "checksummed fetch do not match", code: .downloadFailed, scenario: corrupt),
        ErrnoSituation(key: "provider unreachable", code: .providerUnreachable, scenario: offline),
        ErrnoSituation(key: "content version changed", code: .stale, scenario: versionChange),
        ErrnoSituation(key: "token expired", code: .accessDenied, scenario: accessDenied),
        ErrnoSituation(key: "in require-token mode", code: .accessDenied, scenario: plainPathRefused),
        ErrnoSituation(key: "materialization refused", code: .materializationRefused, scenario: downloadRefused),
        ErrnoSituation(
            key: "through passthrough", code: .busy, scenario: nil,
            elsewhere: "the adapter's decision: OpenTwinTests, PassthroughMountTests"),
        ErrnoSituation(
            key: "metadata call (item, listing, name lookup) that does not answer", code: .timedOut, scenario: nil,
            elsewhere: "a hung metadata call on a manual clock: StalledMetadataCallTests (ProviderCacheTests)"),
        ErrnoSituation(key: "any write, create", code: .readOnlyFileSystem, scenario: readOnly),
        ErrnoSituation(key: "deleted on the provider, at lookup", code: .notFound, scenario: deletedAtOpen),
        ErrnoSituation(
            key: "deleted on the provider, read of missing bytes", code: .downloadFailed,
            scenario: deletedUnderAHandle),
        ErrnoSituation(key: "read claim not granted", code: .coordinationFailed, scenario: claimRefused),
        ErrnoSituation(key: "name longer than 255", code: .nameTooLong, scenario: nameTooLong),
        ErrnoSituation(key: "interrupted while waiting", code: .interrupted, scenario: interrupted),
    ]

    /// The table's rows, each with the one situation that names it.
    static func rows() throws -> [(row: SemanticsRow, situation: ErrnoSituation)] {
        let rows = try SemanticsDocument.table(after: heading)
        var result: [(SemanticsRow, ErrnoSituation)] = []
        for row in rows {
            let matching = situations.filter { row.cells[0].contains($0.key) }
            guard matching.count == 1 else {
                let keys = matching.map(\.key)
                Issue.record(
                    "SEMANTICS row \(row) matches \(matching.count) situations of ErrnoContractTests.situations \(keys): add it there, with its code and a scenario"
                )
                continue
            }
            result.append((row, matching[0]))
        }
        for situation in situations where !rows.contains(where: { $0.cells[0].contains(situation.key) }) {
            Issue.record("no SEMANTICS errno row for '\(situation.key)': the document lost a row the code has")
        }
        return result
    }

    @Test("every row of the errno table names the errno its code maps to")
    func tableRowsMatchTheCode() throws {
        let rows = try Self.rows()
        #expect(rows.count >= 14, "the errno table is incomplete: \(rows.count) rows")
        for (row, situation) in rows {
            #expect(
                situation.scenario != nil || situation.elsewhere != nil, "\(row) has neither a scenario nor a reason")
            let documented = row.cells[1]
            let mapped = FileSystemError(situation.code, "").errno.name
            #expect(mapped == documented, "\(situation.code) maps to \(mapped); SEMANTICS says \(documented): \(row)")
        }
    }

    @Test("FileSystemError.errno: every code has the errno SEMANTICS lists for it")
    func everyCodeHasItsDocumentedErrno() throws {
        let rows = try SemanticsDocument.table(after: "Every code of `FileSystemError` and its errno:")
        var documented: [String: String] = [:]
        for row in rows {
            let code = row.cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`."))
            #expect(documented[code] == nil, "\(code) is listed twice")
            documented[code] = row.cells[1]
        }
        for code in FileSystemError.Code.allCases {
            let name = String(describing: code)
            guard let expected = documented.removeValue(forKey: name) else {
                Issue.record("FileSystemError.Code.\(name) is missing from SEMANTICS' table of codes")
                continue
            }
            #expect(FileSystemError(code, "").errno.name == expected, "\(name): SEMANTICS says \(expected)")
        }
        #expect(documented.isEmpty, "SEMANTICS lists codes that do not exist: \(documented.keys.sorted())")
    }

    /// The situations made to happen here, each its own test case (its own deadline).
    static let scenarioKeys = situations.filter { $0.scenario != nil }.map(\.key)

    @Test("every row that can happen at the file-system level happens, with exactly its errno", arguments: scenarioKeys)
    func rowHappens(key: String) async throws {
        let situation = try #require(Self.situations.first { $0.key == key })
        let scenario = try #require(situation.scenario)
        let rows = try SemanticsDocument.table(after: Self.heading)
        let row = try #require(rows.first { $0.cells[0].contains(key) }, "no SEMANTICS errno row for '\(key)'")
        let expected = row.cells[1]
        // Milliseconds alone; the bound is for a hang, with room for a loaded two-core CI run.
        let thrown = try await withDeadline(.seconds(30), "the scenario for \(row)") { try await scenario() }
        guard let error = thrown else {
            Issue.record("\(row): the operation succeeded; expected \(expected)")
            return
        }
        #expect(error.errno.name == expected, "\(row): \(error) (code \(error.code))")
    }

    // MARK: Scenarios: each makes its situation really happen and returns what the call threw.

    /// Options for scenarios: no read-ahead or background completion, so bytes the test does not
    /// read stay missing.
    static func makeFixture(rangesOnly: Bool = true) throws -> VFSFixture {
        var options = VFSFixture.defaultOptions()
        if rangesOnly {
            options.cache.backgroundCompletion = false
            options.cache.readAheadWindow = 0
        }
        return try VFSFixture(options: options)
    }

    /// Runs `body`, returning the FileSystemError it throws (nil when it does not throw).
    static func failure(_ body: () async throws(FileSystemError) -> Void) async -> FileSystemError? {
        do throws(FileSystemError) {
            try await body()
            return nil
        } catch {
            return error
        }
    }

    static func openFile(_ fileSystem: ProviderFileSystem, _ name: String) async throws -> (InodeNumber, FileHandleID) {
        let entry = try await fileSystem.lookup(parent: .root, name: name, context: .kernel)
        let opened = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        return (entry.inode, opened.handle)
    }

    /// Every fetch fails at byte 50,000 (past the retry budget), and a stream that always ends
    /// early at the same offset: both EIO, and both must be the same answer.
    static let downloadFails: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("failing", .ramp(seed: 1, size: 100_000))
        fixture.provider.putFile("short", .ramp(seed: 2, size: 100_000))
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("failing"), fault: .failAfter(offset: 50_000, errno: EIO)))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("short"), fault: .truncate(offset: 64 << 10)))
        let fileSystem = try fixture.makeFileSystem()
        let (failing, failingHandle) = try await openFile(fileSystem, "failing")
        let failed = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(
                failing, handle: failingHandle, offset: 60_000, count: 1000, context: .kernel)
        }
        let (short, shortHandle) = try await openFile(fileSystem, "short")
        let truncated = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(short, handle: shortHandle, offset: 90_000, count: 1000, context: .kernel)
        }
        #expect(truncated?.errno == failed?.errno, "a truncated stream: \(String(describing: truncated))")
        return failed
    }

    /// Every fetch of a checksummed stream carries flipped bytes (past the retry budget): EIO, and
    /// the bytes are never served.
    static let corrupt: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("bent", .ramp(seed: 9, size: 100_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("bent"), fault: .corrupt(offset: 10_000)))
        let fileSystem = try fixture.makeFileSystem()
        let (inode, handle) = try await openFile(fileSystem, "bent")
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel)
        }
    }

    /// A download that stalls at byte 0: the reader fails at one `stallTimeout` of the manual
    /// clock, which the test moves whenever the download sleeps on it.
    static let stall: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("stuck", .ramp(seed: 3, size: 100_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("stuck"), fault: .stall(offset: 0)))
        let fileSystem = try fixture.makeFileSystem()
        let (inode, handle) = try await openFile(fileSystem, "stuck")
        let done = Locked(false)
        let reader = Task {
            defer { done.withLock { $0 = true } }
            return await failure { () async throws(FileSystemError) in
                _ = try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel)
            }
        }
        // Whenever the download sleeps on a deadline, the clock passes it.
        while !done.value {
            if fixture.clock.sleeperCount > 0 { fixture.clock.advance(by: fixture.options.cache.stallTimeout) }
            try await Task.sleep(for: .milliseconds(1))
        }
        return await reader.value
    }

    /// The provider goes offline before any byte of the file is local. A file read completely
    /// before still reads (its bytes are local).
    static let offline: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("remote", .ramp(seed: 4, size: 100_000))
        fixture.provider.putFile("local", .bytes(Array("local bytes".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        let (local, localHandle) = try await openFile(fileSystem, "local")
        #expect(
            try await fileSystem.read(local, handle: localHandle, offset: 0, count: 100, context: .kernel).bytes
                == Array("local bytes".utf8))
        let (inode, handle) = try await openFile(fileSystem, "remote")
        fixture.faults.add(FaultRule(identifier: .root, fault: .offline))
        let cached = try await fileSystem.read(local, handle: localHandle, offset: 0, count: 100, context: .kernel)
        #expect(cached.bytes == Array("local bytes".utf8), "local bytes read while offline")
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel)
        }
    }

    /// The provider's file changes under an open handle that then needs bytes it does not have;
    /// and a change the provider reports mid-stream (the fault). Both ESTALE, the same answer.
    static let versionChange: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("doc", .ramp(seed: 5, size: 300_000))
        fixture.provider.putFile("moving", .ramp(seed: 6, size: 300_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("moving"), fault: .changeVersion(offset: 64 << 10)))
        let fileSystem = try fixture.makeFileSystem()
        let (moving, movingHandle) = try await openFile(fileSystem, "moving")
        let injected = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(moving, handle: movingHandle, offset: 100_000, count: 10, context: .kernel)
        }
        let (inode, handle) = try await openFile(fileSystem, "doc")
        let head = try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel)
        #expect(head.bytes == fixture.provider.content(of: "doc")!.0.slice(0..<1000))
        fixture.provider.putFile("doc", .ramp(seed: 7, size: 300_000))
        let changed = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(inode, handle: handle, offset: 200_000, count: 1000, context: .kernel)
        }
        #expect(injected?.errno == changed?.errno, "an injected version change: \(String(describing: injected))")
        return changed
    }

    /// The provider refuses the content (an expired token, say).
    static let accessDenied: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("secret", .ramp(seed: 8, size: 10_000))
        let fileSystem = try fixture.makeFileSystem(provider: RefusingProvider(base: fixture.provider))
        let (inode, handle) = try await openFile(fileSystem, "secret")
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(inode, handle: handle, offset: 0, count: 100, context: .kernel)
        }
    }

    /// Require-token mode: a program that is not the owner's providerfs command looks up a
    /// plain name (docs/SEMANTICS.md, "Require-token mode").
    static let plainPathRefused: ErrnoSituation.Scenario = {
        struct Stranger: PlainPathPolicy {
            func decide(_ context: RequestContext) -> PlainPathDecision { .refused(reason: "a stranger") }
        }
        var options = VFSFixture.defaultOptions()
        options.plainPaths = Stranger()
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        }
    }

    static let downloadRefused: ErrnoSituation.Scenario = {
        struct Indexer: DownloadPolicy {
            func refusal(_ context: RequestContext) -> String? { "an indexer is a process that must not download" }
        }
        var options = VFSFixture.defaultOptions()
        options.downloads = Indexer()
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        }
    }

    static let readOnly: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        }
    }

    /// Deleted on the provider after the kernel learned its name: the open fails.
    static let deletedAtOpen: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("gone", .ramp(seed: 9, size: 1000))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "gone", context: .kernel)
        fixture.provider.remove("gone")
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        }
    }

    /// Deleted on the provider while a handle is open and still needs bytes: found by the fetch,
    /// and found first by a listing of its directory (D-280). The same answer either way.
    static let deletedUnderAHandle: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("going", .ramp(seed: 10, size: 300_000))
        fixture.provider.putFile("listed", .ramp(seed: 12, size: 300_000))
        let fileSystem = try fixture.makeFileSystem()
        let (inode, handle) = try await openFile(fileSystem, "going")
        let (listed, listedHandle) = try await openFile(fileSystem, "listed")
        fixture.provider.remove("going")
        fixture.provider.remove("listed")
        let fetched = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(inode, handle: handle, offset: 200_000, count: 10, context: .kernel)
        }
        fixture.clock.advance(by: fixture.options.cache.directoryTTL + .seconds(1))
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", ".."])
        let foundByListing = await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.read(listed, handle: listedHandle, offset: 200_000, count: 10, context: .kernel)
        }
        #expect(
            foundByListing?.errno == fetched?.errno,
            "a deletion found by a listing: \(String(describing: foundByListing))")
        return fetched
    }

    static let claimRefused: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let claims = RecordingClaims()
        claims.refuse()
        let fileSystem = try fixture.makeFileSystem(claims: claims)
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        }
    }

    static let nameTooLong: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        let fileSystem = try fixture.makeFileSystem()
        return await failure { () async throws(FileSystemError) in
            _ = try await fileSystem.lookup(parent: .root, name: String(repeating: "n", count: 256), context: .kernel)
        }
    }

    /// A reader waiting for a download (held at the provider's gate) is cancelled, as the adapter
    /// cancels a request the kernel interrupts.
    static let interrupted: ErrnoSituation.Scenario = {
        let fixture = try makeFixture()
        fixture.provider.putFile("slow", .ramp(seed: 11, size: 100_000))
        let fileSystem = try fixture.makeFileSystem()
        let (inode, handle) = try await openFile(fileSystem, "slow")
        fixture.provider.hold()
        defer { fixture.provider.release() }
        let reader = Task {
            await failure { () async throws(FileSystemError) in
                _ = try await fileSystem.read(inode, handle: handle, offset: 0, count: 1000, context: .kernel)
            }
        }
        while fixture.provider.heldCount < 1 { try await Task.sleep(for: .milliseconds(1)) }
        reader.cancel()
        return await reader.value
    }
}

/// A provider that refuses every fetch as an expired token would.
final class RefusingProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities = []
    init(base: InMemoryProvider) { self.base = base }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        throw ProviderError(.accessDenied, "the token for \(identifier) expired")
    }
}
