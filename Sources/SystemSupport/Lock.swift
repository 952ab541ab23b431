// The one lock type of the project.
//
// Why not `Synchronization.Mutex`: on Linux it is a priority-inheritance futex that ThreadSanitizer
// does not model (a correct counter under Mutex is reported as a race), and holding it across
// syscalls showed up as rt_mutex slow paths in profiles (docs/DECISIONS.md, D-003). A pthread mutex
// is cheap when uncontended, TSan-visible, and never held across a syscall or a reply here.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A non-recursive mutual-exclusion lock over `pthread_mutex_t`.
///
/// Keep critical sections short: never hold a lock across a syscall, a FUSE reply, an `await`
/// (impossible by construction: `withLock` takes a synchronous closure) or a call into another
/// component that may take its own lock, unless the lock order is documented at both places.
public final class Lock: @unchecked Sendable {
    // Safe: the mutex is heap-allocated once, never moved, and only touched through pthread calls.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>

    public init() {
        mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ERRORCHECK))
        let rc = pthread_mutex_init(mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        precondition(rc == 0, "pthread_mutex_init failed with \(rc)")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func lock() {
        let rc = pthread_mutex_lock(mutex)
        precondition(rc == 0, "Lock.lock() failed with \(rc): re-entrant locking (EDEADLK=\(EDEADLK)) is a bug")
    }

    public func unlock() {
        let rc = pthread_mutex_unlock(mutex)
        precondition(rc == 0, "Lock.unlock() failed with \(rc): unlocking a lock this thread does not hold")
    }

    @inlinable
    public func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// State guarded by a lock: the value can only be reached inside `withLock`.
///
/// The pattern for shared mutable state: keep a pure state machine in `State`, mutate it inside
/// `withLock`, return the actions to perform, and perform them after the lock is dropped.
///
/// One allocation holds both the state and its pthread mutex (a `Lock` object would add two:
/// itself and its mutex), so a `Locked` is cheap enough for objects made on every coordination
/// (D-123, D-007). Copies share the same state and lock.
public struct Locked<State>: @unchecked Sendable {
    // Safe: the state is only read or written while the storage's mutex is held.
    @usableFromInline let storage: LockedStorage<State>

    public init(_ initial: State) {
        storage = LockedStorage<State>.make(initial)
    }

    @inlinable
    public func withLock<T, E: Error>(_ body: (inout State) throws(E) -> T) throws(E) -> T {
        storage.lock()
        defer { storage.unlock() }
        return try body(&storage.header)
    }

    /// `withLock` when no other thread holds the lock now; nil, the body not run, when one does.
    @inlinable
    public func withLockIfAvailable<T, E: Error>(_ body: (inout State) throws(E) -> T) throws(E) -> T? {
        guard storage.tryLock() else { return nil }
        defer { storage.unlock() }
        return try body(&storage.header)
    }
}

/// The storage of a `Locked`: the state as the header, then a `pthread_mutex_t` in the elements
/// (words, for its alignment).
@usableFromInline
final class LockedStorage<State>: ManagedBuffer<State, UInt64> {
    private static var words: Int { (MemoryLayout<pthread_mutex_t>.size + 7) / 8 }

    @usableFromInline
    static func make(_ initial: State) -> LockedStorage<State> {
        let storage = unsafeDowncast(create(minimumCapacity: words) { _ in initial }, to: LockedStorage<State>.self)
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ERRORCHECK))
        let rc = pthread_mutex_init(storage.mutex, &attributes)
        pthread_mutexattr_destroy(&attributes)
        precondition(rc == 0, "pthread_mutex_init failed with \(rc)")
        return storage
    }

    deinit {
        pthread_mutex_destroy(mutex)
    }

    /// The mutex, in this object's own allocation (stable: a class instance never moves).
    private var mutex: UnsafeMutablePointer<pthread_mutex_t> {
        withUnsafeMutablePointerToElements {
            UnsafeMutableRawPointer($0).assumingMemoryBound(to: pthread_mutex_t.self)
        }
    }

    @usableFromInline
    func lock() {
        let rc = pthread_mutex_lock(mutex)
        precondition(rc == 0, "Locked.withLock failed with \(rc): re-entrant locking (EDEADLK=\(EDEADLK)) is a bug")
    }

    @usableFromInline
    func tryLock() -> Bool {
        let rc = pthread_mutex_trylock(mutex)
        precondition(rc == 0 || rc == EBUSY, "Locked.withLockIfAvailable failed with \(rc)")
        return rc == 0
    }

    @usableFromInline
    func unlock() {
        let rc = pthread_mutex_unlock(mutex)
        precondition(rc == 0, "Locked: unlocking failed with \(rc)")
    }
}

extension Locked where State: Sendable {
    /// A copy of the current state.
    public var value: State {
        withLock { $0 }
    }
}

/// A closure to keep in a `Locked` (an observer, a handler): `Locked<Callback<T>?>`, never
/// `Locked<((T) -> Void)?>`. A function-typed value in `Locked` is reached through the generic
/// storage's abstraction, so every `withLock`, reads included, writes it back wrapped in two more
/// reabstraction thunks; after 100,000 catalog changes one call went through 200,000 thunks and
/// untar on a writable mount slowed to 18 files/s. A struct around it has one layout, and no thunk
/// accumulates (LockedCallbackTests).
public struct Callback<Argument>: Sendable {
    public let call: @Sendable (Argument) -> Void

    public init(_ call: @escaping @Sendable (Argument) -> Void) {
        self.call = call
    }
}
