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
import SystemSupport
public import Testing

/// Runs jobs on threads outside the cooperative pool: each worker is a serial Dispatch queue of its
/// own, and such queues target Dispatch's overcommit root queue, which starts a thread whenever all
/// are busy (a concurrent queue would target the non-overcommit pool, one thread per core on Linux,
/// and blocking bodies would fill it as they filled the cooperative pool).
///
/// `unbounded` (the trait's, and the one for a task that a blocking test body waits for) starts a
/// worker per job. An executor with a `width` runs at most that many jobs at once and queues the
/// rest in order; the trait does not use one, since a test's own resumptions would queue behind
/// tests not yet started (`BlockingTestSlots` limits how many blocking tests run at once instead).
public final class BlockingTestExecutor: TaskExecutor, @unchecked Sendable {
    // Safe: `queued` and `running` are only touched under `lock`.
    public static let unbounded = BlockingTestExecutor(width: nil)
    static let marker = DispatchSpecificKey<Bool>()

    private let width: Int?
    private let lock = Lock()
    private var queued: [UnownedJob] = []
    private var running = 0

    /// An executor running at most `width` jobs at once (nil: no limit).
    public init(width: Int?) { self.width = width }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        if let width {
            lock.lock()
            guard running < width else {
                queued.append(job)
                lock.unlock()
                return
            }
            running += 1
            lock.unlock()
        }
        startWorker(with: job)
    }

    private func startWorker(with first: UnownedJob) {
        let queue = DispatchQueue(label: "providerfs.tests.blocking", qos: .userInitiated)
        queue.setSpecific(key: Self.marker, value: true)
        let executor = asUnownedTaskExecutor()
        queue.async { [self] in
            var next: UnownedJob? = first
            while let job = next {
                job.runSynchronously(on: executor)
                next = takeNext()
            }
        }
    }

    /// The next queued job for a worker that finished one, or nil (and one worker fewer).
    private func takeNext() -> UnownedJob? {
        guard width != nil else { return nil }
        lock.lock()
        defer { lock.unlock() }
        guard !queued.isEmpty else {
            running -= 1
            return nil
        }
        return queued.removeFirst()
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
        // A scope inside one that holds a slot must not wait for a second (four such would wait forever).
        if BlockingTestSlots.held { return try await function() }
        await BlockingTestSlots.shared.enter()
        defer { BlockingTestSlots.shared.leave() }
        try await BlockingTestSlots.$held.withValue(true) {
            try await withTaskExecutorPreference(BlockingTestExecutor.unbounded) { try await function() }
        }
    }
}

/// At most `width` blocking tests run at once; the rest wait, suspended, in the order they came.
/// The limit is on tests, not on jobs: a running test's jobs (its resumption after an `await`,
/// its child tasks) go to `BlockingTestExecutor.unbounded` and never queue. A width-limited
/// executor queued them behind every test not yet started, so an async test that slept for a
/// millisecond resumed minutes later, after its claim had timed out (`asyncWaitIsCancelledWithTheTask`,
/// CI, 2026-12-02).
package final class BlockingTestSlots: Sendable {
    static let shared = BlockingTestSlots(width: 4)
    @TaskLocal package static var held = false

    private let state: Locked<(free: Int, waiting: [CheckedContinuation<Void, Never>])>

    package init(width: Int) { state = Locked((width, [])) }

    /// Returns when a slot is taken (at once if one is free).
    package func enter() async {
        await withCheckedContinuation { continuation in
            let taken = state.withLock { state -> Bool in
                guard state.free > 0 else {
                    state.waiting.append(continuation)
                    return false
                }
                state.free -= 1
                return true
            }
            if taken { continuation.resume() }
        }
    }

    /// Gives a slot back: to the longest waiter, or to the pool.
    package func leave() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiting.isEmpty else {
                state.free += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
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
