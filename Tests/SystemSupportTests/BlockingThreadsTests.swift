// The `.blockingThreads` trait (TestScheduling) that keeps blocking test bodies off the cooperative
// pool. Run the suite with LIBDISPATCH_COOPERATIVE_POOL_STRICT=1 (a pool of one thread) to see
// the difference: without the trait the first test's wait would hold the pool's only thread.

import Dispatch
import TestScheduling
import Testing

@Suite struct BlockingThreadsTests {
    @Test(.blockingThreads) func aSynchronousBodyRunsOffThePoolAndMayWaitForATask() {
        #expect(isOnBlockingTestThread())
        let done = DispatchSemaphore(value: 0)
        Task.detached { done.signal() }
        #expect(done.wait(timeout: .now() + .seconds(30)) == .success)
    }

    @Test(.blockingThreads) func childTasksInheritThePreference() async {
        async let child = isOnBlockingTestThread()
        #expect(await child)
    }

    @Test func withoutTheTraitATestRunsOnThePool() async {
        #expect(!isOnBlockingTestThread())
    }
}
