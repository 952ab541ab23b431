// In-kernel copies between files and hole queries: GNU extensions that Swift's Glibc module does
// not export (copy_file_range, SEEK_DATA/SEEK_HOLE), reached here with their documented values.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `SEEK_DATA` and `SEEK_HOLE` (lseek(2), _GNU_SOURCE).
public let seekData: Int32 = 3
public let seekHole: Int32 = 4

private typealias CopyFileRange =
    @convention(c) (
        Int32, UnsafeMutablePointer<off_t>?, Int32, UnsafeMutablePointer<off_t>?, Int, UInt32
    ) -> Int

/// glibc's copy_file_range (2.27+), looked up once.
private let copyFileRangeFunction: CopyFileRange? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "copy_file_range") else { return nil }
    return unsafeBitCast(symbol, to: CopyFileRange.self)
}()

/// Copies up to `count` bytes from `source` at `sourceOffset` to `destination` at
/// `destinationOffset` inside the kernel (no user-space buffer), retrying on EINTR. Returns the
/// bytes copied (0 at the end of the source), or the errno. `.notSupported`-class errors (EXDEV,
/// EINVAL, ENOSYS, EOPNOTSUPP) mean the caller should copy through memory instead.
public func copyFileRange(
    from source: Int32, at sourceOffset: Int64, to destination: Int32, at destinationOffset: Int64, count: Int
) -> Result<Int, Errno> {
    guard let copy = copyFileRangeFunction else { return .failure(Errno(ENOSYS)) }
    var input = off_t(sourceOffset)
    var output = off_t(destinationOffset)
    let result = retryingOnInterrupt { copy(source, &input, destination, &output, count, 0) }
    return result < 0 ? .failure(Errno.current) : .success(result)
}

extension Errno {
    /// The errors with which copy_file_range says "not between these files": copy another way.
    public var meansCopyUnsupported: Bool {
        self == Errno(EXDEV) || self == Errno(EINVAL) || self == Errno(ENOSYS) || self == Errno(EOPNOTSUPP)
    }
}

/// Where the next data at or after `offset` starts in `descriptor`: `offset` itself when it is
/// data, later when it is in a hole, nil when only a hole follows up to the end (or the file
/// system cannot tell, in which case everything counts as data: callers then copy zeros, never
/// skip data).
public func nextData(in descriptor: Int32, at offset: Int64) -> Int64? {
    let result = lseek(descriptor, off_t(offset), seekData)
    if result >= 0 { return Int64(result) }
    return errno == ENXIO ? nil : offset
}

/// Where the hole at or after `offset` starts (every file ends with an implicit hole at its size).
public func nextHole(in descriptor: Int32, at offset: Int64) -> Int64 {
    let result = lseek(descriptor, off_t(offset), seekHole)
    return result >= 0 ? Int64(result) : Int64.max
}
