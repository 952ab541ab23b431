// Starting the standalone coordination server on demand (decision D-108).

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Finds and starts the standalone server (decision D-108).
package enum ServerLauncher {
    /// How long a client waits for a server it started.
    static let startTimeout: UInt64 = 10_000_000_000

    /// Connects to the standalone server, starting it when no server answers.
    static func connectOrStart(socketPath: String, delegate: DelegateBox?) throws(CoordinationError) -> ServerLink {
        let deadline = monotonicNanoseconds() + startTimeout
        // When a server was last started here: again only after a second without one answering
        // (a started server may be killed before it answers, D-402), so one slow start does not
        // spawn a crowd (the lock makes extra ones leave anyway).
        var startedAt: UInt64?
        var pause: UInt32 = 1000
        var lastError = ""
        while true {
            do {
                return try ServerLink.connect(socketPath: socketPath, delegate: delegate)
            } catch let error as SystemCallError
                where [ENOENT, ECONNREFUSED, EPIPE, ECONNRESET].contains(error.errno.rawValue)
            {
                // No server, or one that died while we connected.
                lastError = error.description
                let now = monotonicNanoseconds()
                if startedAt.map({ now &- $0 >= 1_000_000_000 }) ?? true {
                    try start()
                    startedAt = now
                }
            } catch let error as CoordinationError where error.code == .connectionLost {
                // The server was exiting on idle (or died) while we connected: start another.
                lastError = error.description
                startedAt = nil
            } catch {
                throw CoordinationError(.serverUnavailable, "Cannot reach the coordination server: \(error).")
            }
            guard monotonicNanoseconds() < deadline else {
                throw CoordinationError(
                    .serverUnavailable, "The coordination server at \(socketPath) did not start (\(lastError)).")
            }
            usleep(pause)
            pause = min(pause * 2, 50_000)
        }
    }

    /// The executable run as `EXE coordinator --idle-exit D`: `$PROVIDERFS_COORDINATOR`; else this
    /// process's own executable when it is `providerfs`; else `providerfs` beside it; else the first
    /// `providerfs` on PATH.
    package static func serverExecutable(environment: [String: String]? = nil) -> String? {
        let environment = environment ?? currentEnvironment()
        if let explicit = environment["PROVIDERFS_COORDINATOR"], !explicit.isEmpty { return explicit }
        let own = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
        if own.hasSuffix("/providerfs") { return own }
        if let slash = own.lastIndex(of: "/") {
            let sibling = String(own[..<slash]) + "/providerfs"
            if access(sibling, X_OK) == 0 { return sibling }
        }
        for directory in (environment["PATH"] ?? "").split(separator: ":") {
            let candidate = String(directory) + "/providerfs"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    /// Idle time after which an on-demand server exits: `$PROVIDERFS_COORDINATOR_IDLE`, default 30s.
    static func idleExit(environment: [String: String]) -> String {
        if let text = environment["PROVIDERFS_COORDINATOR_IDLE"], (try? parseDuration(text)) != nil { return text }
        return "30s"
    }

    /// Starts the server detached: own session, stdin/stdout/stderr on /dev/null, no inherited
    /// descriptors (it must never hold a caller's pipe open), reaped by a background thread.
    static func start() throws(CoordinationError) {
        let environment = currentEnvironment()
        guard let executable = serverExecutable(environment: environment) else {
            throw CoordinationError(
                .serverUnavailable,
                "No coordination server is running and no providerfs executable was found to start one; "
                    + "set PROVIDERFS_COORDINATOR to the providerfs binary.")
        }
        let arguments = [executable, "coordinator", "--idle-exit", idleExit(environment: environment)]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        closeDescriptors(from: 3, in: &actions)
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let rc = withCleanSpawnAttributes(newSession: true) {
            posix_spawn(&pid, executable, &actions, $0, &argv, environ)
        }
        guard rc == 0 else {
            throw CoordinationError(
                .serverUnavailable, "Cannot start the coordination server \(executable): \(Errno(rc).message).")
        }
        let child = pid
        Thread.detachNewThread {
            var status: Int32 = 0
            while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        }
    }
}
