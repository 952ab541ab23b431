#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A page-aligned byte buffer, filled once (e.g. by `pread`) and then handed to another thread
/// read-only (e.g. to be sent with `fuse_reply_buf`). Page alignment measurably lowers kernel-copy
/// cost for FUSE replies (reference/swift-fuse-notes.md §3).
public final class AlignedBuffer: @unchecked Sendable {
    // Safe: ownership passes from the filler to the reader; the type is not used for concurrent
    // mutation (writes happen before the buffer is published, through `withUnsafeMutableBytes`).
    public let capacity: Int
    private let pointer: UnsafeMutableRawPointer

    public init(capacity: Int, alignment: Int = 4096) {
        var raw: UnsafeMutableRawPointer?
        let rc = posix_memalign(&raw, alignment, max(capacity, 1))
        precondition(rc == 0 && raw != nil, "posix_memalign(\(capacity)) failed: \(rc)")
        self.capacity = capacity
        self.pointer = raw!
    }

    deinit { free(pointer) }

    public func withUnsafeMutableBytes<T>(_ body: (UnsafeMutableRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: capacity))
    }

    public func withUnsafeBytes<T>(_ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeRawBufferPointer(start: pointer, count: capacity))
    }
}

/// Bytes answered to a read: a buffer and how many of its bytes are valid.
public struct ReadData: Sendable {
    public let buffer: AlignedBuffer
    public let count: Int

    public init(buffer: AlignedBuffer, count: Int) {
        precondition(count >= 0 && count <= buffer.capacity)
        self.buffer = buffer
        self.count = count
    }

    public init(bytes: [UInt8]) {
        let buffer = AlignedBuffer(capacity: bytes.count)
        buffer.withUnsafeMutableBytes { destination in
            bytes.withUnsafeBytes { destination.copyMemory(from: $0) }
        }
        self.init(buffer: buffer, count: bytes.count)
    }

    public var bytes: [UInt8] {
        buffer.withUnsafeBytes { Array($0.prefix(count)) }
    }
}
