// Reading extended attributes of a path (the client side: `providerfs status`, `providerfs
// download`, coordinated reads in a mount, tests). <sys/xattr.h> comes through CLinuxHeaders:
// Glibc's module map does not export it.

import CLinuxHeaders

#if canImport(Glibc)
import Glibc
#endif

/// `getxattr(2)` / `listxattr(2)` on paths.
public enum ExtendedAttributes {
    /// The value of `name` on `path`, or the errno (ENODATA when absent). One call for a value
    /// of up to 256 bytes (ProviderFS's are short); the size is asked for only when it is
    /// longer. On a FUSE mount every call is a round trip to its daemon (D-534).
    public static func value(_ name: String, of path: String) -> Result<[UInt8], Errno> {
        var capacity = 256
        while true {
            var buffer = [UInt8](repeating: 0, count: capacity)
            let count = buffer.withUnsafeMutableBytes { getxattr(path, name, $0.baseAddress, $0.count) }
            if count >= 0 { return .success(Array(buffer.prefix(count))) }
            guard errno == ERANGE else { return .failure(.current) }
            let size = getxattr(path, name, nil, 0)  // longer; it may grow again before the next call
            if size < 0 { return .failure(.current) }
            capacity = max(size, 1)
        }
    }

    /// The attribute names on `path`.
    public static func names(of path: String) -> Result<[String], Errno> {
        while true {
            let size = listxattr(path, nil, 0)
            if size < 0 { return .failure(.current) }
            var buffer = [CChar](repeating: 0, count: size)
            let count = listxattr(path, &buffer, buffer.count)
            if count < 0 {
                if errno == ERANGE { continue }
                return .failure(.current)
            }
            let bytes = buffer.prefix(count).map { UInt8(bitPattern: $0) }
            return .success(bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) })
        }
    }

    /// One raw `getxattr` call with a buffer of `capacity` bytes (capacity 0 asks for the size):
    /// the return value and errno, for tests of the size-query convention.
    public static func rawGet(_ name: String, of path: String, capacity: Int) -> (result: Int, errno: Errno) {
        var buffer = [UInt8](repeating: 0, count: max(capacity, 1))
        let result = buffer.withUnsafeMutableBytes {
            getxattr(path, name, capacity == 0 ? nil : $0.baseAddress, capacity)
        }
        return (result, .current)
    }

    /// One raw `listxattr` call, like `rawGet`.
    public static func rawList(of path: String, capacity: Int) -> (result: Int, errno: Errno) {
        var buffer = [CChar](repeating: 0, count: max(capacity, 1))
        let result = buffer.withUnsafeMutableBufferPointer {
            listxattr(path, capacity == 0 ? nil : $0.baseAddress, capacity)
        }
        return (result, .current)
    }
}
