import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite("BlockingIOPool", .blockingThreads)
struct BlockingIOPoolTests {
    @Test("runs work on its own threads, concurrently, and returns results and typed errors")
    func runsWork() async throws {
        let pool = BlockingIOPool(threadCount: 3)
        defer { pool.shutdown() }
        let callerThread = pthread_self()
        let ranOnCaller = try await pool.run { () throws(Errno) -> Bool in
            pthread_equal(pthread_self(), callerThread) != 0
        }
        #expect(!ranOnCaller)
        // Three blocking calls at once finish together on three threads (a barrier of 3 would
        // deadlock on fewer).
        let arrived = Locked(0)
        try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<3 {
                group.addTask {
                    try await pool.run { () throws(Errno) -> Int in
                        arrived.withLock { $0 += 1 }
                        var spins = 0
                        while arrived.value < 3 && spins < 5_000 {
                            usleep(1000)
                            spins += 1
                        }
                        return index
                    }
                }
            }
            var results: [Int] = []
            for try await result in group { results.append(result) }
            #expect(results.sorted() == [0, 1, 2])
        }
        #expect(arrived.value == 3)
        await #expect(throws: Errno.ioError) {
            try await pool.run { () throws(Errno) -> Void in throw Errno.ioError }
        }
    }
}

@Suite("BlockingIOPool releases work", .blockingThreads)
struct BlockingIOPoolReleaseTests {
    final class Captured: Sendable {}

    /// What a finished closure captured is released once the work is done, not after 64 more
    /// items (a staging file's descriptor stayed open, and the cache disk full, D-390).
    @Test func finishedWorkIsReleased() async {
        let pool = BlockingIOPool(threadCount: 1)
        defer { pool.shutdown() }
        weak var released: Captured?
        do {
            let captured = Captured()
            released = captured
            await pool.run { () -> Void in _ = captured }
        }
        // One thread, in order: when this returns, the first item's turn is over.
        await pool.run { () -> Void in }
        #expect(released == nil)
    }
}
