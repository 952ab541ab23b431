// A few dedicated threads for blocking system calls (pread/pwrite/fsync on cache files), so that
// they never occupy the Swift cooperative pool, whose threads (one per core) must stay free to run
// tasks (DESIGN.md §3; NIOThreadPool's idea).

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A fixed set of threads that run blocking work submitted from async code.
///
/// `run` suspends the caller (no thread is parked) until a pool thread has executed the closure.
/// Work is started in submission order. Threads live as long as the pool; `shared` lives for the
/// process.
public final class BlockingIOPool: @unchecked Sendable {
    // Safe: `work`, `head` and `stopped` are only read or written while `mutex` is held; `condition`
    // is only waited on with `mutex` held. Both pthread objects are heap-allocated and never move.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    /// Queued work from `head` on; a slot before `head` is emptied when its item is taken, so that
    /// what a closure captured (a staging file's descriptor) goes when the work is done, not after
    /// 64 more items (issue 23: a deleted staging file stayed open and the cache disk full).
    private var work: [(@Sendable () -> Void)?] = []
    private var head = 0
    private var stopped = false
    private var running = 0
    /// Number of threads.
    public let threadCount: Int

    /// The process-wide pool for cache-file I/O (4 threads: enough to overlap a few downloads and
    /// readers on 2 cores without oversubscribing them).
    public static let shared = BlockingIOPool(threadCount: 4)

    public init(threadCount: Int) {
        precondition(threadCount > 0, "a BlockingIOPool needs at least one thread")
        self.threadCount = threadCount
        mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
        for _ in 0..<threadCount {
            let context = Unmanaged.passRetained(self).toOpaque()
            var thread = pthread_t()
            let rc = pthread_create(
                &thread, nil,
                { raw in
                    let pool = Unmanaged<BlockingIOPool>.fromOpaque(raw!).takeRetainedValue()
                    pool.workerLoop()
                    return nil
                }, context)
            precondition(rc == 0, "pthread_create failed with \(rc)")
            pthread_detach(thread)
        }
    }

    deinit {
        // Reached only after `shutdown` let every worker exit (each worker retains the pool).
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    /// Stops the threads once the queued work is done. Work submitted afterwards runs inline on the
    /// submitting thread (so a late caller still gets an answer rather than hanging).
    public func shutdown() {
        pthread_mutex_lock(mutex)
        stopped = true
        pthread_cond_broadcast(condition)
        pthread_mutex_unlock(mutex)
    }

    /// Runs `body` on a pool thread and returns its result.
    public func run<T: Sendable, E: Error>(_ body: @escaping @Sendable () throws(E) -> T) async throws(E) -> T {
        // The result travels through a mutex-guarded box, not through the continuation: when the
        // work finishes before the task has suspended, the runtime hands over with atomics that
        // ThreadSanitizer does not see, and it would report the (correct) hand-off of, say, a
        // freshly filled AlignedBuffer as a race. The mutex makes the happens-before visible.
        let box = Locked<Result<T, E>?>(nil)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            submit {
                let result = Result { () throws(E) -> T in try body() }
                box.withLock { $0 = result }
                continuation.resume()
            }
        }
        return try box.withLock { $0! }.get()
    }

    /// Runs `item` on a pool thread, without waiting for it (inline once the pool is shut down).
    public func execute(_ item: @escaping @Sendable () -> Void) { submit(item) }

    private func submit(_ item: @escaping @Sendable () -> Void) {
        pthread_mutex_lock(mutex)
        if stopped {
            pthread_mutex_unlock(mutex)
            item()
            return
        }
        work.append(item)
        pthread_cond_signal(condition)
        pthread_mutex_unlock(mutex)
    }

    private func workerLoop() {
        // Each worker holds a reference to the pool while it runs (taken from the retained context).
        pthread_mutex_lock(mutex)
        while true {
            while head == work.count && !stopped {
                pthread_cond_wait(condition, mutex)
            }
            if head == work.count && stopped { break }
            let item = work[head]!
            work[head] = nil
            head += 1
            if head > 64 && head * 2 > work.count {
                work.removeFirst(head)
                head = 0
            }
            running += 1
            pthread_mutex_unlock(mutex)
            item()
            pthread_mutex_lock(mutex)
            running -= 1
        }
        pthread_mutex_unlock(mutex)
    }
}
