// The import pipeline and reconcile on local files (no mount): records never point at nothing,
// failures and cancels leave nothing behind, the app's copy outlives its source.

import FileCoordination
import Foundation
import ReadingList
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A data directory and a source directory in one temporary directory, removed with the fixture.
final class LibraryFixture: Sendable {
    let directory: TemporaryDirectory
    let location: LibraryLocation
    let store: RecordStore

    init() throws {
        directory = try TemporaryDirectory(prefix: "reading-list")
        location = LibraryLocation(root: directory.path + "/data")
        try location.prepare()
        store = try RecordStore(path: location.database)
        mkdir(directory.path + "/source", 0o755)
    }

    deinit { directory.remove() }

    func source(_ name: String, _ bytes: [UInt8]) throws -> String {
        try directory.write("source/" + name, bytes)
        return directory.path + "/source/" + name
    }

    func importer(
        access: any DocumentAccess = ScopedDocumentAccess(),
        checkpoint: @escaping @Sendable (ImportCheckpoint) -> Void = { _ in }
    ) -> Importer {
        Importer(location: location, store: store, access: access, checkpoint: checkpoint)
    }

    func names(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
    }

    /// Nothing in staging, and the library holds exactly the available records' files.
    func expectConsistent(sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(names(location.staging).isEmpty, "staging: \(names(location.staging))", sourceLocation: sourceLocation)
        let records = try store.documents()
        #expect(records.allSatisfy { $0.state == .available }, "\(records)", sourceLocation: sourceLocation)
        #expect(
            names(location.library) == records.map { $0.id + ".pdf" }.sorted(), "library vs records",
            sourceLocation: sourceLocation)
    }
}

/// Access that records starts and stops, and can refuse.
final class RecordingAccess: DocumentAccess, Sendable {
    let events = Locked<[String]>([])
    let refuse: Bool
    init(refuse: Bool = false) { self.refuse = refuse }
    func start(_ path: String, category: SourceCategory) throws(ImportFailure) -> AccessSession {
        events.withLock { $0.append("start") }
        if refuse { throw ImportFailure(.access, "refused by the test") }
        return AccessSession(readPath: path, scoped: true, stop: { [events] in events.withLock { $0.append("stop") } })
    }
}

@Suite("reading-list imports", .blockingThreads)
struct ImporterTests {
    @Test("an import: access started and stopped, bytes copied, validated, stored under a UUID, available")
    func importsAFile() async throws {
        let fixture = try LibraryFixture()
        let bytes = TestPDF(pages: 3).bytes()
        let path = try fixture.source("Report 2026.pdf", bytes)
        let access = RecordingAccess()
        let outcome = await fixture.importer(access: access).importDocument(at: path)
        let document = try #require(outcome.document, "\(String(describing: outcome.failure))")
        #expect(access.events.withLock { $0 } == ["start", "stop"])
        #expect(document.state == .available)
        #expect(document.displayName == "Report 2026.pdf")
        #expect(document.pageCount == 3)
        #expect(!document.repaired)
        #expect(document.size == Int64(bytes.count))
        #expect(UUID(uuidString: document.id) != nil)
        #expect(try readFile(fixture.location.documentPath(document.id)) == bytes)
        let stored = try #require(try fixture.store.documents(state: .available).first)
        #expect(stored.id == document.id && stored.sha256 == document.sha256 && stored.size == document.size)
        #expect(abs(stored.importedAt.timeIntervalSince(document.importedAt)) < 0.001)
        #expect(stored.sha256.count == 64)
        #expect(outcome.attempt.result == .imported)
        #expect(outcome.attempt.stages.map(\.stage) == ImportStage.allCases)
        #expect(outcome.attempt.stages.allSatisfy { $0.outcome == .ok })
        #expect(outcome.attempt.fileType == "pdf")
        #expect(outcome.attempt.sourceCategory == .localFile)
        try fixture.expectConsistent()
    }

    @Test("the app's copy outlives its source: moved, then removed, then a new store (a restart)")
    func copyOutlivesSource() async throws {
        let fixture = try LibraryFixture()
        let bytes = TestPDF(pages: 2).bytes()
        let path = try fixture.source("paper.pdf", bytes)
        let document = try #require(await fixture.importer().importDocument(at: path).document)
        #expect(rename(path, fixture.directory.path + "/source/moved.pdf") == 0)
        #expect(unlink(fixture.directory.path + "/source/moved.pdf") == 0)
        let reopened = try RecordStore(path: fixture.location.database)
        _ = try Reconciler.reconcile(location: fixture.location, store: reopened)
        let again = try #require(try reopened.document(document.id))
        #expect(again.state == .available)
        #expect(try readFile(fixture.location.documentPath(again.id)) == bytes)
    }

    @Test("two documents with the same display name are two documents")
    func sameDisplayName() async throws {
        let fixture = try LibraryFixture()
        mkdir(fixture.directory.path + "/source/a", 0o755)
        mkdir(fixture.directory.path + "/source/b", 0o755)
        let first = try fixture.source("a/scan.pdf", TestPDF(pages: 1).bytes())
        let second = try fixture.source("b/scan.pdf", TestPDF(pages: 2).bytes())
        let importer = fixture.importer()
        let one = try #require(await importer.importDocument(at: first).document)
        let two = try #require(await importer.importDocument(at: second).document)
        #expect(one.id != two.id)
        #expect(one.displayName == "scan.pdf" && two.displayName == "scan.pdf")
        #expect(try readFile(fixture.location.documentPath(one.id)) == TestPDF(pages: 1).bytes())
        #expect(try readFile(fixture.location.documentPath(two.id)) == TestPDF(pages: 2).bytes())
        try fixture.expectConsistent()
    }

    @Test("failures name their stage and leave nothing: access refused, a read error, not a PDF, repaired under strict")
    func failuresLeaveNothing() async throws {
        let fixture = try LibraryFixture()
        let good = try fixture.source("good.pdf", TestPDF().bytes())
        let refusing = RecordingAccess(refuse: true)
        let refused = await fixture.importer(access: refusing).importDocument(at: good)
        #expect(refused.failure?.stage == .access)
        #expect(refusing.events.withLock { $0 } == ["start"], "a refused start has nothing to stop")

        let access = RecordingAccess()
        let directory = await fixture.importer(access: access).importDocument(at: fixture.directory.path + "/source")
        #expect(directory.failure?.stage == .read, "\(String(describing: directory.failure))")
        #expect(access.events.withLock { $0 } == ["start", "stop"], "stopped after a read failure too")

        let text = try fixture.source("text.pdf", Array("not a pdf\n".utf8))
        let textAccess = RecordingAccess()
        #expect(await fixture.importer(access: textAccess).importDocument(at: text).failure?.stage == .validate)
        #expect(textAccess.events.withLock { $0 } == ["start", "stop"], "stopped after a validate failure too")
        let empty = try fixture.source("empty.pdf", [])
        let emptyOutcome = await fixture.importer().importDocument(at: empty)
        #expect(emptyOutcome.failure?.stage == .validate)
        #expect(emptyOutcome.attempt.fileType == "empty")

        let repaired = try fixture.source("repaired.pdf", TestPDF(wrongOffsets: true).bytes())
        let strict = await fixture.importer().importDocument(at: repaired, options: ImportOptions(strict: true))
        #expect(strict.failure?.stage == .validate)
        #expect(strict.failure?.message.contains("repaired.pdf") == true, "\(String(describing: strict.failure))")
        #expect(strict.failure?.message.contains(".partial") == false, "no staging path in messages")
        // Without strict: accepted and flagged.
        let flagged = try #require(await fixture.importer().importDocument(at: repaired).document)
        #expect(flagged.repaired && !flagged.warnings.isEmpty)

        #expect(try fixture.store.documents().count == 1)
        try fixture.expectConsistent()
        let attempts = try fixture.store.attempts()
        #expect(attempts.map(\.result) == [.failed, .failed, .failed, .failed, .failed, .imported])
        #expect(attempts.map(\.failedStage) == [.access, .read, .validate, .validate, .validate, nil])
        #expect(attempts.allSatisfy { $0.stages.map(\.stage) == ImportStage.allCases })
    }

    @Test(
        "a cancel at any stage boundary, or with the pending record made, creates no record and leaves no staged file")
    func cancelAtEveryStage() async throws {
        let points: [ImportCheckpoint] = [
            .before(.read), .before(.validate), .before(.store), .pendingRecordCreated, .before(.record),
        ]
        for point in points {
            let fixture = try LibraryFixture()
            let path = try fixture.source("doc.pdf", TestPDF(pages: 2).bytes())
            let cancellation = ImportCancellation()
            let access = RecordingAccess()
            let importer = fixture.importer(access: access) { reached in
                if reached == point { cancellation.cancel() }
            }
            let outcome = await importer.importDocument(at: path, cancellation: cancellation)
            #expect(outcome.failure?.cancelled == true, "cancel at \(point): \(String(describing: outcome.failure))")
            #expect(outcome.attempt.result == .cancelled)
            #expect(access.events.withLock { $0 } == ["start", "stop"])
            #expect(try fixture.store.documents().isEmpty, "cancel at \(point) left a record")
            try fixture.expectConsistent()
        }
    }

    @Test("a cancel during a large copy stops it at the next chunk and leaves nothing")
    func cancelDuringCopy() async throws {
        let fixture = try LibraryFixture()
        let path = try fixture.source("big.pdf", TestPDF(pages: 1, padding: 64 << 20).bytes())
        let cancellation = ImportCancellation()
        let access = RecordingAccess()
        // Cancelled right after the first MiB is staged, with 63 MiB still to read.
        let importer = fixture.importer(access: access) { reached in
            if reached == .copying { cancellation.cancel() }
        }
        let result = await importer.importDocument(at: path, cancellation: cancellation)
        #expect(result.document == nil)
        #expect(result.failure?.cancelled == true, "\(String(describing: result.failure))")
        #expect(result.failure?.stage == .read)
        #expect(result.failure?.message == "cancelled after \(1 << 20) bytes", "\(String(describing: result.failure))")
        #expect(result.attempt.result == .cancelled)
        #expect(result.attempt.stages.first { $0.stage == .copy }?.outcome == .cancelled)
        #expect(access.events.withLock { $0 } == ["start", "stop"])
        #expect(try fixture.store.documents().isEmpty)
        try fixture.expectConsistent()
    }

    @Test("the read claim is released before validate, and the report's file type is the copy's")
    func claimReleasedBeforeValidate() async throws {
        let fixture = try LibraryFixture()
        let path = try fixture.source("doc.pdf", TestPDF(pages: 2).bytes())
        let writerWaited = Locked<String?>(nil)
        let importer = fixture.importer { reached in
            guard reached == .before(.validate) else { return }
            // A writer of the source gets its claim at once: the import no longer reads it.
            let writer = FileCoordinator()
            writer.deadlines = CoordinationDeadlines(claimWait: .seconds(20))
            let started = ContinuousClock.now
            do {
                try writer.coordinate(writingItemAt: URL(fileURLWithPath: path)) { _ in }
                writerWaited.withLock { $0 = "\(ContinuousClock.now - started)" }
            } catch {
                writerWaited.withLock { $0 = "refused: \(error)" }
            }
        }
        let outcome = await importer.importDocument(at: path)
        #expect(outcome.document != nil, "\(String(describing: outcome.failure))")
        let waited = try #require(writerWaited.withLock { $0 })
        #expect(!waited.hasPrefix("refused"), "the writer waited for the import's read claim: \(waited)")
        #expect(outcome.attempt.fileType == "pdf")

        let text = try fixture.source("notes.pdf", Array("plain notes\n".utf8))
        #expect(await fixture.importer().importDocument(at: text).attempt.fileType == "text")
        let directory = await fixture.importer().importDocument(at: fixture.directory.path + "/source")
        #expect(directory.attempt.fileType == "unread", "nothing was copied")
        try fixture.expectConsistent()
    }

    @Test("a source that shrinks during the copy fails validate: the copy is not what the source reported")
    func sizeMismatchFailsValidate() async throws {
        let fixture = try LibraryFixture()
        let whole = TestPDF(pages: 1, padding: 3 << 20).bytes()
        let path = try fixture.source("shrinking.pdf", whole)
        let access = RecordingAccess()
        let importer = fixture.importer(access: access) { reached in
            if reached == .copying { _ = truncate(path, off_t(whole.count / 2)) }
        }
        let outcome = await importer.importDocument(at: path)
        #expect(outcome.failure?.stage == .validate, "\(String(describing: outcome.failure))")
        #expect(
            outcome.failure?.message == "the copy has \(whole.count / 2) bytes but the source reported \(whole.count)",
            "\(String(describing: outcome.failure))")
        #expect(access.events.withLock { $0 } == ["start", "stop"], "access stopped after a validate failure")
        #expect(try fixture.store.documents().isEmpty)
        try fixture.expectConsistent()
    }

    @Test("store and record failures unwind the record and the file, and stop access")
    func storeAndRecordFailuresLeaveNothing() async throws {
        // store: the library is not a directory, so the move fails after the pending record.
        let blocked = try LibraryFixture()
        let path = try blocked.source("doc.pdf", TestPDF().bytes())
        #expect(rmdir(blocked.location.library) == 0)
        try writeFile(blocked.location.library, Array("in the way\n".utf8))
        let pendingSeen = Locked(false)
        let storeAccess = RecordingAccess()
        let store = await blocked.importer(access: storeAccess) { [store = blocked.store] reached in
            if reached == .pendingRecordCreated { pendingSeen.withLock { $0 = (try? store.documents().count) == 1 } }
        }.importDocument(at: path)
        #expect(pendingSeen.withLock { $0 }, "the pending record existed before the move")
        #expect(store.failure?.stage == .store, "\(String(describing: store.failure))")
        #expect(store.failure?.message.contains("cannot move the copy into the library") == true)
        #expect(storeAccess.events.withLock { $0 } == ["start", "stop"])
        #expect(try blocked.store.documents().isEmpty, "the pending record was removed")
        #expect(blocked.names(blocked.location.staging).isEmpty)
        #expect(try readFile(blocked.location.library) == Array("in the way\n".utf8), "nothing else was touched")

        // record: the pending record is gone when it is to become available (another process's
        // reconcile or remove got it): the moved file goes too.
        let fixture = try LibraryFixture()
        let source = try fixture.source("doc.pdf", TestPDF().bytes())
        let recordAccess = RecordingAccess()
        let record = await fixture.importer(access: recordAccess) { [store = fixture.store] reached in
            guard reached == .before(.record), let pending = try? store.documents().first else { return }
            _ = try? store.delete(pending.id)
        }.importDocument(at: source)
        #expect(record.failure?.stage == .record, "\(String(describing: record.failure))")
        #expect(record.failure?.message == "the pending record disappeared")
        #expect(recordAccess.events.withLock { $0 } == ["start", "stop"])
        #expect(fixture.names(fixture.location.library).isEmpty, "the moved file was removed")
        try fixture.expectConsistent()
        #expect(try fixture.store.attempts().map(\.failedStage) == [.record])
    }

    @Test("two imports at once, in one process, each get their own document")
    func concurrentImports() async throws {
        let fixture = try LibraryFixture()
        let paths = try (0..<6).map { try fixture.source("doc\($0).pdf", TestPDF(pages: $0 + 1).bytes()) }
        let importer = fixture.importer()
        let outcomes = await withTaskGroup(of: ImportOutcome.self) { group in
            for path in paths { group.addTask { await importer.importDocument(at: path) } }
            var all: [ImportOutcome] = []
            for await outcome in group { all.append(outcome) }
            return all
        }
        #expect(outcomes.allSatisfy { $0.document != nil }, "\(outcomes.compactMap(\.failure))")
        #expect(Set(outcomes.compactMap { $0.document?.pageCount }) == Set(1...6))
        try fixture.expectConsistent()
    }

    @Test("tokens never reach records, reports or messages")
    func redaction() {
        #expect(
            SourceInspection.redacted("/mnt/.scoped/pfs_abcdefgh_k3j4h5g6f7d8s9a2q3w4e5r6t7y8u9i2/doc.pdf")
                == "/mnt/.scoped/<token>/doc.pdf")
        #expect(
            SourceInspection.redacted("cannot reach /m/.scoped/pfs_x_y: Permission denied")
                == "cannot reach /m/.scoped/<token>: Permission denied")
        #expect(SourceInspection.redacted("/home/me/paper.pdf") == "/home/me/paper.pdf")
    }
}
