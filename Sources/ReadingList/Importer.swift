// The import, the careful way (docs/READING-LIST.md): access, a coordinated read into a staging
// file, validation with libqpdf, a pending record, the move into the library, the record made
// available. Every stage is timed and recorded; every failure names its stage and leaves nothing
// behind: no staged file, no record, no library file.

import CryptoSupport
import FileCoordination
import Foundation
import PDFValidation
public import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// How to import.
public struct ImportOptions: Sendable, Equatable {
    /// The password of an encrypted PDF.
    public var password: String?
    /// Refuse PDFs qpdf had to repair.
    public var strict: Bool

    public init(password: String? = nil, strict: Bool = false) {
        self.password = password
        self.strict = strict
    }
}

/// Cancels imports in progress: the copy stops at its next chunk, a claim still waited for is
/// cancelled, and the import unwinds with a `cancelled` failure. Thread-safe.
public final class ImportCancellation: Sendable {
    private let state = Locked<(cancelled: Bool, handlers: [UInt64: @Sendable () -> Void], next: UInt64)>(
        (false, [:], 0))

    public init() {}

    public var isCancelled: Bool { state.withLock { $0.cancelled } }

    public func cancel() {
        let handlers = state.withLock { state -> [@Sendable () -> Void] in
            guard !state.cancelled else { return [] }
            state.cancelled = true
            defer { state.handlers = [:] }
            return Array(state.handlers.values)
        }
        for handler in handlers { handler() }
    }

    /// Runs `handler` on cancel (at once if already cancelled) until the returned key is removed.
    func onCancel(_ handler: @escaping @Sendable () -> Void) -> UInt64? {
        let key = state.withLock { state -> UInt64? in
            guard !state.cancelled else { return nil }
            state.next += 1
            state.handlers[state.next] = handler
            return state.next
        }
        if key == nil { handler() }
        return key
    }

    func remove(_ key: UInt64?) {
        guard let key else { return }
        state.withLock { _ = $0.handlers.removeValue(forKey: key) }
    }
}

/// Points in an import where tests can stop it.
public enum ImportCheckpoint: Sendable, Equatable {
    /// Before a stage starts (read, validate, store, record).
    case before(ImportStage)
    /// The pending record exists; the staged file is not moved yet.
    case pendingRecordCreated
    /// The copy's first chunk (1 MiB, or the whole of a smaller file) is staged; the claim and
    /// the source are still held, the rest is still to be read.
    case copying

    /// "read", "validate", "store", "record", "pending-record", or "copy".
    public init?(name: String) {
        if name == "pending-record" {
            self = .pendingRecordCreated
        } else if name == "copy" {
            self = .copying
        } else if name != "access", let stage = ImportStage(rawValue: name) {
            self = .before(stage)
        } else {
            return nil
        }
    }
}

/// The result of one import.
public struct ImportOutcome: Sendable {
    public var attempt: ImportAttempt
    /// The new document, when imported.
    public var document: DocumentRecord?
    /// Why not, otherwise.
    public var failure: ImportFailure?
}

/// How the staged copy's bytes are made durable before the move into the library: given the
/// staging file's descriptor, nil when they are, else the error. `stagingDataSync` (fdatasync) in
/// production; tests inject one to record the sync point (which file, under which name) or to
/// fail it (`Importer.init(sync:)`). Called on the importing thread, inside the coordinated read.
public typealias StagingSync = @Sendable (_ descriptor: Int32) -> Errno?

/// fdatasync, retried on EINTR.
public let stagingDataSync: StagingSync = { descriptor in
    retryingOnInterrupt({ fdatasync(descriptor) }) == 0 ? nil : Errno.current
}

/// Imports documents into a library. One per process is enough; imports may run concurrently,
/// in this process and in others.
public final class Importer: Sendable {
    public let location: LibraryLocation
    public let store: RecordStore
    let access: any DocumentAccess
    /// Syncs the staged copy before it is moved into the library (a test seam).
    let sync: StagingSync
    /// Test seam: called at each checkpoint (the kill -9 and cancel tests stop an import there).
    let checkpoint: @Sendable (ImportCheckpoint) -> Void

    public init(
        location: LibraryLocation, store: RecordStore, access: any DocumentAccess = ScopedDocumentAccess(),
        sync: @escaping StagingSync = stagingDataSync,
        checkpoint: @escaping @Sendable (ImportCheckpoint) -> Void = { _ in }
    ) {
        self.location = location
        self.store = store
        self.access = access
        self.sync = sync
        self.checkpoint = checkpoint
    }

    /// Imports the file at `path`. Runs off the caller's thread; suspends until done.
    public func importDocument(
        at path: String, options: ImportOptions = ImportOptions(),
        cancellation: ImportCancellation = ImportCancellation()
    ) async -> ImportOutcome {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(returning: self.importNow(path, options: options, cancellation: cancellation))
            }
        }
    }

    /// The import on the calling thread (which it blocks).
    public func importNow(_ path: String, options: ImportOptions, cancellation: ImportCancellation) -> ImportOutcome {
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        let inspection = SourceInspection.inspect(absolute)
        let me = getpid()
        var attempt = ImportAttempt(
            id: UUID().uuidString.lowercased(), startedAt: Date(), sourcePath: SourceInspection.redacted(absolute),
            sourceCategory: inspection.category, fileType: inspection.fileType, result: .running, failedStage: nil,
            error: nil, documentID: nil, stages: [], versions: inspection.versions, ownerPID: me,
            ownerStartTime: ProcessInfoFiles.startTime(of: me))
        try? store.save(attempt)
        var run = ImportRun(importer: self, path: absolute, options: options, cancellation: cancellation)
        // Saved again once the copy is staged and once it is stored, so that an import killed
        // later still reports its file type and the stages it finished.
        run.progress = { [store, attempt] run in
            var progress = attempt
            progress.fileType = run.copiedFileType()
            // Once stored, the document it made: an import killed before its record is
            // available is finished by reconcile, and the report names the document `list`
            // shows.
            progress.documentID = run.pendingID
            progress.stages = run.stages.map { stage in
                var stage = stage
                stage.detail = stage.detail.map(SourceInspection.redacted)
                return stage
            }
            try? store.save(progress)
        }
        let document: DocumentRecord?
        var failure: ImportFailure?
        do throws(ImportFailure) {
            document = try run.perform(category: inspection.category)
        } catch {
            document = nil
            failure = error
        }
        if var redacted = failure {
            redacted.message = SourceInspection.redacted(redacted.message)
            failure = redacted
        }
        attempt.fileType = run.copiedFileType()
        run.cleanUp(succeeded: failure == nil)
        attempt.stages = run.stages.map { stage in
            var stage = stage
            stage.detail = stage.detail.map(SourceInspection.redacted)
            return stage
        }
        attempt.ownerPID = nil
        attempt.ownerStartTime = nil
        if let failure {
            attempt.result = failure.cancelled ? .cancelled : .failed
            attempt.failedStage = failure.stage
            attempt.error = failure.message
            // The stages not reached, so that the report always has all six.
            for stage in ImportStage.allCases where !attempt.stages.contains(where: { $0.stage == stage }) {
                attempt.stages.append(StageResult(stage: stage, outcome: .skipped, milliseconds: 0))
            }
            attempt.stages.sort { $0.stage.order < $1.stage.order }
        } else {
            attempt.result = .imported
            attempt.documentID = document?.id
        }
        try? store.save(attempt, keepingAttempts: 500)
        return ImportOutcome(attempt: attempt, document: document, failure: failure)
    }
}

extension ImportStage {
    var order: Int { ImportStage.allCases.firstIndex(of: self) ?? 0 }
}

/// One import's state, so that cleanup knows what exists.
struct ImportRun {
    let importer: Importer
    let path: String
    let options: ImportOptions
    let cancellation: ImportCancellation
    var stages: [StageResult] = []
    /// The staging file and its descriptor (locked while the import runs).
    var stagingPath: String?
    var stagingDescriptor: Int32 = -1
    /// The pending record made, and whether its file was moved into the library.
    var pendingID: String?
    var moved = false
    var session: AccessSession?
    /// Called after the read and after the store stage succeed (the attempt is saved with them).
    var progress: (ImportRun) -> Void = { _ in }

    init(importer: Importer, path: String, options: ImportOptions, cancellation: ImportCancellation) {
        self.importer = importer
        self.path = path
        self.options = options
        self.cancellation = cancellation
    }

    var location: LibraryLocation { importer.location }

    mutating func perform(category: SourceCategory) throws(ImportFailure) -> DocumentRecord {
        let importer = self.importer
        let path = self.path
        let options = self.options
        // access
        let session = try timed(.access) { () throws(ImportFailure) -> (AccessSession, String?) in
            let session = try importer.access.start(path, category: category)
            return (session, session.scoped ? "scoped access started" : "no scope to start (\(category.rawValue))")
        }
        self.session = session
        try stop(at: .read)

        // read (and copy, inside it)
        let copied = try readIntoStaging(session.readPath)
        progress(self)
        try stop(at: .validate)

        // validate
        let staged = stagingPath!
        let validation = try timed(.validate) { () throws(ImportFailure) -> (PDFValidation, String?) in
            guard copied.size > 0 else { throw ImportFailure(.validate, "the file is empty (0 bytes)") }
            guard copied.size == copied.reportedSize else {
                throw ImportFailure(
                    .validate, "the copy has \(copied.size) bytes but the source reported \(copied.reportedSize)")
            }
            do throws(PDFValidationError) {
                let result = try PDFValidator.validate(
                    path: staged,
                    options: PDFValidationOptions(
                        password: options.password, strict: options.strict, displayName: Self.displayName(path)))
                let flag = result.repaired ? ", repaired (\(result.warnings.count) warnings)" : ""
                return (result, "\(result.pageCount) pages, PDF \(result.pdfVersion)\(flag)")
            } catch {
                throw ImportFailure(.validate, error.description)
            }
        }
        try stop(at: .store)

        // store: a pending record first, then the file into the library under a UUID.
        let id = UUID().uuidString.lowercased()
        let me = getpid()
        let record = DocumentRecord(
            id: id, displayName: Self.displayName(path), state: .pending, size: copied.size, sha256: copied.sha256,
            pageCount: validation.pageCount, repaired: validation.repaired, warnings: validation.warnings,
            encrypted: validation.encrypted, sourcePath: SourceInspection.redacted(path), sourceCategory: category,
            importedAt: Date(),
            ownerPID: me, ownerStartTime: ProcessInfoFiles.startTime(of: me))
        let (stored, storeRow) = Self.measure(.store) { () throws(ImportFailure) -> (Void, String?) in
            do throws(ReadingListError) {
                try importer.store.insert(record)
            } catch {
                throw ImportFailure(.store, error.message)
            }
            pendingID = id
            importer.checkpoint(.pendingRecordCreated)
            let destination = location.documentPath(id)
            guard rename(stagingPath!, destination) == 0 else {
                throw ImportFailure(.store, "cannot move the copy into the library: \(Errno.current.message)")
            }
            moved = true
            stagingPath = nil
            guard Self.syncDirectory(location.library) else {
                throw ImportFailure(.store, "cannot make the move durable: \(Errno.current.message)")
            }
            return ((), "\(id).pdf")
        }
        stages.append(storeRow)
        try stored.get()
        progress(self)
        try stop(at: .record)

        // record
        try timed(.record) { () throws(ImportFailure) -> (Void, String?) in
            let found: Bool
            do throws(ReadingListError) {
                found = try importer.store.markAvailable(id)
            } catch {
                throw ImportFailure(.record, error.message)
            }
            guard found else { throw ImportFailure(.record, "the pending record disappeared") }
            return ((), "available")
        }
        var available = record
        available.state = .available
        available.ownerPID = nil
        available.ownerStartTime = nil
        return available
    }

    /// The file type of what was copied, from the copy's first bytes (never from the source,
    /// which is only opened inside the coordinated read, with access started): "unread" when no
    /// byte was copied by a read that failed or was cancelled.
    func copiedFileType() -> String {
        let copy = stagingPath ?? (moved ? pendingID.map(location.documentPath) : nil)
        guard let copy else { return "unread" }
        let readFailed = stages.contains { $0.stage == .read && $0.outcome != .ok }
        var info = stat()
        if readFailed && (stat(copy, &info) != 0 || info.st_size == 0) { return "unread" }
        return SourceInspection.fileType(copy)
    }

    /// Unwinds what a failed import made (in the order that never leaves a record pointing at
    /// nothing for longer than a crash would), closes the staging file and stops access.
    mutating func cleanUp(succeeded: Bool) {
        if !succeeded {
            if let pendingID {
                _ = try? importer.store.delete(pendingID)
                if moved { unlink(location.documentPath(pendingID)) }
            }
            if let stagingPath { unlink(stagingPath) }
        }
        if stagingDescriptor >= 0 {
            close(stagingDescriptor)
            stagingDescriptor = -1
        }
        if let session {
            let started = ContinuousClock.now
            session.stop()
            if let index = stages.firstIndex(where: { $0.stage == .access }) {
                stages[index].milliseconds += Self.milliseconds(ContinuousClock.now - started)
            }
            self.session = nil
        }
    }

    /// Throws a `cancelled` failure at `stage` if the import was cancelled; runs the checkpoint.
    mutating func stop(at stage: ImportStage) throws(ImportFailure) {
        importer.checkpoint(.before(stage))
        if cancellation.isCancelled {
            stages.append(StageResult(stage: stage, outcome: .cancelled, milliseconds: 0, detail: "cancelled"))
            throw ImportFailure(stage, "cancelled", cancelled: true)
        }
    }

    struct Copied {
        var size: Int64
        var reportedSize: Int64
        var sha256: String
    }

    /// The coordinated read: the claim (and, in a mount, the download of what is missing), then
    /// the copy into a new, locked staging file, synced before the claim is released.
    mutating func readIntoStaging(_ source: String) throws(ImportFailure) -> Copied {
        // Locked until the import ends: reconcile in another process leaves a locked file alone.
        // One that met the file between its creation and the lock removed it (it unlinks only
        // while it holds the lock): the file is made again under a new name.
        var made: (path: String, descriptor: Int32)?
        for _ in 0..<8 where made == nil {
            let path = location.staging + "/" + UUID().uuidString.lowercased() + ".partial"
            let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else {
                let message = Errno.current.message
                stages.append(StageResult(stage: .read, outcome: .failed, milliseconds: 0, detail: message))
                throw ImportFailure(.read, "cannot create the staging file: \(message)")
            }
            _ = flock(descriptor, LOCK_EX)
            var opened = stat()
            var named = stat()
            if fstat(descriptor, &opened) == 0, stat(path, &named) == 0, opened.st_ino == named.st_ino {
                made = (path, descriptor)
            } else {
                close(descriptor)
            }
        }
        guard let (stagingPath, descriptor) = made else {
            let message = "its staging file was removed by another process as it was made, 8 times"
            stages.append(StageResult(stage: .read, outcome: .failed, milliseconds: 0, detail: message))
            throw ImportFailure(.read, "cannot create the staging file: \(message)")
        }
        self.stagingPath = stagingPath
        stagingDescriptor = descriptor

        let coordinator = FileCoordinator()
        // A cancel also interrupts this thread's blocked open or read of the source: the
        // coordinator's download of it, or the copy (a stalled download in a mount).
        let interruption = CopyInterruption()
        defer { interruption.finish() }
        let key = cancellation.onCancel {
            coordinator.cancel()
            interruption.interrupt()
        }
        defer { cancellation.remove(key) }
        let started = ContinuousClock.now
        let copyTime = Locked<Duration>(.zero)
        let cancellation = self.cancellation
        let importer = self.importer
        let result: Result<Copied, ImportFailure>
        do {
            result = try coordinator.coordinate(readingItemAt: URL(fileURLWithPath: source)) { url in
                let copyStart = ContinuousClock.now
                defer { copyTime.withLock { $0 = ContinuousClock.now - copyStart } }
                return Self.copy(from: url.path, to: descriptor, cancellation: cancellation, sync: importer.sync) {
                    importer.checkpoint(.copying)
                }
            }
        } catch let error as CoordinationError {
            let cancelled = error.code == .cancelled
            let elapsed = Self.milliseconds(ContinuousClock.now - started)
            stages.append(
                StageResult(
                    stage: .read, outcome: cancelled ? .cancelled : .failed, milliseconds: elapsed,
                    detail: error.message))
            stages.append(StageResult(stage: .copy, outcome: .skipped, milliseconds: 0))
            throw ImportFailure(.read, "the coordinated read failed: \(error.message)", cancelled: cancelled)
        } catch {
            stages.append(StageResult(stage: .read, outcome: .failed, milliseconds: 0, detail: "\(error)"))
            throw ImportFailure(.read, "the coordinated read failed: \(error)")
        }
        let total = Self.milliseconds(ContinuousClock.now - started)
        let copyMilliseconds = Self.milliseconds(copyTime.withLock { $0 })
        switch result {
        case .success(let copied):
            stages.append(
                StageResult(
                    stage: .read, outcome: .ok, milliseconds: total,
                    detail: "claim and download \(Self.format(total - copyMilliseconds)) ms"))
            stages.append(
                StageResult(stage: .copy, outcome: .ok, milliseconds: copyMilliseconds, detail: "\(copied.size) bytes"))
            return copied
        case .failure(let failure):
            stages.append(
                StageResult(stage: .read, outcome: failure.cancelled ? .cancelled : .failed, milliseconds: total))
            stages.append(
                StageResult(
                    stage: .copy, outcome: failure.cancelled ? .cancelled : .failed, milliseconds: copyMilliseconds,
                    detail: failure.message))
            throw failure
        }
    }

    /// Copies `source` to `descriptor` (1 MiB at a time, checking for cancellation between
    /// chunks), hashing as it goes, then syncs it (`sync`: fdatasync). Failures are `read` failures.
    static func copy(
        from source: String, to descriptor: Int32, cancellation: ImportCancellation,
        sync: StagingSync = stagingDataSync,
        firstChunkStaged: () -> Void = {}
    ) -> Result<
        Copied, ImportFailure
    > {
        /// `call`, retried on EINTR unless the import was cancelled (then nil).
        func uncancelled<T: BinaryInteger>(_ call: () -> T) -> T? {
            while true {
                let result = call()
                guard result == -1 && errno == EINTR else { return result }
                if cancellation.isCancelled { return nil }
            }
        }
        guard let input = uncancelled({ open(source, O_RDONLY | O_CLOEXEC) }) else {
            return .failure(ImportFailure(.read, "cancelled while opening the source", cancelled: true))
        }
        guard input >= 0 else {
            return .failure(ImportFailure(.read, "cannot open the source: \(Errno.current.message)"))
        }
        defer { close(input) }
        var info = stat()
        guard fstat(input, &info) == 0 else {
            return .failure(ImportFailure(.read, "cannot stat the source: \(Errno.current.message)"))
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            return .failure(ImportFailure(.read, "the source is not a regular file"))
        }
        let reported = Int64(info.st_size)
        let capacity = 1 << 20
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 4096)
        defer { buffer.deallocate() }
        var hasher = SHA256()
        var total: Int64 = 0
        while true {
            if cancellation.isCancelled {
                return .failure(ImportFailure(.read, "cancelled after \(total) bytes", cancelled: true))
            }
            guard let count = uncancelled({ read(input, buffer, capacity) }) else {
                return .failure(ImportFailure(.read, "cancelled after \(total) bytes", cancelled: true))
            }
            if count == 0 { break }
            if count < 0 {
                let error = Errno.current
                let why = error.rawValue == EACCES ? " (access ended)" : ""
                return .failure(
                    ImportFailure(.read, "reading the source failed after \(total) bytes: \(error.message)\(why)"))
            }
            hasher.update(UnsafeRawBufferPointer(start: buffer, count: count))
            var written = 0
            while written < count {
                let result = retryingOnInterrupt { write(descriptor, buffer + written, count - written) }
                if result < 0 {
                    return .failure(ImportFailure(.read, "writing the staging copy failed: \(Errno.current.message)"))
                }
                written += result
            }
            if total == 0 { firstChunkStaged() }
            total += Int64(count)
        }
        if let error = sync(descriptor) {
            return .failure(ImportFailure(.read, "syncing the staging copy failed: \(error.message)"))
        }
        return .success(Copied(size: total, reportedSize: reported, sha256: hexString(hasher.finalize())))
    }

    /// Runs one stage, returning its result and its row (outcome and duration).
    static func measure<T>(
        _ stage: ImportStage, _ body: () throws(ImportFailure) -> (T, String?)
    ) -> (Result<T, ImportFailure>, StageResult) {
        let started = ContinuousClock.now
        do {
            let (value, detail) = try body()
            let elapsed = milliseconds(ContinuousClock.now - started)
            return (.success(value), StageResult(stage: stage, outcome: .ok, milliseconds: elapsed, detail: detail))
        } catch {
            let elapsed = milliseconds(ContinuousClock.now - started)
            let outcome: StageResult.Outcome = error.cancelled ? .cancelled : .failed
            return (
                .failure(error),
                StageResult(stage: stage, outcome: outcome, milliseconds: elapsed, detail: error.message)
            )
        }
    }

    /// `measure`, recording the row.
    mutating func timed<T>(
        _ stage: ImportStage, _ body: () throws(ImportFailure) -> (T, String?)
    ) throws(ImportFailure) -> T {
        let (result, row) = Self.measure(stage, body)
        stages.append(row)
        return try result.get()
    }

    static func displayName(_ path: String) -> String {
        let name = (path as NSString).lastPathComponent
        return name.isEmpty ? "document" : name
    }

    static func syncDirectory(_ path: String) -> Bool {
        let descriptor = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return fsync(descriptor) == 0
    }

    static func milliseconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) * 1000 + Double(attoseconds) / 1e15
    }

    static func format(_ milliseconds: Double) -> String { String(format: "%.1f", milliseconds) }
}
