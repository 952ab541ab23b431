// Rules 1–16 of reference/apple-coordination-spec.md §7.1, against the pure arbiter: no processes,
// no sleeps, an explicit clock.
import FileCoordination
import TestScheduling
import TestSupport
import Testing

@Suite(.blockingThreads) struct ClaimCompatibilityRuleTests {
    @Test func rule01_twoReadersShareAFile() {
        var h = ArbiterHarness()
        let a = h.claim([read("/d/f")], purpose: "A")
        let b = h.claim([read("/d/f")], purpose: "B")
        #expect(h.isGranted(a) && h.isGranted(b))
    }

    @Test func rule02_readWaitsForWriterAndIsGrantedAfterIt() {
        var h = ArbiterHarness()
        let w = h.claim([write("/d/f")], purpose: "A")
        let r = h.claim([read("/d/f")], purpose: "B")
        #expect(h.isGranted(w) && !h.isGranted(r))
        h.release(w)
        #expect(h.isGranted(r))
    }

    @Test func rule03_writeWaitsForAnyReadOrWrite() {
        var h = ArbiterHarness()
        let r = h.claim([read("/d/f")], purpose: "A")
        let w1 = h.claim([write("/d/f")], purpose: "B")
        #expect(!h.isGranted(w1))
        h.release(r)
        #expect(h.isGranted(w1))
        let w2 = h.claim([write("/d/f")], purpose: "C")
        #expect(!h.isGranted(w2))
        h.release(w1)
        #expect(h.isGranted(w2))
    }

    @Test func rule04_oneCoordinatorNeverWaitsForItself() {
        var h = ArbiterHarness()
        let both = h.claim([read("/d/f"), write("/d/f")], purpose: "A")
        #expect(h.isGranted(both))
        let again = h.claim([write("/d/f")], purpose: "A")
        #expect(h.isGranted(again))
    }

    @Test func rule05_samePurposeNeverWaitsEvenAcrossProcesses() {
        var h = ArbiterHarness()
        let a = h.claim([write("/d/f")], purpose: "shared", pid: 1, owner: 1)
        let b = h.claim([write("/d/f")], purpose: "shared", pid: 2, owner: 2)
        #expect(h.isGranted(a) && h.isGranted(b))
        let other = h.claim([read("/d/f")], purpose: "other", pid: 3, owner: 3)
        #expect(!h.isGranted(other))
    }

    @Test func rule08_writeInsidePackageWaitsForReadOfAnotherItemInIt() {
        var h = ArbiterHarness()
        let r = h.claim([read("/P.pkg/b", package: "/P.pkg")], purpose: "A")
        let w = h.claim([write("/P.pkg/a", package: "/P.pkg")], purpose: "B")
        #expect(h.isGranted(r) && !h.isGranted(w))
        h.release(r)
        #expect(h.isGranted(w))
        let r2 = h.claim([read("/P.pkg/b", package: "/P.pkg")], purpose: "C")
        #expect(!h.isGranted(r2))
        // Reads inside one package still share.
        h.release(w)
        let r3 = h.claim([read("/P.pkg/a", package: "/P.pkg")], purpose: "D")
        #expect(h.isGranted(r2) && h.isGranted(r3))
    }

    @Test func rule09_writeOnPackageAndReadInsideExcludeEachOther() {
        var h = ArbiterHarness()
        let r = h.claim([read("/P.pkg/x", package: "/P.pkg")], purpose: "A")
        let w = h.claim([write("/P.pkg", directory: true, package: "/P.pkg")], purpose: "B")
        #expect(!h.isGranted(w))
        h.release(r)
        #expect(h.isGranted(w))
        let r2 = h.claim([read("/P.pkg/x", package: "/P.pkg")], purpose: "C")
        #expect(!h.isGranted(r2))
    }

    @Test func rule10_readOnDirectoryIgnoresWritesInside() {
        var h = ArbiterHarness()
        let w = h.claim([write("/D/x")], purpose: "A")
        let r = h.claim([read("/D", directory: true)], purpose: "B")
        #expect(h.isGranted(w) && h.isGranted(r))
        h.release(w)
        let w2 = h.claim([write("/D/x")], purpose: "C")
        #expect(h.isGranted(w2))
    }

    @Test(arguments: [WritingOptions(), .forMerging, .contentIndependentMetadataOnly])
    func rule11_plainWriteOnDirectoryIgnoresClaimsInside(options: WritingOptions) {
        var h = ArbiterHarness()
        let inside = h.claim([write("/D/x")], purpose: "A")
        let onD = h.claim([write("/D", options, directory: true)], purpose: "B")
        #expect(h.isGranted(inside) && h.isGranted(onD))
        let later = h.claim([read("/D/y/z")], purpose: "C")
        #expect(h.isGranted(later))
    }

    @Test(arguments: [WritingOptions.forDeleting, .forMoving, .forReplacing])
    func rule12_subtreeWriteWaitsForEveryClaimInsideAtAnyDepth(options: WritingOptions) {
        var h = ArbiterHarness()
        let deep = h.claim([read("/D/a/b/c")], purpose: "A")
        let shallow = h.claim([write("/D/x")], purpose: "B")
        let onD = h.claim([write("/D", options, directory: true)], purpose: "C")
        #expect(!h.isGranted(onD))
        h.release(deep)
        #expect(!h.isGranted(onD))
        h.release(shallow)
        #expect(h.isGranted(onD))
    }

    @Test(arguments: [WritingOptions.forDeleting, .forMoving, .forReplacing])
    func rule13_claimsInsideWaitWhileSubtreeWriteIsQueuedOrHeld(options: WritingOptions) {
        var h = ArbiterHarness()
        let holder = h.claim([read("/D/a")], purpose: "A")
        let onD = h.claim([write("/D", options, directory: true)], purpose: "B")
        #expect(!h.isGranted(onD))
        // Queued: a new read inside D waits (FIFO behind the subtree write).
        let queuedBehind = h.claim([read("/D/other")], purpose: "C")
        #expect(!h.isGranted(queuedBehind))
        h.release(holder)
        #expect(h.isGranted(onD) && !h.isGranted(queuedBehind))
        // Held: likewise.
        let whileHeld = h.claim([write("/D/b/c")], purpose: "D")
        #expect(!h.isGranted(whileHeld))
        h.release(onD)
        #expect(h.isGranted(queuedBehind) && h.isGranted(whileHeld))
    }

    @Test func rule14_readOfFileIgnoresPlainWriteOnParent() {
        var h = ArbiterHarness()
        let parent = h.claim([write("/D", directory: true)], purpose: "A")
        let r = h.claim([read("/D/f")], purpose: "B")
        #expect(h.isGranted(parent) && h.isGranted(r))
    }

    @Test func rule15_forMovingOnFileIsAPlainWrite() {
        var h = ArbiterHarness()
        let r = h.claim([read("/D/f")], purpose: "A")
        let move = h.claim([write("/D/f", .forMoving)], purpose: "B")
        #expect(!h.isGranted(move))
        let sibling = h.claim([read("/D/g")], purpose: "C")
        #expect(h.isGranted(sibling))
        h.release(r)
        #expect(h.isGranted(move))
    }

    @Test func rule16_fifoWriterQueuedBeforeReaderIsGrantedFirst() {
        var h = ArbiterHarness()
        let r1 = h.claim([read("/f")], purpose: "A")
        let w = h.claim([write("/f")], purpose: "B")
        let r2 = h.claim([read("/f")], purpose: "C")
        #expect(h.isGranted(r1) && !h.isGranted(w) && !h.isGranted(r2))
        h.release(r1)
        #expect(h.isGranted(w) && !h.isGranted(r2))
        h.release(w)
        #expect(h.isGranted(r2))
    }

    @Test func amongManyHeldReadsAReadWaitsOnlyForTheWritersItConflictsWith() {
        // A read claim is checked against writers alone (read/read never conflicts): held reads,
        // however many, never block it, and every kind of writer still does.
        var h = ArbiterHarness()
        var reads: [ClaimID] = []
        for index in 0..<200 { reads.append(h.claim([read("/d/f\(index)")], purpose: "reader\(index)")) }
        #expect(reads.allSatisfy { h.isGranted($0) })
        let writer = h.claim([write("/d/f7")], purpose: "W")  // waits for reader 7
        let deleter = h.claim([write("/e", .forDeleting, directory: true)], purpose: "D")
        #expect(!h.isGranted(writer) && h.isGranted(deleter))
        let behindWriter = h.claim([read("/d/f7")], purpose: "R1")  // FIFO behind the queued writer
        let insideDeleted = h.claim([read("/e/x")], purpose: "R2")  // inside a granted subtree write
        let elsewhere = h.claim([read("/d/f8")], purpose: "R3")
        #expect(!h.isGranted(behindWriter) && !h.isGranted(insideDeleted) && h.isGranted(elsewhere))
        h.release(reads[7])
        #expect(h.isGranted(writer) && !h.isGranted(behindWriter))
        h.release(writer)
        h.release(deleter)
        #expect(h.isGranted(behindWriter) && h.isGranted(insideDeleted))
    }

    @Test func aKernelCallerInsideItsOwnClaimDoesNotQueueBehindAWriterWaitingForIt() {
        // Process 100 holds a read of /f and, inside its accessor, reads /f through the mount (a
        // claim acting for 300's ancestry, which includes 100). A writer queued meanwhile waits
        // for 100's claim; FIFO behind that writer would deadlock 100 until the deadline.
        var h = ArbiterHarness()
        let library = h.claim([read("/f")], purpose: "app", pid: 100)
        let writer = h.claim([write("/f")], purpose: "W", pid: 200)
        #expect(h.isGranted(library) && !h.isGranted(writer))
        let ownRead = h.claim([read("/f")], purpose: "mount", pid: 300, owner: 2, actingFor: [300, 100, 1])
        #expect(h.isGranted(ownRead))
        // Anyone else still queues behind the writer (FIFO, rule 16).
        let stranger = h.claim([read("/f")], purpose: "mount", pid: 400, owner: 2, actingFor: [400, 1])
        #expect(!h.isGranted(stranger))
        h.release(ownRead)
        h.release(library)
        #expect(h.isGranted(writer) && !h.isGranted(stranger))
        h.release(writer)
        #expect(h.isGranted(stranger))
    }

    @Test func aClaimHeldForAnotherProcessLetsThatProcessThroughOnceItsClientIsGone() {
        // D-406: wrapper 100 (owner 1) holds a write of /f and runs CMD 300. Once the wrapper is
        // gone CMD is init's child: its ancestry is [300, 1], which does not name 100.
        var h = ArbiterHarness()
        let wrapper = h.claim([write("/f")], purpose: "coordinate", pid: 100)
        #expect(h.isGranted(wrapper))
        let before = h.claim([write("/f")], purpose: "mount", pid: 300, owner: 2, actingFor: [300, 1])
        #expect(!h.isGranted(before), "CMD waits for its own claim while the claim names the wrapper")
        // The wrapper says the claim is CMD's: CMD's open that waited goes ahead at once…
        h.apply(h.arbiter.holdFor(1, pid: 300, now: h.now))
        #expect(h.isGranted(before))
        #expect(h.arbiter.snapshot(now: h.now).first { $0.id == wrapper }?.pid == 300)
        // …and so do its later opens and its children's, now nested inside the claim.
        let child = h.claim([write("/f")], purpose: "mount", pid: 301, owner: 2, actingFor: [301, 300, 1])
        #expect(h.isGranted(child))
        // Anyone else, the wrapper's pid included, still waits for the claim.
        let stranger = h.claim([read("/f")], purpose: "mount", pid: 100, owner: 2, actingFor: [100, 1])
        #expect(!h.isGranted(stranger))
        h.release(before)
        h.release(child)
        h.release(wrapper)
        #expect(h.isGranted(stranger))
        // Another owner's claims are not touched, and naming the pid again changes nothing.
        #expect(h.arbiter.holdFor(1, pid: 300, now: h.now).isEmpty)
    }

    @Test func immediateGrantsAskForTheAncestryOnlyWhenAWriterIsAround() {
        // D-229: the mount's opens ask the host at once; /proc is read for the caller's ancestry
        // only when some write claim could make it matter.
        let host = ArbiterHost()
        var asked = 0
        func claim(_ local: UInt64, _ intent: ClaimIntent, pid: Int32, ancestry: [Int32]) -> Bool {
            let request = ClaimRequest(
                id: ClaimID(owner: 1, local: local), pid: pid, purpose: "kernel.\(pid)", intents: [intent],
                waitDeadline: host.now, presenterTimeout: ArbiterHarness.second)
            return host.grantIfImmediate(request) {
                asked += 1
                return ancestry
            }
        }
        #expect(claim(1, read("/m/a"), pid: 10, ancestry: [10, 1]))
        #expect(claim(2, read("/m/b"), pid: 11, ancestry: [11, 1]))
        #expect(asked == 0, "reads among reads: nothing to ask")
        #expect(claim(3, write("/m/c"), pid: 20, ancestry: [20, 1]))
        #expect(asked == 1)
        // With a writer held, a read of its item is granted at once only to a process acting for
        // the writer's (its child), and the ancestry is asked each time.
        #expect(claim(4, read("/m/c"), pid: 21, ancestry: [21, 20, 1]))
        #expect(!claim(5, read("/m/c"), pid: 22, ancestry: [22, 1]))
        #expect(asked == 3)
        // Declined means untouched: the writer still holds /m/c alone, the child's read too.
        #expect(host.dump().claims.count == 4)
    }

    @Test func seededRandomClaimsNeverGrantTwoConflictingClaims() {
        // Random claims, releases, cancels and expiring deadlines over a small tree with hard
        // links (shared identities), a package and subtree writes. Debug builds also check every
        // blocker the conflict index finds against a scan of all claims (Arbiter.blocker).
        let seed = SeededRandom.seedFromEnvironment()
        var random = SeededRandom(seed: seed)
        var h = ArbiterHarness()
        let paths = ["/a", "/a/b", "/a/b/c", "/a/d", "/e", "/e/f", "/e/f/g"]
        var live: [ClaimID: (request: [ClaimIntent], purpose: String, pid: Int32, actingFor: [Int32])] = [:]
        var log: [String] = []
        func randomIntent() -> ClaimIntent {
            let path = paths[Int(random.next() % UInt64(paths.count))]
            var intent: ClaimIntent
            switch random.next() % 6 {
            case 0, 1: intent = read(path, directory: !path.hasSuffix("c") && !path.hasSuffix("g"))
            case 2, 3: intent = write(path)
            case 4: intent = write(path, .forDeleting, directory: true)
            default: intent = write(path, .forMoving)
            }
            if path.hasPrefix("/a/b") && random.next() % 2 == 0 { intent.packageRoot = "/a/b" }
            if path == "/e/f/g" || path == "/a/d" { intent.identity = ItemIdentity(device: 1, inode: 7) }  // hard links
            return intent
        }
        for step in 0..<3000 {
            switch random.next() % 10 {
            case 0...4:
                let intents = random.next() % 4 == 0 ? [randomIntent(), randomIntent()] : [randomIntent()]
                if intents.count == 2
                    && (intents[0].packageRoot ?? intents[0].path) == (intents[1].packageRoot ?? intents[1].path)
                {
                    continue
                }
                let purpose = "p\(random.next() % 6)"
                // Some claims act for a kernel caller's ancestry (D-126): never blocked by those
                // processes' granted claims.
                let pid = Int32(100 + random.next() % 4)
                let actingFor: [Int32] = random.next() % 3 == 0 ? [pid, Int32(100 + random.next() % 4)] : []
                let id = h.claim(
                    intents, purpose: purpose, pid: pid, actingFor: actingFor,
                    wait: UInt64(1 + random.next() % 5) * ArbiterHarness.second)
                live[id] = (intents, purpose, pid, actingFor)
                log.append("\(step): claim \(id) \(purpose) \(intents.map(\.kindDescription)) \(intents.map(\.path))")
            case 5...7:
                guard let id = live.keys.sorted().first(where: { _ in random.next() % 3 == 0 }) ?? live.keys.min()
                else { continue }
                h.release(id)
                live[id] = nil
                log.append("\(step): release \(id)")
            case 8:
                guard let id = live.keys.min(by: { _, _ in random.next() % 2 == 0 }) else { continue }
                h.cancel(id)
                if !h.isGranted(id) { live[id] = nil }
                log.append("\(step): cancel \(id)")
            default:
                h.advance(by: ArbiterHarness.second)
                log.append("\(step): +1s")
            }
            for id in h.failed.keys { live[id] = nil }
            let granted = live.filter { h.isGranted($0.key) }.sorted { $0.key < $1.key }
            for (i, a) in granted.enumerated() {
                for b in granted[(i + 1)...]
                where a.value.purpose != b.value.purpose && !a.value.actingFor.contains(b.value.pid)
                    && !b.value.actingFor.contains(a.value.pid)
                {
                    let clash = a.value.request.contains { x in
                        b.value.request.contains { y in Arbiter.conflicts(x, y) }
                    }
                    if clash {
                        let recent = log.suffix(30).joined(separator: "\n")
                        Issue.record("seed \(seed): \(a.key) and \(b.key) are both granted and conflict\n\(recent)")
                        return
                    }
                }
            }
        }
    }

    @Test func identityMatchesAcrossPaths() {
        // Two names of one inode (a hard link, or a stale path after an uncoordinated rename) are one item.
        var h = ArbiterHarness()
        let identity = ItemIdentity(device: 1, inode: 42)
        var a = write("/d/one")
        a.identity = identity
        var b = read("/d/two")
        b.identity = identity
        let first = h.claim([a], purpose: "A")
        let second = h.claim([b], purpose: "B")
        #expect(h.isGranted(first) && !h.isGranted(second))
    }

    @Test func unrelatedItemsNeverWait() {
        var h = ArbiterHarness()
        let a = h.claim([write("/d/ab")], purpose: "A")
        let b = h.claim([write("/d/a", .forDeleting, directory: true)], purpose: "B")
        #expect(h.isGranted(a) && h.isGranted(b), "/d/ab is not inside /d/a")
    }

    @Test func batchIsAllOrNothingAndKeepsItsPlaceInLine() {
        var h = ArbiterHarness()
        let held = h.claim([write("/b")], purpose: "A")
        let batch = h.claim([read("/a"), write("/b")], purpose: "B")
        #expect(!h.isGranted(batch))
        // The batch holds nothing while it waits, but it is in line before a later writer of /a.
        let other = h.claim([write("/a")], purpose: "C")
        #expect(!h.isGranted(other))
        h.release(held)
        #expect(h.granted[batch] == ["/a", "/b"] && !h.isGranted(other))
        h.release(batch)
        #expect(h.isGranted(other))
    }

    @Test func nestedClaimThatWouldWaitForTheCallersOwnClaimFailsAtOnce() {
        var h = ArbiterHarness()
        let outer = h.claim([write("/f")], purpose: "A")
        let inner = h.claim([read("/f")], purpose: "B", held: [outer])
        #expect(h.failed[inner]?.code == .wouldDeadlock)
        #expect(h.failed[inner]?.message.contains("deadlock") == true)
        #expect(h.arbiter.claimCount == 1)
    }

    @Test func nestedClaimDoesNotQueueBehindAClaimWaitingForTheCaller() {
        var h = ArbiterHarness()
        let outer = h.claim([read("/f")], purpose: "A")
        let writer = h.claim([write("/f")], purpose: "B", owner: 2)
        let inner = h.claim([read("/f")], purpose: "A", held: [outer])
        #expect(!h.isGranted(writer) && h.isGranted(inner))
    }

    @Test func kernelCallerIsNotBlockedByItsOwnProcessTreesClaim() {
        var h = ArbiterHarness()
        let held = h.claim([write("/m/f")], purpose: "cli", pid: 500)
        let fromChild = h.claim([read("/m/f")], purpose: "mount", pid: 501, actingFor: [501, 500, 1])
        let fromStranger = h.claim([read("/m/f")], purpose: "mount", pid: 777, actingFor: [777, 1])
        #expect(h.isGranted(held) && h.isGranted(fromChild) && !h.isGranted(fromStranger))
    }

    @Test func waitingClaimFailsWithTimedOutAtItsDeadline() {
        var h = ArbiterHarness()
        let held = h.claim([write("/f")], purpose: "A", pid: 7)
        let waiting = h.claim([write("/f")], purpose: "B", wait: 2 * ArbiterHarness.second)
        #expect(h.arbiter.nextDeadline == h.now + 2 * ArbiterHarness.second)
        h.advance(by: ArbiterHarness.second)
        #expect(h.failed[waiting] == nil)
        h.advance(by: ArbiterHarness.second)
        #expect(h.failed[waiting]?.code == .timedOut)
        #expect(h.failed[waiting]?.message.contains("pid 7") == true)
        h.release(held)
        #expect(!h.isGranted(waiting) && h.arbiter.claimCount == 0)
    }

    @Test func zeroDeadlineFailsAtOnceOnlyWhenBlocked() {
        var h = ArbiterHarness()
        let free = h.claim([write("/f")], purpose: "A", wait: 0)
        #expect(h.isGranted(free))
        let blocked = h.claim([write("/f")], purpose: "B", wait: 0)
        #expect(h.failed[blocked]?.code == .timedOut)
    }

    @Test func cancelStopsWaitingWithCancelled() {
        var h = ArbiterHarness()
        let held = h.claim([write("/f")], purpose: "A")
        let waiting = h.claim([write("/f")], purpose: "B")
        h.cancel(waiting)
        #expect(h.failed[waiting]?.code == .cancelled)
        h.release(held)
        #expect(!h.isGranted(waiting))
    }

    @Test func deadOwnerReleasesEverythingAtOnce() {
        var h = ArbiterHarness()
        _ = h.claim([write("/f")], purpose: "A", owner: 1)
        _ = h.claim([write("/g")], purpose: "A", owner: 1)
        let waiting = h.claim([read("/f"), read("/g")], purpose: "B", owner: 2)
        h.apply(h.arbiter.ownerGone(1, now: h.now))
        #expect(h.isGranted(waiting) && h.arbiter.claimCount == 1)
    }

    @Test func emptyOrDuplicateClaimIsRejected() {
        var h = ArbiterHarness()
        let empty = h.claim([], purpose: "A")
        #expect(h.failed[empty]?.code == .invalidRequest)
        let request = ClaimRequest(
            id: ClaimID(owner: 1, local: 99), pid: 1, purpose: "A", intents: [read("/f")], waitDeadline: .max,
            presenterTimeout: 1)
        h.apply(h.arbiter.submit(request, now: h.now))
        h.apply(h.arbiter.submit(request, now: h.now))
        #expect(h.failed[request.id]?.code == .invalidRequest)
    }

    @Test func snapshotShowsHeldAndWaitingWithPidAndAge() {
        var h = ArbiterHarness()
        _ = h.claim([write("/f")], purpose: "A", pid: 11)
        _ = h.claim([read("/f")], purpose: "B", pid: 12)
        h.now += 3 * ArbiterHarness.second
        let dump = h.arbiter.snapshot(now: h.now)
        #expect(dump.map(\.state) == ["held", "waiting"])
        #expect(dump.map(\.pid) == [11, 12])
        #expect(dump[0].age == 3 * ArbiterHarness.second)
        #expect(dump[0].intents[0].kindDescription == "write")
    }
}
