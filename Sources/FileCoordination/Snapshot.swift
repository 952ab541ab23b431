// `.forUploading` snapshots (rules 48–49): a copy of a file, or a directory as one ustar archive
// written here (Apple makes a zip; there is no zip writer in the toolchain or Debian's C libraries
// we link, and tar keeps modes and symlinks: decision D-105). Long names use GNU 'L'/'K' records,
// which GNU tar, bsdtar and Python's tarfile read.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A temporary copy handed to a `.forUploading` accessor and removed when it returns.
struct Snapshot {
    /// The snapshot file.
    let url: URL
    /// The private directory holding it.
    let directory: String

    static func make(of path: String) throws(CoordinationError) -> Snapshot {
        var template = Array((NSTemporaryDirectory() + "/providerfs-snapshot-XXXXXX").utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw CoordinationError(
                .fileOperationFailed, "Cannot create a snapshot directory: \(Errno.current.message).")
        }
        let directory = String(cString: made)
        let name = path == "/" ? "root" : String(path.split(separator: "/").last!)
        var info = stat()
        guard lstat(path, &info) == 0 else {
            rmdir(directory)
            throw CoordinationError(.fileOperationFailed, "Cannot snapshot \(path): \(Errno.current.message).")
        }
        do {
            if info.st_mode & S_IFMT == S_IFDIR {
                let archive = directory + "/" + name + ".tar"
                try TarWriter.archive(directory: path, as: name, to: archive)
                return Snapshot(url: URL(fileURLWithPath: archive), directory: directory)
            }
            let copy = directory + "/" + name
            try FileManager.default.copyItem(atPath: path, toPath: copy)
            return Snapshot(url: URL(fileURLWithPath: copy), directory: directory)
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw CoordinationError(.fileOperationFailed, "Cannot snapshot \(path): \(error).")
        }
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A minimal ustar writer: directories, regular files, symbolic links.
enum TarWriter {
    static func archive(directory: String, as name: String, to archivePath: String) throws {
        let fd = open(archivePath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SystemCallError("open \(archivePath)") }
        defer { close(fd) }
        var output = Output(fd: fd)
        try add(path: directory, name: name, to: &output)
        try output.write([UInt8](repeating: 0, count: 1024))  // two zero blocks end the archive
        try output.flush()
    }

    struct Output {
        let fd: Int32
        var buffer: [UInt8] = []
        mutating func write(_ bytes: [UInt8]) throws {
            buffer += bytes
            if buffer.count >= 1 << 20 { try flush() }
        }
        mutating func flush() throws {
            var offset = 0
            while offset < buffer.count {
                let written = buffer[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
                if written < 0 {
                    if errno == EINTR { continue }
                    throw SystemCallError("write")
                }
                offset += written
            }
            buffer.removeAll(keepingCapacity: true)
        }
    }

    private static func add(path: String, name: String, to output: inout Output) throws {
        var info = stat()
        guard lstat(path, &info) == 0 else { throw SystemCallError("lstat \(path)") }
        let mode = Int(info.st_mode & 0o7777)
        let mtime = Int(info.st_mtim.tv_sec)
        switch info.st_mode & S_IFMT {
        case S_IFDIR:
            try header(name: name + "/", mode: mode, size: 0, mtime: mtime, type: "5", link: "", to: &output)
            let entries = try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            for entry in entries { try add(path: path + "/" + entry, name: name + "/" + entry, to: &output) }
        case S_IFLNK:
            let target = try FileManager.default.destinationOfSymbolicLink(atPath: path)
            try header(name: name, mode: mode, size: 0, mtime: mtime, type: "2", link: target, to: &output)
        case S_IFREG:
            let size = Int(info.st_size)
            try header(name: name, mode: mode, size: size, mtime: mtime, type: "0", link: "", to: &output)
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw SystemCallError("open \(path)") }
            defer { close(fd) }
            var remaining = size
            var chunk = [UInt8](repeating: 0, count: 1 << 16)
            while remaining > 0 {
                let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, min($0.count, remaining)) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { throw SystemCallError("read \(path)", count == 0 ? .ioError : .current) }
                try output.write(Array(chunk[0..<count]))
                remaining -= count
            }
            let padding = (512 - size % 512) % 512
            try output.write([UInt8](repeating: 0, count: padding))
        default:
            break  // sockets, fifos, devices: not part of a document
        }
    }

    private static func header(
        name: String, mode: Int, size: Int, mtime: Int, type: Character, link: String, to output: inout Output
    ) throws {
        let nameBytes = Array(name.utf8)
        let linkBytes = Array(link.utf8)
        if nameBytes.count > 100 { try longRecord(nameBytes, type: "L", to: &output) }
        if linkBytes.count > 100 { try longRecord(linkBytes, type: "K", to: &output) }
        output.buffer += block(
            name: Array(nameBytes.prefix(100)), mode: mode, size: size, mtime: mtime, type: type,
            link: Array(linkBytes.prefix(100)))
    }

    private static func longRecord(_ bytes: [UInt8], type: Character, to output: inout Output) throws {
        output.buffer += block(
            name: Array("././@LongLink".utf8), mode: 0o644, size: bytes.count + 1, mtime: 0, type: type, link: [])
        var data = bytes + [0]
        data += [UInt8](repeating: 0, count: (512 - data.count % 512) % 512)
        try output.write(data)
    }

    private static func block(
        name: [UInt8], mode: Int, size: Int, mtime: Int, type: Character, link: [UInt8]
    )
        -> [UInt8]
    {
        var block = [UInt8](repeating: 0, count: 512)
        func put(_ bytes: [UInt8], at offset: Int) {
            for (index, byte) in bytes.enumerated() { block[offset + index] = byte }
        }
        func octal(_ value: Int, width: Int) -> [UInt8] {
            let digits = String(value, radix: 8)
            return Array((String(repeating: "0", count: max(0, width - 1 - digits.count)) + digits).utf8) + [0]
        }
        put(name, at: 0)
        put(octal(mode, width: 8), at: 100)
        put(octal(Int(getuid()), width: 8), at: 108)
        put(octal(Int(getgid()), width: 8), at: 116)
        put(octal(size, width: 12), at: 124)
        put(octal(mtime, width: 12), at: 136)
        put(Array(String(type).utf8), at: 156)
        put(link, at: 157)
        put(Array("ustar".utf8) + [0], at: 257)
        put(Array("00".utf8), at: 263)
        put([UInt8](repeating: UInt8(ascii: " "), count: 8), at: 148)
        let sum = block.reduce(0) { $0 + Int($1) }
        put(
            Array((String(repeating: "0", count: max(0, 6 - String(sum, radix: 8).count)) + String(sum, radix: 8)).utf8)
                + [0, UInt8(ascii: " ")], at: 148)
        return block
    }
}
