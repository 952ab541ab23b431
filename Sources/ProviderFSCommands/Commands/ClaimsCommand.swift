import FileCoordination
import Foundation
import SystemSupport

/// `providerfs claims [--json] [--mount MOUNTPOINT]`: every held and waiting claim (item, kind,
/// pid, age), presenters and recent events, of the standalone coordination server and of every
/// providerfs mount's embedded server (or of one mount's, with --mount). Never starts a server:
/// with none running, the list is empty.
struct ClaimsCommand: CLICommand {
    static let name = "claims"
    static let summary = "list held and waiting coordination claims (item, kind, pid, age)"
    static let usage = "providerfs claims [--json] [--mount MOUNTPOINT]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let mount = try arguments.option("--mount")
        try arguments.finish()
        // Without --mount: the standalone server and the embedded server of every providerfs mount
        // (paths under a mount are coordinated there), merged into one list.
        var sockets = [
            mount.map { CoordinationServer.socketPath(forMountPoint: $0) } ?? CoordinationServer.standaloneSocketPath()
        ]
        if mount == nil {
            sockets += CoordinationServer.providerMountPoints(in: MountTable.current()).map {
                CoordinationServer.socketPath(forMountPoint: $0)
            }
        }
        var dump: CoordinationDump?
        for (index, socket) in sockets.enumerated() {
            let part: CoordinationDump?
            do { part = try CoordinationClient.dump(socketPath: socket) } catch {
                // A mount whose server is gone (a stale mount) must not hide the others.
                if index > 0 { continue }
                throw CommandFailure("cannot read the claims of the server at \(socket): \(error).")
            }
            guard let part else { continue }
            if dump == nil {
                dump = part
            } else {
                dump!.claims += part.claims
                dump!.presenters += part.presenters
                dump!.events += part.events
            }
        }
        let socket = sockets[0]
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
