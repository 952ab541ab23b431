// Reading inotify(7) events: the fixed 16-byte header (wd, mask, cookie, len) and a NUL-padded
// name, many per read(2). Shared by FileCoordination's resolution cache and the local provider's
// change tracking.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One inotify event.
public struct InotifyEvent: Sendable, Equatable {
    /// The watch descriptor it is about.
    public var watch: Int32
    public var mask: UInt32
    /// The entry's name inside the watched directory; empty for an event about the directory itself.
    public var name: String

    public init(watch: Int32, mask: UInt32, name: String) {
        self.watch = watch
        self.mask = mask
        self.name = name
    }
}

/// Reads every event queued on the non-blocking inotify descriptor `fd`, one `read(2)` at a time,
/// calling `batch` with the events of each read in order; returns when none is left, on an error
/// other than EINTR, or when `batch` returns false (it closed `fd`, say: reading on could read
/// another file that reused the number).
public func readInotifyEvents(_ fd: Int32, _ batch: ([InotifyEvent]) -> Bool) {
    var buffer = [UInt8](repeating: 0, count: 16 * 1024)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0 && errno == EINTR { continue }
        guard count > 0 else { return }
        guard batch(parseInotifyEvents(buffer[..<count])) else { return }
    }
}

/// The events in `bytes` (what one read returned); a truncated last record is dropped.
public func parseInotifyEvents(_ bytes: ArraySlice<UInt8>) -> [InotifyEvent] {
    var events: [InotifyEvent] = []
    bytes.withUnsafeBytes { raw in
        var offset = 0
        while offset + 16 <= raw.count {
            let watch = raw.loadUnaligned(fromByteOffset: offset, as: Int32.self)
            let mask = raw.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
            let length = Int(raw.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
            guard length <= raw.count - offset - 16 else { return }
            let name = raw[(offset + 16)..<(offset + 16 + length)].prefix { $0 != 0 }
            events.append(InotifyEvent(watch: watch, mask: mask, name: String(decoding: name, as: UTF8.self)))
            offset += 16 + length
        }
    }
    return events
}
