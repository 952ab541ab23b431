// Whole-file writes that a crash cannot leave half done, and appends, at mode 0600.

import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

enum AtomicFile {
    /// SystemSupport's `replaceFileAtomically`: temporary file, fsync, rename, directory fsync.
    static func replace(_ path: String, with bytes: [UInt8]) -> String? {
        replaceFileAtomically(path, with: bytes)
    }

    /// Appends `bytes` to `path` (created at mode 0600). Returns why it failed, or nil.
    static func append(_ bytes: [UInt8], to path: String) -> String? {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "open \(path): \(Errno.current.message)" }
        defer { close(fd) }
        return writeAll(fd, bytes)
    }

    /// The whole file, or nil and errno when it cannot be read.
    static func contents(of path: String) -> Result<[UInt8], Errno> {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return .failure(.current) }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let got = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if got < 0 {
                if errno == EINTR { continue }
                return .failure(.current)
            }
            if got == 0 { return .success(bytes) }
            bytes.append(contentsOf: chunk[0..<got])
        }
    }

    private static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> String? {
        var offset = 0
        while offset < bytes.count {
            let wrote = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if wrote < 0 {
                if errno == EINTR { continue }
                return Errno.current.message
            }
            offset += wrote
        }
        return nil
    }
}
