#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One line of `/proc/self/mountinfo` (proc(5)): the fields ProviderFS needs.
public struct MountInfoEntry: Sendable, Equatable {
    /// "major:minor" of the mounted file system (for FUSE: the bdi under /sys/class/bdi/).
    public var device: String
    /// The mount point, unescaped.
    public var mountPoint: String
    /// The file-system type, e.g. "fuse.providerfs".
    public var fileSystemType: String
    /// The mount source, e.g. "providerfs" or the source directory.
    public var source: String
    /// The per-mount options, e.g. "rw,nosuid,nodev,relatime".
    public var options: String
}

/// Reads the kernel's mount table. Paths in mountinfo are octal-escaped (space = \040).
public enum MountTable {
    /// Parses mountinfo text; lines that do not parse are skipped.
    public static func parse(_ text: String) -> [MountInfoEntry] {
        text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count >= 10, let dash = fields.firstIndex(of: "-"), dash + 2 < fields.count else {
                return nil
            }
            return MountInfoEntry(
                device: String(fields[2]), mountPoint: unescape(fields[4]), fileSystemType: String(fields[dash + 1]),
                source: unescape(fields[dash + 2]), options: String(fields[5]))
        }
    }

    /// The current mounts, from `/proc/self/mountinfo`.
    public static func current() -> [MountInfoEntry] {
        parse(readTextFile("/proc/self/mountinfo") ?? "")
    }

    /// The mounts read again from the start of `descriptor`, an open `/proc/self/mountinfo` that
    /// the caller polls for POLLPRI (a change of the table); nil when it cannot be read.
    public static func load(from descriptor: Int32) -> [MountInfoEntry]? {
        guard descriptor >= 0, lseek(descriptor, 0, SEEK_SET) == 0 else { return nil }
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { buffer in
                retryingOnInterrupt { read(descriptor, buffer.baseAddress, buffer.count) }
            }
            if count < 0 { return nil }
            if count == 0 { break }
            data += chunk[0..<count]
        }
        return parse(String(decoding: data, as: UTF8.self))
    }

    /// File-system types whose every change passes through this kernel, so that inotify sees it
    /// (not NFS/CIFS, changed by other machines; not FUSE, changed by its daemon). The resolution
    /// cache and the local provider's change tracking trust inotify only on these.
    public static let localFileSystemTypes: Set<String> = [
        "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "ramfs",
    ]

    /// The mounts of the file system on device `device` (an `st_dev`), from mountinfo's
    /// "major:minor" field.
    public static func entries(onDevice device: UInt64) -> [MountInfoEntry] {
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~UInt64(0xfff))
        let minor = (device & 0xff) | ((device >> 12) & ~UInt64(0xff))
        let name = "\(major):\(minor)"
        return current().filter { $0.device == name }
    }

    /// The entry mounted exactly at `path` (the last one when mounts are stacked), if any.
    public static func entry(at path: String) -> MountInfoEntry? {
        current().last { $0.mountPoint == path }
    }

    /// The mount that contains `path` (the longest mount point that is a prefix of it).
    public static func containing(_ path: String) -> MountInfoEntry? {
        let absolute = mountPointPath(path)
        return current().filter { entry in
            entry.mountPoint == "/" || absolute == entry.mountPoint || absolute.hasPrefix(entry.mountPoint + "/")
        }.max { $0.mountPoint.count < $1.mountPoint.count }
    }

    static func unescape(_ field: Substring) -> String {
        var bytes: [UInt8] = []
        let source = Array(field.utf8)
        var index = 0
        while index < source.count {
            if source[index] == UInt8(ascii: "\\"), index + 3 < source.count,
                let value = UInt8(String(decoding: source[(index + 1)...(index + 3)], as: UTF8.self), radix: 8)
            {
                bytes.append(value)
                index += 4
            } else {
                bytes.append(source[index])
                index += 1
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// The whole content of a (small) file as UTF-8 text, or nil when it cannot be read.
public func readTextFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = chunk.withUnsafeMutableBytes { buffer in
            retryingOnInterrupt { read(fd, buffer.baseAddress, buffer.count) }
        }
        if count < 0 { return nil }
        if count == 0 { break }
        result += chunk[0..<count]
    }
    return String(decoding: result, as: UTF8.self)
}

/// `realpath(3)`: the absolute path with symlinks resolved, or nil when it does not resolve.
public func canonicalPath(_ path: String) -> String? {
    guard let resolved = realpath(path, nil) else { return nil }
    defer { free(resolved) }
    return String(cString: resolved)
}

/// A mount point's absolute path as mountinfo shows it, computed without touching the mount point
/// itself (a stat of a stale FUSE mount fails with ENOTCONN, and a daemon must not stat its own
/// mount): only the parent directory is resolved.
public func mountPointPath(_ path: String) -> String {
    var trimmed = path
    while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
    guard let slash = trimmed.lastIndex(of: "/") else {
        return (canonicalPath(".") ?? "") + "/" + trimmed
    }
    let parent = slash == trimmed.startIndex ? "/" : String(trimmed[..<slash])
    let base = String(trimmed[trimmed.index(after: slash)...])
    if base.isEmpty { return "/" }
    let resolvedParent = canonicalPath(parent) ?? parent
    return (resolvedParent == "/" ? "" : resolvedParent) + "/" + base
}
