// Require-token mode (`providerfs mount --require-token`, docs/SEMANTICS.md "Require-token mode"):
// the VirtualFileSystem's `PlainPathPolicy` port over /proc. Plain paths are open to the mounting
// user's own `providerfs` commands only: the caller's uid is the daemon's, and the calling thread
// runs the very file the daemon runs (device and inode of /proc/<tid>/exe, never a name, which
// anyone can give a program).
//
// Decided afresh on every request, with one stat (D-332): the caller is blocked in the request,
// so the thread asked about is the caller; nothing is kept that a reused pid or an exec could
// inherit. A cache keyed by process and start time was measured first and cost more than it
// saved: reading /proc/<pid>/stat for the start time (50–120 µs in the test process) against the stat (2.4 µs).

package import SystemSupport
package import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `PlainPathPolicy` of a mount run by `ownerUID` from the executable `executable`.
package struct MountPlainPaths: PlainPathPolicy {
    /// What tells callers apart (tests substitute fakes for /proc).
    package struct ProcessFacts: Sendable {
        /// The file a thread's process runs; nil when the thread is gone or cannot be seen.
        var executableOfThread: @Sendable (Int32) -> FileIdentity?
        /// For the reason of a refusal: the process of a thread and its command name.
        var describeThread: @Sendable (Int32) -> (pid: Int32, name: String)?

        package init(
            executableOfThread: @escaping @Sendable (Int32) -> FileIdentity?,
            describeThread: @escaping @Sendable (Int32) -> (pid: Int32, name: String)?
        ) {
            self.executableOfThread = executableOfThread
            self.describeThread = describeThread
        }

        /// /proc/<tid>/exe (a thread's directory exists beside its process's, unlisted), and for a
        /// refusal the thread group and its command name.
        package static let system = ProcessFacts(
            executableOfThread: { FileIdentity.executable(of: $0) },
            describeThread: { tid in
                guard let pid = ProcessInfoFiles.threadGroup(ofThread: tid),
                    let identity = ProcessInfoFiles.identity(of: pid)
                else { return nil }
                return (pid, identity.name)
            })
    }

    package let ownerUID: UInt32
    /// The daemon's own executable; nil if it could not be found (then every caller is refused).
    package let executable: FileIdentity?
    let facts: ProcessFacts

    package init(
        ownerUID: UInt32 = getuid(), executable: FileIdentity? = FileIdentity.ownExecutable(),
        facts: ProcessFacts = .system
    ) {
        self.ownerUID = ownerUID
        self.executable = executable
        self.facts = facts
    }

    package func decide(_ context: RequestContext) -> PlainPathDecision {
        guard context.uid == ownerUID else {
            return .refused(reason: "uid \(context.uid) is not the mount's owner (uid \(ownerUID))")
        }
        guard let executable else {
            return .refused(reason: "the daemon cannot tell its own executable, so no command is recognized")
        }
        // 0: a request the kernel makes on its own, or from a process in another pid namespace.
        guard context.threadID > 0 else {
            return .refused(reason: "the calling process cannot be seen by the daemon (pid 0)")
        }
        guard let theirs = facts.executableOfThread(context.threadID) else {
            return .refused(reason: "the calling process (thread \(context.threadID)) is gone or cannot be seen")
        }
        if theirs == executable { return .allowed }
        let caller = facts.describeThread(context.threadID).map { "\($0.name) (pid \($0.pid))" }
        return .refused(
            reason: "\(caller ?? "thread \(context.threadID)") is not a providerfs command of the mount's owner")
    }
}
