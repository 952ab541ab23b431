// A small tmpfs for tests of full disks and read-only file systems (needs root).

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// True unless PROVIDERFS_SKIP_ROOT_TESTS=1: tests that need root (tmpfs mounts) fail without
/// it rather than skip silently (docs/TESTING.md).
public let rootTestsEnabled = currentEnvironment()["PROVIDERFS_SKIP_ROOT_TESTS"] != "1"

/// A tmpfs mounted for one test and always unmounted (lazily, so an open descriptor cannot keep
/// it mounted).
public final class TmpfsMount: Sendable {
    public let path: String
    private let parent: TemporaryDirectory

    public init(size: String) throws {
        parent = try TemporaryDirectory(prefix: "tmpfs")
        path = parent.path + "/mnt"
        guard mkdir(path, 0o755) == 0 else { throw TestSupportError("mkdir \(path): errno \(errno)") }
        guard mount("tmpfs", path, "tmpfs", 0, "size=\(size)") == 0 else {
            throw TestSupportError("mount tmpfs on \(path): errno \(errno) (tests need root)")
        }
    }

    public func file(_ name: String) -> String { "\(path)/\(name)" }

    /// Remounts it read-only. EBUSY means some process has a file on it open for writing: a test
    /// in another suite that spawns a child (exit tests) can briefly hold a copy of every
    /// descriptor of this process between fork and exec, so this retries for about 2 s; a real
    /// leak still fails.
    public func remountReadOnly() throws {
        for _ in 0..<100 {
            if mount("tmpfs", path, "tmpfs", UInt(MS_REMOUNT | MS_RDONLY), nil) == 0 { return }
            guard errno == EBUSY else { break }
            usleep(20_000)
        }
        throw TestSupportError("remount read-only: errno \(errno)")
    }

    deinit {
        umount2(path, Int32(MNT_DETACH))
        parent.remove()
    }
}
