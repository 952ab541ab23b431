// A small child process for cross-process coordination tests and the benchmark. It speaks lines on
// stdout and takes orders on stdin, so a test can drive several of them deterministically:
//
//   coordination-probe hold (--read | --write[=deleting|moving|replacing|merging|evicting]) PATH
//       takes the claim, prints "granted PATH", holds it until stdin reaches EOF or a line,
//       then prints "released" and exits 0 (a failure prints "failed CODE MESSAGE", exits 1). A
//       held claim lost to a server restart prints "lost MESSAGE" at once (D-402).
//   coordination-probe present PATH [--silent] [--evictable]
//       registers a presenter, prints "ready", then one line per event ("event NAME PATH");
//       answers every request unless --silent; exits when stdin reaches EOF. With --evictable it
//       implements accommodatePresentedItemEviction: removes itself, then answers (rule 34).
//   coordination-probe move FROM TO
//       claims FROM .forMoving and TO .forReplacing, prints "moving", waits for a line on stdin,
//       renames FROM to TO, announces it with item(at:didMoveTo:), prints "moved", exits.
//   coordination-probe bench-claims COUNT PATH [--read]
//       COUNT uncontended claim+release round trips; prints "median_ns N" and "claims_per_s N".
import FileCoordination
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// One line on stdout, written at once (no stdio buffering: tests read lines as they happen).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ text: String) -> Never {
    FileHandle.standardError.write(Data(("coordination-probe: " + text + "\n").utf8))
    exit(64)
}

final class ProbePresenter: FilePresenter, @unchecked Sendable {
    // Safe: immutable after init, except `pendingAnswers` (a Locked).
    let presentedItemURL: URL?
    let silent: Bool
    let evictable: Bool
    /// With `--answer-on-input`: answers are kept until a line "answer" arrives on stdin.
    let answerOnInput: Bool
    private let pendingAnswers = Locked<[@Sendable () -> Void]>([])
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()

    init(url: URL, silent: Bool, evictable: Bool, answerOnInput: Bool = false) {
        presentedItemURL = url
        self.silent = silent
        self.evictable = evictable
        self.answerOnInput = answerOnInput
    }

    /// Prints the event, then gives `answer` (never when silent). With `--answer-on-input` the
    /// answer is kept for `releaseAnswers()`, and kept before the event is printed: whoever reads
    /// the event and sends "answer" finds it there.
    func respond(_ name: String, _ answer: @escaping @Sendable () -> Void) {
        if answerOnInput && !silent { pendingAnswers.withLock { $0.append(answer) } }
        note(name)
        if !answerOnInput && !silent { answer() }
    }

    /// Gives the kept answers.
    func releaseAnswers() {
        let answers = pendingAnswers.withLock { answers -> [@Sendable () -> Void] in
            defer { answers = [] }
            return answers
        }
        for answer in answers { answer() }
    }

    var implementedPresenterMethods: PresenterMethods {
        evictable ? PresenterMethods.all.union(.accommodateEviction) : .all
    }

    func note(_ name: String, _ path: String? = nil) { say("event \(name) \(path ?? presentedItemURL!.path)") }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        respond("relinquishToReader") { [self] in reader { [self] in note("reacquire") } }
    }
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        respond("relinquishToWriter") { [self] in writer { [self] in note("reacquire") } }
    }
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        respond("save") { completionHandler(nil) }
    }
    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        respond("accommodateDeletion") { completionHandler(nil) }
    }
    func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("accommodateEviction")
        FileCoordinator.removeFilePresenter(self)  // rule 34: removed before completing
        if !silent { completionHandler(nil) }
    }
    func presentedItemDidChange() { note("didChange") }
    func presentedItemDidMove(to newURL: URL) { note("didMove", newURL.path) }
    func presentedSubitemDidChange(at url: URL) { note("subitemDidChange", url.path) }
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let verb = arguments.first else { fail("usage: coordination-probe (hold|present|bench-claims) …") }
arguments.removeFirst()

switch verb {
case "hold":
    var intent: FileAccessIntent?
    guard let path = arguments.first(where: { !$0.hasPrefix("--") }) else { fail("hold needs a PATH") }
    let url = URL(fileURLWithPath: path)
    for flag in arguments where flag.hasPrefix("--") {
        switch flag {
        case "--read": intent = .readingIntent(with: url)
        case "--read=metadata-only": intent = .readingIntent(with: url, options: .immediatelyAvailableMetadataOnly)
        case "--write": intent = .writingIntent(with: url)
        case "--write=deleting": intent = .writingIntent(with: url, options: .forDeleting)
        case "--write=moving": intent = .writingIntent(with: url, options: .forMoving)
        case "--write=replacing": intent = .writingIntent(with: url, options: .forReplacing)
        case "--write=merging": intent = .writingIntent(with: url, options: .forMerging)
        case "--write=evicting": intent = .writingIntent(with: url, options: .forEvicting)
        default: fail("unknown flag \(flag)")
        }
    }
    guard let intent else { fail("hold needs --read or --write") }
    let coordinator = FileCoordinator()
    coordinator.claimLostHandler = { error in say("lost \(error.message)") }
    do {
        try coordinator.coordinate(intents: [intent]) { urls in
            say("granted \(urls[0].path)")
            _ = readLine()
        }
        say("released")
        exit(0)
    } catch let error as CoordinationError {
        say("failed \(error.code) \(error.message)")
        exit(1)
    }

case "present":
    guard let path = arguments.first(where: { !$0.hasPrefix("--") }) else { fail("present needs a PATH") }
    let url = URL(fileURLWithPath: path)
    let presenter = ProbePresenter(
        url: url, silent: arguments.contains("--silent"), evictable: arguments.contains("--evictable"),
        answerOnInput: arguments.contains("--answer-on-input"))
    do {
        // Registered inside a coordinated read (rule 69) so every later claim sees it.
        try FileCoordinator().coordinate(readingItemAt: url, options: .withoutChanges) { _ in
            FileCoordinator.addFilePresenter(presenter)
        }
    } catch {
        say("failed \(error)")
        exit(1)
    }
    say("ready \(FileCoordinator.filePresenters.count)")
    while let line = readLine() {
        if line == "answer" { presenter.releaseAnswers() }
    }
    FileCoordinator.removeFilePresenter(presenter)
    exit(0)

case "move":
    guard arguments.count == 2 else { fail("move FROM TO") }
    let from = URL(fileURLWithPath: arguments[0])
    let to = URL(fileURLWithPath: arguments[1])
    let coordinator = FileCoordinator()
    do {
        try coordinator.coordinate(writingItemAt: from, options: .forMoving, writingItemAt: to, options: .forReplacing)
        {
            source, destination in
            say("moving")
            _ = readLine()
            try FileManager.default.moveItem(at: source, to: destination)
            try coordinator.item(at: source, didMoveTo: destination)
        }
        say("moved")
        exit(0)
    } catch {
        say("failed \(error)")
        exit(1)
    }

case "bench-local":
    // In-process: the arbiter through its host (the mount's path), and the whole FileCoordinator.
    guard arguments.count >= 2, let count = Int(arguments[0]) else { fail("bench-local COUNT PATH [HELD]") }
    // HELD read claims on other files stay granted meanwhile, as a mount's open files hold theirs.
    let heldCount = arguments.count >= 3 ? Int(arguments[2]) ?? 0 : 0
    final class CountingSink: ArbiterSink, @unchecked Sendable {
        // Safe: only touched by the benchmark thread (actions run on the submitting thread).
        var grants = 0
        func granted(_ claim: ClaimID, paths: [String]) { grants += 1 }
        func failed(_ claim: ClaimID, error: CoordinationError) {}
        func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {}
    }
    let host = ArbiterHost()
    let sink = CountingSink()
    let owner = host.addOwner(sink)
    let intent = ClaimIntent(kind: .write, path: arguments[1])
    let readIntent = ClaimIntent(kind: .read, path: arguments[1])
    for index in 0..<heldCount {
        let held = ClaimIntent(kind: .read, path: arguments[1] + ".held-\(index)")
        host.submit(
            ClaimRequest(
                id: ClaimID(owner: owner, local: UInt64(1 << 40 + index)), pid: 1, purpose: "held", intents: [held],
                waitDeadline: .max, presenterTimeout: 1))
    }
    guard sink.grants == heldCount else { fail("expected \(heldCount) held grants, got \(sink.grants)") }
    sink.grants = 0
    func median(_ body: (Int) throws -> Void) rethrows -> UInt64 {
        var samples: [UInt64] = []
        samples.reserveCapacity(count)
        for index in 0..<count {
            let before = monotonicNanoseconds()
            try body(index)
            samples.append(monotonicNanoseconds() - before)
        }
        samples.sort()
        return samples[samples.count / 2]
    }
    let arbiterMedian = median { index in
        let id = ClaimID(owner: owner, local: UInt64(index + 1))
        host.submit(
            ClaimRequest(
                id: id, pid: 1, purpose: "bench", intents: [intent], waitDeadline: .max, presenterTimeout: 1))
        host.release(id)
    }
    guard sink.grants == count else { fail("expected \(count) grants, got \(sink.grants)") }
    // A read claim, as a mount open takes: with HELD read claims held it shows what they cost it.
    let readMedian = median { index in
        let id = ClaimID(owner: owner, local: UInt64(count + index + 1))
        host.submit(
            ClaimRequest(
                id: id, pid: 1, purpose: "bench", intents: [readIntent], waitDeadline: .max, presenterTimeout: 1))
        host.release(id)
    }
    guard sink.grants == 2 * count else { fail("expected \(2 * count) grants, got \(sink.grants)") }
    let coordinator = FileCoordinator(domain: CoordinationDomain(host: host))
    let url = URL(fileURLWithPath: arguments[1])
    let coordinatorMedian = try median { _ in try coordinator.coordinate(writingItemAt: url) { _ in } }
    say("arbiter_median_ns \(arbiterMedian)")
    say("arbiter_read_median_ns \(readMedian)")
    say("coordinator_median_ns \(coordinatorMedian)")
    exit(0)

case "bench-claims":
    guard arguments.count >= 2, let count = Int(arguments[0]) else { fail("bench-claims COUNT PATH [--read]") }
    let url = URL(fileURLWithPath: arguments[1])
    let coordinator = FileCoordinator()
    let reading = arguments.contains("--read")
    var samples: [UInt64] = []
    samples.reserveCapacity(count)
    let start = monotonicNanoseconds()
    do {
        for _ in 0..<count {
            let before = monotonicNanoseconds()
            if reading {
                try coordinator.coordinate(readingItemAt: url) { _ in }
            } else {
                try coordinator.coordinate(writingItemAt: url) { _ in }
            }
            samples.append(monotonicNanoseconds() - before)
        }
    } catch {
        say("failed \(error)")
        exit(1)
    }
    let elapsed = monotonicNanoseconds() - start
    samples.sort()
    say("median_ns \(samples[samples.count / 2])")
    say("claims_per_s \(Int(Double(count) / (Double(elapsed) / 1e9)))")
    exit(0)

default:
    fail("unknown verb \(verb)")
}
