// File ranges: hole queries (SEEK_DATA/SEEK_HOLE are GNU extensions that Swift's Glibc module
// does not export; here with their documented values) and whole-range pread/pwrite.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `SEEK_DATA` and `SEEK_HOLE` (lseek(2), _GNU_SOURCE).
public let seekData: Int32 = 3
public let seekHole: Int32 = 4

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

/// Reads up to `count` bytes at `offset` into `buffer`, going on after short reads and EINTR;
/// fewer bytes only at the end of the file. The count read, or the errno.
public func readFully(
    _ descriptor: Int32, into buffer: UnsafeMutableRawPointer, count: Int, at offset: Int64
) -> Result<Int, Errno> {
    var done = 0
    while done < count {
        let got = SystemCalls.pread(descriptor, buffer + done, count - done, off_t(offset) + off_t(done))
        if got < 0 { return .failure(Errno.current) }
        if got == 0 { break }
        done += got
    }
    return .success(done)
}

/// Writes all `count` bytes of `buffer` at `offset`, going on after short writes and EINTR.
public func writeFully(
    _ descriptor: Int32, from buffer: UnsafeRawPointer, count: Int, at offset: Int64
) -> Result<Void, Errno> {
    var done = 0
    while done < count {
        let written = SystemCalls.pwrite(descriptor, buffer + done, count - done, off_t(offset) + off_t(done))
        if written < 0 { return .failure(Errno.current) }
        done += written
    }
    return .success(())
}
