import FileCoordination
import Foundation
import SystemSupport

/// `providerfs claims [--json] [--mount MOUNTPOINT]`: every held and waiting claim of a
/// coordination server (item, kind, pid, age), its presenters and recent events. Never starts a
/// server: with none running, the list is empty.
struct ClaimsCommand: CLICommand {
    static let name = "claims"
    static let summary = "list held and waiting coordination claims (item, kind, pid, age)"
    static let usage = "providerfs claims [--json] [--mount MOUNTPOINT]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let mount = try arguments.option("--mount")
        try arguments.finish()
        let socket =
            mount.map { CoordinationServer.socketPath(forMountPoint: $0) } ?? CoordinationServer.standaloneSocketPath()
        let dump: CoordinationDump?
        do { dump = try CoordinationClient.dump(socketPath: socket) } catch {
            throw CommandFailure("cannot read the claims of the server at \(socket): \(error).")
        }
        let result = dump ?? CoordinationDump(serverPid: 0, claims: [], presenters: [], events: [])
        if io.json {
            io.emit(result)
            return ExitStatus.success
        }
        guard dump != nil else {
            io.line("no coordination server is running (\(socket))")
            return ExitStatus.success
        }
        io.line("STATE      PID      AGE       KIND                 ITEM")
        for claim in result.claims {
            for item in claim.items {
                io.line(
                    pad(claim.state, 10) + " " + pad(String(claim.pid), 8) + " "
                        + pad(Duration.milliseconds(claim.ageMilliseconds).humanReadable, 9) + " "
                        + pad(item.kind, 20) + " " + item.path)
            }
            for event in claim.events { io.line("           ! " + event) }
        }
        if !result.presenters.isEmpty {
            io.line("")
            io.line("PRESENTER  PID      ITEM")
            for presenter in result.presenters {
                io.line(pad(presenter.id, 10) + " " + pad(String(presenter.pid), 8) + " " + presenter.path)
            }
        }
        return ExitStatus.success
    }

    private static func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
    }
}
