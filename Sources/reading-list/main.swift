// reading-list: imports PDF documents from a ProviderFS mount (or anywhere) the careful way, and
// keeps its own copies. docs/READING-LIST.md.
//
//   reading-list import PATH… [--strict] [--password-file FILE] [--json]
//   reading-list list [--json]
//   reading-list open ID [--cat]
//   reading-list remove ID
//   reading-list reconcile [--json]
//   reading-list report [--json] [--limit N]
//   common: --data-dir DIR (default $XDG_DATA_HOME/reading-list or ~/.local/share/reading-list)

import Dispatch
import Foundation
import ReadingList
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

let usage = """
    usage: reading-list import PATH… [--strict] [--password-file FILE] [--json]
           reading-list list [--json]
           reading-list open ID [--cat]
           reading-list remove ID
           reading-list reconcile [--json]
           reading-list report [--json] [--limit N]
           reading-list --version
    Every command takes --data-dir DIR (default: $XDG_DATA_HOME/reading-list, else
    ~/.local/share/reading-list); options may come before or after the command.
    ID may be any unique prefix of a document's id.
    Exit status: 0 done, 1 failed (an import, a missing id), 64 usage error, 130/143 cancelled.
    """

enum Exit {
    static let success: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 64
}

/// Lines to stdout and stderr, and JSON lines.
enum Output {
    static func line(_ text: String) { FileHandle.standardOutput.write(Data((text + "\n").utf8)) }
    static func error(_ text: String) { FileHandle.standardError.write(Data(("reading-list: " + text + "\n").utf8)) }
    static func json<T: Encodable>(_ value: T) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        if let data = try? encoder.encode(value) { line(String(decoding: data, as: UTF8.self)) }
    }
}

/// SIGINT and SIGTERM cancel the imports in progress; the process exits 128+N after cleaning up.
final class SignalCancellation: Sendable {
    let cancellation = ImportCancellation()
    let received = Locked<Int32?>(nil)
    let sources: Locked<[any DispatchSourceSignal]> = Locked([])

    init() {
        let queue = DispatchQueue(label: "reading-list.signals")
        var made: [any DispatchSourceSignal] = []
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { [received, cancellation] in
                let first = received.withLock { value -> Bool in
                    defer { if value == nil { value = number } }
                    return value == nil
                }
                if first {
                    cancellation.cancel()
                } else {
                    // A second signal: stop now (what the first one started cleans up at the next start).
                    exit(128 + number)
                }
            }
            source.resume()
            made.append(source)
        }
        sources.withLock { $0 = made }
    }
}

struct ImportLine: Encodable {
    var path: String
    var result: String
    var documentID: String?
    var displayName: String?
    var pages: Int?
    var repaired: Bool?
    var warnings: [String]?
    var stage: String?
    var error: String?
    var stages: [StageResult]
}

func shortSize(_ bytes: Int64) -> String {
    if bytes < 1024 { return "\(bytes) B" }
    let units = ["KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes) / 1024
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return String(format: "%.1f %@", value, units[unit])
}

func resolve(_ prefix: String, in store: RecordStore) throws -> DocumentRecord {
    let matches = try store.documents(state: .available).filter { $0.id.hasPrefix(prefix.lowercased()) }
    guard !prefix.isEmpty, let first = matches.first else { throw ReadingListError("no document has the id \(prefix)") }
    guard matches.count == 1 else {
        throw ReadingListError("the id \(prefix) is ambiguous: \(matches.map(\.id).joined(separator: ", "))")
    }
    return first
}

/// The command; what must stay alive until the process exits goes into `kept`.
func run(keeping kept: inout [any Sendable]) -> Int32 {
    let raw = Array(CommandLine.arguments.dropFirst())
    if raw == ["--version"] {
        Output.line("reading-list \(SourceInspection.appVersion)")
        return Exit.success
    }
    if raw.isEmpty || raw == ["--help"] || raw == ["-h"] || raw == ["help"] {
        Output.line(usage)
        return raw.isEmpty ? Exit.usage : Exit.success
    }
    let arguments: ReadingListArguments
    do {
        arguments = try ReadingListArguments(raw)
    } catch {
        Output.error(error.description)
        FileHandle.standardError.write(Data((usage + "\n").utf8))
        return Exit.usage
    }
    do {
        let location =
            try arguments.dataDirectory.map { directory in
                guard directory.hasPrefix("/") else {
                    return LibraryLocation(root: FileManager.default.currentDirectoryPath + "/" + directory)
                }
                return LibraryLocation(root: directory)
            } ?? LibraryLocation.standard()
        try location.prepare()
        let store = try RecordStore(path: location.database)
        kept.append(store)
        var password: String?
        if let file = arguments.passwordFile {
            guard let text = readTextFile(file) else { throw ReadingListError("cannot read the password file \(file)") }
            password = String(text.split(separator: "\n", omittingEmptySubsequences: false).first ?? "")
        }
        let options = ImportOptions(password: password, strict: arguments.strict)
        // At every start: records and files agree before anything else happens.
        let startup = try Reconciler.reconcile(location: location, store: store, options: options)
        if startup.changedSomething, arguments.command != "reconcile" {
            Output.error(
                "repaired at start: \(startup.madeAvailable.count) made available, "
                    + "\(startup.removedRecords.count + startup.removedMissing.count) records and "
                    + "\(startup.removedFiles.count) files removed, "
                    + "\(startup.interruptedAttempts.count) interrupted imports noted")
        }
        switch arguments.command {
        case "import":
            return importAll(arguments, location: location, store: store, options: options, keeping: &kept)
        case "list":
            let documents = try store.documents(state: .available)
            for document in documents {
                if arguments.json {
                    Output.json(document)
                } else {
                    let flag = document.repaired ? "  repaired" : ""
                    Output.line(
                        "\(document.id)  \(document.displayName)  \(document.pageCount) pages  "
                            + "\(shortSize(document.size))\(flag)")
                }
            }
            return Exit.success
        case "open":
            let document = try resolve(arguments.operands[0], in: store)
            let path = location.documentPath(document.id)
            if arguments.cat {
                guard let input = FileHandle(forReadingAtPath: path) else {
                    throw ReadingListError("cannot open \(path)")
                }
                defer { try? input.close() }
                while let chunk = try input.read(upToCount: 1 << 20), !chunk.isEmpty {
                    FileHandle.standardOutput.write(chunk)
                }
            } else {
                Output.line(path)
            }
            return Exit.success
        case "remove":
            let document = try resolve(arguments.operands[0], in: store)
            // The record first: a crash between the two leaves a file without a record, which
            // reconcile removes, never a record without its file.
            try store.delete(document.id)
            unlink(location.documentPath(document.id))
            Output.line("removed \(document.id) (\(document.displayName))")
            return Exit.success
        case "reconcile":
            if arguments.json {
                Output.json(startup)
            } else {
                Output.line(
                    "made available: \(startup.madeAvailable.count), records removed: "
                        + "\(startup.removedRecords.count + startup.removedMissing.count), files removed: "
                        + "\(startup.removedFiles.count), interrupted imports: \(startup.interruptedAttempts.count), "
                        + "in progress elsewhere: \(startup.inProgress)")
                for id in startup.madeAvailable { Output.line("  available: \(id)") }
                for id in startup.removedRecords + startup.removedMissing { Output.line("  record removed: \(id)") }
                for file in startup.removedFiles { Output.line("  file removed: \(file)") }
            }
            return Exit.success
        case "report":
            let attempts = try store.attempts(limit: arguments.limit)
            if arguments.json {
                for attempt in attempts { Output.json(attempt) }
            } else {
                Output.line(ImportReport.table(attempts))
            }
            return Exit.success
        default:
            return Exit.usage
        }
    } catch {
        Output.error("\(error)")
        return Exit.failure
    }
}

/// The imports, one after another on the main thread: a process that imports blocks until it is
/// done, and a hop to another thread costs a wake-up on a loaded machine (issue 28).
func importAll(
    _ arguments: ReadingListArguments, location: LibraryLocation, store: RecordStore, options: ImportOptions,
    keeping kept: inout [any Sendable]
) -> Int32 {
    let signals = SignalCancellation()
    kept.append(signals)
    let importer = Importer(location: location, store: store, checkpoint: pauseHook())
    var status = Exit.success
    for path in arguments.operands {
        let outcome = importer.importNow(path, options: options, cancellation: signals.cancellation)
        if arguments.json {
            Output.json(
                ImportLine(
                    path: outcome.attempt.sourcePath, result: outcome.attempt.result.rawValue,
                    documentID: outcome.document?.id, displayName: outcome.document?.displayName,
                    pages: outcome.document?.pageCount, repaired: outcome.document?.repaired,
                    warnings: outcome.document?.warnings, stage: outcome.failure?.stage.rawValue,
                    error: outcome.failure?.message, stages: outcome.attempt.stages))
        }
        if let document = outcome.document {
            if !arguments.json {
                let flag = document.repaired ? " — repaired by the validator (\(document.warnings.count) warnings)" : ""
                Output.line(
                    "imported \(document.id)  \(document.displayName)  \(document.pageCount) pages  "
                        + "\(shortSize(document.size))\(flag)")
            }
        } else if let failure = outcome.failure {
            Output.error(
                "\(path): \(failure.cancelled ? "cancelled" : "failed") at \(failure.stage.rawValue): \(failure.message)"
            )
            status = Exit.failure
        }
        if let number = signals.received.withLock({ $0 }) { return 128 + number }
    }
    return status
}

/// Test hook (docs/TESTING.md): with READING_LIST_PAUSE_AT=POINT (read, validate, store, record:
/// before that stage; pending-record: the pending record made, the file not yet moved; copy: the
/// copy's first MiB staged, inside the coordinated read), an import says so on stderr and stops
/// itself (SIGSTOP) there, so that tests can act at a known point: SIGCONT resumes it, kill -9
/// ends it.
func pauseHook() -> @Sendable (ImportCheckpoint) -> Void {
    guard let name = ProcessInfo.processInfo.environment["READING_LIST_PAUSE_AT"],
        let point = ImportCheckpoint(name: name)
    else { return { _ in } }
    return { reached in
        guard reached == point else { return }
        FileHandle.standardError.write(Data("reading-list: paused at \(name) (pid \(getpid()))\n".utf8))
        raise(SIGSTOP)
    }
}

// The records and the signal sources live until the exit: closing the database and releasing
// the sources at the end only woke dispatch threads (a queue's disposal, the sources'
// cancellation) for the exit to kill. The kernel releases the database's locks and descriptors,
// and every commit is already in the WAL, as after a crash, which SQLite is made for (D-534).
var kept: [any Sendable] = []
let status = run(keeping: &kept)
withExtendedLifetime(kept) { exit(status) }
