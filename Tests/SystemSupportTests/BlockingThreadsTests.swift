// The `.blockingThreads` trait (TestScheduling) that keeps blocking test bodies off the cooperative
// pool: where a body runs, and that a task started with the same executor preference does not
// queue behind the pool's work.

import Dispatch
import SystemSupport
import TestScheduling
import Testing

@Suite struct BlockingThreadsTests {
    @Test(.blockingThreads) func aSynchronousBodyRunsOffThePool() {
        #expect(isOnBlockingTestThread())
    }

    /// A task started with the executor preference runs at once even while the pool is busy with
    /// other tests' tasks (a detached task on the pool would queue behind all of them).
    @Test(.blockingThreads) func aTaskWithThePreferenceRunsWhileThisThreadWaits() {
        let done = DispatchSemaphore(value: 0)
        let onThread = Locked(false)
        Task.detached(executorPreference: BlockingTestExecutor.shared) {
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
}
