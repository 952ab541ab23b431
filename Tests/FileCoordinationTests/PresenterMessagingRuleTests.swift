// Rules 17–42 of reference/apple-coordination-spec.md §7.2–7.3 and the deadline rules, against
// the pure arbiter with an explicit clock. Delivery order across presenters is not asserted
// (rule 29): tests look at each presenter's own messages.
import FileCoordination
import TestScheduling
import Testing

@Suite(.blockingThreads) struct PresenterMessagingRuleTests {
    @Test func rule17_readWaitsUntilPresenterRelinquishes() {
        var h = ArbiterHarness()
        let p = h.present("/d/f")
        let r = h.claim([read("/d/f", .withoutChanges)], purpose: "A")
        #expect(h.messages(to: p) == [.relinquishToReader])
        #expect(!h.isGranted(r))
        h.answerAll(p)
        #expect(h.isGranted(r))
    }

    @Test func rule18_readWithoutWithoutChangesAlsoAsksToSave() {
        var h = ArbiterHarness()
        let p = h.present("/d/f")
        let r = h.claim([read("/d/f")], purpose: "A")
        #expect(h.messages(to: p) == [.relinquishToReader], "save follows the relinquish answer")
        h.apply(h.arbiter.reply(messageID: h.deliveries[0].messageID, error: nil, now: h.now))
        #expect(h.messages(to: p) == [.relinquishToReader, .savePresentedItemChanges])
        #expect(!h.isGranted(r))
        h.answerAll(p)
        #expect(h.isGranted(r))
    }

    @Test func rule19_presentersOfEnclosingPackagesAtEveryLevelAreAsked() {
        var h = ArbiterHarness()
        let outer = h.present("/P.pkg", isDirectory: true, packageRoot: "/P.pkg")
        let inner = h.present("/P.pkg/Q.pkg", isDirectory: true, packageRoot: "/P.pkg")
        let plainParent = h.present("/", isDirectory: true)
        _ = h.claim([read("/P.pkg/Q.pkg/file", package: "/P.pkg")], purpose: "A")
        #expect(h.messages(to: outer) == [.relinquishToReader])
        #expect(h.messages(to: inner) == [.relinquishToReader])
        #expect(h.messages(to: plainParent).isEmpty)
    }

    @Test func rule20_plainWriteAsksItemAndPackagesButNotPlainAncestors() {
        var h = ArbiterHarness()
        let item = h.present("/d/P.pkg/f", packageRoot: "/d/P.pkg")
        let package = h.present("/d/P.pkg", isDirectory: true, packageRoot: "/d/P.pkg")
        let plain = h.present("/d", isDirectory: true)
        _ = h.claim([write("/d/P.pkg/f", package: "/d/P.pkg")], purpose: "A")
        #expect(h.messages(to: item) == [.relinquishToWriter])
        #expect(h.messages(to: package) == [.relinquishToWriter])
        #expect(h.messages(to: plain).isEmpty)
    }

    @Test(arguments: [WritingOptions.forDeleting, .forMoving, .forReplacing])
    func rule21_subtreeWriteAsksPresentersOfEverythingInside(options: WritingOptions) {
        var h = ArbiterHarness()
        let deep = h.present("/D/a/b")
        let dir = h.present("/D", isDirectory: true)
        _ = h.claim([write("/D", options, directory: true)], purpose: "A")
        #expect(h.messages(to: deep).first == .relinquishToWriter)
        #expect(h.messages(to: dir).first == .relinquishToWriter)
    }

    @Test(arguments: [WritingOptions.forDeleting, .forReplacing])
    func rule22_deletionIsAccommodatedByItemInsideAndPackages(options: WritingOptions) {
        var h = ArbiterHarness()
        let dir = h.present("/D", isDirectory: true)
        let inside = h.present("/D/x")
        let w = h.claim([write("/D", options, directory: true)], purpose: "A")
        h.answerAll(dir)
        h.answerAll(inside)
        #expect(h.messages(to: dir) == [.relinquishToWriter, .accommodateDeletion])
        #expect(h.messages(to: inside) == [.relinquishToWriter, .accommodateDeletion])
        #expect(h.isGranted(w))

        var k = ArbiterHarness()
        let package = k.present("/P.pkg", isDirectory: true, packageRoot: "/P.pkg")
        _ = k.claim([write("/P.pkg/x", options, package: "/P.pkg")], purpose: "A")
        k.answerAll(package)
        #expect(k.messages(to: package) == [.relinquishToWriter, .accommodateSubitemDeletion(at: "/P.pkg/x")])
    }

    @Test func rule23_deletingInsideAPackageIsAWriteOnThePackage() {
        var h = ArbiterHarness()
        let package = h.present("/P.pkg", isDirectory: true, packageRoot: "/P.pkg")
        _ = h.claim([write("/P.pkg/sub/x", .forDeleting, package: "/P.pkg")], purpose: "A")
        h.answerAll(package)
        #expect(!h.messages(to: package).contains(.accommodateDeletion))
        #expect(h.messages(to: package).first == .relinquishToWriter)
    }

    @Test func rule24_mergingAsksToSavePlainWriteDoesNot() {
        var h = ArbiterHarness()
        let p = h.present("/f")
        let merge = h.claim([write("/f", .forMerging)], purpose: "A")
        h.answerAll(p)
        #expect(h.messages(to: p) == [.relinquishToWriter, .savePresentedItemChanges])
        h.release(merge)
        h.clearDeliveries()
        _ = h.claim([write("/f")], purpose: "B")
        #expect(h.messages(to: p) == [.relinquishToWriter])
    }

    @Test func rule25_presenterErrorFailsTheClaimAndNothingIsGranted() {
        var h = ArbiterHarness()
        let p = h.present("/f")
        let w = h.claim([write("/f", .forDeleting)], purpose: "A")
        h.answerAll(p, error: "document is open")
        #expect(!h.isGranted(w))
        #expect(h.failed[w]?.code == .presenterFailed)
        #expect(h.failed[w]?.message.contains("document is open") == true)
        #expect(h.arbiter.claimCount == 0)
        #expect(h.messages(to: p).last == .reacquire, "the relinquished presenter gets its item back")
    }

    @Test func rule26_ownPresenterGetsNoMessagesFromItsCoordinator() {
        var h = ArbiterHarness()
        let own = h.present("/f", purpose: "A")
        let w = h.claim([write("/f", .forDeleting)], purpose: "A")
        #expect(h.isGranted(w) && h.messages(to: own).isEmpty)
        h.release(w)
        #expect(h.messages(to: own).isEmpty, "no didChange either")
    }

    @Test func rule28_presentersOwnSaveWriteRunsWhileTheReadWaitsForTheSave() {
        var h = ArbiterHarness()
        let p = h.present("/f", purpose: "P")
        let reader = h.claim([read("/f")], purpose: "A")
        h.apply(h.arbiter.reply(messageID: h.deliveries[0].messageID, error: nil, now: h.now))
        #expect(h.messages(to: p) == [.relinquishToReader, .savePresentedItemChanges])
        // While saving, P writes with a coordinator created with P: granted without waiting for the read.
        let save = h.claim([write("/f")], purpose: "P", owner: 9)
        #expect(h.isGranted(save) && !h.isGranted(reader))
        h.answerAll(p)
        #expect(!h.isGranted(reader), "the read still waits for the save's write claim")
        h.release(save)
        #expect(h.isGranted(reader))
    }

    @Test func rule29_anyDeliveryOrderAcrossPresenters() {
        var h = ArbiterHarness()
        let ps = (0..<5).map { h.present("/f", purpose: "P\($0)") }
        let w = h.claim([write("/f")], purpose: "A")
        #expect(Set(h.deliveries.map(\.presenter)) == Set(ps))
        for p in ps.reversed() { h.answerAll(p) }
        #expect(h.isGranted(w))
    }

    @Test func rule31_reacquirerAfterTheClaimEnds() {
        var h = ArbiterHarness()
        let p = h.present("/f")
        let w = h.claim([write("/f")], purpose: "A")
        h.answerAll(p)
        #expect(!h.messages(to: p).contains(.reacquire))
        h.release(w)
        let reacquire = h.deliveries.first { $0.message == .reacquire }
        #expect(reacquire?.presenter == p && reacquire?.claim == w && reacquire?.messageID == 0)
    }

    @Test func rule32_unimplementedMethodsAreSkipped() {
        var h = ArbiterHarness()
        let p = h.present("/f", methods: [.didChange])
        let r = h.claim([read("/f")], purpose: "A")
        #expect(h.isGranted(r) && h.messages(to: p).isEmpty)
    }

    @Test func silentPresenterCountsAsAnsweredAtItsDeadlineAndTheEventIsRecorded() {
        var h = ArbiterHarness()
        let p = h.present("/f", pid: 4242)
        let w = h.claim([write("/f")], purpose: "A", presenterTimeout: 2 * ArbiterHarness.second)
        #expect(h.messages(to: p) == [.relinquishToWriter] && !h.isGranted(w))
        #expect(h.arbiter.snapshot(now: h.now).first?.state == "messaging")
        h.advance(by: 2 * ArbiterHarness.second - 1)
        #expect(!h.isGranted(w))
        h.advance(by: 1)
        #expect(h.isGranted(w))
        let events = h.arbiter.snapshot(now: h.now).first?.events ?? []
        #expect(events.count == 1 && events[0].contains("pid 4242") && events[0].contains("did not answer"))
        #expect(h.arbiter.events.last?.claim == w)
    }

    @Test func onlyThePresentersOwnerCanAnswer() {
        var h = ArbiterHarness()
        let p = h.present("/f", owner: 9)
        let w = h.claim([write("/f")], purpose: "A")
        let message = h.deliveries[0].messageID
        h.apply(h.arbiter.reply(messageID: message, error: "forged veto", from: 3, now: h.now))
        #expect(!h.isGranted(w) && h.failed[w] == nil)
        h.apply(h.arbiter.reply(messageID: message, error: nil, from: p.owner, now: h.now))
        #expect(h.isGranted(w))
    }

    @Test func removedPresenterCountsAsAnswered() {
        var h = ArbiterHarness()
        let p = h.present("/f")
        let w = h.claim([write("/f")], purpose: "A")
        h.apply(h.arbiter.removePresenter(p, now: h.now))
        #expect(h.isGranted(w))
        #expect(h.arbiter.removePresenter(p, now: h.now).isEmpty, "rule 66: removing twice does nothing")
    }

    @Test func presenterOwnerGoneCountsAsAnswered() {
        var h = ArbiterHarness()
        _ = h.present("/f", owner: 5)
        let w = h.claim([write("/f")], purpose: "A")
        h.apply(h.arbiter.ownerGone(5, now: h.now))
        #expect(h.isGranted(w) && h.arbiter.presenterCount == 0)
    }

    @Test func rule35_36_37_moveTellsItemInsideAndContainers() {
        var h = ArbiterHarness()
        let dir = h.present("/a/D", isDirectory: true)
        let inside = h.present("/a/D/x/y")
        let parent = h.present("/a", isDirectory: true)
        let package = h.present("/P.pkg", isDirectory: true, packageRoot: "/P.pkg", methods: [.didChange])
        h.apply(h.arbiter.itemMoved(from: "/a/D", to: "/b/E", purpose: "A", now: h.now))
        #expect(h.messages(to: dir) == [.didMove(to: "/b/E")])
        #expect(h.messages(to: inside) == [.didMove(to: "/b/E/x/y")])
        #expect(h.messages(to: parent) == [.subitemDidMove(from: "/a/D", to: "/b/E")])
        #expect(h.messages(to: package).isEmpty)
        h.clearDeliveries()
        h.apply(h.arbiter.itemMoved(from: "/P.pkg/a", to: "/P.pkg/b", purpose: "A", now: h.now))
        #expect(h.messages(to: package) == [.didChange], "rule 37: package fallback")
        // The presenter now lives at the new path: a write there reaches it.
        h.clearDeliveries()
        _ = h.claim([write("/b/E/x/y")], purpose: "B")
        #expect(h.messages(to: inside) == [.relinquishToWriter])
    }

    @Test func aMoveBringsNoChange() {
        // rename(a, b) as the mount claims it: .forMoving on the source, .forReplacing on the
        // destination. The moved item's presenter hears didMove, its directory subitemDidMove,
        // and nobody didChange (the claim's end used to send didChange to whoever was at /d/b).
        var h = ArbiterHarness()
        let moved = h.present("/d/a")
        let dir = h.present("/d", isDirectory: true)
        let mover = h.claim([write("/d/a", .forMoving), write("/d/b", .forReplacing)], purpose: "M")
        h.answerAll(moved)
        #expect(h.isGranted(mover))
        h.apply(h.arbiter.itemMoved(from: "/d/a", to: "/d/b", purpose: "M", now: h.now))
        h.release(mover)
        #expect(h.messages(to: moved) == [.relinquishToWriter, .didMove(to: "/d/b"), .reacquire])
        #expect(h.messages(to: dir) == [.subitemDidMove(from: "/d/a", to: "/d/b")])
        // Alone, .forReplacing (Save As over a file): the replaced item's presenter was asked to
        // accommodate the deletion and hears no didChange after; the directory hears of the new file.
        h.clearDeliveries()
        let replaced = h.present("/d/c")
        let saveAs = h.claim([write("/d/c", .forReplacing)], purpose: "S")
        h.answerAll(replaced)
        #expect(h.isGranted(saveAs))
        h.release(saveAs)
        #expect(h.messages(to: replaced) == [.relinquishToWriter, .accommodateDeletion, .reacquire])
        #expect(h.messages(to: dir) == [.subitemDidChange(at: "/d/c")])
    }

    @Test func rule38_moveToTheSamePlaceSendsNothing() {
        var h = ArbiterHarness()
        _ = h.present("/f")
        #expect(h.arbiter.itemMoved(from: "/f", to: "/f", purpose: "A", now: h.now).isEmpty)
    }

    @Test func rule39_40_waitingClaimsFollowTheMoveExceptForReplacing() {
        var h = ArbiterHarness()
        let mover = h.claim([write("/a", .forMoving), write("/b", .forReplacing)], purpose: "M")
        let follower = h.claim([read("/a")], purpose: "R")
        let replacer = h.claim([write("/a", .forReplacing)], purpose: "W")
        h.apply(h.arbiter.itemMoved(from: "/a", to: "/b", purpose: "M", now: h.now))
        h.release(mover)
        #expect(h.granted[follower] == ["/b"])
        h.release(follower)
        #expect(h.granted[replacer] == ["/a"])
    }

    @Test func rule41_42_writeEndsWithDidChangeAndSubitemDidChange() {
        var h = ArbiterHarness()
        let file = h.present("/d/f", methods: [.didChange])
        let dir = h.present("/d", isDirectory: true)
        let w = h.claim([write("/d/f")], purpose: "A")
        #expect(h.isGranted(w))
        h.release(w)
        #expect(h.messages(to: file) == [.didChange])
        #expect(h.messages(to: dir) == [.subitemDidChange(at: "/d/f")])
        // Rule 42: creating a new file inside D is reported as subitemDidChange, not didAppear.
        h.clearDeliveries()
        let create = h.claim([write("/d/new")], purpose: "A")
        h.release(create)
        #expect(h.messages(to: dir) == [.subitemDidChange(at: "/d/new")])
    }

    @Test func rule27_versionEventsReachEvenTheWritersOwnPresenter() {
        var h = ArbiterHarness()
        let own = h.present("/d/f", purpose: "A")
        let dir = h.present("/d", isDirectory: true)
        let deaf = h.present("/d/f", methods: [.didChange])
        h.apply(h.arbiter.versionChanged(path: "/d/f", change: .gained, version: "/v/1", versionName: "1"))
        let event = PresenterMessage.versionChanged(change: .gained, item: "/d/f", version: "/v/1", versionName: "1")
        #expect(h.messages(to: own) == [event])
        #expect(h.messages(to: dir) == [event])
        #expect(h.messages(to: deaf).isEmpty)
    }

    @Test func readEndsWithoutDidChange() {
        var h = ArbiterHarness()
        let p = h.present("/f", methods: [.didChange])
        let r = h.claim([read("/f")], purpose: "A")
        h.release(r)
        #expect(h.messages(to: p).isEmpty)
    }

    @Test func rule53_cancelWhileMessagingStopsWaitingAndReturnsTheItem() {
        var h = ArbiterHarness()
        let p = h.present("/f")
        let w = h.claim([write("/f")], purpose: "A")
        h.cancel(w)
        #expect(h.failed[w]?.code == .cancelled)
        #expect(h.messages(to: p) == [.relinquishToWriter, .reacquire])
        // A late answer is ignored.
        h.answerAll(p)
        #expect(!h.isGranted(w))
    }
}
