// The daemon's own code kept mapped (D-531). A page of the executable that no process maps is
// page cache like any other: `drop_caches`, or memory pressure, drops it, and the first request
// that runs code on it waits for the disk (a major fault on the libfuse thread or in a task).
// Which code that is depends on where the linker put it: the first read of a placeholder after a
// cold start faulted on one such page in one build and on none in another. Mapping every page
// of the executable at the start makes that wait happen once, before the mount is visible.

import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

package enum ExecutablePages {
    /// One mapping of the executable file in /proc/self/maps.
    package struct Mapping: Equatable, Sendable {
        package var start: UInt
        package var end: UInt
        package var writable: Bool
    }

    /// MADV_POPULATE_READ (Linux 5.14+; not in every libc's headers).
    static let populateRead: Int32 = 22

    /// Maps every page of this process's executable that is mapped without write access (its
    /// code and read-only data) into its page tables, reading from the disk what the page cache
    /// does not hold. The bytes covered; 0 when the kernel refuses (older than 5.14) or
    /// /proc/self/maps cannot be read.
    @discardableResult
    package static func populate() -> Int {
        var covered = 0
        for mapping in mappings() where !mapping.writable {
            guard let base = UnsafeMutableRawPointer(bitPattern: mapping.start) else { continue }
            let length = Int(mapping.end - mapping.start)
            if madvise(base, length, populateRead) != 0 { return covered }
            covered += length
        }
        return covered
    }

    /// The mappings of the executable file of `process` ("self" or a pid, as /proc/<process>/exe
    /// names it), in address order.
    package static func mappings(of process: String = "self") -> [Mapping] {
        guard let executable = executablePath(of: process), let maps = readTextFile("/proc/\(process)/maps") else {
            return []
        }
        return parse(maps, executable: executable)
    }

    /// The lines of a /proc/<pid>/maps text that map `executable`: "start-end perms offset dev
    /// inode path", the path last (it may contain spaces).
    static func parse(_ maps: String, executable: String) -> [Mapping] {
        var found: [Mapping] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6, fields[5].drop(while: { $0 == " " }) == executable[...] else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16),
                start < end
            else { continue }
            found.append(Mapping(start: start, end: end, writable: fields[1].contains("w")))
        }
        return found
    }

    /// The target of /proc/<process>/exe (with " (deleted)" when the file was replaced, as maps
    /// says).
    static func executablePath(of process: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/\(process)/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        return String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
