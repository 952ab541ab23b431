// Hole queries: SEEK_DATA/SEEK_HOLE are GNU extensions that Swift's Glibc module does not export;
// here with their documented values.

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
