// A small swift-log-shaped facade: a `Logger` value with a label and a level, writing one line per
// event through a process-wide sink. Bootstrap once in `main`; tests use `InMemoryLogSink`.

import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

public enum LogLevel: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    case trace, debug, info, notice, warning, error, critical
    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String {
        switch self {
        case .trace: "trace"
        case .debug: "debug"
        case .info: "info"
        case .notice: "notice"
        case .warning: "warning"
        case .error: "error"
        case .critical: "critical"
        }
    }
}

/// Where log lines go.
public protocol LogSink: Sendable {
    func write(level: LogLevel, label: String, message: String)
}

/// Writes lines to a file descriptor (stderr by default) with `write(2)`, one syscall per line so
/// lines from several threads never interleave.
public struct FileDescriptorLogSink: LogSink {
    public let fd: Int32
    public init(fd: Int32 = 2) { self.fd = fd }
    public func write(level: LogLevel, label: String, message: String) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var tm = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &tm)
        let stamp =
            "\(tm.tm_year + 1900)-\(pad(tm.tm_mon + 1))-\(pad(tm.tm_mday))T"
            + "\(pad(tm.tm_hour)):\(pad(tm.tm_min)):\(pad(tm.tm_sec)).\(pad(Int32(now.tv_nsec / 1_000_000), 3))Z"
        let line = "\(stamp) \(level) \(label): \(message)\n"
        var bytes = Array(line.utf8)
        _ = bytes.withUnsafeMutableBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }
    private func pad(_ value: Int32, _ width: Int = 2) -> String {
        let text = String(value)
        return String(repeating: "0", count: max(0, width - text.count)) + text
    }
}

/// Keeps lines in memory, for tests.
public final class InMemoryLogSink: LogSink {
    private let lines = Locked<[String]>([])
    public init() {}
    public func write(level: LogLevel, label: String, message: String) {
        lines.withLock { $0.append("\(level) \(label): \(message)") }
    }
    public var entries: [String] { lines.value }
}

public enum LoggingSystem {
    private static let configuration = Locked<(sink: any LogSink, level: LogLevel)>(
        (FileDescriptorLogSink(), .warning))

    /// Sets where log lines go and the minimum level. Call once, early in `main`.
    public static func bootstrap(sink: any LogSink, level: LogLevel) {
        configuration.withLock { $0 = (sink, level) }
    }

    static var current: (sink: any LogSink, level: LogLevel) {
        configuration.withLock { $0 }
    }
}

public struct Logger: Sendable {
    public let label: String
    public init(label: String) { self.label = label }

    public func log(_ level: LogLevel, _ message: @autoclosure () -> String) {
        let (sink, minimum) = LoggingSystem.current
        guard level >= minimum else { return }
        sink.write(level: level, label: label, message: message())
    }
    public func trace(_ message: @autoclosure () -> String) { log(.trace, message()) }
    public func debug(_ message: @autoclosure () -> String) { log(.debug, message()) }
    public func info(_ message: @autoclosure () -> String) { log(.info, message()) }
    public func notice(_ message: @autoclosure () -> String) { log(.notice, message()) }
    public func warning(_ message: @autoclosure () -> String) { log(.warning, message()) }
    public func error(_ message: @autoclosure () -> String) { log(.error, message()) }
}
