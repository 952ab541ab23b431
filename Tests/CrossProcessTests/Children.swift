// Child processes for cross-process tests: each test gets its own runtime directory (so its own
// coordination server), starts the server itself, and stops every process it started by PID.
import FileCoordination
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The directory holding the built executables (beside the test bundle).
let binDirectory: String = {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? ""
    return String(exe[..<(exe.lastIndex(of: "/") ?? exe.endIndex)])
}()
let providerfsPath = binDirectory + "/providerfs"
let probePath = binDirectory + "/coordination-probe"

/// A running child with its stdout split into lines.
final class Child: @unchecked Sendable {
    // Safe: `lines` is only touched under `lock`; the process handles are used from the test thread.
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private let lock = NSCondition()
    private var lines: [String] = []
    private var ended = false

    init(_ executable: String, _ arguments: [String], environment: [String: String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = environment
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.standardError
        try process.run()
        let handle = output.fileHandleForReading
        Thread.detachNewThread { [self] in
            var pending = Data()
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                pending += data
                while let newline = pending.firstIndex(of: 10) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    lock.lock()
                    lines.append(line)
                    lock.broadcast()
                    lock.unlock()
                }
            }
            lock.lock()
            ended = true
            lock.broadcast()
            lock.unlock()
        }
    }

    var pid: Int32 { process.processIdentifier }

    var output_: [String] {
        lock.lock()
        defer { lock.unlock() }
        return lines
    }

    /// Waits (up to `timeout` seconds) for a line starting with `prefix`; returns it.
    @discardableResult
    func waitForLine(_ prefix: String, timeout: Double = 10) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        lock.lock()
        defer { lock.unlock() }
        while true {
            if let line = lines.first(where: { $0.hasPrefix(prefix) }) { return line }
            if ended || !lock.wait(until: deadline) { return lines.first(where: { $0.hasPrefix(prefix) }) }
        }
    }

    func hasLine(_ prefix: String) -> Bool { output_.contains { $0.hasPrefix(prefix) } }

    /// Ends a probe's hold: closes its stdin.
    func closeInput() { try? input.fileHandleForWriting.close() }

    /// Writes one line to the child's stdin.
    func send(_ line: String) { input.fileHandleForWriting.write(Data((line + "\n").utf8)) }

    func kill9() { _ = Glibc.kill(pid, SIGKILL) }

    /// Exit status after waiting (SIGTERM first if still running after `grace` seconds).
    @discardableResult
    func stop(grace: Double = 5) -> Int32 {
        closeInput()
        let deadline = Date().addingTimeInterval(grace)
        while process.isRunning && Date() < deadline { usleep(2000) }
        if process.isRunning { _ = Glibc.kill(pid, SIGTERM) }
        process.waitUntilExit()
        // The exit can be seen before the reader thread has taken the last lines out of the
        // pipe: wait (bounded) for its end of file, so callers read complete output.
        let outputDeadline = Date().addingTimeInterval(10)
        lock.lock()
        while !ended && lock.wait(until: outputDeadline) {}
        lock.unlock()
        return process.terminationStatus
    }
}

/// True when `pid` is gone or a zombie (state Z in /proc/PID/stat).
///
/// The test process deliberately does NOT become a child subreaper: it would adopt every orphaned
/// daemon (on-demand coordinators, background mounts) of the whole test run, and Swift Testing's
/// exit-test monitor, which waits for any child without reaping foreign ones, then spins forever on
/// such a zombie and no exit test finishes. An orphan that exits is reparented to PID 1; a zombie
/// there counts as gone.
func processIsGone(_ pid: Int32) -> Bool {
    if kill(pid, 0) != 0 { return true }
    let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
    guard let close = stat.lastIndex(of: ")"), stat.distance(from: close, to: stat.endIndex) > 2 else { return true }
    return stat[stat.index(close, offsetBy: 2)] == "Z"
}

/// One isolated coordination world: a private runtime directory and its server.
final class CoordinationWorld: @unchecked Sendable {
    // Safe: used from one test at a time.
    let runtime: String
    let files: String
    var server: Child?
    var children: [Child] = []

    init(startServer: Bool = true) throws {
        var template = Array("/tmp/pfs-xp-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        runtime = String(cString: made!)
        files = runtime + "/files"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        if startServer {
            let server = try Child(providerfsPath, ["coordinator"], environment: environment)
            self.server = server
            #expect(server.waitForLine("coordination server listening") != nil)
        }
    }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["PROVIDERFS_RUNTIME_DIR"] = runtime
        environment["PROVIDERFS_COORDINATOR"] = providerfsPath
        environment["PROVIDERFS_COORDINATOR_IDLE"] = "3s"
        return environment
    }

    func probe(_ arguments: [String], extra: [String: String] = [:]) throws -> Child {
        let child = try Child(probePath, arguments, environment: environment.merging(extra) { $1 })
        children.append(child)
        return child
    }

    func path(_ name: String) -> String { files + "/" + name }

    /// The claim dump of this world's standalone server.
    func dump() throws -> CoordinationDump? {
        try CoordinationClient.dump(socketPath: runtime + "/coordinator.sock")
    }

    /// Polls the dump until `condition` holds (no fixed sleep; 10 s at most).
    func eventually(_ condition: (CoordinationDump) -> Bool) -> Bool {
        for _ in 0..<2000 {
            if let dump = try? dump(), condition(dump) { return true }
            usleep(5000)
        }
        return false
    }

    /// Pids of servers started on demand that this world has seen (from coordinator.pid).
    var onDemandServers: Set<Int32> = []

    /// The pid in coordinator.pid, remembered for the teardown.
    func onDemandServerPid() -> Int32? {
        guard let text = try? String(contentsOfFile: runtime + "/coordinator.pid", encoding: .utf8),
            let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), pid > 0
        else { return nil }
        if pid != server?.pid { onDemandServers.insert(pid) }
        return pid
    }

    /// Stops every child and the server (by PID), and servers the library started on demand
    /// (SIGTERM, then reaped when they are our children, or seen gone: see processIsGone).
    func tearDown() {
        _ = onDemandServerPid()
        for child in children { child.stop(grace: 2) }
        if let server {
            _ = kill(server.pid, SIGTERM)
            server.process.waitUntilExit()
        }
        for pid in onDemandServers {
            _ = kill(pid, SIGTERM)
            for _ in 0..<2500 {
                var status: Int32 = 0
                let reaped = waitpid(pid, &status, WNOHANG)
                if reaped == pid || (reaped < 0 && processIsGone(pid)) { break }
                usleep(2000)
            }
        }
        try? FileManager.default.removeItem(atPath: runtime)
    }
}
