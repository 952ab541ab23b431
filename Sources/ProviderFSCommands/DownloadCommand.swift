// `providerfs download PATH`: materializes a file (or every file under a directory) by reading it
// through the mount, so the same download path, coordination and cache rules apply as for any
// reader. A progress bar on a terminal; plain progress lines otherwise.

import FUSEAdapter
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct DownloadCommand: CLICommand {
    static let name = "download"
    static let summary = "download (materialize) a file or a folder through the mount, with progress"
    static let usage = "providerfs download PATH [--json]"

    struct FileResult: Encodable {
        var path: String
        var bytes: Int64
        var size: Int64
        var state: String?
        var error: String?
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        var info = stat()
        guard stat(path, &info) == 0 else {
            if Errno.current == .notConnected { throw CommandFailure(staleMountAdvice(mountPointPath(path))) }
            throw CommandFailure("\(path): \(Errno.current.message)")
        }
        let files = info.st_mode & S_IFMT == S_IFDIR ? regularFiles(under: path) : [path]
        let progress = ProgressDisplay(terminal: isatty(1) == 1 && !io.json, io: io)
        var results: [FileResult] = []
        for file in files {
            let result = download(file, progress: progress)
            results.append(result)
            if io.json { io.emit(result) }
        }
        let failed = results.filter { $0.error != nil }
        if !io.json && files.count > 1 {
            io.line("\(results.count - failed.count) of \(results.count) files downloaded.")
        }
        if let first = failed.first {
            throw CommandFailure(
                failed.count == 1
                    ? "\(first.path): \(first.error!)"
                    : "\(failed.count) files failed; first: \(first.path): \(first.error!)")
        }
        return ExitStatus.success
    }

    static func download(_ path: String, progress: ProgressDisplay) -> FileResult {
        var info = stat()
        _ = stat(path, &info)
        let size = Int64(info.st_size)
        var result = FileResult(path: path, bytes: 0, size: size)
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            result.error = Errno.current.description
            progress.finish(path, bytes: 0, size: size, error: result.error)
            return result
        }
        defer { close(fd) }
        let buffer = AlignedBuffer(capacity: 1 << 20)
        progress.start(path, size: size)
        while true {
            let count = buffer.withUnsafeMutableBytes { raw in
                retryingOnInterrupt { read(fd, raw.baseAddress, raw.count) }
            }
            if count < 0 {
                result.error = "download failed after \(formatSize(result.bytes)): \(Errno.current.description)"
                break
            }
            if count == 0 { break }
            result.bytes += Int64(count)
            progress.update(path, bytes: result.bytes, size: size)
        }
        if case .success(let state) = ExtendedAttributes.value("user.providerfs.state", of: path) {
            result.state = String(decoding: state, as: UTF8.self)
        }
        progress.finish(path, bytes: result.bytes, size: size, error: result.error)
        return result
    }

    /// Every regular file below `directory`, sorted. A plain readdir walk: FileManager's
    /// enumerator (fts) trusts a directory link count of 2 to mean "no subdirectories", which a
    /// FUSE file system need not honour.
    static func regularFiles(under directory: String) -> [String] {
        var files: [String] = []
        guard let stream = opendir(directory) else { return files }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        closedir(stream)
        for name in names.sorted() {
            let full = directory + "/" + name
            var info = stat()
            guard lstat(full, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFREG: files.append(full)
            case S_IFDIR: files += regularFiles(under: full)
            default: continue
            }
        }
        return files
    }
}

/// Progress output: a redrawn bar on a terminal, else a line per 10% step (and at the end).
final class ProgressDisplay: @unchecked Sendable {
    // Safe: used from the one task running the command.
    let terminal: Bool
    let io: CommandIO
    private var lastStep = -1
    private var lastDraw = ContinuousClock.now

    init(terminal: Bool, io: CommandIO) {
        self.terminal = terminal
        self.io = io
    }

    func start(_ path: String, size: Int64) {
        lastStep = -1
        lastDraw = .now - .seconds(1)
        if !io.json && !terminal { io.line("\(path): downloading \(formatSize(size))") }
    }

    func update(_ path: String, bytes: Int64, size: Int64) {
        guard !io.json else { return }
        let fraction = size > 0 ? min(1, Double(bytes) / Double(size)) : 1
        if terminal {
            guard ContinuousClock.now - lastDraw > .milliseconds(100) else { return }
            lastDraw = .now
            let width = 30
            let filled = Int(fraction * Double(width))
            let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
            let text = "\r\(path) [\(bar)] \(Int(fraction * 100))% \(formatSize(bytes))/\(formatSize(size))"
            FileHandle.standardOutput.write(Data(text.utf8))
        } else {
            let step = Int(fraction * 10)
            guard step > lastStep, step < 10 else { return }
            lastStep = step
            io.line("\(path): \(step * 10)% (\(formatSize(bytes)) of \(formatSize(size)))")
        }
    }

    func finish(_ path: String, bytes: Int64, size: Int64, error: String?) {
        guard !io.json else { return }
        if terminal { FileHandle.standardOutput.write(Data("\r\u{1B}[K".utf8)) }
        if let error {
            io.line("\(path): FAILED: \(error)")
        } else {
            io.line("\(path): 100% (\(formatSize(bytes))) done")
        }
    }
}
