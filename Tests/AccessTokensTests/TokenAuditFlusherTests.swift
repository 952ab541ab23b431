// The audit flusher (D-347): entries of uses that change nothing else reach tokens-audit.jsonl from
// a thread of the authority's own, in order, within about 50 ms, also while the cooperative pool
// and Dispatch's global queues are saturated; on demand, at the mount's end and at deinit.

import Dispatch
import Foundation
import SystemSupport
import TestSupport
import Testing

@testable import AccessTokens

@Suite("Token audit flusher (D-347)", .timeLimit(.minutes(2)))
struct TokenAuditFlusherTests {
    static func lines(_ directory: String) -> [Substring] {
        let text = (try? String(contentsOfFile: directory + "/tokens-audit.jsonl", encoding: .utf8)) ?? ""
        return text.split(separator: "\n")
    }

    static func useLines(_ directory: String) -> Int {
        lines(directory).filter { $0.contains("\"event\":\"use\"") }.count
    }

    static func sequences(_ directory: String) -> [Int] {
        lines(directory).compactMap { line -> Int? in
            guard let range = line.range(of: "\"sequence\":") else { return nil }
            return Int(line[range.upperBound...].prefix { $0.isNumber })
        }
    }

    /// Polls (every millisecond, never past `limit`) until `condition` holds; how long it took.
    static func poll(limit: Duration = .seconds(10), _ condition: () -> Bool) -> Duration? {
        let clock = ContinuousClock()
        let start = clock.now
        while clock.now - start < limit {
            if condition() { return clock.now - start }
            usleep(1000)
        }
        return condition() ? clock.now - start : nil
    }

    @Test("uses reach the file from the flusher thread, in sequence order, without asking")
    func ordered() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        // A grant changes a token: its entry is in the file when grant returns.
        #expect(Self.lines(directory.path).count == 1)
        for _ in 0..<5 { #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil) }
        let took = Self.poll { Self.useLines(directory.path) == 5 }
        #expect(took != nil, "the file has \(Self.useLines(directory.path)) of 5 use entries")
        print("5 uses reached the file after \(took.map { "\($0)" } ?? "never")")
        #expect(Self.sequences(directory.path) == Array(1...6))
        // The thread counts a flush once it has written it: on a loaded machine the file can
        // already have the lines while the count is not yet up.
        #expect(Self.poll { fixture.authority.auditFlusher.flushCount >= 1 } != nil, "the flusher thread wrote them")
    }

    @Test("flushAuditLog appends at once; auditLog flushes first, so the file has what it answers")
    func onDemand() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        for _ in 0..<3 { _ = fixture.authority.recordUse(issued.token, caller: me) }
        fixture.authority.flushAuditLog()
        #expect(Self.useLines(directory.path) == 3)
        _ = fixture.authority.recordUse(issued.token, caller: me)
        let log = fixture.authority.auditLog()
        #expect(log.map(\.sequence) == Array(1...5).map(UInt64.init))
        #expect(Self.sequences(directory.path) == Array(1...5))
    }

    @Test("an authority's deinit appends what waits and stops its thread; the thread does not keep it alive")
    func deinitFlushes() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        weak var weakAuthority: TokenAuthority?
        let flusher: AuditFlusher
        do {
            let fixture = TokenFixture(directory: directory.path)
            let issued = try fixture.authority.grant(scope: scope, mode: .read)
            for _ in 0..<7 { _ = fixture.authority.recordUse(issued.token, caller: me) }
            weakAuthority = fixture.authority
            flusher = fixture.authority.auditFlusher
            #expect(flusher.isRunning)
        }
        #expect(weakAuthority == nil)
        #expect(!flusher.isRunning)
        #expect(Self.useLines(directory.path) == 7)
        #expect(Self.sequences(directory.path) == Array(1...8))
    }

    @Test("the flusher batches requests, flushes once more at stop, and refuses requests after it")
    func flusherUnit() {
        let flusher = AuditFlusher(delay: .milliseconds(50))
        #expect(!flusher.request())  // not started: the caller flushes itself
        let flushed = Locked(0)
        flusher.start { flushed.withLock { $0 += 1 } }
        for _ in 0..<1000 { #expect(flusher.request()) }
        #expect(Self.poll { flushed.value >= 1 } != nil)
        // A thousand requests made within a millisecond or so are one batch (a few at most on a
        // loaded machine that stops this thread for more than the delay between two of them).
        #expect(flushed.value <= 10, "\(flushed.value) flushes for 1,000 requests")
        let before = flushed.value
        flusher.stop()
        #expect(Self.poll { flushed.value == before + 1 } != nil)
        #expect(!flusher.request())
        #expect(!flusher.isRunning)
    }

    @Test("a burst of 10,000 uses: every entry reaches the file, in order")
    func burst() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        for _ in 0..<10_000 { _ = fixture.authority.recordUse(issued.token, caller: me) }
        #expect(Self.poll { Self.useLines(directory.path) == 10_000 } != nil)
        #expect(Self.sequences(directory.path) == Array(1...10_001))
    }

    @Test("entries reach the file while the cooperative pool and Dispatch's global queues are blocked")
    func underStarvation() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        let issued = try fixture.authority.grant(scope: scope, mode: .read)
        // Every cooperative thread but the one running this test, and far more global-queue
        // items than Dispatch has threads, wait on `release` until the entries are in the file.
        let release = DispatchSemaphore(value: 0)
        let started = Locked(0)
        let cooperative = ProcessInfo.processInfo.activeProcessorCount
        let dispatched = 64
        for _ in 0..<cooperative {
            Task.detached {
                started.withLock { $0 += 1 }
                release.wait()
            }
        }
        let probeRan = Locked(false)
        for index in 0..<dispatched {
            DispatchQueue.global(qos: index % 2 == 0 ? .default : .userInitiated).async {
                started.withLock { $0 += 1 }
                release.wait()
            }
        }
        DispatchQueue.global().async { probeRan.withLock { $0 = true } }
        defer { for _ in 0..<(cooperative + dispatched) { release.signal() } }
        // Blocked: at least the threads Dispatch and the pool have (more wait in their queues).
        #expect(Self.poll(limit: .seconds(5)) { started.value >= min(cooperative, 2) } != nil)
        for _ in 0..<100 { _ = fixture.authority.recordUse(issued.token, caller: me) }
        let took = Self.poll { Self.useLines(directory.path) == 100 }
        #expect(took != nil, "the file has \(Self.useLines(directory.path)) of 100 use entries")
        print(
            "100 uses reached the file after \(took.map { "\($0)" } ?? "never") with \(started.value) blockers "
                + "running; the global queue's probe \(probeRan.value ? "ran" : "had not run")")
        #expect(Self.sequences(directory.path) == Array(1...101))
    }
}
