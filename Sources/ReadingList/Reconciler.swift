// Reconcile: after it, no record points at a missing file and no file lacks a record. Runs on its
// own (`reading-list reconcile`) and at every start, while other imports may be running: their
// staging files are locked and their pending records name a live process, so both are left alone.

import CryptoSupport
import Foundation
import PDFValidation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// What a reconcile did.
public struct ReconcileReport: Sendable, Equatable, Codable {
    /// Pending documents whose file was in the library and validated: now available.
    public var madeAvailable: [String] = []
    /// Pending documents without a file (or with one that does not validate): removed.
    public var removedRecords: [String] = []
    /// Library files without a record, and staging files no import holds: removed.
    public var removedFiles: [String] = []
    /// Available records whose file is missing: removed (their document is gone).
    public var removedMissing: [String] = []
    /// Attempts left `running` by a process that is gone: marked interrupted.
    public var interruptedAttempts: [String] = []
    /// Pending documents and staging files of imports still running: left alone.
    public var inProgress = 0

    public var changedSomething: Bool {
        !(madeAvailable.isEmpty && removedRecords.isEmpty && removedFiles.isEmpty && removedMissing.isEmpty
            && interruptedAttempts.isEmpty)
    }
}

public enum Reconciler {
    /// Brings records and files into agreement. Files are listed before records are read, so a
    /// file moved in by an import running meanwhile always has its (pending) record in the read.
    public static func reconcile(
        location: LibraryLocation, store: RecordStore, options: ImportOptions = ImportOptions()
    ) throws(ReadingListError) -> ReconcileReport {
        var report = ReconcileReport()
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: location.staging)) ?? []
        let files = Set((try? FileManager.default.contentsOfDirectory(atPath: location.library)) ?? [])
        let (pending, available) = try store.reconcileView()
        let known = Set(pending.map(\.id) + available)

        // Staging files: a live import holds its file's lock.
        for name in staged.sorted() {
            let path = location.staging + "/" + name
            switch removeUnlessLocked(path) {
            case nil: report.inProgress += 1
            case true?: report.removedFiles.append("staging/" + name)
            case false?: break
            }
        }

        for record in pending {
            let path = location.documentPath(record.id)
            let exists = files.contains(record.id + ".pdf")
            if isAlive(pid: record.ownerPID, startTime: record.ownerStartTime) {
                report.inProgress += 1
                continue
            }
            if exists, validates(path, record: record, options: options) {
                if try store.markAvailable(record.id) { report.madeAvailable.append(record.id) }
            } else {
                try store.delete(record.id)
                report.removedRecords.append(record.id)
                if exists, unlink(path) == 0 { report.removedFiles.append("library/" + record.id + ".pdf") }
            }
        }
        for id in available where !files.contains(id + ".pdf") && !fileExists(location.documentPath(id)) {
            try store.delete(id)
            report.removedMissing.append(id)
        }

        for name in files.sorted() {
            let id = name.hasSuffix(".pdf") ? String(name.dropLast(4)) : name
            guard !known.contains(id) else { continue }
            let path = location.library + "/" + name
            // A file moved in after the records were read has a record now; a locked one is an
            // import's own.
            if isLocked(path) || (try? store.document(id)) != nil {
                report.inProgress += 1
                continue
            }
            if unlink(path) == 0 { report.removedFiles.append("library/" + name) }
        }

        for attempt in try store.runningAttempts() {
            guard !isAlive(pid: attempt.ownerPID, startTime: attempt.ownerStartTime) else { continue }
            var interrupted = attempt
            interrupted.result = .interrupted
            interrupted.error = "the import's process ended before it finished (killed?)"
            // An import killed after it stored its document: the records above decided the
            // document (made available, or removed), and the attempt says which, so that `report`
            // and `list` agree and the attempt never names a document that is not there.
            if let id = attempt.documentID {
                if let document = try store.document(id), document.state == .available {
                    interrupted.error =
                        "the import's process ended after it stored the document; reconcile checked the stored "
                        + "copy (SHA-256, PDF) and made it available"
                } else {
                    interrupted.documentID = nil
                    interrupted.error =
                        "the import's process ended after it stored the document; the stored copy did not check "
                        + "out and was removed"
                }
            }
            interrupted.ownerPID = nil
            interrupted.ownerStartTime = nil
            try store.save(interrupted)
            report.interruptedAttempts.append(attempt.id)
        }
        return report
    }

    /// A pending document's file is the file the import validated (same SHA-256) and validates
    /// again (an encrypted one, whose password is not kept, only up to its password check).
    static func validates(_ path: String, record: DocumentRecord, options: ImportOptions) -> Bool {
        guard let digest = sha256(of: path), digest == record.sha256 else { return false }
        do throws(PDFValidationError) {
            let result = try PDFValidator.validate(
                path: path, options: PDFValidationOptions(password: options.password))
            return result.size == record.size
        } catch {
            return record.encrypted && (error == .passwordRequired || error == .wrongPassword)
        }
    }

    /// The SHA-256 of a file's bytes, hex; nil when it cannot be read.
    static func sha256(of path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        let capacity = 1 << 20
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 4096)
        defer { buffer.deallocate() }
        var hasher = SHA256()
        while true {
            let count = retryingOnInterrupt { read(descriptor, buffer, capacity) }
            if count < 0 { return nil }
            if count == 0 { break }
            hasher.update(UnsafeRawBufferPointer(start: buffer, count: count))
        }
        return hexString(hasher.finalize())
    }

    /// Removes `path` unless another open file description holds its lock: nil when one does,
    /// else whether it was removed. The unlink happens while this holds the lock, so an import
    /// that created the file and locks it only now finds its name gone and makes another.
    static func removeUnlessLocked(_ path: String) -> Bool? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else { return errno == EWOULDBLOCK ? nil : false }
        return unlink(path) == 0
    }

    /// Whether another open file description holds a lock on `path`.
    static func isLocked(_ path: String) -> Bool {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        if flock(descriptor, LOCK_EX | LOCK_NB) == 0 {
            flock(descriptor, LOCK_UN)
            return false
        }
        return errno == EWOULDBLOCK
    }

    /// The process `pid` is running and started at `startTime` (not a reused pid).
    static func isAlive(pid: Int32?, startTime: UInt64?) -> Bool {
        guard let pid, pid > 0 else { return false }
        guard let current = ProcessInfoFiles.startTime(of: pid) else { return false }
        return startTime == nil || current == startTime
    }

    static func fileExists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }
}
