// The grace period after a coordination server restart and the reclaims of claims granted before
// it (D-402), against the pure arbiter: no processes, no sleeps, an explicit clock.
import FileCoordination
import TestScheduling
import TestSupport
import Testing

extension ArbiterHarness {
    /// `holder` reclaims one claim per intent list; returns their ids (owner `owner`).
    @discardableResult
    mutating func reclaim(
        _ claims: [[ClaimIntent]], purpose: String, from holder: ClaimHolder, owner: UInt64 = 1, pid: Int32 = 100
    ) -> [ClaimID] {
        var requests: [ClaimRequest] = []
        for intents in claims {
            let id = ClaimID(owner: owner, local: nextLocal)
            nextLocal += 1
            requests.append(
                ClaimRequest(
                    id: id, pid: pid, purpose: purpose, intents: intents, waitDeadline: 0,
                    presenterTimeout: ArbiterHarness.second))
        }
        apply(arbiter.reclaim(requests, from: holder, now: now))
        return requests.map(\.id)
    }

    mutating func beginGrace(_ holders: Set<ClaimHolder>, seconds: UInt64 = 10) {
        arbiter.beginGrace(awaiting: holders, until: now + seconds * ArbiterHarness.second, now: now)
    }
}

@Suite(.blockingThreads) struct GraceRuleTests {
    let alpha = ClaimHolder(server: 500, owner: 1)
    let beta = ClaimHolder(server: 500, owner: 2)

    @Test func duringGraceANewClaimWaitsEvenWhenNothingConflictsYet() {
        var h = ArbiterHarness()
        h.beginGrace([alpha])
        #expect(h.arbiter.inGrace)
        let newcomer = h.claim([write("/d/f")], purpose: "new", owner: 7)
        #expect(!h.isGranted(newcomer) && h.failed[newcomer] == nil, "it waits: the holder may reclaim /d/f")
        #expect(h.arbiter.nextDeadline == h.now + 10 * ArbiterHarness.second)
        // The holder reclaims its write on the same file: granted, the newcomer keeps waiting behind it.
        let reclaimed = h.reclaim([[write("/d/f")]], purpose: "old", from: alpha)
        #expect(h.isGranted(reclaimed[0]))
        #expect(!h.arbiter.inGrace, "every awaited holder reclaimed: the grace period ends at once")
        #expect(!h.isGranted(newcomer))
        h.release(reclaimed[0])
        #expect(h.isGranted(newcomer))
    }

    @Test func aClaimThatDoesNotConflictIsGrantedAsSoonAsTheGraceEnds() {
        var h = ArbiterHarness()
        h.beginGrace([alpha, beta])
        let other = h.claim([read("/d/other")], purpose: "new", owner: 7)
        h.reclaim([[write("/d/f")]], purpose: "a", from: alpha)
        #expect(h.arbiter.inGrace && h.arbiter.awaitedHolders == [beta])
        #expect(!h.isGranted(other))
        #expect(
            h.arbiter.holdersGone([beta], now: h.now).map { action -> ClaimID? in
                if case .grant(let id, _) = action { return id }
                return nil
            } == [other])
        #expect(!h.arbiter.inGrace)
    }

    @Test func theGraceEndsAtItsDeadlineAndALateReclaimIsLost() {
        var h = ArbiterHarness()
        h.beginGrace([alpha], seconds: 2)
        let newcomer = h.claim([write("/d/f")], purpose: "new", owner: 7, wait: 30 * ArbiterHarness.second)
        h.advance(by: ArbiterHarness.second)
        #expect(!h.isGranted(newcomer) && h.arbiter.inGrace)
        h.advance(by: ArbiterHarness.second)
        #expect(!h.arbiter.inGrace)
        #expect(h.isGranted(newcomer), "nobody reclaimed in time: the newcomer is served")
        #expect(h.arbiter.events.contains { $0.text.contains("did not reclaim in time") })
        let late = h.reclaim([[write("/d/f")]], purpose: "old", from: alpha)
        #expect(h.failed[late[0]]?.code == .claimLost)
        #expect(h.failed[late[0]]?.message.contains("/d/f") == true)
    }

    @Test func aReclaimThatConflictsWithAnotherReclaimIsLostNotQueued() {
        var h = ArbiterHarness()
        h.beginGrace([alpha, beta])
        let first = h.reclaim([[write("/d/f")]], purpose: "a", from: alpha, owner: 1, pid: 41)
        let second = h.reclaim([[read("/d/f")], [read("/d/g")]], purpose: "b", from: beta, owner: 2)
        #expect(h.isGranted(first[0]))
        #expect(h.failed[second[0]]?.code == .claimLost)
        #expect(h.failed[second[0]]?.message.contains("pid 41") == true)
        #expect(h.isGranted(second[1]), "each claim of a holder is judged on its own")
    }

    @Test func onlyAwaitedHoldersReclaimAndOnlyOnce() {
        var h = ArbiterHarness()
        let stranger = h.reclaim([[write("/d/f")]], purpose: "x", from: alpha)
        #expect(h.failed[stranger[0]]?.code == .claimLost, "no grace period: nothing can be reclaimed")
        h.beginGrace([alpha, beta])
        let unknown = h.reclaim([[write("/d/g")]], purpose: "x", from: ClaimHolder(server: 499, owner: 1))
        #expect(h.failed[unknown[0]]?.code == .claimLost, "a holder the previous server did not list")
        h.reclaim([[write("/d/h")]], purpose: "a", from: alpha)
        let again = h.reclaim([[write("/d/i")]], purpose: "a", from: alpha)
        #expect(h.failed[again[0]]?.code == .claimLost, "a holder reclaims once")
    }

    @Test func reclaimsSendNoPresenterMessages() {
        var h = ArbiterHarness()
        let presenter = h.present("/d/f")
        h.beginGrace([alpha])
        let reclaimed = h.reclaim([[write("/d/f")]], purpose: "a", from: alpha)
        #expect(h.isGranted(reclaimed[0]))
        #expect(h.messages(to: presenter).isEmpty, "they were asked before the first grant")
        h.release(reclaimed[0])
        #expect(h.messages(to: presenter) == [.didChange], "the write's end is still announced")
    }

    @Test func aWaitingClaimTimesOutDuringTheGraceWithAReason() {
        var h = ArbiterHarness()
        h.beginGrace([alpha], seconds: 20)
        let short = h.claim([read("/d/x")], purpose: "new", owner: 7, wait: ArbiterHarness.second)
        h.advance(by: ArbiterHarness.second)
        #expect(h.failed[short]?.code == .timedOut)
        #expect(h.failed[short]?.message.contains("restarted") == true)
    }

    @Test func anEmptyOrPastGraceIsNoGrace() {
        var h = ArbiterHarness()
        h.beginGrace([])
        #expect(!h.arbiter.inGrace)
        h.arbiter.beginGrace(awaiting: [alpha], until: h.now, now: h.now)
        #expect(!h.arbiter.inGrace)
        let claim = h.claim([write("/d/f")], purpose: "p")
        #expect(h.isGranted(claim))
    }

    /// Random reclaims, claims, releases, departures and clock steps: at no point are two
    /// conflicting claims of different purposes granted together, reclaimed or new.
    @Test(arguments: [UInt64(1), 2, 3, 0x5eed])
    func grantedClaimsNeverConflictThroughRandomGraces(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let paths = ["/d/a", "/d/b", "/d/c"]
        for _ in 0..<40 {
            var h = ArbiterHarness()
            var intents: [ClaimID: ClaimIntent] = [:]
            var purposes: [ClaimID: String] = [:]
            let holders = (1...4).map { ClaimHolder(server: 9, owner: UInt64($0)) }
            h.beginGrace(Set(holders), seconds: 5)
            for step in 0..<60 {
                let path = paths[Int(random.next() % 3)]
                let intent = random.next() % 2 == 0 ? read(path) : write(path)
                let purpose = "p\(random.next() % 5)"
                switch random.next() % 5 {
                case 0:
                    let holder = holders[Int(random.next() % 4)]
                    for id in h.reclaim([[intent]], purpose: purpose, from: holder, owner: 100 + UInt64(step)) {
                        intents[id] = intent
                        purposes[id] = purpose
                    }
                case 1, 2:
                    let id = h.claim([intent], purpose: purpose, owner: 200 + UInt64(step))
                    intents[id] = intent
                    purposes[id] = purpose
                case 3:
                    if let id = h.granted.keys.sorted().first { h.release(id) }
                default:
                    h.advance(by: ArbiterHarness.second)
                }
                let held = h.granted.keys.sorted()
                for (index, a) in held.enumerated() {
                    for b in held[(index + 1)...] where purposes[a] != purposes[b] {
                        #expect(
                            !Arbiter.conflicts(intents[a]!, intents[b]!),
                            "seed \(seed): \(a) and \(b) granted together on \(intents[a]!.path)")
                    }
                }
                if h.arbiter.inGrace {
                    #expect(held.allSatisfy { $0.owner < 200 }, "seed \(seed): only reclaims are granted in grace")
                }
            }
        }
    }
}
