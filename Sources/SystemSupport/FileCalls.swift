// System calls that Swift's Glibc module does not declare (glibc has them only under _GNU_SOURCE),
// through CLinuxHeaders' inline wrappers. Here rather than imported by their users: a module that
// imports CLinuxHeaders makes it visible to `@testable` importers, where it then claims glibc's
// own types (struct timespec) under MemberImportVisibility.

import CLinuxHeaders

/// renameat2(2)'s flags.
public enum RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST when the destination exists.
    public static let noReplace = UInt32(PROVIDERFS_RENAME_NOREPLACE)
    /// RENAME_EXCHANGE: swap the two names atomically (both must exist).
    public static let exchange = UInt32(PROVIDERFS_RENAME_EXCHANGE)
}

/// renameat2(2): 0, or -1 with errno set.
public func renameAt2(
    _ oldDirectory: Int32, _ oldPath: UnsafePointer<CChar>, _ newDirectory: Int32, _ newPath: UnsafePointer<CChar>,
    flags: UInt32
) -> Int32 {
    providerfs_renameat2(oldDirectory, oldPath, newDirectory, newPath, flags)
}

/// copy_file_range(2) from and to the descriptors' own offsets: the bytes copied (0 at the end of
/// the source), or -1 with errno set.
public func copyFileRange(from source: Int32, to destination: Int32, count: Int) -> Int {
    providerfs_copy_file_range(source, destination, UInt(count))
}

/// fallocate(2): 0, or -1 with errno set. `keepSize`: FALLOC_FL_KEEP_SIZE (space only).
public func fileAllocate(_ descriptor: Int32, keepSize: Bool, offset: Int64, length: Int64) -> Int32 {
    providerfs_fallocate(descriptor, keepSize ? PROVIDERFS_FALLOC_FL_KEEP_SIZE : 0, offset, length)
}

/// fallocate(2)'s FALLOC_FL_KEEP_SIZE, the one mode flag ProviderFS offers.
public let fallocateKeepSize = Int32(PROVIDERFS_FALLOC_FL_KEEP_SIZE)

/// utimensat(2)'s UTIME_OMIT (a time left as it is).
public let utimeOmit = Int(PROVIDERFS_UTIME_OMIT)

/// utimensat(2)'s UTIME_NOW (the time set to now).
public let utimeNow = Int(PROVIDERFS_UTIME_NOW)

/// open(2)'s O_TMPFILE: an unnamed file in the directory opened, linked in later with linkat(2).
public let openUnnamedTemporary = Int32(PROVIDERFS_O_TMPFILE)

/// open(2)'s O_PATH: a descriptor that names a file without opening it for I/O.
public let openPathOnly = Int32(PROVIDERFS_O_PATH)
