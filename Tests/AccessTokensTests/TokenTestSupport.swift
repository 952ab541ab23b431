import AccessTokens
import Foundation
import SystemSupport
import TestSupport

/// A wall clock a test sets (and jumps).
final class ManualWallClock: Sendable {
    private let current = Locked(Date(timeIntervalSince1970: 1_800_000_000))
    var now: Date { current.value }
    func jump(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
    var read: @Sendable () -> Date { { self.now } }
}

/// Process start times a test controls: pid → start time.
final class FakeProcesses: Sendable {
    private let table = Locked<[Int32: UInt64]>([:])
    func set(_ pid: Int32, startedAt start: UInt64?) { table.withLock { $0[pid] = start } }
    var read: @Sendable (Int32) -> UInt64? { { pid in self.table.withLock { $0[pid] } } }
}

struct TokenFixture {
    let clock: ManualClock
    let wall: ManualWallClock
    let processes: FakeProcesses
    let authority: TokenAuthority

    init(
        directory: String? = nil, limits: TokenLimits = TokenLimits(), wall: ManualWallClock = ManualWallClock(),
        processes: FakeProcesses = FakeProcesses()
    ) {
        clock = ManualClock()
        self.wall = wall
        self.processes = processes
        authority = TokenAuthority(
            storeDirectory: directory, clock: clock, wallClock: wall.read, processStartTime: processes.read,
            limits: limits)
    }

    /// Another authority over the same directory, wall clock and processes: a restart, with a
    /// fresh monotonic clock. The daemon's end appends the audit entries still waiting for the
    /// flusher (D-347), so this does first.
    func restarted(directory: String, limits: TokenLimits = TokenLimits()) -> TokenFixture {
        authority.flushAuditLog()
        return TokenFixture(directory: directory, limits: limits, wall: wall, processes: processes)
    }
}

let me = TokenCaller(pid: 4242, uid: 1000)
let scope = TokenScope(identifier: "item-7", path: "Documents/report.pdf")
