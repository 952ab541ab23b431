// `providerfs pin PATH…` (keep downloaded: the daemon downloads the files in the background,
// with progress in `providerfs status MOUNTPOINT`, fetches their changes eagerly and never evicts
// them) and `providerfs pin --inherit PATH…` (back to the parent's policy), through the control
// socket (docs/CONTROL.md, D-445). A directory's state covers what is in it, now and later.
// `providerfs unpin` (UnpinCommand.swift) is the same request with `unpinned`. Exit 0 when every
// state was set.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct PinCommand: CLICommand {
    static let name = "pin"
    static let summary = "keep files (or folders, with what comes into them later) downloaded; --inherit undoes it"
    static let usage = "providerfs pin [--inherit] PATH... [--json]"

    /// One path's outcome.
    struct PathResult: Encodable {
        var path: String
        /// pinned, unpinned or inherited (nil: the request failed).
        var pin: String?
        /// The effective policy: pinned (kept downloaded) or unpinned (download on read).
        var policy: String?
        /// The path (in the mount) whose state decides the policy; nil: the default.
        var decidedBy: String?
        /// Unpin: files evicted, freed bytes, and the files kept with the reason.
        var evicted: Int?
        var freedBytes: Int64?
        var refused: [Refusal]?
        /// Why the request failed.
        var error: String?
    }

    struct Refusal: Encodable {
        var path: String
        var reason: String
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let inherit = try arguments.flag("--inherit")
        return try await run(state: inherit ? "inherited" : "pinned", &arguments, io: io, usage: usage)
    }

    /// Sets `state` on each PATH and reports it (shared with `unpin`).
    static func run(state: String, _ arguments: inout ArgumentList, io: CommandIO, usage: String) async throws -> Int32
    {
        var paths: [String] = []
        while let path = arguments.positional() { paths.append(path) }
        try arguments.finish()
        guard !paths.isEmpty else {
            throw UsageError("providerfs \(arguments.commandName): missing PATH.\nusage: \(usage)")
        }
        var failed: [PathResult] = []
        for path in paths {
            var info = stat()
            guard stat(path, &info) == 0 else {
                if Errno.current == .notConnected {
                    throw CommandFailure(staleMountAdvice(staleMountPoint(containing: path)))
                }
                throw CommandFailure("\(path): \(Errno.current.message)")
            }
            let (client, relative) = try ControlClient.forMount(containing: path)
            let result: PathResult
            do {
                let reply = try await client.pin(relative, state: state)
                let evicted = reply.evictions.filter { $0.outcome == "evicted" }
                let refused = reply.evictions.filter { $0.outcome == "refused" || $0.outcome == "failed" }
                result = PathResult(
                    path: path, pin: reply.pin, policy: reply.policy,
                    decidedBy: reply.decidedBy.map { $0.isEmpty ? client.mountpoint : client.mountpoint + "/" + $0 },
                    evicted: state == "unpinned" ? evicted.count : nil,
                    freedBytes: state == "unpinned" ? evicted.reduce(Int64(0)) { $0 + $1.freedBytes } : nil,
                    refused: state == "unpinned"
                        ? refused.map { Refusal(path: client.mountpoint + "/" + $0.item.path, reason: $0.reason ?? "") }
                        : nil)
            } catch {
                result = PathResult(path: path, error: error.message)
                failed.append(result)
            }
            if io.json {
                io.emit(result)
            } else {
                describe(result, io: io)
            }
        }
        if let first = failed.first {
            throw CommandFailure(
                failed.count == 1
                    ? "\(first.path): \(first.error ?? "")"
                    : "\(failed.count) paths failed; first: \(first.path): \(first.error ?? "")")
        }
        return ExitStatus.success
    }

    static func describe(_ result: PathResult, io: CommandIO) {
        guard let pin = result.pin else { return }
        let policy =
            result.policy == "pinned"
            ? "kept downloaded" + (pin == "pinned" ? " (downloading in the background: providerfs status)" : "")
            : "downloaded on read"
        let from = pin == "inherited" ? ", from \(result.decidedBy ?? "the mount's default")" : ""
        io.line("\(result.path): \(pin); \(policy)\(from)")
        if let evicted = result.evicted {
            io.line("  \(evicted) file(s) evicted, \(formatSize(result.freedBytes ?? 0)) freed")
        }
        for refusal in result.refused ?? [] { io.line("  kept \(refusal.path): \(refusal.reason)") }
    }
}
