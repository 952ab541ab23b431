// The public API in one process (CoordinationDomain over an in-process ArbiterHost): rules of
// §7.1, §7.4 and §7.5 that need real threads and files, and the bad-input list.
import Dispatch
import FileCoordination
import Foundation
import SystemSupport
import TestScheduling
import Testing

/// A presenter that records what it is told and answers at once (or never, when `silent`).
final class RecordingPresenter: FilePresenter, @unchecked Sendable {
    // Safe: `log` is only touched under `lock`; the other fields are immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()
    let silent: Bool
    let failWith: String?
    private let lock = Lock()
    private var log: [String] = []

    init(_ url: URL, silent: Bool = false, failWith: String? = nil) {
        presentedItemURL = url
        self.silent = silent
        self.failWith = failWith
    }

    var events: [String] { lock.withLock { log } }
    private func note(_ text: String) { lock.withLock { log.append(text) } }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquishToWriter")
        if !silent { writer { [weak self] in self?.note("reacquire") } }
    }
    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquishToReader")
        if !silent { reader { [weak self] in self?.note("reacquire") } }
    }
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("save")
        if !silent { completionHandler(nil) }
    }
    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("accommodateDeletion")
        if let failWith {
            completionHandler(CoordinationError(.presenterFailed, failWith))
        } else {
            completionHandler(nil)
        }
    }
    func presentedItemDidChange() { note("didChange") }
    func presentedItemDidMove(to newURL: URL) { note("didMove \(newURL.path)") }
}

/// Polls until `condition` holds or 30 s pass, suspending between polls: in async code a blocking
/// poll would hold a cooperative thread, and on a 2-core machine that can starve the very task
/// being waited for. The deadline only bounds a failure: a passing wait ends at the first true
/// poll. (5 s was not enough on a loaded 2-core machine while sync tests held both cooperative
/// threads.)
func eventuallyAsync(_ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return condition()
}

/// Polls (no fixed sleep) until `condition` holds or 30 s pass.
func eventually(_ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        usleep(1000)
    }
    return condition()
}

@Suite(.blockingThreads) final class FileCoordinatorTests {
    let host: ArbiterHost
    let domain: CoordinationDomain
    /// Directories made by this test, removed when it ends (a suite instance lives for one test).
    private var scratch: [URL] = []

    init() {
        host = ArbiterHost()
        domain = CoordinationDomain(host: host)
    }

    deinit {
        for url in scratch { try? FileManager.default.removeItem(at: url) }
    }

    func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("fc-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        scratch.append(url)
        return url
    }

    @Test func readerWaitsForWriterOnAnotherThread() throws {
        let dir = try temporaryDirectory()
        let file = dir.appendingPathComponent("f")
        try Data("old".utf8).write(to: file)
        let domain = self.domain
        let writerIn = DispatchSemaphore(value: 0)
        let finishWriter = DispatchSemaphore(value: 0)
        let readDone = DispatchSemaphore(value: 0)
        let readValue = Locked<String?>(nil)
        DispatchQueue.global().async {
            try? FileCoordinator(domain: domain).coordinate(writingItemAt: file) { url in
                writerIn.signal()
                finishWriter.wait()
                try? Data("new".utf8).write(to: url)
            }
        }
        writerIn.wait()
        DispatchQueue.global().async {
            let text = try? FileCoordinator(domain: domain).coordinate(readingItemAt: file) { url in
                try String(contentsOf: url, encoding: .utf8)
            }
            readValue.withLock { $0 = text }
            readDone.signal()
        }
        #expect(eventually { host.dump().claims.map(\.state) == ["held", "waiting"] })
        finishWriter.signal()
        readDone.wait()
        #expect(readValue.value == "new", "rule 2: the read runs after the write")
    }

    @Test func rule06_coordinatorsOfOnePresenterSharePurposeAndDoNotExclude() throws {
        let dir = try temporaryDirectory()
        let presenter = RecordingPresenter(dir.appendingPathComponent("f"))
        let a = FileCoordinator(filePresenter: presenter, domain: domain)
        let b = FileCoordinator(filePresenter: presenter, domain: domain)
        #expect(a.purposeIdentifier == b.purposeIdentifier)
        #expect(FileCoordinator(domain: domain).purposeIdentifier != a.purposeIdentifier)
        let file = dir.appendingPathComponent("f")
        try a.coordinate(writingItemAt: file) { _ in
            // The other coordinator of the same presenter is not blocked (it would deadlock here).
            try b.coordinate(writingItemAt: file) { _ in }
        }
    }

    @Test func rule07_purposeIdentifierRules() throws {
        let coordinator = FileCoordinator(domain: domain)
        #expect(throws: CoordinationError.self) { try coordinator.setPurposeIdentifier("") }
        try coordinator.setPurposeIdentifier("sync-engine")
        #expect(coordinator.purposeIdentifier == "sync-engine")
        #expect(throws: CoordinationError.self) { try coordinator.setPurposeIdentifier("again") }
        let bound = FileCoordinator(filePresenter: RecordingPresenter(URL(fileURLWithPath: "/x")), domain: domain)
        #expect(throws: CoordinationError.self) { try bound.setPurposeIdentifier("mine") }
    }

    @Test func rule05_samePurposeCoordinatorsDoNotExclude() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let a = FileCoordinator(domain: domain)
        let b = FileCoordinator(domain: domain)
        try a.setPurposeIdentifier("same")
        try b.setPurposeIdentifier("same")
        try a.coordinate(writingItemAt: file) { _ in try b.coordinate(writingItemAt: file) { _ in } }
    }

    @Test func nestedCoordinationThatWouldDeadlockFailsAtOnce() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let outer = FileCoordinator(domain: domain)
        let inner = FileCoordinator(domain: domain)
        var thrown: CoordinationError?
        try outer.coordinate(writingItemAt: file) { _ in
            do { try inner.coordinate(readingItemAt: file) { _ in Issue.record("inner accessor ran") } } catch {
                thrown = error as? CoordinationError
            }
        }
        #expect(thrown?.code == .wouldDeadlock)
        #expect(thrown?.message.contains("deadlock") == true)
    }

    @Test func rule59_60_sameCoordinatorMayNestReadAndWrite() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let coordinator = FileCoordinator(domain: domain)
        var ran = 0
        try coordinator.coordinate(writingItemAt: file) { _ in
            try coordinator.coordinate(readingItemAt: file) { _ in ran += 1 }
        }
        try coordinator.coordinate(readingItemAt: file, writingItemAt: file) { _, _ in
            try coordinator.coordinate(writingItemAt: file) { _ in ran += 1 }
        }
        #expect(ran == 2)
    }

    @Test func rule53_55_cancelBeforeTheAccessorIsSticky() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let domain = self.domain
        let holder = FileCoordinator(domain: domain)
        let waiter = FileCoordinator(domain: domain)
        let result = Locked<CoordinationError?>(nil)
        let done = DispatchSemaphore(value: 0)
        try holder.coordinate(writingItemAt: file) { _ in
            DispatchQueue.global().async {
                do { try waiter.coordinate(readingItemAt: file) { _ in Issue.record("accessor ran") } } catch {
                    result.withLock { $0 = error as? CoordinationError }
                }
                done.signal()
            }
            #expect(eventually { host.dump().claims.count == 2 })
            waiter.cancel()
            done.wait()
        }
        #expect(result.value?.code == .cancelled)
        #expect(throws: CoordinationError(.cancelled, "The coordinator was cancelled.")) {
            try waiter.coordinate(readingItemAt: file) { _ in Issue.record("accessor ran after cancel") }
        }
        #expect(host.dump().claims.isEmpty)
    }

    @Test func rule54_cancelDuringTheAccessorLetsItFinish() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let coordinator = FileCoordinator(domain: domain)
        let value = try coordinator.coordinate(readingItemAt: file) { _ in
            coordinator.cancel()
            return 42
        }
        #expect(value == 42)
    }

    @Test func badInputGetsAClearError() throws {
        let coordinator = FileCoordinator(domain: domain)
        func code(_ body: () throws -> Void) -> CoordinationError.Code? {
            do { try body() } catch { return (error as? CoordinationError)?.code }
            return nil
        }
        #expect(
            code { try coordinator.coordinate(readingItemAt: URL(string: "https://example.com/x")!) { _ in } }
                == .invalidURL)
        #expect(
            code { try coordinator.coordinate(readingItemAt: URL(string: "file:relative/x")!) { _ in } } == .invalidURL)
        #expect(code { _ = try ItemResolver.validatedPath("relative/x") } == .invalidURL)
        #expect(code { _ = try ItemResolver.validatedPath("/tmp/a\u{0}b") } == .invalidURL)
        let long = "/tmp/" + String(repeating: "n", count: 256)
        #expect(code { try coordinator.coordinate(writingItemAt: URL(fileURLWithPath: long)) { _ in } } == .invalidURL)
        #expect(code { try coordinator.coordinate(intents: []) { _ in } } == .invalidRequest)
        let file = URL(fileURLWithPath: "/tmp/fc-same")
        #expect(
            code {
                try coordinator.coordinate(intents: [
                    .writingIntent(with: file, options: .forDeleting), .writingIntent(with: file, options: .forMerging),
                ]) { _ in }
            } == .invalidRequest)
        #expect(
            code { try coordinator.coordinate(writingItemAt: file, options: [.forDeleting, .forMoving]) { _ in } }
                == .invalidRequest)
        // A read and a write of one item in one call is fine (rule 4).
        try coordinator.coordinate(readingItemAt: file, writingItemAt: file) { _, _ in }
    }

    @Test func pathsAreCheckedDecodedAndTheAccessorGetsTheCallersURL() throws {
        let directory = try temporaryDirectory()
        let coordinator = FileCoordinator(domain: domain)
        // Encoded characters are checked and claimed decoded: "%41" is three bytes of a name.
        let odd = directory.appendingPathComponent("a b%41?#;é")
        #expect(try ItemResolver.validatedPath(odd) == directory.path + "/a b%41?#;é")
        // A 255-byte name (in UTF-8; "é" is two bytes) passes; one byte more does not, even when
        // its encoded form is what grows past the limit.
        let longest = directory.appendingPathComponent(String(repeating: "é", count: 127) + "x")
        #expect(try ItemResolver.validatedPath(longest) == longest.path)
        #expect(throws: CoordinationError.self) {
            _ = try ItemResolver.validatedPath(directory.appendingPathComponent(String(repeating: "é", count: 128)))
        }
        // Foundation leaves "%00" encoded: it names the literal bytes, never a NUL.
        #expect(try ItemResolver.validatedPath(URL(string: "file:///tmp/a%00b")!) == "/tmp/a%00b")
        // The accessor gets the caller's own URL back when it already named the item's canonical
        // path, and the canonical URL when it did not (a "." component).
        let file = directory.appendingPathComponent("f")
        let given = try coordinator.coordinate(readingItemAt: file) { $0 }
        #expect(given == file)
        let dotted = URL(fileURLWithPath: directory.path + "/./f")
        let canonical = try coordinator.coordinate(readingItemAt: dotted) { $0 }
        #expect(canonical.path == file.path)
    }

    @Test func presenterRelinquishesBeforeWriteAndHearsDidChangeAfter() throws {
        let domain = self.domain
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        #expect(domain.filePresenters.count == 1)
        var seenInside: [String] = []
        try FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in seenInside = presenter.events }
        #expect(seenInside == ["relinquishToWriter"])
        #expect(eventually { presenter.events == ["relinquishToWriter", "reacquire", "didChange"] })
        // Rule 26: its own coordinator does not message it.
        try FileCoordinator(filePresenter: presenter, domain: domain).coordinate(writingItemAt: file) { _ in }
        presenter.presentedItemOperationQueue.waitUntilAllOperationsAreFinished()
        #expect(presenter.events.count == 3)
    }

    @Test func rule25_presenterVetoFailsTheDelete() throws {
        let domain = self.domain
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file, failWith: "unsaved edits")
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        #expect(throws: CoordinationError.self) {
            try FileCoordinator(domain: domain).coordinate(writingItemAt: file, options: .forDeleting) { _ in
                Issue.record("accessor ran despite the veto")
            }
        }
    }

    @Test func silentPresenterHitsItsDeadlineAndTheWriteHappens() throws {
        let domain = self.domain
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file, silent: true)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        let coordinator = FileCoordinator(domain: domain)
        coordinator.deadlines = CoordinationDeadlines(claimWait: .seconds(10), presenterAnswer: .milliseconds(100))
        try coordinator.coordinate(writingItemAt: file) { url in try Data("x".utf8).write(to: url) }
        #expect(try Data(contentsOf: file) == Data("x".utf8))
        #expect(host.dump().events.contains { $0.text.contains("did not answer") })
    }

    @Test func claimTimesOutWithTimedOut() throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let domain = self.domain
        let waiter = FileCoordinator(domain: domain)
        waiter.deadlines = CoordinationDeadlines(claimWait: .milliseconds(50), presenterAnswer: .seconds(1))
        let error = Locked<CoordinationError?>(nil)
        try FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                do { try waiter.coordinate(writingItemAt: file) { _ in } } catch let failure {
                    error.withLock { $0 = failure as? CoordinationError }
                }
                done.signal()
            }
            done.wait()
        }
        #expect(error.value?.code == .timedOut)
    }

    @Test func rule39_intentURLFollowsAMove() throws {
        let dir = try temporaryDirectory()
        let a = dir.appendingPathComponent("a")
        let b = dir.appendingPathComponent("b")
        try Data("x".utf8).write(to: a)
        let domain = self.domain
        let mover = FileCoordinator(domain: domain)
        let intent = FileAccessIntent.readingIntent(with: a)
        let granted = DispatchSemaphore(value: 0)
        let seen = Locked<(URL, Bool)?>(nil)
        let queue = OperationQueue()
        try mover.coordinate(writingItemAt: a, options: .forMoving, writingItemAt: b, options: .forReplacing) {
            from, to in
            FileCoordinator(domain: domain).coordinate(with: [intent], queue: queue) { error in
                seen.withLock {
                    $0 = (intent.url, error == nil && FileManager.default.fileExists(atPath: intent.url.path))
                }
                granted.signal()
            }
            #expect(eventually { host.dump().claims.count == 2 })
            try FileManager.default.moveItem(at: from, to: to)
            try mover.item(at: from, didMoveTo: to)
        }
        granted.wait()
        #expect(seen.value?.0.lastPathComponent == "b")
        #expect(seen.value?.1 == true)
    }

    @Test func rule47_resolvesSymbolicLink() throws {
        let dir = try temporaryDirectory()
        let target = dir.appendingPathComponent("target")
        try Data("t".utf8).write(to: target)
        let link = dir.appendingPathComponent("link")
        try FileManager.default.createSymbolicLink(at: link, withDestinationURL: target)
        let url = try FileCoordinator(domain: domain).coordinate(readingItemAt: link, options: .resolvesSymbolicLink) {
            $0
        }
        #expect(url.lastPathComponent == "target")
    }

    @Test func rule48_forUploadingFileIsASnapshotThatDisappears() throws {
        let dir = try temporaryDirectory()
        let file = dir.appendingPathComponent("doc.txt")
        try Data("content".utf8).write(to: file)
        let domain = self.domain
        var snapshot: URL?
        try FileCoordinator(domain: domain).coordinate(readingItemAt: file, options: .forUploading) { url in
            snapshot = url
            #expect(url != file)
            #expect(try Data(contentsOf: url) == Data("content".utf8))
            // The original is free for a writer while the accessor runs.
            try FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in }
        }
        #expect(snapshot.map { FileManager.default.fileExists(atPath: $0.path) } == false)
    }

    @Test func rule49_forUploadingDirectoryIsOneTarFile() throws {
        let dir = try temporaryDirectory()
        let package = dir.appendingPathComponent("Doc.pkg")
        try FileManager.default.createDirectory(
            at: package.appendingPathComponent("sub"), withIntermediateDirectories: true)
        try Data("a".utf8).write(to: package.appendingPathComponent("sub/a.txt"))
        let longName = String(repeating: "l", count: 120)
        try Data("b".utf8).write(to: package.appendingPathComponent(longName))
        let listing = try FileCoordinator(domain: domain).coordinate(readingItemAt: package, options: .forUploading) {
            url in
            #expect(url.pathExtension == "tar")
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/tar")
            process.arguments = ["-tf", url.path]
            let pipe = Pipe()
            process.standardOutput = pipe
            try process.run()
            let output = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
            return String(decoding: output, as: UTF8.self)
        }
        let names = Set(listing.split(separator: "\n").map(String.init))
        #expect(names == ["Doc.pkg/", "Doc.pkg/sub/", "Doc.pkg/sub/a.txt", "Doc.pkg/" + longName])
    }

    @Test func packageMarkerMakesADirectoryOneItem() throws {
        let dir = try temporaryDirectory()
        let package = dir.appendingPathComponent("Doc.pkg")
        try FileManager.default.createDirectory(at: package, withIntermediateDirectories: true)
        try Data().write(to: package.appendingPathComponent(filePackageMarkerName))
        let item = try ItemResolver.resolve(package.appendingPathComponent("a/b").path)
        #expect(item.packageRoot == package.resolvingSymlinksInPath().path)
        let plain = try ItemResolver.resolve(dir.appendingPathComponent("x").path)
        #expect(plain.packageRoot == nil)
    }

    @Test func asyncFormsDoNotBlockAndRelease() async throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let domain = self.domain
        let value = try await FileCoordinator(domain: domain).coordinate(
            writingItemAt: file,
            performing: { url in
                try Data("async".utf8).write(to: url)
                return 7
            })
        #expect(value == 7)
        let text = try await FileCoordinator(domain: domain).coordinate(
            readingItemAt: file,
            performing: { url in
                try String(contentsOf: url, encoding: .utf8)
            })
        #expect(text == "async")
        #expect(host.dump().claims.isEmpty)
    }

    @Test func asyncWaitIsCancelledWithTheTask() async throws {
        let file = try temporaryDirectory().appendingPathComponent("f")
        let domain = self.domain
        let host = self.host
        let holder = FileCoordinator(domain: domain)
        _ = try await holder.coordinate(
            writingItemAt: file,
            performing: { _ in
                // Detached: a child task would inherit the held claim and fail at once as a nested deadlock.
                // Off the cooperative pool, so the claim is asked for at once even while every other
                // test's task is queued there (the wait below has a wall-clock deadline).
                let task = Task.detached(executorPreference: BlockingTestExecutor.unbounded) {
                    try await FileCoordinator(domain: domain).coordinate(readingItemAt: file, performing: { _ in 1 })
                }
                #expect(await eventuallyAsync { host.dump().claims.count == 2 })
                task.cancel()
                let result = await task.result
                #expect((try? result.get()) == nil)
                return 0
            })
    }

    @Test func rule61_batchAccessorRunsOnceOnTheQueue() throws {
        let dir = try temporaryDirectory()
        let queue = OperationQueue()
        let done = DispatchSemaphore(value: 0)
        let calls = Locked<Int>(0)
        FileCoordinator(domain: domain).coordinate(
            with: [
                .readingIntent(with: dir.appendingPathComponent("a")),
                .writingIntent(with: dir.appendingPathComponent("b")),
            ],
            queue: queue
        ) { error in
            #expect(error == nil)
            calls.withLock { $0 += 1 }
            done.signal()
        }
        done.wait()
        queue.waitUntilAllOperationsAreFinished()
        #expect(calls.value == 1)
        #expect(eventually { host.dump().claims.isEmpty })
    }

    @Test func pathsAreMadeCanonical() throws {
        let dir = try temporaryDirectory().resolvingSymlinksInPath().path
        try FileManager.default.createDirectory(atPath: dir + "/real", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: dir + "/alias", withDestinationPath: dir + "/real")
        #expect(try ItemResolver.resolve(dir + "/./real//x/../y").path == dir + "/real/y")
        #expect(try ItemResolver.resolve(dir + "/alias/y").path == dir + "/real/y", "parent symlinks resolved")
        #expect(try ItemResolver.resolve(dir + "/alias").path == dir + "/alias", "the last component is kept")
        #expect(try ItemResolver.resolve(dir + "/missing/deeper/z").path == dir + "/missing/deeper/z")
        #expect(try ItemResolver.resolve(dir + "/real/...").path == dir + "/real/...")
        #expect(try ItemResolver.resolve("/").path == "/")
    }

    @Test func rule46_presenterWithoutURLIsRegisteredAfterItsCoordinatorsAccess() throws {
        final class LatePresenter: FilePresenter, @unchecked Sendable {
            // Safe: `url` is only touched under `lock`.
            private let lock = Lock()
            private var url: URL?
            let presentedItemOperationQueue = OperationQueue()
            var presentedItemURL: URL? {
                get { lock.withLock { url } }
                set { lock.withLock { url = newValue } }
            }
        }
        let domain = self.domain
        let presenter = LatePresenter()
        domain.addFilePresenter(presenter)
        #expect(host.dump().presenters.isEmpty, "nothing to register yet")
        let file = try temporaryDirectory().appendingPathComponent("new")
        try FileCoordinator(filePresenter: presenter, domain: domain).coordinate(writingItemAt: file) { url in
            try Data().write(to: url)
            presenter.presentedItemURL = url
        }
        #expect(host.dump().presenters.map(\.path) == [file.resolvingSymlinksInPath().path])
        domain.removeFilePresenter(presenter)
    }

    @Test func rule27_versionHooksAreCalledIncludingOnTheWritersPresenter() throws {
        final class VersionPresenter: FilePresenter, @unchecked Sendable {
            // Safe: `seen` is only touched under `lock`.
            let presentedItemURL: URL?
            let presentedItemOperationQueue = OperationQueue()
            private let lock = Lock()
            private var seen: [String] = []
            init(_ url: URL) { presentedItemURL = url }
            var events: [String] { lock.withLock { seen } }
            func presentedItemDidGain(_ version: FileVersion) { lock.withLock { seen.append("gain \(version.name)") } }
            func presentedSubitem(at url: URL, didLose version: FileVersion) {
                lock.withLock { seen.append("sublose \(url.lastPathComponent) \(version.name)") }
            }
        }
        let domain = self.domain
        let dir = try temporaryDirectory().resolvingSymlinksInPath()
        let file = dir.appendingPathComponent("doc")
        let own = VersionPresenter(file)
        let parent = VersionPresenter(dir)
        domain.addFilePresenter(own)
        domain.addFilePresenter(parent)
        defer {
            domain.removeFilePresenter(own)
            domain.removeFilePresenter(parent)
        }
        let coordinator = FileCoordinator(filePresenter: own, domain: domain)
        let version = FileVersion(url: dir.appendingPathComponent(".v1"), name: "v1")
        try coordinator.coordinate(writingItemAt: file) { url in
            try coordinator.item(at: url, didChangeVersion: version, change: .gained)
            try coordinator.item(at: url, didChangeVersion: version, change: .lost)
        }
        #expect(throws: CoordinationError.self) {
            try coordinator.item(at: file, didChangeVersion: version, change: .gained)
        }
        #expect(eventually { own.events == ["gain v1"] })
        #expect(eventually { parent.events == ["sublose doc v1"] })
    }

    @Test func rule30_presenterMethodsRunOnItsOperationQueue() throws {
        final class QueueCheckingPresenter: FilePresenter, @unchecked Sendable {
            // Safe: `calls` is only touched under `lock`.
            let presentedItemURL: URL?
            let presentedItemOperationQueue = OperationQueue()
            private let lock = Lock()
            private var calls: [(String, Bool)] = []
            init(_ url: URL) { presentedItemURL = url }
            var log: [(String, Bool)] { lock.withLock { calls } }
            private func note(_ name: String) {
                let onQueue = OperationQueue.current === presentedItemOperationQueue
                lock.withLock { calls.append((name, onQueue)) }
            }
            func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
                note("relinquishToReader")
                reader { [self] in note("reacquire") }
            }
            func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
                note("relinquishToWriter")
                writer { [self] in note("reacquire") }
            }
            func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
                note("save")
                completionHandler(nil)
            }
            func presentedItemDidChange() { note("didChange") }
        }
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = QueueCheckingPresenter(file)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        try FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in }
        try FileCoordinator(domain: domain).coordinate(readingItemAt: file) { _ in }
        let expected = ["relinquishToWriter", "reacquire", "didChange", "relinquishToReader", "save", "reacquire"]
        #expect(eventually { presenter.log.count == expected.count })
        #expect(Set(presenter.log.map(\.0)) == Set(expected))
        let log = presenter.log
        #expect(log.allSatisfy { $0.1 }, "every call on presentedItemOperationQueue: \(log)")
    }

    @Test func rule56_cancelReturnsAtOnceAndDoesNotRetractDeliveredMessages() throws {
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file, silent: true)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        let writer = FileCoordinator(domain: domain)
        // Far beyond the polls below: a cancel that waited for the presenter would fail them.
        writer.deadlines = CoordinationDeadlines(claimWait: .seconds(300), presenterAnswer: .seconds(300))
        let outcome = Locked<String?>(nil)
        DispatchQueue.global().async {
            do {
                try writer.coordinate(writingItemAt: file) { _ in outcome.withLock { $0 = "accessor ran" } }
            } catch {
                outcome.withLock { $0 = (error as? CoordinationError)?.code == .cancelled ? "cancelled" : "\(error)" }
            }
        }
        #expect(eventually { presenter.events == ["relinquishToWriter"] })
        let cancelled = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            writer.cancel()
            cancelled.signal()
        }
        #expect(cancelled.wait(timeout: .now() + 30) == .success, "cancel() returned")
        #expect(eventually { outcome.value != nil })
        #expect(outcome.value == "cancelled")
        // The message was delivered and stays delivered: nothing retracts it or follows it.
        presenter.presentedItemOperationQueue.waitUntilAllOperationsAreFinished()
        #expect(presenter.events == ["relinquishToWriter"])
        #expect(host.dump().claims.isEmpty)
    }

    @Test func rule68_theRegistryKeepsAPresenterAliveUntilItIsRemoved() throws {
        weak var weakPresenter: RecordingPresenter?
        do {
            let presenter = RecordingPresenter(URL(fileURLWithPath: "/tmp/fc-retained"))
            weakPresenter = presenter
            domain.addFilePresenter(presenter)
        }
        #expect(weakPresenter != nil, "registered: kept alive by the registry alone")
        if let presenter = weakPresenter { domain.removeFilePresenter(presenter) }
        #expect(weakPresenter == nil, "removed: released")
    }

    @Test func rule69_aPresenterAddedInsideAReadOfItsItemHearsEveryLaterClaim() throws {
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file)
        let domain = self.domain
        let writerAsked = DispatchSemaphore(value: 0)
        let writerDone = DispatchSemaphore(value: 0)
        try FileCoordinator(domain: domain).coordinate(readingItemAt: file, options: .withoutChanges) { _ in
            domain.addFilePresenter(presenter)
            // A writer that asks while the read is held waits for it, then must go through the
            // presenter registered meanwhile.
            DispatchQueue.global().async {
                writerAsked.signal()
                try? FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in }
                writerDone.signal()
            }
            writerAsked.wait()
            #expect(eventually { self.host.dump().claims.count == 2 })
        }
        defer { domain.removeFilePresenter(presenter) }
        writerDone.wait()
        #expect(eventually { presenter.events == ["relinquishToWriter", "reacquire", "didChange"] })
    }

    @Test func aWaitingAsyncClaimLeavesItsThreadFree() throws {
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let domain = self.domain
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            try? FileCoordinator(domain: domain).coordinate(writingItemAt: file) { _ in
                holding.signal()
                release.wait()
            }
        }
        holding.wait()
        // One thread runs both tasks: if the waiting claim held it, the second task never would.
        let oneThread = BlockingTestExecutor(width: 1)
        let waiting = Task(executorPreference: oneThread) {
            try await FileCoordinator(domain: domain).coordinate(readingItemAt: file, performing: { _ in 1 })
        }
        #expect(eventually { self.host.dump().claims.map(\.state) == ["held", "waiting"] })
        let ran = Locked(false)
        Task(executorPreference: oneThread) { ran.withLock { $0 = true } }
        #expect(eventually { ran.value }, "another task ran on the thread while the claim waited")
        #expect(host.dump().claims.map(\.state) == ["held", "waiting"])
        release.signal()
        let done = Locked<Int?>(nil)
        // Not on the cooperative pool: this blocking body waits for it, and other suites' blocking
        // bodies can hold both pool threads for longer than the deadline (TestScheduling's rule;
        // it failed that way once in CI's ThreadSanitizer run, 2026-12-01).
        Task(executorPreference: BlockingTestExecutor.unbounded) {
            let value = try? await waiting.value
            done.withLock { $0 = value }
        }
        #expect(eventually { done.value == 1 })
    }

    @Test func rule43_willMoveToSendsNothing() throws {
        let directory = try temporaryDirectory()
        let file = directory.appendingPathComponent("a")
        let presenter = RecordingPresenter(file)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        let mover = FileCoordinator(filePresenter: nil, domain: domain)
        try mover.coordinate(writingItemAt: file, options: .forMoving) { url in
            mover.item(at: url, willMoveTo: directory.appendingPathComponent("b"))
        }
        presenter.presentedItemOperationQueue.waitUntilAllOperationsAreFinished()
        // What the claim itself sends, and nothing about a move.
        #expect(eventually { presenter.events == ["relinquishToWriter", "reacquire"] })
        #expect(domain.filePresenters.first?.presentedItemURL == file)
    }

    @Test func rule53_theContentStepOfACoordinatedReadStopsWhenCancelled() throws {
        // ProviderContent is what a read in a ProviderFS mount runs between grant and accessor;
        // any file shows its loop. Cancelled after the first 1 MiB step, it stops there.
        let file = try temporaryDirectory().appendingPathComponent("big")
        try Data(repeating: 7, count: 4 << 20).write(to: file)
        var asked = 0
        do {
            try ProviderContent.makeAvailable(file.path) {
                asked += 1
                return asked > 1
            }
            Issue.record("not cancelled")
        } catch {
            #expect(error.code == .cancelled)
        }
        #expect(asked == 2)
        // Not cancelled: it reads to the end (4 steps and the end of file).
        asked = 0
        try ProviderContent.makeAvailable(file.path) {
            asked += 1
            return false
        }
        #expect(asked == 5)
        // A missing item and a directory need no download.
        try ProviderContent.makeAvailable(file.path + "-missing") { true }
        let directory = file.deletingLastPathComponent().path
        #expect(throws: Never.self) { try ProviderContent.makeAvailable(directory) { true } }
    }

    @Test func rule66_68_presenterRegistry() throws {
        let domain = self.domain
        let presenter = RecordingPresenter(URL(fileURLWithPath: "/tmp/fc-registry"))
        domain.removeFilePresenter(presenter)
        domain.addFilePresenter(presenter)
        domain.addFilePresenter(presenter)
        #expect(domain.filePresenters.count == 1)
        domain.removeFilePresenter(presenter)
        #expect(domain.filePresenters.isEmpty)
        #expect(host.dump().presenters.isEmpty)
    }
}
