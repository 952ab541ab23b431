// Presenters hear the provider (D-403): the arbiter's provider-change events send what a
// coordinated write, move or delete of the item would have sent, with no claim and no answer
// awaited.
import FileCoordination
import TestScheduling
import Testing

@Suite(.blockingThreads) struct ProviderChangeEventTests {
    @Test func providerChangeSendsWhatAFinishedWriteSends() {
        var h = ArbiterHarness()
        let file = h.present("/m/d/f", purpose: "A")
        let dir = h.present("/m/d", purpose: "A", isDirectory: true)
        let root = h.present("/m", purpose: "B", isDirectory: true)
        let other = h.present("/m/d/g")
        let package = h.present("/m/P.pkg", isDirectory: true, packageRoot: "/m/P.pkg", methods: [.didChange])
        let deaf = h.present("/m/d/f", methods: [.relinquishToWriter])
        h.apply(h.arbiter.itemChanged(path: "/m/d/f"))
        // Every presenter hears, whatever its purpose: the provider is nobody's writer.
        #expect(h.messages(to: file) == [.didChange])
        #expect(h.messages(to: dir) == [.subitemDidChange(at: "/m/d/f")])
        #expect(h.messages(to: root) == [.subitemDidChange(at: "/m/d/f")])
        #expect(h.messages(to: other).isEmpty)
        #expect(h.messages(to: deaf).isEmpty, "rule 32: a method not implemented is skipped")
        #expect(h.deliveries.allSatisfy { $0.messageID == 0 && $0.claim == nil })
        // The same as a write claim on the item ends with (Arbiter.finish).
        var w = ArbiterHarness()
        let wFile = w.present("/m/d/f", purpose: "A")
        let wDir = w.present("/m/d", purpose: "A", isDirectory: true)
        let claim = w.claim([write("/m/d/f")], purpose: "W")
        w.answerAll(wFile)
        w.clearDeliveries()
        w.release(claim)
        // (Its reacquirer ends the relinquish that the claim asked for; the provider asked none.)
        #expect(w.messages(to: wFile).filter { $0 != .reacquire } == h.messages(to: file))
        #expect(w.messages(to: wDir) == h.messages(to: dir))
        h.clearDeliveries()
        h.apply(h.arbiter.itemChanged(path: "/m/P.pkg/inner"))
        #expect(h.messages(to: package) == [.didChange], "rule 37: a package presenter without subitem methods")
    }

    @Test func providerDeleteTellsItemInsideAndContainersWithoutWaiting() {
        var h = ArbiterHarness()
        let dir = h.present("/m/D", isDirectory: true)
        let inside = h.present("/m/D/x")
        let parent = h.present("/m", isDirectory: true)
        let plainParent = h.present("/m", methods: [.subitemDidChange])
        let sibling = h.present("/m/E")
        h.apply(h.arbiter.itemDeleted(path: "/m/D"))
        #expect(h.messages(to: dir) == [.accommodateDeletion])
        #expect(h.messages(to: inside) == [.accommodateDeletion])
        #expect(h.messages(to: parent) == [.accommodateSubitemDeletion(at: "/m/D")])
        #expect(h.messages(to: plainParent) == [.subitemDidChange(at: "/m/D")])
        #expect(h.messages(to: sibling).isEmpty)
        // Told after the fact: no answer is awaited, no claim is made, presenters stay.
        #expect(h.deliveries.allSatisfy { $0.messageID == 0 })
        #expect(h.arbiter.claimCount == 0 && h.arbiter.presenterCount == 5)
        #expect(h.arbiter.nextDeadline == nil)
    }

    @Test func providerMoveFollowsThePresenterAndTellsEveryone() {
        var h = ArbiterHarness()
        let file = h.present("/m/d/a", purpose: "A")
        let dir = h.present("/m/d", purpose: "B", isDirectory: true)
        h.apply(h.arbiter.itemMoved(from: "/m/d/a", to: "/m/d/b", purpose: Arbiter.providerPurpose, now: h.now))
        #expect(h.messages(to: file) == [.didMove(to: "/m/d/b")])
        #expect(h.messages(to: dir) == [.subitemDidMove(from: "/m/d/a", to: "/m/d/b")])
        // The presenter now lives at the new name: a provider change there reaches it.
        h.clearDeliveries()
        h.apply(h.arbiter.itemChanged(path: "/m/d/b"))
        #expect(h.messages(to: file) == [.didChange])
    }

    @Test func isPresentedNearCoversItemAboveAndInside() {
        var h = ArbiterHarness()
        #expect(!h.arbiter.isPresented(near: "/m/d/f"))
        _ = h.present("/m/d", isDirectory: true)
        #expect(h.arbiter.isPresented(near: "/m/d"))
        #expect(h.arbiter.isPresented(near: "/m/d/f"), "a directory above")
        #expect(h.arbiter.isPresented(near: "/m"), "an item inside")
        #expect(!h.arbiter.isPresented(near: "/m/e/f"))
        #expect(!h.arbiter.isPresented(near: "/m/dd"), "a sibling sharing a prefix")
    }

    @Test func providerEventsWithNoPresenterSendNothing() {
        let arbiter = Arbiter()
        #expect(arbiter.itemChanged(path: "/m/f").isEmpty)
        #expect(arbiter.itemDeleted(path: "/m/f").isEmpty)
    }
}
