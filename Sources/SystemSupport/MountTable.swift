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
        var text = text
        return text.withUTF8 { parse(bytes: $0) }
    }

    /// The parse over the text's bytes: every process that imports or coordinates reads the
    /// table several times, and splitting it into Strings first cost ~1.5M instructions a read.
    static func parse(bytes: UnsafeBufferPointer<UInt8>) -> [MountInfoEntry] {
        var entries: [MountInfoEntry] = []
        var fields: [Range<Int>] = []
        var lineStart = 0
        while lineStart < bytes.count {
            var lineEnd = lineStart
            while lineEnd < bytes.count && bytes[lineEnd] != UInt8(ascii: "\n") { lineEnd += 1 }
            defer { lineStart = lineEnd + 1 }
            guard lineEnd > lineStart else { continue }
            fields.removeAll(keepingCapacity: true)
            var fieldStart = lineStart
            for index in lineStart...lineEnd where index == lineEnd || bytes[index] == UInt8(ascii: " ") {
                fields.append(fieldStart..<index)
                fieldStart = index + 1
            }
            guard fields.count >= 10,
                let dash = fields.firstIndex(where: { $0.count == 1 && bytes[$0.lowerBound] == UInt8(ascii: "-") }),
                dash + 2 < fields.count
            else { continue }
            func text(_ range: Range<Int>) -> String { String(decoding: bytes[range], as: UTF8.self) }
            entries.append(
                MountInfoEntry(
                    device: text(fields[2]), mountPoint: unescape(bytes[fields[4]]),
                    fileSystemType: text(fields[dash + 1]), source: unescape(bytes[fields[dash + 2]]),
                    options: text(fields[5])))
        }
        return entries
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
        return data.withUnsafeBufferPointer { parse(bytes: $0) }
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

    /// `\ooo` (three octal digits, at most 255) becomes that byte; anything else stays.
    static func unescape(_ field: Slice<UnsafeBufferPointer<UInt8>>) -> String {
        guard field.contains(UInt8(ascii: "\\")) else { return String(decoding: field, as: UTF8.self) }
        func octal(_ byte: UInt8) -> UInt32? {
            (UInt8(ascii: "0")...UInt8(ascii: "7")).contains(byte) ? UInt32(byte - UInt8(ascii: "0")) : nil
        }
        var bytes: [UInt8] = []
        var index = field.startIndex
        while index < field.endIndex {
            if field[index] == UInt8(ascii: "\\"), index + 3 < field.endIndex, let high = octal(field[index + 1]),
                let middle = octal(field[index + 2]), let low = octal(field[index + 3]),
                high * 64 + middle * 8 + low < 256
            {
                bytes.append(UInt8(high * 64 + middle * 8 + low))
                index += 4
            } else {
                bytes.append(field[index])
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
