// Require-token mode (`providerfs mount --require-token`, docs/SEMANTICS.md "Require-token mode"):
// the VirtualFileSystem's `PlainPathPolicy` port over /proc. Plain paths are open to the mounting
// user's own `providerfs` commands only: the caller's uid is the daemon's, and its process runs
// the very file the daemon runs (device and inode of /proc/<pid>/exe, never a name, which anyone
// can give a program). Decisions are kept per process (pid, start time and command name), so a
// command's stream of requests costs one read of /proc/<pid>/stat each, and a reused pid, or an
// exec into another program, is decided afresh (D-332).

package import SystemSupport
package import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `PlainPathPolicy` of a mount run by `ownerUID` from the executable `executable`.
package final class MountPlainPaths: PlainPathPolicy {
    /// What tells processes apart (tests substitute fakes for /proc).
    package struct ProcessFacts: Sendable {
        /// The process (thread group) of a FUSE request's thread.
        var processOfThread: @Sendable (Int32) -> Int32?
        /// A process's start time and command name; nil when it is gone.
        var identity: @Sendable (Int32) -> (startTime: UInt64, name: String)?
        /// The file a process runs; nil when it cannot be seen.
        var executable: @Sendable (Int32) -> FileIdentity?

        package init(
            processOfThread: @escaping @Sendable (Int32) -> Int32?,
            identity: @escaping @Sendable (Int32) -> (startTime: UInt64, name: String)?,
            executable: @escaping @Sendable (Int32) -> FileIdentity?
        ) {
            self.processOfThread = processOfThread
            self.identity = identity
            self.executable = executable
        }

        package static let system = ProcessFacts(
            processOfThread: { ProcessInfoFiles.threadGroup(ofThread: $0) },
            identity: { ProcessInfoFiles.identity(of: $0) },
            executable: { FileIdentity.executable(of: $0) })
    }

    struct ProcessKey: Hashable {
        var pid: Int32
        var startTime: UInt64
        var name: String
    }

    package let ownerUID: UInt32
    /// The daemon's own executable; nil if it could not be found (then every caller is refused).
    package let executable: FileIdentity?
    let facts: ProcessFacts
    /// Decisions by process; cleared when it holds `cacheLimit` of them.
    private let decisions = Locked<[ProcessKey: Bool]>([:])
    static let cacheLimit = 4096

    package init(
        ownerUID: UInt32 = getuid(), executable: FileIdentity? = FileIdentity.ownExecutable(),
        facts: ProcessFacts = .system
    ) {
        self.ownerUID = ownerUID
        self.executable = executable
        self.facts = facts
    }

    /// How many processes have a decision kept (tests).
    package var cachedDecisions: Int { decisions.withLock { $0.count } }

    package func decide(_ context: RequestContext) -> PlainPathDecision {
        guard context.uid == ownerUID else {
            return .refused(reason: "uid \(context.uid) is not the mount's owner (uid \(ownerUID))")
        }
        guard let executable else {
            return .refused(reason: "the daemon cannot tell its own executable, so no command is recognized")
        }
        // 0: a request the kernel makes on its own, or from a process in another pid namespace.
        guard context.threadID > 0, let pid = facts.processOfThread(context.threadID) else {
            return .refused(reason: "the calling process (thread \(context.threadID)) cannot be seen by the daemon")
        }
        guard let identity = facts.identity(pid) else {
            return .refused(reason: "the calling process \(pid) is gone")
        }
        let key = ProcessKey(pid: pid, startTime: identity.startTime, name: identity.name)
        let known = decisions.withLock { $0[key] }
        let allowed: Bool
        if let known {
            allowed = known
        } else {
            allowed = facts.executable(pid) == executable
            decisions.withLock { decisions in
                if decisions.count >= Self.cacheLimit { decisions.removeAll(keepingCapacity: true) }
                decisions[key] = allowed
            }
        }
        if allowed { return .allowed }
        return .refused(reason: "\(identity.name) (pid \(pid)) is not a providerfs command of the mount's owner")
    }
}
