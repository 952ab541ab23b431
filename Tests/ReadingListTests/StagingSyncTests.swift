// The staged copy's durability, through the importer's `StagingSync` seam (`Importer.init(sync:)`).
// The seam records, at each sync, where the descriptor's file is at that moment (/proc/self/fd:
// under `staging/` until the store stage renames it into `library/`), its inode and its size. So
// a sync that is dropped, or that comes after the rename, shows: the library file's inode has no
// sync, or its sync named the library path.

import Foundation
import ReadingList
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One call of the sync seam: where the file was (the descriptor's path then), its inode, its size.
struct StagingSyncCall: Sendable, Equatable {
    var path: String
    var inode: UInt64
    var size: Int64
}

@Suite("reading-list: the staged copy is synced before its move into the library", .blockingThreads)
struct StagingSyncTests {
    @Test("the library file was synced once, whole, under its staging name (before the rename)")
    func syncedBeforeTheMove() async throws {
        let fixture = try LibraryFixture()
        let bytes = TestPDF(pages: 2).bytes()
        let path = try fixture.source("synced.pdf", bytes)
        let syncs = Locked<[StagingSyncCall]>([])
        let importer = Importer(
            location: fixture.location, store: fixture.store,
            sync: { descriptor in
                var info = stat()
                guard fstat(descriptor, &info) == 0 else { return Errno.current }
                let path =
                    (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(descriptor)")) ?? "?"
                if let error = stagingDataSync(descriptor) { return error }
                syncs.withLock {
                    $0.append(StagingSyncCall(path: path, inode: UInt64(info.st_ino), size: Int64(info.st_size)))
                }
                return nil
            })
        let outcome = await importer.importDocument(at: path)
        let document = try #require(outcome.document, "\(String(describing: outcome.failure))")
        var info = stat()
        let stored = fixture.location.documentPath(document.id)
        try #require(stat(stored, &info) == 0, "\(stored): \(Errno.current.message)")
        let ofDocument = syncs.value.filter { $0.inode == UInt64(info.st_ino) }
        #expect(ofDocument.count == 1, "the syncs of the library file: \(syncs.value)")
        let staging = URL(fileURLWithPath: fixture.location.staging).resolvingSymlinksInPath().path + "/"
        #expect(
            ofDocument.allSatisfy { $0.path.hasPrefix(staging) && $0.size == Int64(bytes.count) },
            "synced under \(ofDocument.map(\.path)), expected under \(staging)")
        #expect(try readFile(stored) == bytes)
        try fixture.expectConsistent()
    }

    @Test("a sync that fails fails the read stage and leaves nothing: no record, no library file, nothing staged")
    func failedSyncLeavesNothing() async throws {
        let fixture = try LibraryFixture()
        let path = try fixture.source("unsynced.pdf", TestPDF(pages: 1).bytes())
        let importer = Importer(location: fixture.location, store: fixture.store, sync: { _ in .ioError })
        let outcome = await importer.importDocument(at: path)
        #expect(outcome.document == nil)
        #expect(outcome.failure?.stage == .read)
        #expect(outcome.failure?.message.contains("syncing the staging copy failed") == true)
        #expect(outcome.attempt.result == .failed)
        #expect(try fixture.store.documents().isEmpty)
        try fixture.expectConsistent()
    }
}
