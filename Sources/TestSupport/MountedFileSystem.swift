// A FUSE mount run by a child process for the duration of a test: `providerfs mount --foreground`
// or the `fuse-fixture` test executable. `stop()` never leaves anything behind: SIGTERM, wait,
// SIGKILL, `fusermount3 -uz` when the mount survived, then the temporary directories go.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Whether mount tests run: always, unless PROVIDERFS_SKIP_MOUNT_TESTS=1 (then reported skipped).
public enum MountTestGate {
    /// False only when the environment asks to skip mount tests.
    public static var enabled: Bool { currentEnvironment()["PROVIDERFS_SKIP_MOUNT_TESTS"] != "1" }
    /// Nil when /dev/fuse is usable, else the sentence to fail the test with.
    public static var problem: String? {
        access("/dev/fuse", R_OK | W_OK) == 0
            ? nil
            : "/dev/fuse is missing or not accessible; mount tests cannot run (set PROVIDERFS_SKIP_MOUNT_TESTS=1 to skip them)"
    }
}

/// Why a mount did not come up.
public struct MountFailure: Error, CustomStringConvertible {
    /// What happened, with the daemon's stderr.
    public var description: String
}

/// A mounted file system served by a child process.
public final class MountedFileSystem: @unchecked Sendable {
    // Safe: `stopped` is guarded by `lock`; the rest is immutable.
    /// The temporary directory holding the mount point (removed by `stop`).
    public let directory: String
    /// The mount point (`directory/mnt`).
    public let mountpoint: String
    /// The daemon process.
    public let child: ChildProcess
    private let lock = Lock()
    private var stopped = false

    /// Spawns `executable arguments…` where the literal "{mountpoint}" in `arguments` is replaced
    /// by a fresh empty directory, and waits (up to `timeout`) until the mount is in mountinfo.
    public init(
        executable: String, arguments: [String], environment: [String: String] = [:], timeout: Duration = .seconds(30)
    ) throws {
        let directory = try makeTemporaryDirectory(prefix: "mount")
        let mountpoint = directory + "/mnt"
        self.directory = directory
        self.mountpoint = mountpoint
        mkdir(mountpoint, 0o755)
        let resolved = arguments.map { $0 == "{mountpoint}" ? mountpoint : $0 }
        do {
            child = try ChildProcess(executable, resolved, environment: environment)
        } catch {
            removeTreeWithinFileSystem(directory)
            throw error
        }
        let deadline = ContinuousClock.now + timeout
        while MountTable.entry(at: mountpoint) == nil {
            if let status = child.poll() {
                let log = child.standardError
                stop()
                throw MountFailure(description: "\(executable) exited with \(status) before mounting: \(log)")
            }
            if ContinuousClock.now > deadline {
                stop()
                throw MountFailure(description: "\(executable) did not mount within \(timeout)")
            }
            usleep(10_000)
        }
    }

    /// Mounts an in-memory copy of `tree` with the `fuse-fixture` test executable.
    public static func fixture(tree: String? = nil, extraArguments: [String] = []) throws -> MountedFileSystem {
        var arguments = ["{mountpoint}"]
        if let tree { arguments += ["--tree", tree] }
        return try MountedFileSystem(
            executable: productsDirectory + "/fuse-fixture", arguments: arguments + extraArguments)
    }

    /// `providerfs mount ARGUMENTS… {mountpoint} --foreground`.
    public static func providerfs(
        _ arguments: [String], environment: [String: String] = [:]
    ) throws -> MountedFileSystem {
        try MountedFileSystem(
            executable: productsDirectory + "/providerfs",
            arguments: ["mount"] + arguments + ["{mountpoint}", "--foreground"], environment: environment)
    }

    /// `mountpoint + "/" + relative`.
    public func path(_ relative: String) -> String { mountpoint + "/" + relative }

    /// Stops the daemon and removes everything; returns its exit status (nil if it had to be
    /// killed). Safe to call more than once.
    @discardableResult
    public func stop(timeout: Duration = .seconds(10)) -> Int32? {
        let first = lock.withLock { () -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return child.poll() }
        child.signal(SIGTERM)
        var status = child.wait(timeout: timeout)
        if status == nil {
            child.signal(SIGKILL)
            child.wait(timeout: .seconds(5))
            status = nil
        }
        if MountTable.entry(at: mountpoint) != nil {
            _ = try? ChildProcess.run("/bin/fusermount3", ["-uz", mountpoint], timeout: .seconds(10))
        }
        removeTreeWithinFileSystem(directory)
        return status
    }

    deinit { stop() }
}
