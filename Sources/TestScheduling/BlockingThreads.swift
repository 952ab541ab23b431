// Tests that block their thread (waiting for a child process, a shell command, a semaphore) must
// not do it on Swift concurrency's cooperative pool. Swift Testing calls synchronous test functions
// from its test tasks, which run on that pool, and the pool has one thread per core: two on CI.
// Two suites waiting on processes there leave nothing for the tasks every other test awaits, and a
// test that waits for its own task with a deadline fails although nothing is wrong (it happened:
// `asyncWaitIsCancelledWithTheTask`, CI, 2026-11-29).
//
// `.blockingThreads` runs a test (or every test of a suite) with a task executor preference for
// an executor whose jobs run on Dispatch threads outside the cooperative pool, so a synchronous
// body that blocks holds one of those threads, never a pool thread. Child tasks of the test inherit
// the preference; unstructured and detached tasks do not and run on the pool as usual.

import Dispatch
public import Testing

/// Runs each job on a serial Dispatch queue of its own. Such queues target Dispatch's overcommit
/// root queue, which starts a thread whenever every one it has is busy, so a job that blocks never
/// keeps another from starting. (A concurrent queue targets the non-overcommit pool, one thread
/// per core on Linux: blocking test bodies filled it, and a task they waited for queued behind
/// them, which is the starvation this executor exists to avoid.)
public final class BlockingTestExecutor: TaskExecutor {
    public static let shared = BlockingTestExecutor()
    static let marker = DispatchSpecificKey<Bool>()

    public func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let queue = DispatchQueue(label: "providerfs.tests.blocking", qos: .userInitiated)
        queue.setSpecific(key: Self.marker, value: true)
        queue.async { unowned.runSynchronously(on: executor) }
    }
}

/// The trait behind `.blockingThreads`.
public struct BlockingThreadsTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        // A suite's scope is entered once for the suite and again for each test; only tests need it.
        guard testCase != nil || !test.isSuite else { return try await function() }
        try await withTaskExecutorPreference(BlockingTestExecutor.shared) { try await function() }
    }
}

extension Trait where Self == BlockingThreadsTrait {
    /// The test's body runs outside the cooperative pool, so it may block its thread (wait for a
    /// process, a semaphore, a shell command) without starving other tests' tasks.
    public static var blockingThreads: Self { BlockingThreadsTrait() }
}

/// True when the calling code runs on a thread of `BlockingTestExecutor`, not the cooperative pool.
public func isOnBlockingTestThread() -> Bool {
    DispatchQueue.getSpecific(key: BlockingTestExecutor.marker) == true
}
