// Kernel cache invalidation (D-228): the file system says what changed, this sends libfuse's
// notify_inval_entry / notify_inval_inode for it, in order, from a queue of its own. Never from a
// loop thread or a request's reply path: libfuse warns that an invalidation sent in the execution
// path of a related operation (a lookup in the same directory) deadlocks, because the kernel
// takes the directory's lock that the operation holds.

import CFuse3
import Diagnostics
import Dispatch
import Synchronization
import SystemSupport
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

final class KernelNotifier: Sendable {
    private let queue = DispatchQueue(label: "providerfs.fuse.invalidate")
    /// The session, as its address; 0 once stopped (nothing is sent after that).
    private let session = Atomic<UInt>(0)
    private let logger: Logger
    /// Invalidations sent and those the kernel refused for a reason other than "not cached".
    private let counts = Locked<(sent: Int, failed: Int)>((0, 0))

    init(session: OpaquePointer, logger: Logger) {
        self.session.store(UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(session))), ordering: .releasing)
        self.logger = logger
    }

    /// Queues `invalidations` (duplicates in one batch are sent once). Never blocks.
    func send(_ invalidations: [KernelInvalidation]) {
        queue.async { [self] in
            guard let session = OpaquePointer(bitPattern: session.load(ordering: .acquiring)) else { return }
            var seen = Set<KernelInvalidation>()
            var failed = 0
            for invalidation in invalidations where seen.insert(invalidation).inserted {
                let rc: Int32
                switch invalidation {
                case .entry(let parent, var name):
                    rc = name.withUTF8 { bytes in
                        bytes.withMemoryRebound(to: CChar.self) {
                            fuse_lowlevel_notify_inval_entry(session, parent.rawValue, $0.baseAddress, $0.count)
                        }
                    }
                case .attributes(let inode):
                    // A negative offset: attributes only. Content is the open's business (D-208).
                    rc = fuse_lowlevel_notify_inval_inode(session, inode.rawValue, -1, 0)
                case .content(let inode):
                    // Offset 0, length 0: every cached page, and the attributes (a publish).
                    rc = fuse_lowlevel_notify_inval_inode(session, inode.rawValue, 0, 0)
                }
                // ENOENT: the kernel does not hold that name or node (never looked up, or forgotten).
                if rc < 0 && rc != -ENOENT {
                    failed += 1
                    if failed == 1 { logger.debug("invalidation \(invalidation) refused: \(-rc)") }
                }
            }
            counts.withLock {
                $0.sent += seen.count
                $0.failed += failed
            }
        }
    }

    /// Sends nothing more, and returns once what was queued has been sent.
    func stop() -> (sent: Int, failed: Int) {
        session.store(0, ordering: .releasing)
        queue.sync {}
        return counts.withLock { $0 }
    }
}
