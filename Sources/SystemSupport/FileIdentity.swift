// A file by device and inode, whatever it is named: how require-token mode recognizes the
// providerfs executable in another process (/proc/<pid>/exe).

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A file as the kernel knows it, whatever its name: device and inode.
public struct FileIdentity: Hashable, Sendable {
    public var device: UInt64
    public var inode: UInt64
    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    /// The file at `path`, symbolic links (and /proc's magic links) followed; nil when it cannot
    /// be stat'ed.
    public init?(path: String) {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        self.init(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
    }

    /// The file process `pid` runs (/proc/<pid>/exe, which the kernel lets a process of the same
    /// user stat). Nil when the process is gone, is a kernel thread, or is not ours to inspect.
    public static func executable(of pid: Int32) -> FileIdentity? {
        guard pid > 0 else { return nil }
        return FileIdentity(path: "/proc/\(pid)/exe")
    }

    /// The file this process runs.
    public static func ownExecutable() -> FileIdentity? { FileIdentity(path: "/proc/self/exe") }
}
