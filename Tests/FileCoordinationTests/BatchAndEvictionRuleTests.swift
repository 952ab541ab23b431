// Rules 33 (batch preparation) and 34 (eviction) of reference/apple-coordination-spec.md §7.2:
// first against the pure arbiter with an explicit clock, then through FileCoordinator in one process.
import Dispatch
import FileCoordination
import Foundation
import SystemSupport
import TestScheduling
import Testing

@Suite struct BatchAndEvictionArbiterRuleTests {
    @Test func rule33_prepareAsksItemAndEverythingInsideToSaveWithoutRelinquish() {
        var h = ArbiterHarness()
        let dir = h.present("/D", isDirectory: true)
        let deep = h.present("/D/a/b")
        let outside = h.present("/E/x")
        let batch = h.claim([read("/D", .preparing, directory: true)], purpose: "A")
        #expect(h.messages(to: dir) == [.savePresentedItemChanges])
        #expect(h.messages(to: deep) == [.savePresentedItemChanges])
        #expect(h.messages(to: outside).isEmpty)
        #expect(!h.isGranted(batch))
        h.answerAll(dir)
        h.answerAll(deep)
        #expect(h.isGranted(batch))
        h.release(batch)
        // No relinquish, so no reacquirer; no didChange either.
        #expect(h.messages(to: dir) == [.savePresentedItemChanges])
        #expect(h.messages(to: deep) == [.savePresentedItemChanges])
    }

    @Test func rule33_prepareWithoutChangesAsksNobodyAndNestedCallsStillRelinquish() {
        var h = ArbiterHarness()
        let deep = h.present("/D/f")
        let batch = h.claim([read("/D", [.withoutChanges, .preparing], directory: true)], purpose: "A")
        #expect(h.isGranted(batch))
        #expect(h.messages(to: deep).isEmpty)
        // The nested per-item call of the same coordinator still takes a claim and relinquishes.
        let nested = h.claim([read("/D/f", .withoutChanges)], purpose: "A", held: [batch])
        #expect(h.messages(to: deep) == [.relinquishToReader])
        h.answerAll(deep)
        #expect(h.isGranted(nested))
    }

    @Test func rule33_prepareDeletingAsksToAccommodateDeletionWithoutRelinquish() {
        var h = ArbiterHarness()
        let dir = h.present("/D", isDirectory: true)
        let inside = h.present("/D/x")
        let merging = h.present("/M")
        let batch = h.claim(
            [write("/D", [.forDeleting, .preparing], directory: true), write("/M", [.forMerging, .preparing])],
            purpose: "A")
        #expect(h.messages(to: dir) == [.accommodateDeletion])
        #expect(h.messages(to: inside) == [.accommodateDeletion])
        #expect(h.messages(to: merging) == [.savePresentedItemChanges])
        h.answerAll(dir)
        h.answerAll(inside)
        h.answerAll(merging)
        #expect(h.isGranted(batch))
    }

    @Test func rule33_prepareVetoFailsTheBatch() {
        var h = ArbiterHarness()
        let p = h.present("/D/x")
        let batch = h.claim([write("/D", [.forDeleting, .preparing], directory: true)], purpose: "A")
        h.answerAll(p, error: "unsaved")
        #expect(h.failed[batch]?.code == .presenterFailed)
    }

    @Test func rule34_evictionFailsWhenAPresenterDoesNotImplementIt() {
        var h = ArbiterHarness()
        let deaf = h.present("/D/f")  // .all lacks .accommodateEviction
        let e = h.claim([write("/D", .forEvicting, directory: true)], purpose: "A")
        #expect(h.failed[e]?.code == .presenterFailed)
        #expect(h.failed[e]?.message.contains("accommodatePresentedItemEviction") == true)
        #expect(h.messages(to: deaf).isEmpty)
        #expect(h.arbiter.claimCount == 0)
    }

    @Test func rule34_evictionSucceedsWhenThePresenterRemovesItselfFirst() {
        var h = ArbiterHarness()
        let p = h.present("/f", methods: PresenterMethods.all.union(.accommodateEviction))
        let e = h.claim([write("/f", .forEvicting)], purpose: "A")
        #expect(h.messages(to: p) == [.accommodateEviction])
        #expect(!h.isGranted(e))
        h.apply(h.arbiter.removePresenter(p, now: h.now))
        #expect(h.isGranted(e))
        // Its late completion answer changes nothing.
        h.apply(h.arbiter.reply(messageID: h.deliveries[0].messageID, error: nil, now: h.now))
        #expect(h.isGranted(e) && h.failed[e] == nil)
        h.release(e)
        #expect(h.messages(to: p) == [.accommodateEviction], "no didChange or reacquire after an eviction")
    }

    @Test func rule34_answeringWithoutRemovingOrWithAnErrorFailsTheEviction() {
        var h = ArbiterHarness()
        let methods = PresenterMethods.all.union(.accommodateEviction)
        let stays = h.present("/f", methods: methods)
        let e = h.claim([write("/f", .forEvicting)], purpose: "A")
        h.answerAll(stays)
        #expect(h.failed[e]?.code == .presenterFailed)
        #expect(h.failed[e]?.message.contains("without removing itself") == true)

        var k = ArbiterHarness()
        let vetoes = k.present("/f", methods: methods)
        let v = k.claim([write("/f", .forEvicting)], purpose: "A")
        k.answerAll(vetoes, error: "open in an editor")
        #expect(k.failed[v]?.message.contains("open in an editor") == true)

        var s = ArbiterHarness()
        _ = s.present("/f", methods: methods)
        let t = s.claim([write("/f", .forEvicting)], purpose: "A", presenterTimeout: 2 * ArbiterHarness.second)
        s.advance(by: 2 * ArbiterHarness.second)
        #expect(s.failed[t]?.message.contains("did not answer in time") == true)
    }

    @Test func rule34_evictionOfADirectoryWaitsForClaimsInsideAndADeadPresenterCountsAsRemoved() {
        var h = ArbiterHarness()
        let reader = h.claim([read("/D/f")], purpose: "B", owner: 2)
        #expect(h.isGranted(reader))
        let inside = h.present("/D/g", owner: 7, methods: PresenterMethods.all.union(.accommodateEviction))
        let e = h.claim([write("/D", .forEvicting, directory: true)], purpose: "A")
        #expect(h.messages(to: inside).isEmpty, "queued behind the read inside: nobody asked yet")
        h.release(reader)
        #expect(h.messages(to: inside) == [.accommodateEviction])
        h.apply(h.arbiter.ownerGone(7, now: h.now))
        #expect(h.isGranted(e))
    }

    @Test func rule34_ownPurposeAndUnrelatedPresentersDoNotVeto() {
        var h = ArbiterHarness()
        _ = h.present("/f", purpose: "A")  // rule 26: the evicting coordinator's own presenter
        _ = h.present("/g")
        let e = h.claim([write("/f", .forEvicting)], purpose: "A")
        #expect(h.isGranted(e))
    }
}

/// A presenter that accommodates evictions: removes itself from `domain`, then answers (or vetoes).
final class EvictablePresenter: FilePresenter, @unchecked Sendable {
    // Safe: `log` is only touched under `lock`; the other fields are immutable.
    let presentedItemURL: URL?
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()
    let domain: CoordinationDomain
    let veto: String?
    let removesItself: Bool
    private let lock = Lock()
    private var log: [String] = []

    init(_ url: URL, domain: CoordinationDomain, veto: String? = nil, removesItself: Bool = true) {
        presentedItemURL = url
        self.domain = domain
        self.veto = veto
        self.removesItself = removesItself
    }

    var implementedPresenterMethods: PresenterMethods { PresenterMethods.all.union(.accommodateEviction) }
    var events: [String] { lock.withLock { log } }
    private func note(_ text: String) { lock.withLock { log.append(text) } }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("save")
        completionHandler(nil)
    }
    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquishToReader")
        reader(nil)
    }
    func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("accommodateEviction")
        if let veto { return completionHandler(CoordinationError(.presenterFailed, veto)) }
        if removesItself { domain.removeFilePresenter(self) }
        completionHandler(nil)
    }
}

@Suite(.blockingThreads) final class BatchAndEvictionCoordinatorTests {
    let domain = CoordinationDomain(host: ArbiterHost())
    private var scratch: [URL] = []

    deinit {
        for url in scratch { try? FileManager.default.removeItem(at: url) }
    }

    func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("fcb-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        scratch.append(url)
        return url
    }

    @Test func rule33_prepareMessagesOnceThenNestedCallsRunUntilTheCompletionHandler() throws {
        let dir = try temporaryDirectory()
        let file = dir.appendingPathComponent("f")
        try Data("x".utf8).write(to: file)
        let presenter = RecordingPresenter(file)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        let coordinator = FileCoordinator(domain: domain)
        var seenAtStart: [String] = []
        var contents = ""
        try coordinator.prepare(forReadingItemsAt: [dir], writingItemsAt: []) { completionHandler in
            seenAtStart = presenter.events
            // The nested per-item call still takes a claim (and relinquishes), usually withoutChanges.
            try? coordinator.coordinate(readingItemAt: file, options: .withoutChanges) { url in
                contents = (try? String(contentsOf: url, encoding: .utf8)) ?? ""
            }
            // Completed from another thread, as Apple allows.
            DispatchQueue.global().async { completionHandler() }
        }
        #expect(seenAtStart == ["save"], "the batch asked the presenter inside to save, without relinquish")
        #expect(contents == "x")
        // The batch claim ends when the handler runs: a writer of another purpose then gets in.
        let other = FileCoordinator(domain: domain)
        other.deadlines = CoordinationDeadlines(claimWait: .seconds(5), presenterAnswer: .seconds(5))
        try other.coordinate(writingItemAt: dir) { _ in }
        #expect(eventually { presenter.events.starts(with: ["save", "relinquishToReader"]) })
    }

    @Test func rule33_prepareRejectsOptionsAppleRejectsAndAThrowingBatchEnds() throws {
        let dir = try temporaryDirectory()
        let coordinator = FileCoordinator(domain: domain)
        for (reading, writing) in [(ReadingOptions.resolvesSymbolicLink, WritingOptions()), ([], .forReplacing)] {
            let error = #expect(throws: CoordinationError.self) {
                try coordinator.prepare(
                    forReadingItemsAt: [dir], options: reading, writingItemsAt: [dir], options: writing
                ) { _ in Issue.record("batch ran") }
            }
            #expect(error?.code == .invalidRequest)
        }
        struct Boom: Error {}
        #expect(throws: Boom.self) {
            try coordinator.prepare(forReadingItemsAt: [], writingItemsAt: [dir]) { _ in throw Boom() }
        }
        // The throwing batch released its claim: another purpose can write now.
        let other = FileCoordinator(domain: domain)
        other.deadlines = CoordinationDeadlines(claimWait: .seconds(2), presenterAnswer: .seconds(2))
        try other.coordinate(writingItemAt: dir) { _ in }
    }

    @Test func rule33_asyncPrepareRunsNestedCalls() async throws {
        let dir = try temporaryDirectory()
        let coordinator = FileCoordinator(domain: domain)
        let result = try await coordinator.prepare(forReadingItemsAt: [dir], writingItemsAt: []) {
            try await coordinator.coordinate(readingItemAt: dir, options: .withoutChanges, performing: { $0.path })
        }
        #expect(result.hasSuffix(dir.lastPathComponent))
    }

    @Test func rule34_evictionFailsForAPresenterWithoutTheMethod() throws {
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = RecordingPresenter(file)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        do {
            try FileCoordinator(domain: domain).coordinate(evictingItemAt: file) { _ in
                Issue.record("evicted despite a presenter that cannot accommodate it")
            }
            Issue.record("no error")
        } catch let error as CoordinationError {
            #expect(error.code == .presenterFailed)
            #expect(error.message.contains("does not implement accommodatePresentedItemEviction"))
        }
        #expect(presenter.events.isEmpty)
    }

    @Test func rule34_presenterThatRemovesItselfLetsTheEvictionRun() throws {
        let file = try temporaryDirectory().appendingPathComponent("doc")
        let presenter = EvictablePresenter(file, domain: domain)
        domain.addFilePresenter(presenter)
        defer { domain.removeFilePresenter(presenter) }
        var ran = false
        try FileCoordinator(domain: domain).coordinate(evictingItemAt: file) { _ in ran = true }
        #expect(ran)
        #expect(presenter.events == ["accommodateEviction"])
        #expect(domain.filePresenters.isEmpty)
    }

    @Test func rule34_vetoOrStayingRegisteredFailsTheEviction() throws {
        let dir = try temporaryDirectory()
        for (veto, removes) in [("open in an editor", true), (nil, false)] as [(String?, Bool)] {
            let file = dir.appendingPathComponent(UUID().uuidString)
            let presenter = EvictablePresenter(file, domain: domain, veto: veto, removesItself: removes)
            domain.addFilePresenter(presenter)
            defer { domain.removeFilePresenter(presenter) }
            do {
                try FileCoordinator(domain: domain).coordinate(evictingItemAt: file) { _ in
                    Issue.record("evicted despite the presenter")
                }
                Issue.record("no error")
            } catch let error as CoordinationError {
                #expect(error.code == .presenterFailed)
                #expect(error.message.contains(veto ?? "without removing itself"))
            }
        }
    }
}
