// The adapter's half of D-400: FUSE_INTERRUPT reaches the request's task as a cancellation
// (which the file system's waits observe: WriteClaimAtOpenTests, WriteBackTests), also when the
// interrupt comes before the task was attached, and never answers the request by itself.

import CFuse3
import SystemSupport
import TestSupport
import Testing

@testable import FUSEAdapter

@Suite struct InterruptPlumbingTests {
    /// A request handle that is never handed to libfuse (no reply is sent in this test).
    static let fake = FUSERequest(raw: OpaquePointer(bitPattern: 0x1000)!)

    /// A task that waits (up to a minute) until it is cancelled, and whether it was (set when it
    /// ends).
    static func waitingTask() -> (task: Task<Void, Never>, cancelled: Locked<Bool?>) {
        let cancelled = Locked<Bool?>(nil)
        let task = Task {
            try? await Task.sleep(for: .seconds(60))
            cancelled.withLock { $0 = Task.isCancelled }
        }
        return (task, cancelled)
    }

    @Test func anInterruptCancelsTheRequestsTaskAndLeavesTheAnswerToIt() async throws {
        let pending = PendingReplies()
        let id = try #require(pending.register(Self.fake))
        let (task, cancelled) = Self.waitingTask()
        pending.attach(id, task: task)
        pending.interrupt(id)
        try await withDeadline(.seconds(10), "the interrupted task") { await task.value }
        #expect(cancelled.value == true)
        #expect(pending.isWaiting(id), "the interrupt answered the request itself")
        var answers = 0
        pending.complete(id) { _ in answers += 1 }
        pending.complete(id) { _ in answers += 1 }
        #expect(answers == 1)
        #expect(!pending.isWaiting(id))
        pending.interrupt(id)  // after the answer: nothing left to cancel
        #expect(pending.count == 0)
    }

    @Test func anInterruptBeforeTheTaskIsAttachedCancelsItAtTheAttach() async throws {
        let pending = PendingReplies()
        let id = try #require(pending.register(Self.fake))
        pending.interrupt(id)
        let (task, cancelled) = Self.waitingTask()
        pending.attach(id, task: task)
        try await withDeadline(.seconds(10), "the task attached after the interrupt") { await task.value }
        #expect(cancelled.value == true)
        pending.complete(id) { _ in }
    }

    @Test func anotherRequestsInterruptLeavesATaskAlone() async throws {
        let pending = PendingReplies()
        let first = try #require(pending.register(Self.fake))
        let second = try #require(pending.register(Self.fake))
        let (task, _) = Self.waitingTask()
        pending.attach(first, task: task)
        pending.interrupt(second)
        try await Task.sleep(for: .milliseconds(50))
        #expect(!task.isCancelled)
        task.cancel()
        _ = await task.value
        pending.complete(first) { _ in }
        pending.complete(second) { _ in }
    }
}
