// `providerfs evict PATH…`: returns files (or every file under a directory) to placeholders in
// the mount's daemon and frees their space in its cache, through the control socket
// (docs/CONTROL.md). Per file: evicted (with the bytes freed), already a placeholder, or refused
// with the reason (changes not uploaded yet, open, downloading, a presenter refused, …). Exit 0
// when nothing was refused, 1 otherwise.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct EvictCommand: CLICommand {
    static let name = "evict"
    static let summary = "return files (or folders, recursively) to placeholders and free their cache space"
    static let usage = "providerfs evict PATH... [--json]"

    struct FileResult: Encodable {
        var path: String
        /// evicted, alreadyPlaceholder or refused (or failed: the request itself did not work).
        var outcome: String
        var reason: String?
        var freedBytes: Int64
        var state: String?
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        var paths: [String] = []
        while let path = arguments.positional() { paths.append(path) }
        try arguments.finish()
        guard !paths.isEmpty else { throw UsageError("providerfs evict: missing PATH.\nusage: \(usage)") }
        var results: [FileResult] = []
        for path in paths {
            var info = stat()
            guard stat(path, &info) == 0 else {
                if Errno.current == .notConnected {
                    throw CommandFailure(staleMountAdvice(staleMountPoint(containing: path)))
                }
                throw CommandFailure("\(path): \(Errno.current.message)")
            }
            let (client, root) = try ControlClient.forMount(containing: path)
            let files = info.st_mode & S_IFMT == S_IFDIR ? DownloadCommand.regularFiles(under: path) : [path]
            for file in files {
                let relative = DownloadCommand.relativePath(of: file, under: path, root: root)
                let result = await evict(file, relativePath: relative, client: client)
                results.append(result)
                if io.json {
                    io.emit(result)
                } else {
                    io.line(describe(result))
                }
            }
        }
        let refused = results.filter { $0.outcome == "refused" || $0.outcome == "failed" }
        if !io.json && results.count > 1 {
            let freed = results.reduce(Int64(0)) { $0 + $1.freedBytes }
            io.line(
                "\(results.count - refused.count) of \(results.count) files are placeholders now; "
                    + "\(formatSize(freed)) freed.")
        }
        if let first = refused.first {
            throw CommandFailure(
                refused.count == 1
                    ? "\(first.path) was not evicted: \(first.reason ?? "")"
                    : "\(refused.count) files were not evicted; first: \(first.path): \(first.reason ?? "")")
        }
        return ExitStatus.success
    }

    static func evict(_ path: String, relativePath: String, client: ControlClient) async -> FileResult {
        do {
            let reply = try await client.evict(relativePath)
            return FileResult(
                path: path, outcome: reply.outcome, reason: reply.reason, freedBytes: reply.freedBytes,
                state: reply.item.state)
        } catch {
            return FileResult(path: path, outcome: "failed", reason: error.message, freedBytes: 0, state: nil)
        }
    }

    static func describe(_ result: FileResult) -> String {
        switch result.outcome {
        case "evicted": "\(result.path): evicted, \(formatSize(result.freedBytes)) freed"
        case "alreadyPlaceholder": "\(result.path): already a placeholder"
        default: "\(result.path): not evicted: \(result.reason ?? "")"
        }
    }
}
