// Cancelling a copy blocked in a read of the source. A read through a mount whose download
// stalls waits in the kernel until bytes arrive or the mount gives up (30 s), and the import's
// cancel (SIGINT and SIGTERM are taken on a dispatch queue and ignored by every thread) never
// reaches the thread waiting there. So while it copies, the copying thread takes SIGUSR1, whose
// handler does nothing and has no SA_RESTART; a cancel sends it to that thread until the copy
// ends. The kernel then interrupts the FUSE request (the mount answers EINTR, D-400), the read
// returns EINTR, and the copy sees the cancel (docs/READING-LIST.md).

import Dispatch
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// The signal that interrupts the copying thread's blocked call.
private let copyInterruptSignal = SIGUSR1

/// Its handler, installed once: nothing to do, only the EINTR matters.
private let copyInterruptHandlerInstalled: Bool = {
    var action = sigaction()
    action.__sigaction_handler.sa_handler = { _ in }
    sigemptyset(&action.sa_mask)
    action.sa_flags = 0  // no SA_RESTART: the blocked read must return EINTR
    return sigaction(copyInterruptSignal, &action, nil) == 0
}()

/// The calling thread, made interruptible by `interrupt()` until `finish()` (on the same thread).
final class CopyInterruption: Sendable {
    private let thread: pthread_t
    /// Set by `finish`; no signal is sent once it is (so none reaches a thread that went on).
    private let finished = Locked(false)
    private let previousMask: sigset_t

    init() {
        _ = copyInterruptHandlerInstalled
        thread = pthread_self()
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, copyInterruptSignal)
        var previous = sigset_t()
        pthread_sigmask(SIG_UNBLOCK, &set, &previous)
        previousMask = previous
    }

    /// Sends the signal to the copying thread now and every 20 ms until `finish` (a signal that
    /// lands just before the thread enters its read is not lost: the next one interrupts it).
    func interrupt() {
        DispatchQueue.global().async { [self] in
            while finished.withLock({ finished in
                if !finished { pthread_kill(thread, copyInterruptSignal) }
                return !finished
            }) {
                usleep(20_000)
            }
        }
    }

    /// The copy is over: no more signals; the thread's signal mask as it was.
    func finish() {
        finished.withLock { $0 = true }
        var mask = previousMask
        pthread_sigmask(SIG_SETMASK, &mask, nil)
    }
}
