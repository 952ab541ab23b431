// The download rules as a pure state machine (`DownloadMachine`), tested the way the arbiter is:
// rule tests drive events and assert the actions and the state, and a seeded random run plays a
// host (a download loop that delivers only bytes it was asked to fetch) against it and checks the
// invariants after every event.
//
// Replay: PROVIDERFS_TEST_SEED=<seed> swift test --filter DownloadMachineTests

import TestSupport
import Testing

@testable import ProviderCache

/// Drives a machine with an explicit clock and records what it asked for.
struct DownloadHarness {
    var machine: DownloadMachine
    var now: Duration = .zero
    /// Waiters completed, with the error they got (nil: their bytes are present), in order.
    var completed: [(id: UInt64, error: CacheError?)] = []
    var downloadStarts = 0
    var downloadCancels = 0
    var persistsBeside = 0

    init(size: Int64 = 1 << 20, present: ByteRanges = ByteRanges(), options: CacheOptions = Self.options()) {
        machine = DownloadMachine(size: size, present: present, lastError: nil, options: options, identifier: "f")
    }

    static func options(background: Bool = true) -> CacheOptions {
        var options = CacheOptions()
        options.chunkSize = 64 << 10
        options.firstChunkSize = 64 << 10
        options.readAheadWindow = 256 << 10
        options.persistInterval = 512 << 10
        options.persistPeriod = .seconds(5)
        options.maximumAttempts = 3
        options.backgroundCompletion = background
        return options
    }

    /// A reader asks for `range`: nil when answered at once (ready or failed), else its waiter id.
    mutating func read(_ range: Range<Int64>) -> UInt64? {
        guard case .wait(let id) = machine.beginRead(range) else { return nil }
        apply(machine.register(id, range: range))
        return id
    }

    mutating func apply(_ actions: [DownloadAction]) {
        for action in actions {
            switch action {
            case .startDownload: downloadStarts += 1
            case .cancelDownload: downloadCancels += 1
            case .complete(let waiter, let error): completed.append((waiter, error))
            case .persistBeside: persistsBeside += 1
            }
        }
    }

    @discardableResult
    mutating func deliver(_ range: Range<Int64>, fetchStartedAt: Duration = .zero) -> Bool {
        let (actions, retarget) = machine.delivered(range, now: now, fetchStartedAt: fetchStartedAt)
        apply(actions)
        return retarget
    }

    func error(of id: UInt64) -> CacheError?? {
        completed.first { $0.id == id }.map(\.error)
    }
}

@Suite("Download machine: rules")
struct DownloadMachineRuleTests {
    @Test("present bytes are ready at once; a missing range waits and starts one download, which a second reader joins")
    func readersShareOneDownload() {
        var harness = DownloadHarness(present: ByteRanges([0..<4096]))
        #expect(harness.machine.beginRead(0..<4096) == .ready)
        let first = harness.read(0..<100_000)
        let second = harness.read(200_000..<300_000)
        #expect(first != nil && second != nil)
        #expect(harness.downloadStarts == 1)
        #expect(harness.machine.loopRunning && harness.machine.downloading)
        // The oldest waiter's first gap is fetched first, to the end of that gap.
        #expect(harness.machine.nextFetch() == 4096..<(1 << 20))
    }

    @Test("a waiter is completed only when every byte of its range is present, and only once")
    func deliveryCompletesWaiters() throws {
        var harness = DownloadHarness()
        let read = harness.read(0..<100_000)
        let id = try #require(read)
        _ = harness.machine.nextFetch()
        harness.machine.fetchStarted(0..<(1 << 20))
        harness.deliver(0..<65536)
        #expect(harness.completed.isEmpty)
        harness.deliver(65536..<131072)
        #expect(harness.completed.count == 1)
        #expect(harness.error(of: id) == .some(nil))
        harness.deliver(131072..<196608)
        #expect(harness.completed.count == 1)
    }

    @Test("a cancelled reader is completed with .cancelled: at once when waiting, at registration when not yet")
    func cancellation() throws {
        var harness = DownloadHarness()
        let read = harness.read(0..<10)
        let waiting = try #require(read)
        harness.apply(harness.machine.cancel(waiting))
        #expect(harness.error(of: waiting)??.code == .cancelled)
        #expect(harness.machine.waiters.isEmpty)
        // Cancelled between beginRead and register (the task's handler ran first).
        guard case .wait(let early) = harness.machine.beginRead(0..<10) else {
            Issue.record("missing bytes must wait")
            return
        }
        harness.apply(harness.machine.cancel(early))
        #expect(harness.error(of: early) == nil, "not completed before it registers")
        harness.apply(harness.machine.register(early, range: 0..<10))
        #expect(harness.error(of: early)??.code == .cancelled)
        #expect(harness.completed.count == 2)
    }

    @Test("retiring fails the waiters and later reads of missing bytes, keeps present bytes, stops the download")
    func retirement() throws {
        var harness = DownloadHarness(present: ByteRanges([0..<10]))
        let read = harness.read(0..<100)
        let id = try #require(read)
        harness.apply(harness.machine.retire(CacheError(.stale, "changed")))
        #expect(harness.error(of: id)??.code == .stale)
        #expect(harness.downloadCancels == 1)
        #expect(harness.machine.beginRead(0..<10) == .ready)
        #expect(harness.machine.beginRead(0..<11) == .failed(CacheError(.stale, "changed")))
        #expect(harness.machine.nextFetch() == nil)
        let goesOn = harness.machine.finishUnlessNeeded(afterFailure: false)
        #expect(!goesOn)
        #expect(!harness.machine.loopRunning)
    }

    @Test("transient failures are retried maximumAttempts times in a row, then every waiter fails and it is recorded")
    func retryBudget() throws {
        var harness = DownloadHarness()
        let read = harness.read(0..<10)
        let id = try #require(read)
        let failure = CacheError(.unreachable, "down")
        #expect(harness.machine.fetchEnded(.failed(failure, progress: false)) == .retryAfterDelay(attempt: 1))
        #expect(harness.machine.fetchEnded(.failed(failure, progress: false)) == .retryAfterDelay(attempt: 2))
        guard case .fail(let actions) = harness.machine.fetchEnded(.failed(failure, progress: false)) else {
            Issue.record("the third failure in a row is fatal")
            return
        }
        harness.apply(actions)
        #expect(harness.error(of: id) == .some(failure))
        #expect(harness.machine.lastError == RecordedError(code: .unreachable, message: "down", offset: 0))
        // Progress resets the budget.
        let second = harness.read(0..<10)
        let again = try #require(second)
        let goesOn = harness.machine.finishUnlessNeeded(afterFailure: true)
        #expect(goesOn)
        #expect(harness.machine.fetchEnded(.failed(failure, progress: true)) == .retryAfterDelay(attempt: 1))
        _ = again
    }

    @Test("a version gone from the provider fails its waiters as deleted and is retired")
    func notFoundRetires() throws {
        var harness = DownloadHarness()
        let read = harness.read(0..<10)
        let id = try #require(read)
        guard
            case .fail(let actions) = harness.machine.fetchEnded(
                .failed(CacheError(.notFound, "gone"), progress: false))
        else {
            Issue.record("notFound is fatal at once")
            return
        }
        harness.apply(actions)
        #expect(harness.error(of: id)??.code == .deletedRemotely)
        #expect(harness.machine.retiredError?.code == .deletedRemotely)
    }

    @Test("a range-map save beside the download is due by bytes or by time on the clock passed in, one at a time")
    func persistenceIsDue() {
        var harness = DownloadHarness()
        _ = harness.machine.requestBackgroundDownload()
        harness.deliver(0..<(128 << 10))
        #expect(harness.persistsBeside == 0)
        harness.deliver((128 << 10)..<(256 << 10))
        #expect(harness.persistsBeside == 1, "half of persistInterval reached")
        harness.deliver((256 << 10)..<(768 << 10))
        #expect(harness.persistsBeside == 1, "one save at a time")
        harness.machine.backgroundPersistEnded()
        #expect(harness.machine.persistSnapshot(now: harness.now) != nil)
        harness.now = .seconds(3)
        harness.deliver((768 << 10)..<(769 << 10))
        #expect(harness.persistsBeside == 2, "half of persistPeriod passed since the last save started")
        // Nothing new since a save: nothing to save.
        let snapshot = harness.machine.persistSnapshot(now: harness.now)
        #expect(snapshot != nil)
        harness.machine.persisted(snapshot!.0, lastError: snapshot!.1)
        #expect(harness.machine.persistSnapshot(now: harness.now) == nil)
    }

    @Test(
        "a fetch reported completed without its whole range fails: a short stream taken at its word ends the download")
    func completedButShortIsAFailure() throws {
        var harness = DownloadHarness(size: 1000)
        let read = harness.read(0..<1000)
        let id = try #require(read)
        // A host that counts a truncated stream as completed, at most 100 times: the machine
        // must end it within the retry budget (it used to ask for the same gap forever).
        var fetches: [Range<Int64>] = []
        var outcome: DownloadMachine.AfterFetch?
        for _ in 0..<100 {
            guard let target = harness.machine.nextFetch() else { break }
            fetches.append(target)
            harness.machine.fetchStarted(target)
            if target.lowerBound < 500 { harness.deliver(target.lowerBound..<500) }
            let after = harness.machine.fetchEnded(.completed(progress: target.lowerBound < 500))
            if case .fail(let actions) = after {
                harness.apply(actions)
                outcome = after
                break
            }
        }
        #expect(fetches == [0..<1000, 500..<1000, 500..<1000])
        #expect(outcome != nil)
        #expect(harness.error(of: id)??.code == .downloadFailed)
        #expect(
            harness.machine.lastError
                == RecordedError(
                    code: .downloadFailed, message: "the provider ended the transfer at byte 500 of 1000", offset: 500))
        #expect(harness.machine.present == ByteRanges([0..<500]))
    }

    @Test("a corrupt fetch delivers nothing, is retried within the budget, and is recorded at the fetch's start")
    func corruptFetch() throws {
        var harness = DownloadHarness(size: 1000, present: ByteRanges([0..<100]))
        let read = harness.read(0..<1000)
        let id = try #require(read)
        let corrupt = CacheError(.corrupt, "bytes 100..<1000 do not match their checksum")
        for attempt in 1...3 {
            let next = harness.machine.nextFetch()
            let target = try #require(next)
            #expect(target == 100..<1000, "only the missing range, every time")
            harness.machine.fetchStarted(target)
            let after = harness.machine.fetchEnded(.failed(corrupt, progress: false))
            if attempt < 3 {
                #expect(after == .retryAfterDelay(attempt: attempt))
            } else if case .fail(let actions) = after {
                harness.apply(actions)
            } else {
                Issue.record("the third corrupt fetch in a row is fatal")
            }
        }
        #expect(harness.error(of: id) == .some(corrupt))
        #expect(harness.machine.lastError == RecordedError(code: .corrupt, message: corrupt.message, offset: 100))
        #expect(harness.machine.present == ByteRanges([0..<100]))
    }

    @Test("the failure recorded is the one readers got: a version gone reads as deleted (EIO), not as not found")
    func recordedAsDelivered() throws {
        var harness = DownloadHarness()
        _ = harness.read(8192..<9000)
        harness.machine.fetchStarted(0..<(1 << 20))
        harness.deliver(0..<4096)
        guard
            case .fail(let actions) = harness.machine.fetchEnded(.failed(CacheError(.notFound, "gone"), progress: true))
        else {
            Issue.record("notFound is fatal at once")
            return
        }
        harness.apply(actions)
        #expect(harness.completed.first?.error?.code == .deletedRemotely)
        #expect(harness.machine.lastError?.code == .deletedRemotely)
        #expect(harness.machine.lastError?.offset == 4096)
    }

    @Test("a background download asked for while a failed download winds down goes on, shown as downloading")
    func downloadRequestedAfterAFailure() throws {
        var harness = DownloadHarness()
        let read = harness.read(0..<10)
        _ = try #require(read)
        let failure = CacheError(.downloadFailed, "broken")
        var after = DownloadMachine.AfterFetch.next
        for _ in 0..<3 {
            let next = harness.machine.nextFetch()
            harness.machine.fetchStarted(try #require(next))
            after = harness.machine.fetchEnded(.failed(failure, progress: false))
        }
        guard case .fail(let actions) = after else {
            Issue.record("three failures in a row are fatal")
            return
        }
        harness.apply(actions)
        #expect(!harness.machine.downloading, "error")
        // `providerfs download` while the loop still saves the range map.
        #expect(harness.machine.requestBackgroundDownload() == [])
        #expect(harness.machine.downloading, "shown as downloading at once")
        let goesOn = harness.machine.finishUnlessNeeded(afterFailure: true)
        #expect(goesOn)
        #expect(harness.machine.nextFetch() == 0..<(1 << 20))
        // With a fresh budget.
        #expect(harness.machine.fetchEnded(.failed(failure, progress: false)) == .retryAfterDelay(attempt: 1))
    }

    @Test(
        "more is fetched only after a save when the bytes the store lacks would pass persistInterval; not while saves fail"
    )
    func saveBeforeFetchingMore() {
        var harness = DownloadHarness()
        _ = harness.machine.requestBackgroundDownload()
        #expect(!harness.machine.mustSave(before: 1 << 20), "nothing unsaved yet")
        harness.deliver(0..<(448 << 10))
        #expect(harness.machine.unsavedBytes == 448 << 10)
        #expect(!harness.machine.mustSave(before: 64 << 10), "448 + 64 KiB is within 512 KiB")
        #expect(harness.machine.mustSave(before: (64 << 10) + 1))
        // A save taken now: until it is in the store, the bytes still count as unsaved.
        let snapshot = harness.machine.persistSnapshot(now: harness.now)
        #expect(harness.machine.mustSave(before: 128 << 10))
        harness.machine.persisted(snapshot!.0, lastError: snapshot!.1)
        #expect(harness.machine.unsavedBytes == 0)
        #expect(!harness.machine.mustSave(before: 512 << 10))
        // A failing save: the host is not made to wait for saves that cannot happen.
        harness.deliver((448 << 10)..<(960 << 10))
        _ = harness.machine.persistSnapshot(now: harness.now)
        harness.machine.persistFailed()
        #expect(!harness.machine.mustSave(before: 64 << 10))
    }

    @Test("ranges only: the read-ahead window after the last request bounds the download")
    func readAheadWindow() throws {
        var harness = DownloadHarness(options: DownloadHarness.options(background: false))
        let read = harness.read(0..<1000)
        _ = try #require(read)
        // A waiter's gap is fetched up to the window after it; the window bounds what is read
        // ahead of it.
        let window: Range<Int64> = 0..<(1000 + (256 << 10))
        let target = harness.machine.nextFetch()
        #expect(target == window)
        harness.machine.fetchStarted(window)
        let early = harness.deliver(0..<1000)
        #expect(!early)
        let covered = harness.deliver(1000..<(1000 + (256 << 10)))
        #expect(covered, "window covered, nobody waits: stop")
        #expect(harness.machine.nextFetch() == nil)
    }
}

@Suite("Download machine: invariants under random events")
struct DownloadMachineRandomTests {
    @Test("bytes are present only once delivered; every waiter is completed exactly once; no byte is fetched twice")
    func randomEvents() {
        let baseSeed = SeededRandom.seedFromEnvironment()
        for run in 0..<40 {
            let seed = baseSeed &+ UInt64(run)
            if let failure = Self.play(seed: seed) {
                Issue.record("\(failure) — seed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed))")
                return
            }
        }
    }

    /// One random run; the first broken invariant, if any.
    static func play(seed: UInt64) -> String? {
        var random = SeededRandom(seed: seed)
        let size = Int64(1 + random.next() % 600_000)
        var harness = DownloadHarness(size: size, options: DownloadHarness.options(background: random.next() % 2 == 0))
        var delivered = ByteRanges()
        var registered: [UInt64: Range<Int64>] = [:]
        var running = false
        var fetch: Range<Int64>?
        var cursor: Int64 = 0
        var checkedCompletions = 0
        for step in 0..<300 {
            let startsBefore = harness.downloadStarts
            switch random.next() % 10 {
            case 0, 1, 2:
                let start = Int64(random.next() % UInt64(size))
                let end = min(size, start + Int64(1 + random.next() % 150_000))
                switch harness.machine.beginRead(start..<end) {
                case .ready:
                    if !delivered.contains(start..<end) { return "step \(step): ready before delivered" }
                case .failed: if harness.machine.retiredError == nil { return "step \(step): failed unretired" }
                case .wait(let id):
                    registered[id] = start..<end
                    harness.apply(harness.machine.register(id, range: start..<end))
                }
            case 3:
                if let id = registered.keys.sorted().randomElement(using: &random) {
                    harness.apply(harness.machine.cancel(id))
                }
            case 4:
                harness.apply(harness.machine.requestBackgroundDownload())
            case 5:
                if random.next() % 8 == 0 { harness.apply(harness.machine.retire(CacheError(.stale, "changed"))) }
            default:
                // The host's loop, one move at a time.
                guard running else { break }
                if let target = fetch {
                    if random.next() % 12 == 0 {
                        fetch = nil
                        let end = DownloadMachine.FetchEnd.failed(
                            CacheError(.unreachable, "x"), progress: cursor > target.lowerBound)
                        switch harness.machine.fetchEnded(end) {
                        case .next, .retryAfterDelay: break
                        case .fail(let actions):
                            harness.apply(actions)
                            if !harness.machine.finishUnlessNeeded(afterFailure: true) { running = false }
                        }
                        break
                    }
                    let length = harness.machine.chunkLength(at: cursor, end: target.upperBound, previous: nil)
                    let chunk = cursor..<(cursor + Int64(length))
                    delivered.insert(chunk)
                    let retarget = harness.deliver(chunk)
                    cursor = chunk.upperBound
                    if retarget || cursor >= target.upperBound {
                        fetch = nil
                        _ = harness.machine.fetchEnded(retarget ? .retarget : .completed(progress: true))
                    }
                } else if let target = harness.machine.nextFetch() {
                    if harness.machine.present.missing(in: target) != [target] {
                        return "step \(step): fetch \(target) overlaps present bytes \(harness.machine.present)"
                    }
                    harness.machine.fetchStarted(target)
                    fetch = target
                    cursor = target.lowerBound
                } else if !harness.machine.finishUnlessNeeded(afterFailure: false) {
                    running = false
                }
            }
            if harness.downloadStarts > startsBefore {
                if running || harness.downloadStarts > startsBefore + 1 { return "step \(step): a second download" }
                running = true
                fetch = nil
            }
            // Invariants after every event.
            if !Self.subset(harness.machine.present, of: delivered, size: size) {
                return "step \(step): present \(harness.machine.present) beyond delivered \(delivered)"
            }
            for completion in harness.completed[checkedCompletions...] {
                guard let range = registered[completion.id] else { return "step \(step): unknown waiter completed" }
                if completion.error == nil, !delivered.contains(range) {
                    return "step \(step): waiter \(completion.id) succeeded before its bytes were delivered"
                }
            }
            checkedCompletions = harness.completed.count
            let ids = harness.completed.map(\.id)
            if Set(ids).count != ids.count { return "step \(step): a waiter completed twice" }
            if harness.machine.loopRunning != running {
                return "step \(step): loopRunning \(harness.machine.loopRunning)"
            }
        }
        // The end: retiring completes whoever still waits; then every waiter was completed once.
        harness.apply(harness.machine.retire(CacheError(.cancelled, "shutdown")))
        let ids = harness.completed.map(\.id)
        if Set(ids).count != ids.count { return "end: a waiter completed twice" }
        if Set(ids) != Set(registered.keys) {
            return "end: waiters never completed: \(Set(registered.keys).subtracting(ids))"
        }
        return nil
    }

    /// Every byte of `small` is in `large`: no byte of `small` lies in a gap of `large`.
    static func subset(_ small: ByteRanges, of large: ByteRanges, size: Int64) -> Bool {
        large.missing(in: 0..<size).allSatisfy { gap in !intersects(small, gap) }
    }

    static func intersects(_ ranges: ByteRanges, _ range: Range<Int64>) -> Bool {
        ranges.missing(in: range) != [range]
    }
}
