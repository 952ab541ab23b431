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

    deinit {
        umount2(path, Int32(MNT_DETACH))
        parent.remove()
    }
}
