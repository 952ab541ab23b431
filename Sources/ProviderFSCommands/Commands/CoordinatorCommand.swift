import Dispatch
import FileCoordination
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `providerfs coordinator [--idle-exit DURATION]`: the standalone coordination server, in the
/// foreground. Libraries start it on demand (with --idle-exit) when no server answers.
struct CoordinatorCommand: CLICommand {
    static let name = "coordinator"
    static let summary = "run the standalone coordination server in the foreground"
    static let usage = "providerfs coordinator [--idle-exit DURATION]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let idleExit = try arguments.duration("--idle-exit")
        try arguments.finish()
        let socket = CoordinationServer.standaloneSocketPath()
        let server: CoordinationServer?
        do {
            server = try CoordinationServer.startStandalone(idleExit: idleExit) { line in
                io.error("providerfs coordinator: \(line)")
            }
        } catch {
            throw CommandFailure(error.message)
        }
        guard let server else {
            throw CommandFailure("a coordination server is already running at \(socket).")
        }
        // SIGINT/SIGTERM stop the server cleanly: connections closed, socket removed.
        let signals = [SIGINT, SIGTERM].map { number -> any DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { server.stop() }
            source.resume()
            return source
        }
        if io.json {
            io.emit(["socket": socket, "pid": String(getpid())])
        } else {
            io.line("coordination server listening on \(socket) (pid \(getpid()))")
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                server.waitUntilStopped()
                continuation.resume()
            }
        }
        for source in signals { source.cancel() }
        return ExitStatus.success
    }
}
