// Replacing a small file so that a crash or power cut leaves either the old contents or the new,
// never a mix: the stores of faults and of access tokens keep their state this way.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Writes `bytes` to a new temporary file beside `path` (mode 0600), fsyncs it, renames it over
/// `path`, then fsyncs the directory. Returns why it failed (the temporary file removed), or nil.
/// Concurrent calls, even for the same path, use distinct temporary files; the last rename wins.
public func replaceFileAtomically(_ path: String, with bytes: [UInt8]) -> String? {
    let temporary = path + ".tmp-\(getpid())-\(temporarySerial.next())"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return "open \(temporary): \(Errno.current.message)" }
    let written = bytes.withUnsafeBytes { raw -> Result<Void, Errno> in
        guard let base = raw.baseAddress else { return .success(()) }
        return writeFully(fd, from: base, count: raw.count, at: 0)
    }
    if case .failure(let error) = written {
        close(fd)
        unlink(temporary)
        return "write \(temporary): \(error.message)"
    }
    guard fsync(fd) == 0 else {
        let error = Errno.current
        close(fd)
        unlink(temporary)
        return "fsync \(temporary): \(error.message)"
    }
    close(fd)
    guard rename(temporary, path) == 0 else {
        let error = Errno.current
        unlink(temporary)
        return "rename to \(path): \(error.message)"
    }
    let directory = path.lastIndex(of: "/").map { String(path[..<$0]) } ?? "."
    let directoryFD = open(directory.isEmpty ? "/" : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    if directoryFD >= 0 {
        fsync(directoryFD)
        close(directoryFD)
    }
    return nil
}

/// Numbers the temporary files of this process.
private let temporarySerial = SerialNumbers()

private final class SerialNumbers: Sendable {
    private let value = Locked<UInt64>(0)
    func next() -> UInt64 {
        value.withLock { value in
            value += 1
            return value
        }
    }
}
