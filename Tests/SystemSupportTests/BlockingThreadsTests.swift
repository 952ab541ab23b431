// The `.blockingThreads` trait (TestScheduling) that keeps blocking test bodies off the cooperative
// pool: where a body runs, and that a task started with the same executor preference does not
// queue behind the pool's work.

import Dispatch
import SystemSupport
import TestScheduling
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct BlockingThreadsTests {
    @Test(.blockingThreads) func aSynchronousBodyRunsOffThePool() {
        #expect(isOnBlockingTestThread())
    }

    /// A task started with the executor preference runs at once even while the pool is busy with
    /// other tests' tasks (a detached task on the pool would queue behind all of them).
    @Test(.blockingThreads) func aTaskWithThePreferenceRunsWhileThisThreadWaits() {
        let done = DispatchSemaphore(value: 0)
        let onThread = Locked(false)
        Task.detached(executorPreference: BlockingTestExecutor.unbounded) {
            onThread.withLock { $0 = isOnBlockingTestThread() }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + .seconds(30)) == .success)
        #expect(onThread.value)
    }

    @Test(.blockingThreads) func childTasksInheritThePreference() async {
        async let child = isOnBlockingTestThread()
        #expect(await child)
    }

    @Test func withoutTheTraitATestRunsOnThePool() async {
        #expect(!isOnBlockingTestThread())
    }

    @Test(.blockingThreads) func aBoundedExecutorRunsAtMostItsWidthAtOnceAndThenTheRest() {
        let executor = BlockingTestExecutor(width: 2)
        let gate = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let state = Locked((running: 0, peak: 0))
        for _ in 0..<4 {
            Task.detached(executorPreference: executor) {
                state.withLock {
                    $0.running += 1
                    $0.peak = max($0.peak, $0.running)
                }
                gate.wait()
                state.withLock { $0.running -= 1 }
                finished.signal()
            }
        }
        var polls = 0
        while state.value.running < 2 && polls < 30_000 {
            usleep(1000)
            polls += 1
        }
        #expect(state.value.running == 2)
        // The other two stay queued while both workers block (time for a wrong executor to start them).
        usleep(100_000)
        #expect(state.value.peak == 2)
        for _ in 0..<4 { gate.signal() }
        for _ in 0..<4 { #expect(finished.wait(timeout: .now() + .seconds(30)) == .success) }
        #expect(state.value.peak == 2)
    }
}

@Suite struct BlockingTestSlotsTests {
    /// Two slots: two tests enter at once, a third waits (suspended) until one leaves.
    @Test func aTestWaitsForAFreeSlotAndGetsTheFirstOneFreed() async {
        let slots = BlockingTestSlots(width: 2)
        await slots.enter()
        await slots.enter()
        let entered = Locked(false)
        let third = Task {
            await slots.enter()
            entered.withLock { $0 = true }
        }
        // Time for a wrong implementation to let the third in (not a wait for a result).
        try? await Task.sleep(for: .milliseconds(100))
        #expect(!entered.value)
        slots.leave()
        await third.value
        #expect(entered.value)
        // Both slots are taken again: a fourth waits until the next leave.
        let fourth = Task { await slots.enter() }
        slots.leave()
        await fourth.value
    }

    /// A blocking test that suspends resumes on an unbounded blocking thread: its jobs never wait
    /// for a worker that other tests' blocking bodies hold.
    @Test(.blockingThreads) func aBlockingTestResumesOffThePool() async throws {
        try await Task.sleep(for: .milliseconds(1))
        #expect(isOnBlockingTestThread())
        #expect(BlockingTestSlots.held)
    }
}
