// Real HTTP servers on 127.0.0.1 for the WebDAV provider's tests: `rclone serve webdav` of a
// directory (Debian rclone), and Python's `http.server` (a plain server that ignores Range, for
// the fallback path). Each runs as a child process on a free port, is waited for until it
// accepts connections, and is stopped by its PID (SIGTERM, then SIGKILL) in `stop`, which `deinit`
// also calls: a failing test leaves no server behind.
//
// WebDAV tests never skip silently: without rclone they fail, unless
// PROVIDERFS_SKIP_WEBDAV_TESTS=1 is set, and then the suite is reported skipped with that reason.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Whether the WebDAV tests that need a server run, and what is missing when they cannot.
public enum WebDAVTestGate {
    /// False only when the environment asks to skip them.
    public static var enabled: Bool { currentEnvironment()["PROVIDERFS_SKIP_WEBDAV_TESTS"] != "1" }

    /// Nil when rclone is installed, else the sentence to fail the test with.
    public static var problem: String? {
        rclone == nil
            ? "rclone is not installed (apt-get install rclone, or Scripts/install-deps); WebDAV tests cannot run "
                + "(set PROVIDERFS_SKIP_WEBDAV_TESTS=1 to skip them)"
            : nil
    }

    /// The rclone executable, if any.
    public static var rclone: String? { findExecutable("rclone") }

    static func findExecutable(_ name: String) -> String? {
        let path = currentEnvironment()["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for directory in path.split(separator: ":").map(String.init) + ["/usr/bin"] {
            let candidate = directory + "/" + name
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

/// A server process on 127.0.0.1 (see the file's header).
public final class WebDAVTestServer: @unchecked Sendable {
    // Safe: `process` and `port` are only replaced by `start`/`stop` of the one test that owns the
    // server.
    public enum Kind: Sendable {
        /// `rclone serve webdav ROOT`, with basic authentication when a user is given.
        case rclone(user: String?, password: String?)
        /// `rclone serve webdav ROOT` over https, with this certificate and key (PEM files).
        case rcloneTLS(certificate: String, key: String)
        /// `python3 -m http.server`: GET only, Range ignored.
        case pythonStatic
    }

    /// The directory served.
    public let root: String
    public let kind: Kind
    public private(set) var port: Int32 = 0
    public private(set) var process: ChildProcess?
    private let scratch: String

    /// Starts serving `root` (created if missing).
    public init(root: String, kind: Kind = .rclone(user: nil, password: nil)) throws {
        self.root = root
        self.kind = kind
        mkdir(root, 0o755)
        scratch = try makeTemporaryDirectory(prefix: "webdav-server")
        try start()
    }

    deinit {
        stop()
        rmdir(scratch)
    }

    /// `http://127.0.0.1:<port>/` (https for `.rcloneTLS`).
    public var url: String {
        if case .rcloneTLS = kind { return "https://127.0.0.1:\(port)/" }
        return "http://127.0.0.1:\(port)/"
    }

    /// Starts the server again (after `stop`), on a new free port unless `samePort`.
    public func start(samePort: Bool = false) throws {
        var lastError = ""
        for _ in 0..<5 {
            if !samePort || port == 0 { port = try Self.freePort() }
            let (executable, arguments, environment) = try command()
            let child = try ChildProcess(executable, arguments, environment: environment)
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline {
                if Self.accepts(port) {
                    process = child
                    return
                }
                if child.poll() != nil { break }
                usleep(20_000)
            }
            lastError = child.standardError
            child.signal(SIGKILL)
            child.wait(timeout: .seconds(5))
        }
        throw SystemCallError("start a test server on 127.0.0.1: \(lastError.suffix(500))", Errno(EADDRINUSE))
    }

    private func command() throws -> (String, [String], [String: String]) {
        switch kind {
        case .rclone, .rcloneTLS:
            guard let rclone = WebDAVTestGate.rclone else {
                throw SystemCallError(WebDAVTestGate.problem ?? "rclone is missing", Errno(ENOENT))
            }
            // No rclone configuration of the user's; the password through the environment.
            var environment = ["RCLONE_CONFIG": scratch + "/rclone.conf"]
            // No directory cache: a change made in `root` behind the server's back is what the
            // next PROPFIND shows (rclone's VFS would otherwise serve its cached metadata for 5 min).
            var arguments = ["serve", "webdav", "--addr", "127.0.0.1:\(port)", "--dir-cache-time", "0s", root]
            if case .rclone(let user?, let password) = kind {
                arguments += ["--user", user]
                environment["RCLONE_PASS"] = password ?? ""
            }
            if case .rcloneTLS(let certificate, let key) = kind { arguments += ["--cert", certificate, "--key", key] }
            return (rclone, arguments, environment)
        case .pythonStatic:
            guard let python = WebDAVTestGate.findExecutable("python3") else {
                throw SystemCallError("python3 is missing", Errno(ENOENT))
            }
            return (python, ["-m", "http.server", "--bind", "127.0.0.1", "--directory", root, "\(port)"], [:])
        }
    }

    /// Stops the server by its PID: SIGTERM, then SIGKILL after 5 s. Safe to call more than once.
    public func stop() {
        guard let process else { return }
        self.process = nil
        process.signal(SIGTERM)
        if process.wait(timeout: .seconds(5)) == nil {
            process.signal(SIGKILL)
            process.wait(timeout: .seconds(5))
        }
    }

    /// Kills the server at once (SIGKILL): its connections break mid-answer.
    public func kill() {
        guard let process else { return }
        self.process = nil
        process.signal(SIGKILL)
        process.wait(timeout: .seconds(5))
    }

    /// A port nothing listens on right now (bound to port 0, read back, closed).
    public static func freePort() throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SystemCallError("socket") }
        defer { close(fd) }
        var address = loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0 else { throw SystemCallError("bind 127.0.0.1:0") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { throw SystemCallError("getsockname") }
        return Int32(UInt16(bigEndian: address.sin_port))
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port`.
    public static func accepts(_ port: Int32) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    private static func loopback(port: Int32) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return address
    }
}
