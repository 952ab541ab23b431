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

/// The owner of a `ReadData.file` range that can also show the range in memory: a mapping of
/// the file that lives as long as the owner. A reply can then be written to the kernel straight
/// from the page cache, without first reading the bytes into a buffer.
public protocol MappedFileRanges: AnyObject, Sendable {
    /// The bytes of `offset..<offset+count` in memory, or nil (not mapped; read the descriptor).
    /// Only the kernel may touch them (as the source of a write): a file changed under a mapping
    /// faults there, which the kernel reports as EFAULT, while a user-space access would SIGBUS.
    func mappedBytes(at offset: Int64, count: Int) -> UnsafeRawPointer?
}

/// Bytes answered to a read: either a filled buffer, or a range of an open file that the reply
/// copies (or splices) straight from the file, so no buffer is allocated or filled in between.
public struct ReadData: Sendable {
    /// Where the bytes are.
    public enum Source: Sendable {
        /// The first `count` bytes of a buffer.
        case memory(AlignedBuffer)
        /// `count` bytes of `descriptor` at `offset`; `owner` keeps the descriptor open for as long
        /// as this value lives (the file's bytes in that range must not change meanwhile).
        case file(descriptor: Int32, offset: Int64, owner: any AnyObject & Sendable)
    }

    public let source: Source
    public let count: Int

    public init(buffer: AlignedBuffer, count: Int) {
        precondition(count >= 0 && count <= buffer.capacity)
        self.source = .memory(buffer)
        self.count = count
    }

    public init(bytes: [UInt8]) {
        let buffer = AlignedBuffer(capacity: bytes.count)
        buffer.withUnsafeMutableBytes { destination in
            bytes.withUnsafeBytes { destination.copyMemory(from: $0) }
        }
        self.init(buffer: buffer, count: bytes.count)
    }

    /// `count` bytes of the open file `descriptor` at `offset`, kept open by `owner`.
    public init(descriptor: Int32, offset: Int64, count: Int, owner: any AnyObject & Sendable) {
        precondition(count >= 0 && offset >= 0)
        self.source = .file(descriptor: descriptor, offset: offset, owner: owner)
        self.count = count
    }

    /// The bytes (a file range is read with `pread`; fewer bytes if the file is shorter).
    public var bytes: [UInt8] {
        switch source {
        case .memory(let buffer):
            return buffer.withUnsafeBytes { Array($0.prefix(count)) }
        case .file(let descriptor, let offset, let owner):
            return withExtendedLifetime(owner) {
                var result = [UInt8](repeating: 0, count: count)
                let read = result.withUnsafeMutableBytes { raw in
                    readFully(descriptor, into: raw.baseAddress!, count: count, at: offset)
                }
                return Array(result.prefix((try? read.get()) ?? 0))
            }
        }
    }
}
