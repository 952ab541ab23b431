import FileCoordination
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// `providerfs coordinate (--read | --write[=KIND]) PATH [--timeout D] -- CMD [ARG…]`: runs CMD
/// while holding a coordinated claim on PATH; exits with CMD's status, 75 when the claim times out,
/// 76 when the claim was lost while CMD ran (its server died and the claim could not be
/// re-established, D-402).
struct CoordinateCommand: CLICommand {
    static let name = "coordinate"
    static let summary = "run a command while holding a coordinated read or write claim on a path"
    static let usage =
        "providerfs coordinate (--read | --write[=deleting|moving|replacing|merging|evicting]) PATH [--timeout DURATION] -- CMD [ARG...]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let read = try arguments.flag("--read")
        let write = arguments.optionalValueFlag("--write")
        let timeout = try arguments.duration("--timeout")
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        guard read != (write != nil) else {
            throw UsageError("providerfs coordinate: give exactly one of --read and --write.")
        }
        var writingOptions: WritingOptions = []
        switch write {
        case nil, "": break
        case "deleting": writingOptions = .forDeleting
        case "moving": writingOptions = .forMoving
        case "replacing": writingOptions = .forReplacing
        case "merging": writingOptions = .forMerging
        case "evicting": writingOptions = .forEvicting  // rule 34: presenters must remove themselves
        case let other?:
            throw UsageError(
                "providerfs coordinate: --write takes deleting, moving, replacing, merging or evicting (got '\(other)')."
            )
        }
        guard let command = arguments.trailing, !command.isEmpty else {
            throw UsageError("providerfs coordinate: missing the command to run after '--'.")
        }
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        let url = URL(fileURLWithPath: absolute)
        let coordinator = FileCoordinator()
        var deadlines = CoordinationDeadlines.default
        if let timeout { deadlines.claimWait = timeout }
        coordinator.deadlines = deadlines
        // The claim's server died and the claim could not be re-established (D-402): CMD is no
        // longer protected. Said at once on stderr; the exit status says it after CMD.
        let lost = Locked(false)
        coordinator.claimLostHandler = { error in
            lost.withLock { $0 = true }
            io.error("providerfs coordinate: warning: \(error.message) CMD goes on without the claim.")
        }
        let intent: FileAccessIntent =
            read ? .readingIntent(with: url) : .writingIntent(with: url, options: writingOptions)
        do {
            let status = try await coordinator.coordinate(
                with: [intent],
                performing: { _ in
                    try await runChild(command, claimDescriptors: FileCoordinator.heldClaimDescriptors)
                })
            if lost.withLock({ $0 }) {
                throw CommandFailure(
                    "the claim on \(absolute) was lost while CMD ran (CMD exited with status \(status)).",
                    status: ExitStatus.claimLost)
            }
            return status
        } catch let error as CoordinationError where error.code == .timedOut {
            throw CommandFailure(error.message, status: ExitStatus.timeout)
        } catch let error as CoordinationError {
            throw CommandFailure(error.message)
        }
    }

    /// CMD could not be run: 127 when it was not found, 126 when it was found but could not be
    /// executed (not executable, a directory, a bad format), as `env`, `timeout` and `nohup` do.
    static func spawnFailure(_ executable: String, _ error: Errno) -> CommandFailure {
        if error.rawValue == ENOENT {
            let place = executable.contains("/") ? "no such file" : "not found in PATH"
            return CommandFailure("cannot run '\(executable)': \(place).", status: ExitStatus.commandNotFound)
        }
        return CommandFailure(
            "cannot run '\(executable)': \(error.message).", status: ExitStatus.commandNotExecutable)
    }

    /// Why execvp could not run `executable` (nil: it could): ENOENT when no file is there (or
    /// none in PATH), EACCES when one is there but is a directory or not executable (for a bare
    /// name, only when no later PATH entry has an executable one), as execvp reports.
    static func execError(_ executable: String) -> Errno? {
        func check(_ path: String) -> Errno? {
            var info = stat()
            guard stat(path, &info) == 0 else { return Errno.current }
            if info.st_mode & S_IFMT == S_IFDIR || access(path, X_OK) != 0 { return Errno(EACCES) }
            return nil
        }
        if executable.isEmpty { return Errno(ENOENT) }
        if executable.contains("/") { return check(executable) }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        var found: Errno = Errno(ENOENT)
        for directory in path.split(separator: ":", omittingEmptySubsequences: false) {
            let candidate = (directory.isEmpty ? "." : String(directory)) + "/" + executable
            guard let error = check(candidate) else { return nil }
            if error.rawValue == EACCES { found = error }
        }
        return found
    }

    /// Runs CMD and returns its exit status, or 128+signal. CMD gets our stdin, stdout and stderr,
    /// and `claimDescriptors` (the sockets of the server connections that hold the claim,
    /// close-on-exec here): the server releases a claim when the last copy of its socket is
    /// closed, so CMD keeps the claim alive if this process is killed, and the claim ends at once
    /// when both are gone (D-136). No other descriptor reaches CMD, as before (Foundation's
    /// Process closed them too): a caller's Process, for one, detects our exit by the end of a
    /// socket we inherited, and would otherwise wait for CMD as well. CMD stays in our process
    /// group, so Ctrl-C reaches both. When CMD ends, the caller releases the claim explicitly, at
    /// once, even if something CMD left running still holds a copy of the socket. Right after the
    /// spawn the claim is said to be CMD's (its pid and start time, D-406), so CMD's own opens
    /// through a mount pass it also once this process is gone; CMD itself starts only once the
    /// servers have that (D-528): the spawned process is `/bin/sh`, which waits on a pipe, then
    /// execs CMD in the same process (same pid, same start time).
    static func runChild(_ command: [String], claimDescriptors: [Int32]) async throws -> Int32 {
        let executable = command[0]
        // What execvp would find (or why not): an exec failure in the gate's shell would not be
        // told apart from CMD's own status.
        if let error = execError(executable) { throw spawnFailure(executable, error) }
        var gate: [Int32] = [-1, -1]
        // pipe2 is hidden from Swift; nothing else spawns in this process meanwhile.
        guard pipe(&gate) == 0 else { throw CommandFailure("cannot make a pipe: \(Errno.current.message).") }
        for end in gate { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        var released = false
        defer {
            if !released { close(gate[1]) }
            close(gate[0])
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Close every other descriptor above stderr: those open now (a close of one that is gone
        // by the spawn fails with EBADF, which posix_spawn ignores); any opened later by another
        // thread of ours is close-on-exec.
        // The gate's descriptor in the child: one digit, as sh's redirections take.
        guard let fd = (Int32(3)...9).first(where: { !claimDescriptors.contains($0) }) else {
            throw CommandFailure("too many coordination servers hold the claim (\(claimDescriptors.count)).")
        }
        let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        for descriptor in open.compactMap({ Int32($0) }) where descriptor > 2 {
            // The gate's end is moved below, and closed at the exec (close-on-exec).
            if !claimDescriptors.contains(descriptor) && descriptor != gate[0] {
                posix_spawn_file_actions_addclose(&actions, descriptor)
            }
        }
        for descriptor in claimDescriptors {
            // dup2 onto itself clears FD_CLOEXEC in the child only (POSIX 2024; glibc ≥ 2.29, musl).
            posix_spawn_file_actions_adddup2(&actions, descriptor, descriptor)
        }
        posix_spawn_file_actions_adddup2(&actions, gate[0], fd)
        // The gate: one line on the pipe lets CMD start; its end without one (this process died
        // first) does not. CMD gets neither end. "$0" is CMD as given: sh looks it up in PATH
        // as execvp does, and CMD's argv[0] is what the caller wrote.
        let script = "read -r _ <&\(fd) || exit 125; exec \"$0\" \"$@\" \(fd)<&-"
        let argv = (["/bin/sh", "-c", script] + command).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = withCleanSpawnAttributes(newSession: false) {
            posix_spawn(&pid, "/bin/sh", &actions, $0, argv, environ)
        }
        guard rc == 0 else { throw spawnFailure("/bin/sh", Errno(rc)) }
        let child = pid
        // Before the wait below, so CMD is not reaped yet: even a CMD that has already exited (a
        // zombie) still has its /proc stat, and the server ignores the name of a process that is gone.
        if let started = ProcessInfoFiles.startTime(of: child) {
            FileCoordinator.holdClaims(forProcess: child, startTime: started)
            // At most 5 s (a server that does not answer): CMD then starts as before D-528.
            _ = FileCoordinator.confirmHeldClaimsReceived(milliseconds: 5000)
        }
        var line: UInt8 = 10
        _ = write(gate[1], &line, 1)
        close(gate[1])
        released = true
        return await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            Thread.detachNewThread {
                var status: Int32 = 0
                while waitpid(child, &status, 0) < 0 && errno == EINTR {}
                // WIFSIGNALED / WTERMSIG / WEXITSTATUS are macros Swift does not import.
                let signal = status & 0x7f
                continuation.resume(returning: signal != 0 ? 128 + signal : (status >> 8) & 0xff)
            }
        }
    }
}
