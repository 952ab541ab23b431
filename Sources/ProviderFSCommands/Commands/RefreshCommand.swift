// `providerfs refresh PATH…`: asks the mount's provider again about each path now (D-450),
// through the control socket (docs/CONTROL.md): its directory's listing and, for a directory, its
// own. What changed on the provider (a file rewritten, created, deleted on a WebDAV server or in
// the source directory) is applied as the mount applies any change it learns of: the kernel's
// caches drop it, open readers of a changed version get ESTALE, presenters are told. The path
// itself is never stat'ed (it may be gone). Exit 0 when every path was refreshed, 1 otherwise.

import SystemSupport

struct RefreshCommand: CLICommand {
    static let name = "refresh"
    static let summary = "ask the provider again about files or folders now (changes made elsewhere)"
    static let usage = "providerfs refresh PATH... [--json]"

    struct PathResult: Encodable {
        var path: String
        /// present, absent, or failed (the request did not work; `reason` says why).
        var outcome: String
        var reason: String?
        var kind: String?
        var size: Int64?
        var version: String?
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        var paths: [String] = []
        while let path = arguments.positional() { paths.append(path) }
        try arguments.finish()
        guard !paths.isEmpty else { throw UsageError("providerfs refresh: missing PATH.\nusage: \(usage)") }
        var failed: [PathResult] = []
        for path in paths {
            let result: PathResult
            do throws(CommandFailure) {
                let (client, relative) = try ControlClient.forMount(containing: path)
                let reply = try await client.refresh(relative)
                result = PathResult(
                    path: path, outcome: reply.present ? "present" : "absent", kind: reply.kind, size: reply.size,
                    version: reply.version)
            } catch {
                result = PathResult(path: path, outcome: "failed", reason: error.message)
                failed.append(result)
            }
            if io.json {
                io.emit(result)
            } else {
                io.line(describe(result))
            }
        }
        if let first = failed.first {
            throw CommandFailure(
                failed.count == 1
                    ? "\(first.path) was not refreshed: \(first.reason ?? "")"
                    : "\(failed.count) paths were not refreshed; first: \(first.path): \(first.reason ?? "")")
        }
        return ExitStatus.success
    }

    static func describe(_ result: PathResult) -> String {
        switch result.outcome {
        case "present": "\(result.path): refreshed (\(result.kind ?? "item"), version \(result.version ?? "?"))"
        case "absent": "\(result.path): refreshed; the provider has no such item"
        default: "\(result.path): not refreshed: \(result.reason ?? "")"
        }
    }
}
