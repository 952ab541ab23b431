// `providerfs fault add | list | clear`: faults on cue, at the provider boundary of a running
// mount, through its control socket (docs/CONTROL.md, docs/MOUNT.md "Faults on cue"). The daemon
// stores them in the mount's cache directory, so they survive a restart.

import Foundation
import ProviderFaults
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct FaultCommand: CLICommand {
    static let name = "fault"
    static let summary = "make a mount's provider fail on cue: add, list and clear faults"
    static let usage = """
        providerfs fault add PATH (--fail-at BYTES [--errno NAME] | --stall [DURATION] [--at BYTES]
                                   | --truncate-at BYTES | --corrupt [--at BYTES] | --change-version-at BYTES
                                   | --slow BYTES/S | --offline) [--times N] [--metadata] [--json]
               providerfs fault add PATH --on upload (--fail-at BYTES [--errno NAME] | --stall [DURATION]
                                   | --offline) [--times N] [--json]
               (--on download is the default; --on metadata is --metadata)
               providerfs fault list [PATH] [--json]
               providerfs fault clear (PATH | --all [PATH]) [--json]
        """

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        guard let action = arguments.positional() else {
            throw UsageError("providerfs fault: missing action: add, list or clear.")
        }
        switch action {
        case "add": return try await add(&arguments, io: io)
        case "list": return try await list(&arguments, io: io)
        case "clear": return try await clear(&arguments, io: io)
        default: throw UsageError("providerfs fault: unknown action '\(action)': use add, list or clear.")
        }
    }

    // MARK: add

    /// The fault flags of `fault add` (everything but PATH), checked as the daemon checks them.
    static func parseAdd(_ arguments: inout ArgumentList) throws(UsageError) -> FaultRequest {
        let command = arguments.commandName + " add"
        func size(_ flag: String, _ text: String) throws(UsageError) -> Int64 {
            let value: Int64
            do { value = try parseSize(text) } catch { throw UsageError("\(command): \(flag): \(error).") }
            guard value <= FaultRequest.maximumOffset else {
                throw UsageError("\(command): \(flag): \(text) is beyond any file (at most 1 PiB).")
            }
            return value
        }
        let failAt = try arguments.option("--fail-at")
        let errnoName = try arguments.option("--errno")
        let stall = arguments.optionalValueFlag("--stall", valueIf: { (try? parseDuration($0)) != nil })
        let at = try arguments.option("--at")
        let truncateAt = try arguments.option("--truncate-at")
        let corrupt = try arguments.flag("--corrupt")
        let changeVersionAt = try arguments.option("--change-version-at")
        let slow = try arguments.option("--slow")
        let offline = try arguments.flag("--offline")
        let timesText = try arguments.option("--times")
        let metadataFlag = try arguments.flag("--metadata")
        let onText = try arguments.option("--on")
        guard onText == nil || ["download", "upload", "metadata"].contains(onText!) else {
            throw UsageError("\(command): --on: '\(onText!)' is not download, upload or metadata.")
        }
        let on: FaultCall = onText == "upload" ? .upload : .download
        // `--on metadata` is `--metadata`: metadata calls as well as downloads.
        let metadata = metadataFlag || onText == "metadata"
        if on == .upload && metadataFlag {
            throw UsageError("\(command): --metadata does not go with --on upload.")
        }

        let kinds = [
            failAt.map { _ in "--fail-at" }, stall.map { _ in "--stall" }, truncateAt.map { _ in "--truncate-at" },
            corrupt ? "--corrupt" : nil, changeVersionAt.map { _ in "--change-version-at" },
            slow.map { _ in "--slow" }, offline ? "--offline" : nil,
        ].compactMap { $0 }
        guard kinds.count == 1, let kind = kinds.first else {
            throw UsageError(
                kinds.isEmpty
                    ? "\(command): name the fault: --fail-at, --stall, --truncate-at, --corrupt, --change-version-at, --slow or --offline."
                    : "\(command): one fault at a time (got \(kinds.joined(separator: " and "))).")
        }
        if on == .upload && !["--fail-at", "--stall", "--offline"].contains(kind) {
            throw UsageError("\(command): \(kind) does not apply to uploads (use --fail-at, --stall or --offline).")
        }
        if on == .upload && at != nil {
            throw UsageError("\(command): --at does not apply to uploads (an upload stalls before its first byte).")
        }
        if errnoName != nil && kind != "--fail-at" {
            throw UsageError("\(command): --errno goes with --fail-at.")
        }
        if at != nil && kind != "--stall" && kind != "--corrupt" {
            throw UsageError("\(command): --at goes with --stall or --corrupt.")
        }
        let offset = try at.map { text throws(UsageError) in try size("--at", text) } ?? 0
        let fault: Fault
        switch kind {
        case "--fail-at":
            var code = EIO
            if let errnoName {
                guard let number = FaultRequest.errnoNumber(errnoName) else {
                    throw UsageError(
                        "\(command): --errno: '\(errnoName)' is not an errno name (EIO, ECONNRESET, EACCES, …).")
                }
                code = number
            }
            fault = .failAfter(offset: try size("--fail-at", failAt!), errno: code)
        case "--stall":
            var duration: Duration?
            if let text = stall, !text.isEmpty {
                do { duration = try parseDuration(text) } catch { throw UsageError("\(command): --stall: \(error).") }
                guard let value = duration, value >= .milliseconds(1), value <= .seconds(86_400) else {
                    throw UsageError("\(command): --stall: a stall lasts from 1ms to 24h (got \(text)).")
                }
            }
            fault = .stall(offset: offset, duration: duration)
        case "--truncate-at": fault = .truncate(offset: try size("--truncate-at", truncateAt!))
        case "--corrupt": fault = .corrupt(offset: offset)
        case "--change-version-at": fault = .changeVersion(offset: try size("--change-version-at", changeVersionAt!))
        case "--slow":
            let text = slow!.hasSuffix("/s") ? String(slow!.dropLast(2)) : slow!
            let rate = try size("--slow", text)
            guard rate >= 1, rate <= FaultRequest.maximumBytesPerSecond else {
                throw UsageError("\(command): --slow: a rate from 1 byte/s to 1 TiB/s (got \(slow!)).")
            }
            fault = .slow(bytesPerSecond: rate)
        default: fault = .offline
        }
        var times: Int?
        if let timesText {
            guard let value = Int(timesText), value >= 0, Int64(value) <= FaultRequest.maximumTimes else {
                throw UsageError(
                    "\(command): --times: '\(timesText)' is not a count from 0 (until cleared) to 1000000.")
            }
            times = value
        }
        if metadata && !fault.appliesToMetadata {
            throw UsageError(
                "\(command): \(metadataFlag ? "--metadata" : "--on metadata") goes with --fail-at, --stall or --offline."
            )
        }
        return FaultRequest(path: "", fault: fault, times: times, metadata: metadata, on: on)
    }

    static func add(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        var request = try parseAdd(&arguments)
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        let (client, relative) = try ControlClient.forMount(containing: path)
        request.path = relative
        let added = try await client.send(.faultAdd(request), as: ControlFault.self)
        if io.json {
            io.emit(OnMount(mountpoint: client.mountpoint, value: added))
        } else {
            io.line("\(path): \(describe(added))")
        }
        return ExitStatus.success
    }

    // MARK: list

    static func list(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let path = arguments.positional()
        try arguments.finish()
        var listed: [OnMount<ControlFault>] = []
        for client in try clients(path) {
            let reply = try await client.send(.faultList, as: ControlFaultList.self)
            listed += reply.faults.map { OnMount(mountpoint: client.mountpoint, value: $0) }
        }
        if io.json {
            for fault in listed { io.emit(fault) }
        } else if listed.isEmpty {
            io.line("No faults.")
        } else {
            for fault in listed {
                io.line(absolute(fault.mountpoint, fault.value.path) + "  " + describe(fault.value))
            }
        }
        return ExitStatus.success
    }

    // MARK: clear

    static func clear(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let all = try arguments.flag("--all")
        let path = arguments.positional()
        try arguments.finish()
        var cleared = 0
        if all {
            for client in try clients(path) {
                cleared += try await client.send(.faultClear(path: nil), as: ControlFaultCleared.self).cleared
            }
        } else {
            guard let path else {
                throw UsageError("providerfs fault clear: name a PATH, or --all for every fault.")
            }
            let (client, relative) = try ControlClient.forMount(containing: path)
            cleared = try await client.send(.faultClear(path: relative), as: ControlFaultCleared.self).cleared
        }
        if io.json {
            io.emit(ControlFaultCleared(cleared: cleared))
        } else {
            io.line("\(cleared) fault\(cleared == 1 ? "" : "s") cleared.")
        }
        return ExitStatus.success
    }

    // MARK: Helpers

    /// The mount containing `path`, or (nil) every running ProviderFS mount of this user.
    static func clients(_ path: String?) throws(CommandFailure) -> [ControlClient] {
        if let path { return [try ControlClient.forMount(containing: path).client] }
        return MountRegistry.all().filter { record in
            record.daemonIsAlive
                && MountTable.entry(at: record.mountpoint)?.fileSystemType == "fuse.providerfs"
        }.map { ControlClient(socketPath: MountRegistry.controlSocket(for: $0.mountpoint), mountpoint: $0.mountpoint) }
    }

    static func absolute(_ mountpoint: String, _ relative: String) -> String {
        relative.isEmpty ? mountpoint : mountpoint + "/" + relative
    }

    /// "fail at 4194304 with EIO, 1 download left, metadata too"; "on upload: fail at 0 with
    /// ENOSPC, 2 uploads left".
    static func describe(_ fault: ControlFault) -> String {
        let upload = fault.on == FaultCall.upload.rawValue
        var text = (upload ? "on upload: " : "") + fault.description
        if let left = fault.timesLeft {
            text += ", \(left) \(upload ? "upload" : "download")\(left == 1 ? "" : "s") left"
            if fault.running > 0 { text += " (\(fault.running) running)" }
        } else {
            text += ", until cleared"
        }
        if fault.metadata { text += ", metadata too" }
        return text
    }
}
