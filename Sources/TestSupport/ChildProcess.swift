// Child processes for tests and benchmarks, spawned with posix_spawn so that the child starts with
// an empty signal mask and default dispositions: a child of a Swift Testing thread otherwise
// inherits that thread's blocked SIGTERM and never stops (swift-fuse-notes §4). Output goes to
// files, not pipes, so a chatty child can never block on a full pipe.

public import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// A spawned child process. Stop it with `terminate`/`kill` and always `wait` for it.
public final class ChildProcess: @unchecked Sendable {
    // Safe: `status` is guarded by `lock`; everything else is immutable after init.
    /// The child's process id.
    public let pid: Int32
    /// The program that was run.
    public let executable: String
    /// Its arguments (without argv[0]).
    public let arguments: [String]
    /// Files that receive the child's stdout and stderr.
    public let standardOutputPath: String
    public let standardErrorPath: String
    private let lock = Lock()
    private var status: Int32?
    private var usage: rusage?
    private let outputDirectory: String

    /// Spawns `executable` with `arguments`; stdin is /dev/null. `environment` adds to or
    /// overrides the current environment.
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:]
    ) throws(SystemCallError) {
        self.executable = executable
        self.arguments = arguments
        let directory = try makeTemporaryDirectory(prefix: "child")
        outputDirectory = directory
        standardOutputPath = directory + "/stdout"
        standardErrorPath = directory + "/stderr"

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, standardOutputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, standardErrorPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        closeDescriptors(from: 3, in: &actions)

        var merged = currentEnvironment()
        for (key, value) in environment { merged[key] = value }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var child: pid_t = 0
        let rc = withCleanSpawnAttributes(newSession: false) {
            posix_spawn(&child, executable, &actions, $0, argv, envp)
        }
        guard rc == 0 else { throw SystemCallError("posix_spawn \(executable)", Errno(rc)) }
        pid = child
    }

    /// Runs to completion (killed after `timeout`) and returns the exit status and output.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        timeout: Duration = .seconds(60)
    ) throws(SystemCallError) -> (status: Int32, output: String, error: String) {
        let result = try runMeasured(executable, arguments, environment: environment, timeout: timeout)
        return (result.status, result.output, result.error)
    }

    /// `run`, plus the processor time the child used (`processorSeconds`).
    public static func runMeasured(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        timeout: Duration = .seconds(60)
    ) throws(SystemCallError) -> (status: Int32, output: String, error: String, processorSeconds: Double) {
        let child = try ChildProcess(executable, arguments, environment: environment)
        var status = child.wait(timeout: timeout)
        if status == nil {
            child.signal(SIGKILL)
            status = child.wait(timeout: .seconds(10))
        }
        return (status ?? -1, child.standardOutput, child.standardError, child.processorSeconds ?? -1)
    }

    deinit {
        // The output files go with the object; a child still running is reaped by nobody, so
        // callers must wait() first (MountedFileSystem.stop does).
        unlink(standardOutputPath)
        unlink(standardErrorPath)
        rmdir(outputDirectory)
    }

    /// Sends `signal` unless the child has already been reaped (a reaped pid may be reused).
    public func signal(_ signal: Int32) {
        lock.withLock {
            if status == nil { _ = kill(pid, signal) }
        }
    }

    /// True until the child has exited (reaps it when it has).
    public var isRunning: Bool { poll() == nil }

    /// The exit status (128+N when killed by signal N), or nil while still running.
    public func poll() -> Int32? {
        lock.withLock {
            if let status { return status }
            var raw: Int32 = 0
            var resources = rusage()
            let rc = wait4(pid, &raw, WNOHANG, &resources)
            guard rc == pid else { return nil }
            usage = resources
            let exited = raw & 0x7f == 0
            status = exited ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
            return status
        }
    }

    /// The processor time the child used (user + system, its own threads only), once it has
    /// been reaped; nil before. Unlike wall time, it does not grow with the load of tests that run
    /// beside it, so a bound on what a command computes holds on a busy machine.
    public var processorSeconds: Double? {
        lock.withLock {
            guard let usage else { return nil }
            func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1_000_000 }
            return seconds(usage.ru_utime) + seconds(usage.ru_stime)
        }
    }

    /// Waits up to `timeout` for the child to exit; returns its status or nil on timeout.
    @discardableResult
    public func wait(timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let status = poll() { return status }
            usleep(10_000)
        }
        return poll()
    }

    /// Everything the child wrote to stdout so far.
    public var standardOutput: String { readTextFile(standardOutputPath) ?? "" }
    /// Everything the child wrote to stderr so far.
    public var standardError: String { readTextFile(standardErrorPath) ?? "" }
}

/// Creates a fresh directory under $TMPDIR (or /tmp) and returns its path.
public func makeTemporaryDirectory(prefix: String) throws(SystemCallError) -> String {
    let base = currentEnvironment()["TMPDIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
    var template = Array("\(base)/providerfs-\(prefix)-XXXXXX".utf8CString)
    guard let result = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw SystemCallError("mkdtemp")
    }
    return String(cString: result)
}

/// `rm -rf path` for test cleanup; never follows symbolic links out of the tree and never crosses
/// into a mount (a still-mounted directory is left alone rather than emptied through FUSE).
/// FUSE mounts a failed test left under `path` are detached first (lazily), so their daemons end
/// with their sessions: a test that fails half-way leaves no mount and no daemon behind.
public func removeTreeWithinFileSystem(_ path: String) {
    detachFUSEMounts(under: path)
    removeTreeStayingOnThisSide(path)
}

/// Detaches every FUSE mount at or under `path` (umount2 MNT_DETACH as root, else
/// `fusermount3 -u -z`), deepest first.
public func detachFUSEMounts(under path: String) {
    let mounts = MountTable.current().filter { entry in
        entry.fileSystemType.hasPrefix("fuse") && (entry.mountPoint == path || entry.mountPoint.hasPrefix(path + "/"))
    }
    for entry in mounts.sorted(by: { $0.mountPoint.count > $1.mountPoint.count }) {
        if umount2(entry.mountPoint, Int32(MNT_DETACH)) != 0 {
            _ = try? ChildProcess.run("/bin/fusermount3", ["-u", "-z", entry.mountPoint], timeout: .seconds(10))
        }
    }
}

private func removeTreeStayingOnThisSide(_ path: String) {
    removeTree(path, descendingInto: { MountTable.entry(at: $0) == nil })
}

/// The directory holding the built products (`providerfs`, `fuse-fixture`) next to the test bundle.
public var productsDirectory: String {
    let executable = canonicalPath("/proc/self/exe") ?? ""
    var directory = executable
    // The test binary is .build/<config>/ProviderFSPackageTests.xctest (a file on Linux).
    while let slash = directory.lastIndex(of: "/") {
        directory = String(directory[..<slash])
        if access(directory + "/providerfs", X_OK) == 0 { return directory }
    }
    return ""
}
