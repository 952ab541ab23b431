// A client's side of a mount's control socket (docs/CONTROL.md): where the socket of a mount is,
// which mount a path is inside, and one blocking request/reply exchange with deadlines. The CLI's
// `ControlClient` and ScopedAccess both send through here.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

package enum ControlConnection {
    /// Where mounts keep their registry files and control sockets: `<runtime dir>/mounts`.
    package static var mountsDirectory: String { RuntimeDirectory.path() + "/mounts" }

    /// The control socket of the daemon serving `mountpoint`: beside its registry file,
    /// `<runtime dir>/mounts/<FNV-1a of the mount point>.control.sock` (mode 0600, directory 0700).
    /// `directory`: another mounts directory than this process's (tests).
    package static func socketPath(forMountpoint mountpoint: String, in directory: String? = nil) -> String {
        (directory ?? mountsDirectory) + "/\(fnv1a(mountpoint)).control.sock"
    }

    /// The ProviderFS mount containing `path` (its mount point as mountinfo shows it) and `path`
    /// relative to the mount's root ("" for the mount point itself); nil when `path` is not inside
    /// one. The mount point itself is never stat'ed.
    package static func mount(containing path: String) -> (mountpoint: String, relativePath: String)? {
        let absolute = mountPointPath(path)
        guard let mount = MountTable.containing(absolute), mount.fileSystemType == "fuse.providerfs" else {
            return nil
        }
        let relative =
            absolute == mount.mountPoint ? "" : String(absolute.dropFirst(mount.mountPoint.count).drop { $0 == "/" })
        return (mount.mountPoint, relative)
    }

    /// Blocking: connect, send `frame`, read one reply frame (its payload), each step within
    /// `timeout`.
    package static func roundTrip(
        socketPath: String, frame: [UInt8], timeout: Duration, maximumReplySize: Int = 64 << 20
    ) throws(ControlError) -> [UInt8] {
        let fd: Int32
        do { fd = try UnixSocket.connect(socketPath) } catch {
            throw ControlError(.unavailable, "connect \(socketPath): \(error.errno.name)")
        }
        defer { close(fd) }
        var limit = timeval(tv_sec: Int(timeout.seconds.rounded(.up)), tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        // A refused peer gets its reply without the daemon reading the request: a failed send
        // (EPIPE, ECONNRESET) still leaves that reply to read.
        let sendError: Errno?
        do {
            try UnixSocket.writeAll(fd, frame)
            sendError = nil
        } catch {
            sendError = error.errno
        }
        // Replies may be larger than requests: `tokenList` of 10,000 tokens, a full `tokenLog`.
        var reader = ControlFrameReader(maximumMessageSize: maximumReplySize)
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            do {
                if let payload = try reader.next() { return payload }
            } catch {
                throw ControlError(.malformed, "the daemon's reply is too large")
            }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                reader.append(Array(buffer[0..<count]))
                continue
            }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                throw ControlError(.timedOut, "no reply within \(timeout.humanReadable)")
            }
            let cause = count < 0 ? Errno.current : sendError
            throw ControlError(
                .unavailable, "the daemon closed the connection" + (cause.map { " (\($0.name))" } ?? ""))
        }
    }

    /// `roundTrip` of one request, and the `ok` payload of its reply (or its error).
    package static func request(
        socketPath: String, kind: String, arguments: [String: Any], timeout: Duration
    ) throws(ControlError) -> [UInt8] {
        let payload = try roundTrip(
            socketPath: socketPath, frame: ControlProtocol.requestFrame(id: 1, kind: kind, arguments: arguments),
            timeout: timeout)
        return try ControlProtocol.parseResponse(payload).result.get()
    }
}

/// FNV-1a 64-bit of the UTF-8 bytes, as 16 hex digits: stable names for paths.
package func fnv1a(_ text: String) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in text.utf8 {
        hash ^= UInt64(byte)
        hash = hash &* 0x100_0000_01b3
    }
    let hex = String(hash, radix: 16)
    return String(repeating: "0", count: 16 - hex.count) + hex
}
