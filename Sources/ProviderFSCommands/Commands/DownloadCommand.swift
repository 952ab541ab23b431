// `providerfs download PATH`: materializes a file (or every file under a directory) in the mount's
// daemon, through its control socket (docs/CONTROL.md): the daemon fetches every byte into its
// cache, and the command polls the item's progress until it is materialized or failed. An item
// already fully here is reported as "already downloaded". A progress bar on a terminal; plain
// progress lines otherwise.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct DownloadCommand: CLICommand {
    static let name = "download"
    static let summary = "download (materialize) a file or a folder in the mount's cache, with progress"
    static let usage = "providerfs download PATH [--json]"

    /// How often the progress of a running download is asked for.
    static let pollInterval: Duration = .milliseconds(100)

    struct FileResult: Encodable {
        var path: String
        var bytes: Int64
        var size: Int64
        var state: String?
        var error: String?
        /// Every byte was already in the cache: nothing was fetched.
        var alreadyDownloaded = false
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        var info = stat()
        guard stat(path, &info) == 0 else {
            if Errno.current == .notConnected {
                throw CommandFailure(staleMountAdvice(staleMountPoint(containing: path)))
            }
            throw CommandFailure("\(path): \(Errno.current.message)")
        }
        let (client, root) = try ControlClient.forMount(containing: path)
        let files = info.st_mode & S_IFMT == S_IFDIR ? regularFiles(under: path) : [path]
        let progress = ProgressDisplay(terminal: isatty(1) == 1 && !io.json, io: io)
        var results: [FileResult] = []
        for file in files {
            let relative = relativePath(of: file, under: path, root: root)
            let result = await download(file, relativePath: relative, client: client, progress: progress)
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

    /// Asks the daemon to download `relativePath` and follows its progress to the end.
    static func download(
        _ path: String, relativePath: String, client: ControlClient, progress: ProgressDisplay
    ) async -> FileResult {
        var result = FileResult(path: path, bytes: 0, size: 0)
        do {
            let reply = try await client.download(relativePath)
            var item = reply.item
            result.size = item.totalBytes
            if reply.alreadyDownloaded {
                result.bytes = item.presentBytes
                result.state = item.state
                result.alreadyDownloaded = true
                progress.alreadyDownloaded(path, size: item.totalBytes)
                return result
            }
            progress.start(path, size: item.totalBytes)
            while true {
                result.bytes = item.presentBytes
                result.state = item.state
                progress.update(path, bytes: item.presentBytes, size: item.totalBytes)
                if item.state == "materialized" { break }
                if item.state != "downloading" {
                    result.error =
                        "download failed after \(formatSize(item.presentBytes)): "
                        + (item.error.map { error in
                            "\(error.message)\(error.offset.map { " (at byte \($0))" } ?? "") [\(error.errno)]"
                        } ?? "it stopped (\(item.state))")
                    break
                }
                try? await Task.sleep(for: pollInterval)
                item = try await client.item(relativePath)
            }
        } catch {
            result.error = error.message
        }
        progress.finish(path, bytes: result.bytes, size: result.size, error: result.error)
        return result
    }

    /// `file` (at or under the command's `path`) relative to the mount root, given `root`: `path`
    /// relative to the mount root (`ControlClient.forMount`).
    static func relativePath(of file: String, under path: String, root: String) -> String {
        let suffix = String(file.dropFirst(path.count)).drop { $0 == "/" }
        return root.isEmpty ? String(suffix) : suffix.isEmpty ? root : root + "/" + suffix
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
            // Redrawn at most every 100 ms, and always at 100%.
            guard ContinuousClock.now - lastDraw > .milliseconds(100) || bytes >= size else { return }
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

    func alreadyDownloaded(_ path: String, size: Int64) {
        guard !io.json else { return }
        io.line("\(path): already downloaded (\(formatSize(size)))")
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
