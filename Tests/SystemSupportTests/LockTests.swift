import Dispatch
import Foundation
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

@Suite struct LockedCallbackTests {
    /// The depth of the stack when `call` runs.
    static func depth() -> Int {
        Thread.callStackReturnAddresses.count
    }

    /// A closure kept as a `Locked` value directly is wrapped in two more reabstraction thunks at
    /// every `withLock` (the inout access goes through the generic header and back): after
    /// 100,000 catalog changes a call went through 200,000 thunks, and each change cost more than
    /// the last. Kept in a `Callback`, it is not.
    @Test func aCallbackReadManyTimesIsCalledAtTheSameDepth() {
        let measured = Locked(0)
        let callback = Locked<Callback<Int>?>(Callback { _ in measured.withLock { $0 = LockedCallbackTests.depth() } })
        callback.withLock { $0 }?.call(1)
        let first = measured.value
        for _ in 0..<10_000 { _ = callback.withLock { $0 } }
        callback.withLock { $0 }?.call(1)
        #expect(measured.value == first, "the call went \(measured.value - first) frames deeper")
    }
}
