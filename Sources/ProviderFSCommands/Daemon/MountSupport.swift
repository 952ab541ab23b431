// What mount, unmount, status and download share: user directories, the mount registry, mount
// point checks (stale, busy, not empty…), and process helpers.

import ControlWire
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// XDG base directories (with the spec's fallbacks under $HOME).
enum UserDirectories {
    static func home(_ environment: [String: String] = currentEnvironment()) -> String {
        if let home = environment["HOME"], !home.isEmpty { return home }
        if let entry = getpwuid(getuid()), let directory = entry.pointee.pw_dir { return String(cString: directory) }
        return "/tmp"
    }

    /// `$XDG_CACHE_HOME` or `~/.cache`.
    static func cacheHome(_ environment: [String: String] = currentEnvironment()) -> String {
        environment["XDG_CACHE_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home(environment) + "/.cache"
    }

    /// `$XDG_DATA_HOME` or `~/.local/share`.
    static func dataHome(_ environment: [String: String] = currentEnvironment()) -> String {
        environment["XDG_DATA_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home(environment) + "/.local/share"
    }

    /// Where `--demo` keeps its source: `$XDG_DATA_HOME/providerfs/demo`.
    static var demoSource: String { dataHome() + "/providerfs/demo" }

    /// The default cache directory of a source: `$XDG_CACHE_HOME/providerfs/<name>-<hash of source>`.
    static func defaultCache(forSource source: String) -> String {
        let name = source.split(separator: "/").last.map(String.init) ?? "root"
        let safe = String(name.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" ? $0 : "_" }.prefix(40))
        return cacheHome() + "/providerfs/\(safe)-\(fnv1a(source))"
    }
}

/// One running (or crashed) mount, as the daemon recorded it.
struct MountRecord: Codable, Equatable {
    var pid: Int32
    /// Field 22 of /proc/<pid>/stat: tells a reused pid from our daemon.
    var processStartTime: UInt64
    var mountpoint: String
    var source: String
    var demo: Bool
    var cacheDirectory: String
    var logFile: String
    var version: String
    var startedAt: Date
    /// Require-token mode (`--require-token`); nil in records of older versions (not in it).
    var requireToken: Bool? = nil
}

/// One JSON file per mount under `<runtime dir>/mounts/`, written by the daemon once it is ready
/// and removed when it exits (or by `providerfs unmount` after a crash).
enum MountRegistry {
    static var directory: String { ControlConnection.mountsDirectory }

    static func file(for mountpoint: String) -> String { directory + "/\(fnv1a(mountpoint)).json" }

    /// The log file a daemon for `mountpoint` writes to.
    static func logFile(for mountpoint: String) -> String { directory + "/\(fnv1a(mountpoint)).log" }

    static func ensureDirectory() throws {
        _ = try RuntimeDirectory.ensure()
        try makeDirectories(directory, mode: 0o700)
    }

    static func write(_ record: MountRecord) throws {
        try ensureDirectory()
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        let path = file(for: record.mountpoint)
        // Write then rename: a reader never sees half a record.
        try encoder.encode(record).write(to: URL(fileURLWithPath: path + ".tmp"))
        guard rename(path + ".tmp", path) == 0 else { throw SystemCallError("rename \(path)") }
    }

    static func remove(mountpoint: String) {
        unlink(file(for: mountpoint))
    }

    static func record(for mountpoint: String) -> MountRecord? {
        read(file(for: mountpoint))
    }

    static func all() -> [MountRecord] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        return names.filter { $0.hasSuffix(".json") }.sorted().compactMap { read(directory + "/" + $0) }
    }

    private static func read(_ path: String) -> MountRecord? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return try? decoder.decode(MountRecord.self, from: data)
    }
}

extension MountRecord {
    /// True while the recorded daemon process exists (same pid and start time) and is not a zombie.
    var daemonIsAlive: Bool { ProcessInfoFiles.isRunning(pid, startedAt: processStartTime) }
}

/// What state a mount point is in, checked without hanging on a dead FUSE connection.
enum MountPointState: Equatable {
    case missing
    case notADirectory
    /// stat fails with ENOTCONN: a FUSE mount whose daemon is gone.
    case stale
    case mounted(type: String)
    case notEmpty
    case usable
    case inaccessible(Errno)
}

func inspectMountPoint(_ path: String) -> MountPointState {
    var info = stat()
    if stat(path, &info) != 0 {
        switch Errno.current {
        case .notConnected: return .stale
        case .noSuchFileOrDirectory: return .missing
        case let error:
            if error == Errno(ECONNABORTED) { return .stale }
            return .inaccessible(error)
        }
    }
    if let entry = MountTable.entry(at: mountPointPath(path)) {
        // Just after its daemon died, a FUSE mount's root may still stat from the kernel's
        // attribute cache; statvfs always asks the daemon, so a dead connection shows (ENOTCONN).
        if entry.fileSystemType.hasPrefix("fuse") {
            var space = statvfs()
            if statvfs(path, &space) != 0 {
                let error = Errno.current
                if error == .notConnected || error == Errno(ECONNABORTED) { return .stale }
            }
        }
        return .mounted(type: entry.fileSystemType)
    }
    guard info.st_mode & S_IFMT == S_IFDIR else { return .notADirectory }
    guard let stream = opendir(path) else { return .inaccessible(.current) }
    defer { closedir(stream) }
    while let entry = readdir(stream) {
        let first = entry.pointee.d_name.0
        let second = entry.pointee.d_name.1
        let third = entry.pointee.d_name.2
        let isDot = first == 0x2e && (second == 0 || (second == 0x2e && third == 0))
        if !isDot { return .notEmpty }
    }
    return .usable
}

/// Detaches the stale ProviderFS mount at `mountpoint` (its daemon is gone) and removes the
/// dead daemon's registry record, so that a new mount can take the mount point (D-286). Lazily:
/// processes that still hold files there keep their (dead) handles and nothing waits for them.
/// Root detaches with umount2(MNT_DETACH); others, or when that is refused, with `fusermount3
/// -uz`, which checks that the mount is theirs. Refused (nothing changed) when the mount point
/// holds another file system, or a ProviderFS mount whose recorded daemon still runs.
func cleanStaleProviderFSMount(_ mountpoint: String) throws(CommandFailure) {
    let path = mountPointPath(mountpoint)
    guard let entry = MountTable.entry(at: path) else {
        throw CommandFailure(
            "\(mountpoint) does not answer (Transport endpoint is not connected) but is not in the mount table")
    }
    guard entry.fileSystemType == "fuse.providerfs" else {
        throw CommandFailure(
            "\(mountpoint) is a stale mount of another file system (\(entry.fileSystemType)); "
                + "it is not ProviderFS's to clean: unmount it with 'fusermount3 -uz \(mountpoint)' or 'umount -l \(mountpoint)'"
        )
    }
    if let record = MountRegistry.record(for: path), record.daemonIsAlive {
        throw CommandFailure(
            "\(mountpoint) does not answer but its daemon (pid \(record.pid)) is still running; "
                + "stop it or run 'providerfs unmount --lazy \(mountpoint)'")
    }
    if geteuid() != 0 || umount2(path, Int32(MNT_DETACH)) != 0 {
        let result = runHelper(fusermountPath, ["-uz", path])
        guard result.status == 0 else {
            throw CommandFailure("cannot clean the stale mount \(mountpoint): \(result.error)")
        }
    }
    MountRegistry.remove(mountpoint: path)
}

/// The mount point of the stale mount that `path` (failing with ENOTCONN) lies in, for the
/// advice: the longest mount in /proc/self/mountinfo that contains the path. The path is resolved
/// first as far as lstat sees (absolute, symbolic links followed, "." and ".." applied); realpath
/// cannot be used, since every lstat inside the stale mount fails. Falls back to that path.
func staleMountPoint(containing path: String) -> String {
    let absolute = resolvedAsFarAsReadable(path)
    let containing = MountTable.current().map(\.mountPoint).filter { mountPoint in
        mountPoint != "/" && (absolute == mountPoint || absolute.hasPrefix(mountPoint + "/"))
    }
    return containing.max { $0.count < $1.count } ?? absolute
}

/// `path` made absolute, its symbolic links followed until a component cannot be lstat'ed; the
/// rest is kept as written, with "." and ".." applied to the text.
func resolvedAsFarAsReadable(_ path: String) -> String {
    var pending = path.split(separator: "/").map(String.init)
    var resolved =
        path.hasPrefix("/") ? [] : FileManager.default.currentDirectoryPath.split(separator: "/").map(String.init)
    var readable = true
    var links = 0
    while !pending.isEmpty {
        let name = pending.removeFirst()
        if name == "." { continue }
        if name == ".." {
            _ = resolved.popLast()
            continue
        }
        resolved.append(name)
        guard readable else { continue }
        let current = "/" + resolved.joined(separator: "/")
        var info = stat()
        guard lstat(current, &info) == 0 else {
            readable = false
            continue
        }
        guard info.st_mode & S_IFMT == S_IFLNK, links < 40 else { continue }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink(current, &buffer, Int(PATH_MAX))
        guard length > 0 else { continue }
        let target = String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        links += 1
        resolved.removeLast()
        if target.hasPrefix("/") { resolved = [] }
        pending = target.split(separator: "/").map(String.init) + pending
    }
    return "/" + resolved.joined(separator: "/")
}

/// The one sentence telling the user how to clean a stale mount.
func staleMountAdvice(_ mountpoint: String) -> String {
    "\(mountpoint) is a stale ProviderFS mount (its daemon is gone: 'Transport endpoint is not connected'); "
        + "clean it with 'providerfs unmount \(mountpoint)' (or 'fusermount3 -uz \(mountpoint)')"
}

/// Runs a helper program to completion and returns its status and stderr.
func runHelper(_ executable: String, _ arguments: [String]) -> (status: Int32, error: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let errorPipe = Pipe()
    process.standardError = errorPipe
    process.standardOutput = FileHandle.nullDevice
    process.standardInput = FileHandle.nullDevice
    do { try process.run() } catch { return (127, "cannot run \(executable): \(error)") }
    let data = errorPipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (
        process.terminationStatus, String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    )
}

/// `fusermount3` on PATH or at its Debian location.
var fusermountPath: String {
    for candidate in ["/usr/bin/fusermount3", "/bin/fusermount3", "/usr/local/bin/fusermount3"]
    where access(candidate, X_OK) == 0 {
        return candidate
    }
    return "fusermount3"
}
