// Unix-domain socket helpers over Glibc: the only place that builds sockaddr_un. Used by the
// coordination wire (FileCoordination) and the mount's control socket (ProviderFSCommands).

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

public enum UnixSocket {
    static func address(_ path: String) throws(SystemCallError) -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity, !bytes.contains(0) else {
            throw SystemCallError("socket path \(path)", .nameTooLong)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in bytes.enumerated() { raw[index] = byte }
            raw[bytes.count] = 0
        }
        return address
    }

    /// A connected, blocking, close-on-exec stream socket.
    public static func connect(_ path: String) throws(SystemCallError) -> Int32 {
        var address = try address(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemCallError("socket") }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if rc != 0 {
            let error = Errno.current
            close(fd)
            throw SystemCallError("connect \(path)", error)
        }
        return fd
    }

    /// A listening, non-blocking, close-on-exec socket bound at `path` (mode 0600).
    public static func listen(_ path: String) throws(SystemCallError) -> Int32 {
        var address = try address(path)
        let fd = socket(
            AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw SystemCallError("socket") }
        // Not umask: it is per process, and files other threads create meanwhile (a test's
        // directories, the daemon's cache files) got mode & ~0177 (a test saw a 0600 directory).
        // Until the chmod the socket has the caller's umask mode; its directory (0700, made by
        // the server) keeps others out for that instant.
        var rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if rc == 0 { rc = chmod(path, 0o600) }
        if rc != 0 {
            let error = Errno.current
            close(fd)
            throw SystemCallError("bind \(path)", error)
        }
        guard Glibc.listen(fd, 128) == 0 else {
            let error = Errno.current
            close(fd)
            throw SystemCallError("listen \(path)", error)
        }
        return fd
    }

    /// The credentials of the process at the other end of a connected socket (SO_PEERCRED: the
    /// peer's pid, uid and gid when it connected), or nil when the kernel does not say.
    public struct PeerCredentials: Sendable, Equatable {
        public var pid: Int32
        public var uid: UInt32
        public var gid: UInt32
        public init(pid: Int32, uid: UInt32, gid: UInt32) {
            self.pid = pid
            self.uid = uid
            self.gid = gid
        }
    }

    public static func peerCredentials(_ fd: Int32) -> PeerCredentials? {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; } — not visible through the Glibc module.
        var credentials: (Int32, UInt32, UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        let soPeerCred: Int32 = 17  // SO_PEERCRED on Linux (asm-generic/socket.h)
        guard getsockopt(fd, SOL_SOCKET, soPeerCred, &credentials, &length) == 0,
            length == socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
        else { return nil }
        return PeerCredentials(pid: credentials.0, uid: credentials.1, gid: credentials.2)
    }

    /// Accepts every connection waiting on the listening socket `listenFD` (non-blocking), each
    /// made close-on-exec and non-blocking, and hands it to `body`. Returns when none is left.
    public static func acceptPending(_ listenFD: Int32, _ body: (Int32) -> Void) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                return
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, O_NONBLOCK)
            body(fd)
        }
    }

    /// The peer's pid (SO_PEERCRED), or 0 when unknown.
    public static func peerPid(_ fd: Int32) -> Int32 {
        peerCredentials(fd)?.pid ?? 0
    }

    /// Writes every byte (blocking socket), retrying on EINTR and short writes.
    public static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws(SystemCallError) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written < 0 {
                if errno == EINTR { continue }
                throw SystemCallError("send")
            }
            offset += written
        }
    }
}
