import Dispatch
import SystemSupport
import Testing

@Suite struct LockTests {
    /// Eight threads increment a shared counter; the lock must make every increment count.
    @Test func lockedCounterIsExact() {
        let counter = Locked(0)
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<10_000 { counter.withLock { $0 += 1 } }
        }
        #expect(counter.value == 80_000)
    }

    @Test func errnoNamesAndParsing() {
        #expect(Errno.ioError.name == "EIO")
        #expect(Errno(parsing: "eio") == .ioError)
        #expect(Errno(parsing: "5") == .ioError)
        #expect(Errno(parsing: "ENOPE") == nil)
        #expect(Errno.noSuchFileOrDirectory.message == "No such file or directory")
    }
}
