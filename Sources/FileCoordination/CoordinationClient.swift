// Talking to a server without a domain: the claim dump for `providerfs claims`.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Talking to a server without a domain: the claim dump for `providerfs claims`.
package enum CoordinationClient {
    /// The dump of the server at `socketPath`; nil when no server is running there (none is started).
    package static func dump(
        socketPath: String = CoordinationServer.standaloneSocketPath()
    ) throws
        -> CoordinationDump?
    {
        let connected: Result<Int32, SystemCallError> = Result { () throws(SystemCallError) in
            try UnixSocket.connect(socketPath)
        }
        let fd: Int32
        switch connected {
        case .success(let value): fd = value
        case .failure(let error):
            if [ENOENT, ECONNREFUSED].contains(error.errno.rawValue) { return nil }
            throw error
        }
        defer { close(fd) }
        var buffer = FrameBuffer()
        _ = try ServerLink.handshake(fd: fd, buffer: &buffer)
        try UnixSocket.writeAll(fd, WireMessage.dumpRequest(requestID: 1).frame())
        while true {
            let message = try ServerLink.readMessage(fd: fd, buffer: &buffer, timeoutMilliseconds: 5000)
            if case .dump(_, let json) = message { return try CoordinationDump.decode(json) }
        }
    }
}
