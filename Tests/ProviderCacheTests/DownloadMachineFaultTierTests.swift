// The fault tier against the download rules alone (`DownloadMachine`): every fault of `providerfs
// fault`, as the download loop sees it, × {a first read, a read after part of the file is present,
// concurrent readers}. A scripted host plays the loop: it fetches what the machine asks, delivers
// bytes up to the fault's byte, and ends each fetch the way the fault ends it. No clock but the
// value passed in, no tasks, no sleeps.

import Testing

@testable import ProviderCache

@Suite("Fault tier: the download machine under every fault")
struct DownloadMachineFaultTierTests {
    static let size: Int64 = 400_000
    static let at: Int64 = 200_000

    /// How each fault of the CLI ends a fetch that reaches its byte, as the loop reports it.
    enum Ending: String, CaseIterable, Sendable {
        case failAt, stall, truncate, corrupt, changeVersion, offline

        /// Bytes of the fetch delivered before it ends (a corrupt fetch delivers none; offline
        /// fails when the stream is opened).
        func delivered(_ target: Range<Int64>) -> Range<Int64>? {
            switch self {
            case .corrupt, .offline: nil
            case .failAt, .stall, .truncate, .changeVersion:
                target.lowerBound < at ? target.lowerBound..<min(target.upperBound, at) : nil
            }
        }

        func end(progress: Bool) -> DownloadMachine.FetchEnd {
            switch self {
            case .failAt: .failed(CacheError(.downloadFailed, "transfer failed (injected)"), progress: progress)
            case .stall: .failed(CacheError(.timedOut, "no data"), progress: progress)
            // The stream ends cleanly, short of its range: the machine must see the lie.
            case .truncate: .completed(progress: progress)
            case .corrupt: .failed(CacheError(.corrupt, "checksum mismatch"), progress: false)
            case .changeVersion: .failed(CacheError(.stale, "changed"), progress: progress)
            case .offline: .failed(CacheError(.unreachable, "offline"), progress: false)
            }
        }

        /// The code every reader needing bytes past the fault gets.
        var code: CacheError.Code {
            switch self {
            case .failAt, .truncate: .downloadFailed
            case .stall: .timedOut
            case .corrupt: .corrupt
            case .changeVersion: .stale
            case .offline: .unreachable
            }
        }

        /// Whether the loop tries again (within the budget) rather than failing at once.
        var transient: Bool { self == .failAt || self == .truncate || self == .corrupt || self == .offline }
    }

    enum Situation: String, CaseIterable, Sendable {
        case firstRead, afterPartialCache, concurrentReaders
    }

    @Test(arguments: Ending.allCases, Situation.allCases)
    func machineUnderFault(ending: Ending, situation: Situation) throws {
        let present = situation == .afterPartialCache ? ByteRanges([0..<100_000]) : ByteRanges()
        var harness = DownloadHarness(size: Self.size, present: present)
        let ranges: [Range<Int64>] =
            situation == .concurrentReaders
            ? [0..<Self.size, 50_000..<100_000, 150_000..<Self.size, 300_000..<Self.size] : [0..<Self.size]
        var waiters: [(id: UInt64, range: Range<Int64>)] = []
        for range in ranges {
            if let id = harness.read(range) { waiters.append((id, range)) }
        }
        #expect(harness.downloadStarts == 1, "one download for every reader")

        // The loop, bounded: a fault that makes it spin forever fails here instead of hanging.
        var fetches = 0
        var ended = false
        for _ in 0..<200 {
            guard let target = harness.machine.nextFetch() else {
                if !harness.machine.finishUnlessNeeded(afterFailure: false) {
                    ended = true
                    break
                }
                continue
            }
            fetches += 1
            harness.machine.fetchStarted(target)
            var progress = false
            if let delivered = ending.delivered(target), !delivered.isEmpty {
                var position = delivered.lowerBound
                while position < delivered.upperBound {
                    let next = min(delivered.upperBound, position + (64 << 10))
                    harness.deliver(position..<next)
                    position = next
                }
                progress = true
            }
            switch harness.machine.fetchEnded(ending.end(progress: progress)) {
            case .next, .retryAfterDelay: continue
            case .fail(let actions):
                harness.apply(actions)
                if !harness.machine.finishUnlessNeeded(afterFailure: true) {
                    ended = true
                    break
                }
            }
            if ended { break }
        }
        #expect(ended, "the download ended (\(fetches) fetches)")

        // Every reader is answered once: those before the fault with their bytes, the others
        // with the fault's error.
        for waiter in waiters {
            let answers = harness.completed.filter { $0.id == waiter.id }
            #expect(answers.count == 1, "waiter \(waiter.range): \(answers.count) answers")
            // A corrupt fetch gives none of its bytes (it began before the fault's byte), and an
            // offline provider none at all: their waiters fail even before the fault's byte.
            if waiter.range.upperBound <= Self.at && ending != .corrupt && ending != .offline {
                #expect(answers.first?.error == nil, "waiter \(waiter.range): \(String(describing: answers.first))")
            } else {
                #expect(answers.first?.error?.code == ending.code, "waiter \(waiter.range)")
            }
        }
        // Never a byte past the fault; bytes before it (and those cached before) stay.
        #expect(
            harness.machine.present.firstMissing(in: 0..<min(Self.at, 100_000)) == nil || ending == .corrupt
                || ending == .offline)
        #expect(!harness.machine.present.contains(Self.at..<(Self.at + 1)))
        #expect(harness.machine.present.contains(present.isEmpty ? 0..<0 : 0..<100_000))
        // The failure is recorded with its byte; transient faults used the retry budget, no more.
        #expect(harness.machine.lastError?.code == (ending == .changeVersion ? .stale : ending.code))
        #expect(harness.machine.lastError?.offset != nil)
        let budget = harness.machine.options.maximumAttempts
        #expect(fetches <= (ending.transient ? budget + 2 : 2), "\(fetches) fetches")
        if ending == .changeVersion { #expect(harness.machine.retiredError?.code == .stale) }
    }
}
