import Dispatch
import FileCoordination
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// `providerfs present PATH`: registers a file presenter for PATH and prints every presenter event
/// as one JSON line (`{"event":"relinquishToWriter","path":…}`); relinquish, save and
/// accommodate requests are answered at once. The first line is `{"event":"ready",…}`. Stops
/// cleanly on SIGINT or SIGTERM. An eviction of the item (`providerfs evict`) is vetoed, as by
/// any presenter that does not implement accommodatePresentedItemEviction (rule 34); with
/// `--accept-eviction` it is accepted: the presenter removes itself, answers, and the command
/// ends after printing the event.
struct PresentCommand: CLICommand {
    static let name = "present"
    static let summary = "print presenter events for a path as JSON lines until stopped"
    static let usage = "providerfs present PATH [--accept-eviction]"

    struct Event: Encodable {
        var event: String
        var path: String
        var to: String?
    }

    final class Printer: FilePresenter, @unchecked Sendable {
        // Safe: `url` is guarded by `lock`; the queue and io are immutable.
        let io: CommandIO
        let presentedItemOperationQueue: OperationQueue = {
            let queue = OperationQueue()
            queue.maxConcurrentOperationCount = 1
            return queue
        }()
        private let lock = Lock()
        private var url: URL

        /// `--accept-eviction`: implements accommodatePresentedItemEviction, and `evicted` runs
        /// once it accepted one.
        let acceptsEviction: Bool
        let evicted: @Sendable () -> Void

        init(url: URL, io: CommandIO, acceptsEviction: Bool = false, evicted: @escaping @Sendable () -> Void = {}) {
            self.url = url
            self.io = io
            self.acceptsEviction = acceptsEviction
            self.evicted = evicted
        }

        var implementedPresenterMethods: PresenterMethods {
            acceptsEviction ? PresenterMethods.all.union(.accommodateEviction) : .all
        }
        func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
            emit("accommodatePresentedItemEviction")
            // Rule 34: the presenter removes itself before it answers.
            FileCoordinator.removeFilePresenter(self)
            completionHandler(nil)
            evicted()
        }

        var presentedItemURL: URL? { lock.withLock { url } }
        func emit(_ event: String, _ path: String? = nil, to: String? = nil) {
            io.emit(Event(event: event, path: path ?? lock.withLock { url.path }, to: to))
        }

        func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
            emit("relinquishToReader")
            reader { [weak self] in self?.emit("reacquire") }
        }
        func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
            emit("relinquishToWriter")
            writer { [weak self] in self?.emit("reacquire") }
        }
        func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
            emit("savePresentedItemChanges")
            completionHandler(nil)
        }
        func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
            emit("accommodatePresentedItemDeletion")
            completionHandler(nil)
        }
        func accommodatePresentedSubitemDeletion(
            at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void
        ) {
            emit("accommodatePresentedSubitemDeletion", url.path)
            completionHandler(nil)
        }
        func presentedItemDidMove(to newURL: URL) {
            let old = lock.withLock { () -> String in
                defer { url = newURL }
                return url.path
            }
            emit("presentedItemDidMove", old, to: newURL.path)
        }
        func presentedItemDidChange() { emit("presentedItemDidChange") }
        func presentedSubitemDidChange(at url: URL) { emit("presentedSubitemDidChange", url.path) }
        func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {
            emit("presentedSubitemDidMove", oldURL.path, to: newURL.path)
        }
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let path = try arguments.requiredPositional("PATH")
        let acceptsEviction = try arguments.flag("--accept-eviction")
        try arguments.finish()
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        let url = URL(fileURLWithPath: absolute)
        let stop = Locked<(signalled: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))
        let finish: @Sendable () -> Void = {
            let waiter = stop.withLock { stop -> CheckedContinuation<Void, Never>? in
                guard !stop.signalled else { return nil }
                stop.signalled = true
                defer { stop.waiter = nil }
                return stop.waiter
            }
            waiter?.resume()
        }
        let printer = Printer(url: url, io: io, acceptsEviction: acceptsEviction, evicted: finish)
        // Register inside a coordinated read of the item (Apple's race-free idiom, rule 69): every
        // claim granted after this read sees the presenter.
        do {
            try await FileCoordinator().coordinate(
                readingItemAt: url, options: .withoutChanges,
                performing: { _ in FileCoordinator.addFilePresenter(printer) })
        } catch let error as CoordinationError {
            throw CommandFailure(error.message)
        }
        // The stop signals are caught before "ready" is printed: a script may signal as soon as
        // it reads that line (a SIGINT in between used to end the process with status 130).
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { finish() }
            source.resume()
            Self.sources.withLock { $0.append(source) }
        }
        printer.emit("ready")
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let signalled = stop.withLock { stop -> Bool in
                if !stop.signalled { stop.waiter = continuation }
                return stop.signalled
            }
            if signalled { continuation.resume() }
        }
        FileCoordinator.removeFilePresenter(printer)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            printer.presentedItemOperationQueue.addOperation { continuation.resume() }
        }
        printer.emit("stopped")
        return ExitStatus.success
    }

    /// Keeps the signal sources alive while the command waits.
    static let sources = SourceList()

    final class SourceList: Sendable {
        private let list = Locked<[any DispatchSourceSignal]>([])
        func withLock<T>(_ body: (inout [any DispatchSourceSignal]) -> T) -> T { list.withLock { body(&$0) } }
    }
}
