// A self-pipe that wakes a poll(2) loop from another thread: the coordination server's and the
// mount's control server's loops each poll one beside their sockets. (eventfd would do too, but it
// is not visible through the Glibc module.)

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A non-blocking, close-on-exec pipe: `wake()` from any thread makes `descriptor` readable;
/// the loop that polls it calls `drain()` when it is.
public final class WakePipe: Sendable {
    /// The end to poll for `POLLIN`.
    public let descriptor: Int32
    private let writeEnd: Int32

    public init() {
        var ends: [Int32] = [-1, -1]
        if pipe(&ends) == 0 {
            for end in ends {
                _ = fcntl(end, F_SETFD, FD_CLOEXEC)
                _ = fcntl(end, F_SETFL, O_NONBLOCK)
            }
        }
        descriptor = ends[0]
        writeEnd = ends[1]
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
        if writeEnd >= 0 { close(writeEnd) }
    }

    /// Makes the loop's next (or current) poll return. Never blocks: a full pipe already wakes it.
    public func wake() {
        var one: UInt8 = 1
        _ = write(writeEnd, &one, 1)
    }

    /// Empties the pipe, so the next poll waits again until the next `wake()`.
    public func drain() {
        var buffer = [UInt8](repeating: 0, count: 256)
        while buffer.withUnsafeMutableBytes({ read(descriptor, $0.baseAddress, $0.count) }) > 0 {}
    }
}
