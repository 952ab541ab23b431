#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A fresh directory under /tmp, removed with everything in it by `remove()`.
public struct TemporaryDirectory: Sendable {
    public let path: String

    public init(prefix: String = "providerfs-test") throws {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw TestSupportError("mkdtemp failed: errno \(errno)")
        }
        path = String(cString: made)
    }

    /// `rm -rf` of the directory.
    public func remove() {
        removeTree(path)
    }

    /// Writes `bytes` to `relativePath` (parents created), replacing any file there.
    public func write(_ relativePath: String, _ bytes: [UInt8]) throws {
        try writeFile(path + "/" + relativePath, bytes)
    }
}

/// A failure inside a test helper.
public struct TestSupportError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Writes a whole file (creating parent directories), truncating an existing one.
public func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    if let slash = path.lastIndex(of: "/") {
        var prefix = ""
        for component in path[..<slash].split(separator: "/") {
            prefix += "/" + component
            mkdir(prefix, 0o755)
        }
    }
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    guard fd >= 0 else { throw TestSupportError("open \(path): errno \(errno)") }
    defer { close(fd) }
    var done = 0
    while done < bytes.count {
        let result = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
        guard result > 0 else { throw TestSupportError("write \(path): errno \(errno)") }
        done += result
    }
}

/// Reads a whole file.
public func readFile(_ path: String) throws -> [UInt8] {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { throw TestSupportError("open \(path): errno \(errno)") }
    defer { close(fd) }
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, 65536) }
        guard count >= 0 else { throw TestSupportError("read \(path): errno \(errno)") }
        if count == 0 { return result }
        result += buffer[0..<count]
    }
}

/// `rm -rf path` (no symlink following).
public func removeTree(_ path: String) {
    removeTree(path, descendingInto: { _ in true })
}

/// `rm -rf path`, entering a directory only when `descend` says so (a directory it refuses is
/// left whole). Names go by their bytes: a name that is not UTF-8 (as the bad-input tests make)
/// is removed like any other.
func removeTree(_ path: String, descendingInto descend: (String) -> Bool) {
    removeTree(bytes: Array(path.utf8).map { CChar(bitPattern: $0) }, descend: descend)
}

private func removeTree(bytes path: [CChar], descend: (String) -> Bool) {
    let cPath = path + [0]
    var info = stat()
    guard lstat(cPath, &info) == 0 else { return }
    guard info.st_mode & S_IFMT == S_IFDIR else {
        unlink(cPath)
        return
    }
    guard descend(String(decoding: path.map { UInt8(bitPattern: $0) }, as: UTF8.self)) else { return }
    if let directory = opendir(cPath) {
        var names: [[CChar]] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                raw.prefix(while: { $0 != 0 }).map { CChar(bitPattern: $0) }
            }
            if name != [46] && name != [46, 46] { names.append(name) }
        }
        closedir(directory)
        for name in names { removeTree(bytes: path + [47] + name, descend: descend) }
    }
    rmdir(cPath)
}

/// The byte at `offset` of ramp content with `seed`: every read checks itself (mountpoint-s3's
/// `ramp`), no expected copy needed.
@inline(__always)
public func rampByte(seed: UInt64, offset: Int64) -> UInt8 {
    let mixed = UInt64(bitPattern: offset) &* 0x9E37_79B9 &+ seed &* 0x85EB_CA6B
    return UInt8(truncatingIfNeeded: (mixed >> 13) ^ mixed)
}

/// `count` ramp bytes starting at `offset`.
public func rampBytes(seed: UInt64, offset: Int64, count: Int) -> [UInt8] {
    [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        for index in 0..<count { buffer[index] = rampByte(seed: seed, offset: offset + Int64(index)) }
        initialized = count
    }
}
