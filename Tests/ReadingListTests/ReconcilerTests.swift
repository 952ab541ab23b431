// Reconcile repairs what a crash leaves (a pending record before or after the move, files without
// records, records without files, attempts left running) and leaves running imports alone.

import Foundation
import ReadingList
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("reading-list reconcile", .blockingThreads)
struct ReconcilerTests {
    /// A pending record as an import makes it just before the move, owned by `pid`.
    func pending(_ fixture: LibraryFixture, bytes: [UInt8], pid: Int32?, start: UInt64?) throws -> DocumentRecord {
        let record = DocumentRecord(
            id: UUID().uuidString.lowercased(), displayName: "doc.pdf", state: .pending, size: Int64(bytes.count),
            sha256: hexDigest(bytes), pageCount: 1, repaired: false, warnings: [], encrypted: false,
            sourcePath: "/somewhere/doc.pdf", sourceCategory: .localFile, importedAt: Date(), ownerPID: pid,
            ownerStartTime: start)
        try fixture.store.insert(record)
        return record
    }

    /// A pid that is not running (a child that has exited and been reaped).
    func deadPID() throws -> Int32 {
        let child = try ChildProcess("/bin/true", [])
        _ = child.wait(timeout: .seconds(30))
        return child.pid
    }

    @Test("kill -9 after the record, before the move: the record and the staged file go")
    func crashBeforeMove() throws {
        let fixture = try LibraryFixture()
        let bytes = TestPDF().bytes()
        let record = try pending(fixture, bytes: bytes, pid: try deadPID(), start: 1)
        try writeFile(fixture.location.staging + "/abandoned.partial", bytes)
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.removedRecords == [record.id])
        #expect(report.removedFiles == ["staging/abandoned.partial"])
        try fixture.expectConsistent()
    }

    @Test("kill -9 after the move, before the record was made available: it becomes available")
    func crashAfterMove() throws {
        let fixture = try LibraryFixture()
        let bytes = TestPDF(pages: 2).bytes()
        let record = try pending(fixture, bytes: bytes, pid: try deadPID(), start: 1)
        try writeFile(fixture.location.documentPath(record.id), bytes)
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.madeAvailable == [record.id])
        #expect(try fixture.store.document(record.id)?.state == .available)
        try fixture.expectConsistent()
    }

    @Test("killed after the move: report names the document list shows, or none when it was removed")
    func crashAfterMoveReportAgreesWithList() async throws {
        for keepsFile in [true, false] {
            let fixture = try LibraryFixture()
            let path = try fixture.source("one.pdf", TestPDF(pages: 2).bytes())
            // What a kill -9 just before "available" leaves: the records as saved at that point.
            let atRecord = Locked<(attempt: ImportAttempt?, document: DocumentRecord?)>((nil, nil))
            let importer = fixture.importer { [store = fixture.store] point in
                guard point == .before(.record) else { return }
                let saved = (try? store.attempts().first, try? store.documents().first)
                atRecord.withLock { $0 = (saved.0 ?? nil, saved.1 ?? nil) }
            }
            _ = await importer.importDocument(at: path)
            let (running, pendingDocument) = atRecord.withLock { $0 }
            var attempt = try #require(running)
            let document = try #require(pendingDocument)
            #expect(attempt.result == .running && attempt.documentID == document.id)
            // Put the library back as it was at the kill, its owner gone.
            let dead = try deadPID()
            attempt.ownerPID = dead
            var pendingAgain = document
            pendingAgain.ownerPID = dead
            _ = try fixture.store.delete(document.id)
            try fixture.store.insert(pendingAgain)
            try fixture.store.save(attempt)
            if !keepsFile { unlink(fixture.location.documentPath(document.id)) }

            let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
            #expect(report.interruptedAttempts == [attempt.id])
            let after = try #require(try fixture.store.attempts().first { $0.id == attempt.id })
            #expect(after.result == .interrupted)
            let listed = try fixture.store.documents().filter { $0.state == .available }.map(\.id)
            if keepsFile {
                #expect(listed == [document.id])
                #expect(after.documentID == document.id, "report and list name the same document")
            } else {
                #expect(listed.isEmpty)
                #expect(after.documentID == nil, "the attempt names no document that is gone")
            }
            try fixture.expectConsistent()
        }
    }

    @Test("a moved file that is not the validated one (other bytes) is not made available")
    func wrongFileAfterMove() throws {
        let fixture = try LibraryFixture()
        let record = try pending(fixture, bytes: TestPDF().bytes(), pid: try deadPID(), start: 1)
        try writeFile(fixture.location.documentPath(record.id), TestPDF(pages: 3).bytes())
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.removedRecords == [record.id])
        try fixture.expectConsistent()
        #expect(fixture.names(fixture.location.library).isEmpty)
    }

    @Test("files without records and available records without files are removed")
    func orphans() throws {
        let fixture = try LibraryFixture()
        try writeFile(fixture.location.library + "/stray.pdf", TestPDF().bytes())
        var gone = try pending(fixture, bytes: TestPDF().bytes(), pid: nil, start: nil)
        try fixture.store.markAvailable(gone.id)
        gone.state = .available
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.removedFiles == ["library/stray.pdf"])
        #expect(report.removedMissing == [gone.id])
        try fixture.expectConsistent()
        // Nothing more to do the second time.
        #expect(try !Reconciler.reconcile(location: fixture.location, store: fixture.store).changedSomething)
    }

    @Test("a running import elsewhere is left alone: its locked staging file and its live pending record")
    func leavesRunningImportsAlone() throws {
        let fixture = try LibraryFixture()
        let me = getpid()
        let record = try pending(fixture, bytes: TestPDF().bytes(), pid: me, start: ProcessInfoFiles.startTime(of: me))
        let staging = fixture.location.staging + "/busy.partial"
        try writeFile(staging, [1, 2, 3])
        let descriptor = open(staging, O_RDONLY)
        defer { close(descriptor) }
        #expect(flock(descriptor, LOCK_EX) == 0)
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.inProgress == 2)
        #expect(!report.changedSomething)
        #expect(try fixture.store.document(record.id)?.state == .pending)
        #expect(fixture.names(fixture.location.staging) == ["busy.partial"])
        // The same pid with another start time is a reused pid: not alive.
        let reused = try pending(fixture, bytes: TestPDF().bytes(), pid: me, start: 1)
        #expect(
            try Reconciler.reconcile(location: fixture.location, store: fixture.store).removedRecords == [reused.id])
    }

    @Test("a live import between its move and available, among available documents: nothing changes, counted once")
    func liveImportAfterItsMoveAmongAvailableDocuments() throws {
        let fixture = try LibraryFixture()
        let me = getpid()
        var kept: [String] = []
        for _ in 0..<3 {
            let bytes = TestPDF().bytes()
            let record = try pending(fixture, bytes: bytes, pid: nil, start: nil)
            try fixture.store.markAvailable(record.id)
            try writeFile(fixture.location.documentPath(record.id), bytes)
            kept.append(record.id)
        }
        let bytes = TestPDF(pages: 2).bytes()
        let moving = try pending(fixture, bytes: bytes, pid: me, start: ProcessInfoFiles.startTime(of: me))
        try writeFile(fixture.location.documentPath(moving.id), bytes)
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(!report.changedSomething)
        #expect(report.inProgress == 1, "its record and its file are one import")
        #expect(try fixture.store.document(moving.id)?.state == .pending)
        #expect(try fixture.store.documents(state: .available).map(\.id).sorted() == kept.sorted())
        #expect(fixture.names(fixture.location.library).count == 4)
    }

    @Test("an attempt left running by a process that is gone is marked interrupted")
    func interruptedAttempts() throws {
        let fixture = try LibraryFixture()
        let attempt = ImportAttempt(
            id: "a1", startedAt: Date(), sourcePath: "/x.pdf", sourceCategory: .mountPath, fileType: "pdf",
            result: .running, failedStage: nil, error: nil, documentID: nil, stages: [],
            versions: Versions(system: "s", provider: "p", app: "a"), ownerPID: try deadPID(), ownerStartTime: 1)
        try fixture.store.save(attempt)
        let report = try Reconciler.reconcile(location: fixture.location, store: fixture.store)
        #expect(report.interruptedAttempts == ["a1"])
        #expect(try fixture.store.attempts().first?.result == .interrupted)
    }

    /// An import saves its attempt four times; a save of a known attempt updates its row in place
    /// (one page of the WAL, not three: D-533), and the start of its first save stays.
    @Test("an attempt saved again is updated and keeps the start of its first save")
    func attemptSavedAgain() throws {
        let fixture = try LibraryFixture()
        let started = Date(timeIntervalSince1970: 1_000_000)
        var attempt = ImportAttempt(
            id: "a1", startedAt: started, sourcePath: "/x.pdf", sourceCategory: .mountPath, fileType: "unread",
            result: .running, failedStage: nil, error: nil, documentID: nil, stages: [],
            versions: Versions(system: "s", provider: "p", app: "a"), ownerPID: 7, ownerStartTime: 1)
        try fixture.store.save(attempt)
        attempt.startedAt = started.addingTimeInterval(60)
        attempt.fileType = "pdf"
        attempt.result = .imported
        attempt.documentID = "d1"
        attempt.ownerPID = nil
        attempt.ownerStartTime = nil
        try fixture.store.save(attempt, keepingAttempts: 500)
        let saved = try fixture.store.attempts()
        #expect(saved.count == 1)
        #expect(saved.first?.startedAt == started)
        #expect(saved.first?.fileType == "pdf" && saved.first?.result == .imported)
        #expect(saved.first?.documentID == "d1" && saved.first?.ownerPID == nil)
        #expect(try fixture.store.runningAttempts().isEmpty)
    }
}

func hexDigest(_ bytes: [UInt8]) -> String {
    // The importer hashes with CryptoSupport's SHA256; the test uses sha256sum to check it independently.
    let directory = try! TemporaryDirectory(prefix: "digest")
    defer { directory.remove() }
    try! directory.write("f", bytes)
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
    process.arguments = [directory.path + "/f"]
    let pipe = Pipe()
    process.standardOutput = pipe
    try! process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return String(String(decoding: data, as: UTF8.self).prefix(64))
}
