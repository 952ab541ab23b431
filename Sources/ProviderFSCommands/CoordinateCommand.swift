import FileCoordination
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `providerfs coordinate (--read | --write[=KIND]) PATH [--timeout D] -- CMD [ARG…]`: runs CMD
/// while holding a coordinated claim on PATH; exits with CMD's status, 75 when the claim times out.
struct CoordinateCommand: CLICommand {
    static let name = "coordinate"
    static let summary = "run a command while holding a coordinated read or write claim on a path"
    static let usage =
        "providerfs coordinate (--read | --write[=deleting|moving|replacing|merging|evicting]) PATH [--timeout DURATION] -- CMD [ARG...]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let read = try arguments.flag("--read")
        let write = arguments.optionalValueFlag("--write")
        let timeout = try arguments.duration("--timeout")
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        guard read != (write != nil) else {
            throw UsageError("providerfs coordinate: give exactly one of --read and --write.")
        }
        var writingOptions: WritingOptions = []
        switch write {
        case nil, "": break
        case "deleting": writingOptions = .forDeleting
        case "moving": writingOptions = .forMoving
        case "replacing": writingOptions = .forReplacing
        case "merging": writingOptions = .forMerging
        case "evicting": writingOptions = .forEvicting  // rule 34: presenters must remove themselves
        case let other?:
            throw UsageError(
                "providerfs coordinate: --write takes deleting, moving, replacing, merging or evicting (got '\(other)')."
            )
        }
        guard let command = arguments.trailing, !command.isEmpty else {
            throw UsageError("providerfs coordinate: missing the command to run after '--'.")
        }
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        let url = URL(fileURLWithPath: absolute)
        let coordinator = FileCoordinator()
        var deadlines = CoordinationDeadlines.default
        if let timeout { deadlines.claimWait = timeout }
        coordinator.deadlines = deadlines
        let intent: FileAccessIntent =
            read ? .readingIntent(with: url) : .writingIntent(with: url, options: writingOptions)
        do {
            return try await coordinator.coordinate(
                with: [intent],
                performing: { _ in
                    try await runChild(command)
                })
        } catch let error as CoordinationError where error.code == .timedOut {
            throw CommandFailure(error.message, status: ExitStatus.timeout)
        } catch let error as CoordinationError {
            throw CommandFailure(error.message)
        }
    }

    /// Runs CMD with our stdin/stdout/stderr; its exit status, or 128+signal.
    static func runChild(_ command: [String]) async throws -> Int32 {
        let process = Process()
        let executable = command[0]
        if executable.contains("/") {
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = Array(command.dropFirst())
        } else {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = command
        }
        return try await withCheckedThrowingContinuation { continuation in
            process.terminationHandler = { finished in
                let status = finished.terminationStatus
                continuation.resume(returning: finished.terminationReason == .uncaughtSignal ? 128 + status : status)
            }
            do { try process.run() } catch {
                process.terminationHandler = nil
                continuation.resume(throwing: CommandFailure("cannot run \(executable): \(error.localizedDescription)"))
            }
        }
    }
}
