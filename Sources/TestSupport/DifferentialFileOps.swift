// A differential tester for file systems (issue 14): one seeded random sequence of namespace and
// write operations is run on two roots — a reference (a temporary directory) and a subject (the
// mount) — step by step; every step's result (return value, bytes read, the comparable stat
// fields, errno) must be the same on both. The first divergence is reported with the seed, the
// step, both results and the numbered sequence up to it; at the end both trees are compared
// (names, types, sizes, bytes, symbolic link targets, permissions). Known deviations of a subject
// are an explicit list, each with its reason, and every use of one is counted in the report.
//
// The name space is small (14 names, three directories deep) so that operations collide: creates
// over existing names, renames over files and directories, unlinks of open files, paths through
// files, names too long. Reproduce a failure from the seed: the sequence depends only on it (and
// on the excluded operation kinds), never on the file system.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Operations

/// How a file is opened.
public struct OpenOptions: Sendable, Equatable, CustomStringConvertible {
    /// O_RDONLY, O_WRONLY or O_RDWR.
    public enum Access: Sendable, Equatable { case readOnly, writeOnly, readWrite }
    public var access: Access
    public var create: Bool
    public var exclusive: Bool
    public var truncate: Bool
    public var append: Bool

    public init(
        _ access: Access, create: Bool = false, exclusive: Bool = false, truncate: Bool = false, append: Bool = false
    ) {
        self.access = access
        self.create = create
        self.exclusive = exclusive
        self.truncate = truncate
        self.append = append
    }

    /// The flags for open(2) (always with O_CLOEXEC).
    public var rawValue: Int32 {
        var flags: Int32 =
            switch access {
            case .readOnly: O_RDONLY
            case .writeOnly: O_WRONLY
            case .readWrite: O_RDWR
            }
        if create { flags |= O_CREAT }
        if exclusive { flags |= O_EXCL }
        if truncate { flags |= O_TRUNC }
        if append { flags |= O_APPEND }
        return flags | O_CLOEXEC
    }

    public var description: String {
        var parts: [String] =
            switch access {
            case .readOnly: ["O_RDONLY"]
            case .writeOnly: ["O_WRONLY"]
            case .readWrite: ["O_RDWR"]
            }
        if create { parts.append("O_CREAT") }
        if exclusive { parts.append("O_EXCL") }
        if truncate { parts.append("O_TRUNC") }
        if append { parts.append("O_APPEND") }
        return parts.joined(separator: "|")
    }
}

/// rename(2), or renameat2(2) with one of its flags.
public enum RenameMode: Sendable, Equatable {
    case plain, noReplace, exchange
}

/// One step of a sequence. Paths are relative to the root a runner works in; `slot` names one of
/// the runner's open descriptors (an open into an occupied slot closes what was there first).
public enum FileOperation: Sendable, Equatable, CustomStringConvertible {
    case open(slot: Int, path: String, flags: OpenOptions, mode: UInt32)
    case close(slot: Int)
    /// pwrite(2) of `count` bytes of the pattern with seed `pattern` at `offset`.
    case pwrite(slot: Int, offset: Int, count: Int, pattern: UInt64)
    /// write(2) at the descriptor's position (the end, with O_APPEND).
    case write(slot: Int, count: Int, pattern: UInt64)
    case pread(slot: Int, offset: Int, count: Int)
    /// read(2) from the descriptor's position.
    case read(slot: Int, count: Int)
    case ftruncate(slot: Int, size: Int)
    case truncate(path: String, size: Int)
    case fsync(slot: Int)
    case fstat(slot: Int)
    case stat(path: String)
    case lstat(path: String)
    case unlink(path: String)
    case mkdir(path: String, mode: UInt32)
    case rmdir(path: String)
    case rename(from: String, to: String, mode: RenameMode)
    case link(from: String, to: String)
    /// symlink(2): `target` is stored as given (relative to the link's directory).
    case symlink(target: String, path: String)
    case readlink(path: String)
    case chmod(path: String, mode: UInt32)
    /// utimensat(2) with explicit times (whole seconds).
    case setTimes(path: String, accessed: Int, modified: Int)
    /// The sorted names of a directory (without "." and "..").
    case readdir(path: String)

    /// The kinds of operation, to exclude some from generated sequences.
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        case open, close, pwrite, write, pread, read, ftruncate, truncate, fsync, fstat, stat, lstat
        case unlink, mkdir, rmdir, rename, link, symlink, readlink, chmod, setTimes, readdir
    }

    public var kind: Kind {
        switch self {
        case .open: .open
        case .close: .close
        case .pwrite: .pwrite
        case .write: .write
        case .pread: .pread
        case .read: .read
        case .ftruncate: .ftruncate
        case .truncate: .truncate
        case .fsync: .fsync
        case .fstat: .fstat
        case .stat: .stat
        case .lstat: .lstat
        case .unlink: .unlink
        case .mkdir: .mkdir
        case .rmdir: .rmdir
        case .rename: .rename
        case .link: .link
        case .symlink: .symlink
        case .readlink: .readlink
        case .chmod: .chmod
        case .setTimes: .setTimes
        case .readdir: .readdir
        }
    }

    public var description: String {
        func octal(_ mode: UInt32) -> String { "0" + String(mode, radix: 8) }
        func show(_ path: String) -> String {
            path.utf8.count > 40 ? "\"\(path.prefix(12))…(\(path.utf8.count) bytes)\"" : "\"\(path)\""
        }
        switch self {
        case .open(let slot, let path, let flags, let mode):
            return "open(\(show(path)), \(flags), \(octal(mode))) → slot \(slot)"
        case .close(let slot): return "close(slot \(slot))"
        case .pwrite(let slot, let offset, let count, let pattern):
            return "pwrite(slot \(slot), offset \(offset), \(count) bytes of pattern \(pattern))"
        case .write(let slot, let count, let pattern):
            return "write(slot \(slot), \(count) bytes of pattern \(pattern))"
        case .pread(let slot, let offset, let count): return "pread(slot \(slot), offset \(offset), \(count) bytes)"
        case .read(let slot, let count): return "read(slot \(slot), \(count) bytes)"
        case .ftruncate(let slot, let size): return "ftruncate(slot \(slot), \(size))"
        case .truncate(let path, let size): return "truncate(\(show(path)), \(size))"
        case .fsync(let slot): return "fsync(slot \(slot))"
        case .fstat(let slot): return "fstat(slot \(slot))"
        case .stat(let path): return "stat(\(show(path)))"
        case .lstat(let path): return "lstat(\(show(path)))"
        case .unlink(let path): return "unlink(\(show(path)))"
        case .mkdir(let path, let mode): return "mkdir(\(show(path)), \(octal(mode)))"
        case .rmdir(let path): return "rmdir(\(show(path)))"
        case .rename(let from, let to, let mode):
            switch mode {
            case .plain: return "rename(\(show(from)), \(show(to)))"
            case .noReplace: return "renameat2(\(show(from)), \(show(to)), RENAME_NOREPLACE)"
            case .exchange: return "renameat2(\(show(from)), \(show(to)), RENAME_EXCHANGE)"
            }
        case .link(let from, let to): return "link(\(show(from)), \(show(to)))"
        case .symlink(let target, let path): return "symlink(\(show(target)), \(show(path)))"
        case .readlink(let path): return "readlink(\(show(path)))"
        case .chmod(let path, let mode): return "chmod(\(show(path)), \(octal(mode)))"
        case .setTimes(let path, let accessed, let modified):
            return "utimensat(\(show(path)), atime \(accessed), mtime \(modified))"
        case .readdir(let path): return "readdir(\(show(path)))"
        }
    }
}

// MARK: - Results

/// The kind of a file, as stat reports it.
public enum FileKind: String, Sendable, Equatable {
    case regular, directory, symbolicLink, other

    init(mode: mode_t) {
        switch mode & S_IFMT {
        case S_IFREG: self = .regular
        case S_IFDIR: self = .directory
        case S_IFLNK: self = .symbolicLink
        default: self = .other
        }
    }
}

/// The fields of a stat that two file systems must agree on. Not compared: inode numbers, device,
/// block counts, access and change times, a directory's size and link count (file-system specific).
public struct ComparableStatus: Sendable, Equatable, CustomStringConvertible {
    /// A modification time either set explicitly (utimensat, before 2017) or recent (set by a change).
    public enum ModificationTime: Sendable, Equatable {
        case explicit(seconds: Int)
        case recent
    }
    public var kind: FileKind
    /// Regular files and symbolic links only.
    public var size: Int?
    /// `st_mode & 0o777`.
    public var permissions: UInt32
    /// Regular files only.
    public var links: Int?
    public var modified: ModificationTime

    init(_ info: stat) {
        kind = FileKind(mode: info.st_mode)
        size = kind == .directory ? nil : Int(info.st_size)
        permissions = UInt32(info.st_mode) & 0o777
        links = kind == .regular ? Int(info.st_nlink) : nil
        let seconds = Int(info.st_mtim.tv_sec)
        modified = seconds < ComparableStatus.explicitTimeLimit ? .explicit(seconds: seconds) : .recent
    }

    public init(kind: FileKind, size: Int?, permissions: UInt32, links: Int?, modified: ModificationTime) {
        self.kind = kind
        self.size = size
        self.permissions = permissions
        self.links = links
        self.modified = modified
    }

    /// Times below this (2017-07-14) can only have been set explicitly by a sequence.
    public static let explicitTimeLimit = 1_500_000_000

    public var description: String {
        var parts = [kind.rawValue]
        if let size { parts.append("size \(size)") }
        parts.append("mode 0" + String(permissions, radix: 8))
        if let links { parts.append("nlink \(links)") }
        switch modified {
        case .explicit(let seconds): parts.append("mtime \(seconds)")
        case .recent: parts.append("mtime recent")
        }
        return parts.joined(separator: " ")
    }
}

/// What one step did on one root.
public enum StepResult: Sendable, Equatable, CustomStringConvertible {
    /// -1 with this errno.
    case failed(Int32)
    /// 0 (or a descriptor, for open).
    case done
    /// A byte count (write).
    case count(Int)
    /// The bytes a read returned.
    case bytes([UInt8])
    case status(ComparableStatus)
    case names([String])
    case target(String)
    /// The slot holds no descriptor (an earlier open failed or it was closed); nothing was called.
    case noDescriptor

    public var description: String {
        switch self {
        case .failed(let code): "-1 \(Errno(code).name)"
        case .done: "0"
        case .count(let count): "\(count)"
        case .bytes(let bytes): "\(bytes.count) bytes (fnv1a \(String(fnv1a(bytes), radix: 16)))"
        case .status(let status): status.description
        case .names(let names): "[" + names.joined(separator: ", ") + "]"
        case .target(let target): "→ \"\(target)\""
        case .noDescriptor: "no descriptor in that slot"
        }
    }
}

/// FNV-1a of `bytes` (to name read results compactly in reports).
func fnv1a(_ bytes: [UInt8]) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
    return hash
}

/// `count` bytes of the deterministic pattern with `seed` (SplitMix64 words, little-endian).
public func seededBytes(seed: UInt64, count: Int) -> [UInt8] {
    var random = SeededRandom(seed: seed)
    return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
        let raw = UnsafeMutableRawBufferPointer(buffer)
        var index = 0
        while index + 8 <= count {
            raw.storeBytes(of: random.next().littleEndian, toByteOffset: index, as: UInt64.self)
            index += 8
        }
        var word = random.next().littleEndian
        while index < count {
            raw[index] = UInt8(truncatingIfNeeded: word)
            word >>= 8
            index += 1
        }
        initialized = count
    }
}

// MARK: - Known deviations

/// A documented way in which a subject may differ from the reference. Each has a reason, printed
/// in every report together with how often it was used; nothing is tolerated silently.
public struct KnownDeviation: Sendable {
    public var reason: String
    /// Operation kinds never generated (the subject does not support them, by design).
    public var excludedKinds: Set<FileOperation.Kind>
    /// Operations never generated (finer than kinds: renameat2 with a flag, say).
    public var excludes: (@Sendable (FileOperation) -> Bool)?
    /// Whether a difference between the reference's and the subject's result of a step is this
    /// deviation. It must be one that leaves both trees alike (or later steps diverge anyway).
    public var accepts: @Sendable (_ operation: FileOperation, _ reference: StepResult, _ subject: StepResult) -> Bool

    public init(
        reason: String, excludedKinds: Set<FileOperation.Kind> = [],
        accepts: @escaping @Sendable (FileOperation, StepResult, StepResult) -> Bool = { _, _, _ in false }
    ) {
        self.reason = reason
        self.excludedKinds = excludedKinds
        self.accepts = accepts
    }

    /// These kinds of operation are not generated at all.
    public static func excluding(_ kinds: Set<FileOperation.Kind>, reason: String) -> KnownDeviation {
        KnownDeviation(reason: reason, excludedKinds: kinds)
    }

    /// Operations for which `excludes` is true are not generated at all.
    public static func excluding(
        reason: String, _ excludes: @escaping @Sendable (FileOperation) -> Bool
    ) -> KnownDeviation {
        var deviation = KnownDeviation(reason: reason)
        deviation.excludes = excludes
        return deviation
    }

    /// Stat results that differ only in the fields `mask` resets.
    public static func statusDiffering(
        reason: String, kinds: Set<FileKind>? = nil, _ mask: @escaping @Sendable (inout ComparableStatus) -> Void
    ) -> KnownDeviation {
        KnownDeviation(reason: reason) { _, reference, subject in
            guard case .status(var left) = reference, case .status(var right) = subject else { return false }
            if let kinds, !kinds.contains(left.kind) { return false }
            mask(&left)
            mask(&right)
            return left == right
        }
    }

    /// The modification time class (explicit or recent) may differ, for files of these kinds.
    public static func modificationTimes(of kinds: Set<FileKind>? = nil, reason: String) -> KnownDeviation {
        statusDiffering(reason: reason, kinds: kinds) { $0.modified = .recent }
    }

    /// The subject fails an operation of these kinds with `subjectErrno` where the reference fails
    /// it with `referenceErrno` (both failed: nothing changed on either side).
    public static func errno(
        _ referenceErrno: Int32, becomes subjectErrno: Int32, for kinds: Set<FileOperation.Kind>, reason: String
    ) -> KnownDeviation {
        KnownDeviation(reason: reason) { operation, reference, subject in
            kinds.contains(operation.kind) && reference == .failed(referenceErrno) && subject == .failed(subjectErrno)
        }
    }
}

// MARK: - Runners

/// Runs operations against one file system, holding its own open descriptors.
public protocol FileOperationRunner: AnyObject {
    /// The directory the operations' paths are relative to.
    var root: String { get }
    /// Performs one operation. Failures are results, never thrown.
    func perform(_ operation: FileOperation) -> StepResult
    /// Closes every descriptor still open.
    func closeAll()
}

/// Runs operations with the real system calls under `root`.
public final class DirectoryRunner: FileOperationRunner {
    public let root: String
    private var descriptors: [Int: Int32] = [:]

    public init(root: String) { self.root = root }

    deinit { closeAll() }

    public func closeAll() {
        for descriptor in descriptors.values { Glibc.close(descriptor) }
        descriptors.removeAll()
    }

    func path(_ relative: String) -> String { relative.isEmpty ? root : root + "/" + relative }

    private static func check(_ result: Int32) -> StepResult { result == 0 ? .done : .failed(errno) }

    public func perform(_ operation: FileOperation) -> StepResult {
        switch operation {
        case .open(let slot, let relative, let flags, let mode):
            if let old = descriptors.removeValue(forKey: slot) { Glibc.close(old) }
            let descriptor = retryingOnInterrupt { Glibc.open(path(relative), flags.rawValue, mode_t(mode)) }
            guard descriptor >= 0 else { return .failed(errno) }
            descriptors[slot] = descriptor
            return .done
        case .close(let slot):
            guard let descriptor = descriptors.removeValue(forKey: slot) else { return .noDescriptor }
            return Self.check(Glibc.close(descriptor))
        case .pwrite(let slot, let offset, let count, let pattern):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            let bytes = seededBytes(seed: pattern, count: count)
            let written = retryingOnInterrupt {
                bytes.withUnsafeBytes { Glibc.pwrite(descriptor, $0.baseAddress, count, off_t(offset)) }
            }
            return written < 0 ? .failed(errno) : .count(written)
        case .write(let slot, let count, let pattern):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            let bytes = seededBytes(seed: pattern, count: count)
            let written = retryingOnInterrupt {
                bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, count) }
            }
            return written < 0 ? .failed(errno) : .count(written)
        case .pread(let slot, let offset, let count):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            return Self.readResult(count) { Glibc.pread(descriptor, $0, count, off_t(offset)) }
        case .read(let slot, let count):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            return Self.readResult(count) { Glibc.read(descriptor, $0, count) }
        case .ftruncate(let slot, let size):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            return Self.check(retryingOnInterrupt { Glibc.ftruncate(descriptor, off_t(size)) })
        case .truncate(let relative, let size):
            return Self.check(retryingOnInterrupt { Glibc.truncate(path(relative), off_t(size)) })
        case .fsync(let slot):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            return Self.check(retryingOnInterrupt { Glibc.fsync(descriptor) })
        case .fstat(let slot):
            guard let descriptor = descriptors[slot] else { return .noDescriptor }
            var info = stat()
            guard Glibc.fstat(descriptor, &info) == 0 else { return .failed(errno) }
            return .status(ComparableStatus(info))
        case .stat(let relative):
            var info = Glibc.stat()
            guard fstatat(AT_FDCWD, path(relative), &info, 0) == 0 else { return .failed(errno) }
            return .status(ComparableStatus(info))
        case .lstat(let relative):
            var info = stat()
            guard Glibc.lstat(path(relative), &info) == 0 else { return .failed(errno) }
            return .status(ComparableStatus(info))
        case .unlink(let relative):
            return Self.check(Glibc.unlink(path(relative)))
        case .mkdir(let relative, let mode):
            return Self.check(Glibc.mkdir(path(relative), mode_t(mode)))
        case .rmdir(let relative):
            return Self.check(Glibc.rmdir(path(relative)))
        case .rename(let from, let to, let mode):
            switch mode {
            case .plain: return Self.check(Glibc.rename(path(from), path(to)))
            case .noReplace:
                return Self.check(renameAt2(AT_FDCWD, path(from), AT_FDCWD, path(to), flags: RenameFlags.noReplace))
            case .exchange:
                return Self.check(renameAt2(AT_FDCWD, path(from), AT_FDCWD, path(to), flags: RenameFlags.exchange))
            }
        case .link(let from, let to):
            return Self.check(Glibc.link(path(from), path(to)))
        case .symlink(let target, let relative):
            return Self.check(Glibc.symlink(target, path(relative)))
        case .readlink(let relative):
            var buffer = [CChar](repeating: 0, count: 4097)
            let count = Glibc.readlink(path(relative), &buffer, 4096)
            guard count >= 0 else { return .failed(errno) }
            return .target(String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self))
        case .chmod(let relative, let mode):
            return Self.check(Glibc.chmod(path(relative), mode_t(mode)))
        case .setTimes(let relative, let accessed, let modified):
            let times = [timespec(tv_sec: accessed, tv_nsec: 0), timespec(tv_sec: modified, tv_nsec: 0)]
            return Self.check(utimensat(AT_FDCWD, path(relative), times, 0))
        case .readdir(let relative):
            switch directoryNames(path(relative)) {
            case .success(let names): return .names(names)
            case .failure(let error): return .failed(error.rawValue)
            }
        }
    }

    private static func readResult(_ count: Int, _ call: (UnsafeMutableRawPointer) -> Int) -> StepResult {
        var buffer = [UInt8](repeating: 0, count: max(count, 1))
        let got = retryingOnInterrupt { buffer.withUnsafeMutableBytes { call($0.baseAddress!) } }
        guard got >= 0 else { return .failed(errno) }
        return .bytes(Array(buffer[0..<got]))
    }
}

/// The sorted names in a directory, without "." and "..".
func directoryNames(_ path: String) -> Result<[String], Errno> {
    guard let stream = opendir(path) else { return .failure(Errno.current) }
    defer { closedir(stream) }
    var names: [String] = []
    while let entry = readdir(stream) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        if name != "." && name != ".." { names.append(name) }
    }
    return .success(names.sorted())
}

// MARK: - Generator

/// Seeded random sequences over a small name space.
public struct FileOperationGenerator: Sendable {
    /// Fourteen names, up to three directories deep; any of them may become a file, a directory or
    /// a symbolic link during a sequence.
    public static let names = [
        "a", "b", "f", "g", "a/c", "a/f", "a/g", "b/f", "b/h", "a/c/d", "a/c/f", "a/c/d/f", "l", "a/c/l",
    ]
    /// Names that are often symbolic links.
    static let linkNames = ["l", "a/c/l"]
    /// Names that are often directories.
    static let directoryNames = ["a", "b", "a/c", "a/c/d"]
    /// Names that are often files.
    static let fileNames = ["f", "g", "a/f", "a/g", "b/f", "b/h", "a/c/f", "a/c/d/f"]
    /// A component of 256 bytes (NAME_MAX is 255).
    public static let tooLong = "a/" + String(repeating: "n", count: 256)
    /// Relative symbolic link targets: never "..", so nothing points out of the root.
    static let targets = ["f", "g", "c", "c/f", "d/f", "a", "b/h", "missing", "f/x"]
    static let slots = 4

    private var random: SeededRandom
    private let excluded: Set<FileOperation.Kind>
    private let excludes: [@Sendable (FileOperation) -> Bool]
    /// Slots this generator opened and has not closed (the open may have failed: only a bias).
    private var opened: Set<Int> = []
    /// Paths this generator made symbolic links at (they may be gone: only a bias).
    private var linked: [String] = []
    /// The first operations of every sequence: the directories and a few files, so that later
    /// operations meet something (they are compared like any other step).
    private var preamble: [FileOperation] = []

    /// The generator for `seed`; `excludes` drops single operations (another is drawn instead).
    public init(
        seed: UInt64, excluding excluded: Set<FileOperation.Kind> = [],
        excludes: [@Sendable (FileOperation) -> Bool] = []
    ) {
        random = SeededRandom(seed: seed)
        self.excluded = excluded
        self.excludes = excludes
        preamble = Self.directoryNames.map { FileOperation.mkdir(path: $0, mode: 0o755) }
        for name in ["f", "a/f", "a/c/f", "b/h"] {
            preamble.append(.open(slot: 0, path: name, flags: OpenOptions(.readWrite, create: true), mode: 0o644))
            preamble.append(.pwrite(slot: 0, offset: 0, count: 1 + below(6000), pattern: random.next()))
            preamble.append(.close(slot: 0))
        }
        preamble.reverse()
    }

    /// The first `count` operations of the sequence for `seed`.
    public static func sequence(
        seed: UInt64, count: Int, excluding excluded: Set<FileOperation.Kind> = [],
        excludes: [@Sendable (FileOperation) -> Bool] = []
    ) -> [FileOperation] {
        var generator = FileOperationGenerator(seed: seed, excluding: excluded, excludes: excludes)
        return (0..<count).map { _ in generator.next() }
    }

    private static let weights: [(FileOperation.Kind, Int)] = [
        (.open, 14), (.close, 6), (.pwrite, 14), (.write, 6), (.pread, 10), (.read, 4), (.ftruncate, 4),
        (.truncate, 3), (.fsync, 3), (.fstat, 4), (.stat, 6), (.lstat, 2), (.unlink, 5), (.mkdir, 6),
        (.rmdir, 4), (.rename, 8), (.link, 2), (.symlink, 4), (.readlink, 3), (.chmod, 2), (.setTimes, 2),
        (.readdir, 4),
    ]

    private mutating func below(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }
    private mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    private mutating func pick<T>(_ items: [T]) -> T { items[below(items.count)] }

    /// Mostly a pool name; sometimes a path through a name (ENOTDIR when it is a file) or a name
    /// too long.
    private mutating func path() -> String {
        let roll = below(100)
        if roll < 3 { return Self.tooLong }
        if roll < 7 { return pick(Self.names) + "/x" }
        return pick(Self.names)
    }

    private mutating func directoryPath() -> String {
        chance(70) ? pick(Self.directoryNames) : path()
    }

    private mutating func filePath() -> String {
        chance(75) ? pick(Self.fileNames) : path()
    }

    /// Mostly a slot that was opened, so that descriptor operations mostly meet a descriptor.
    private mutating func usedSlot() -> Int {
        if !opened.isEmpty && chance(85) { return pick(opened.sorted()) }
        return below(Self.slots)
    }

    private mutating func offset() -> Int {
        let roll = below(100)
        if roll < 45 { return below(8 << 10) }
        if roll < 70 { return below(64 << 10) }
        if roll < 90 { return below(512 << 10) }
        return below(2 << 20)
    }

    private mutating func count() -> Int {
        chance(80) ? 1 + below(16 << 10) : 1 + below(128 << 10)
    }

    private mutating func size() -> Int {
        let roll = below(100)
        if roll < 20 { return 0 }
        if roll < 80 { return below(64 << 10) }
        return below(1 << 20)
    }

    public mutating func next() -> FileOperation {
        if let first = preamble.popLast() { return first }
        while true {
            let candidate = draw()
            if !excludes.contains(where: { $0(candidate) }) { return candidate }
        }
    }

    private mutating func draw() -> FileOperation {
        let total = Self.weights.filter { !excluded.contains($0.0) }.reduce(0) { $0 + $1.1 }
        precondition(total > 0, "every operation kind is excluded")
        var roll = below(total)
        var kind = FileOperation.Kind.stat
        for (candidate, weight) in Self.weights where !excluded.contains(candidate) {
            if roll < weight {
                kind = candidate
                break
            }
            roll -= weight
        }
        let slot = usedSlot()
        switch kind {
        case .open:
            let free = (0..<Self.slots).filter { !opened.contains($0) }
            let slot = !free.isEmpty && chance(70) ? pick(free) : below(Self.slots)
            opened.insert(slot)
            let access = pick([OpenOptions.Access.readOnly, .writeOnly, .readWrite, .readWrite, .readWrite])
            let create = chance(75)
            let flags = OpenOptions(
                access, create: create, exclusive: create && chance(30), truncate: chance(10), append: chance(15))
            return .open(slot: slot, path: filePath(), flags: flags, mode: pick([0o644, 0o600, 0o755]))
        case .close:
            opened.remove(slot)
            return .close(slot: slot)
        case .pwrite: return .pwrite(slot: slot, offset: offset(), count: count(), pattern: random.next())
        case .write: return .write(slot: slot, count: count(), pattern: random.next())
        case .pread: return .pread(slot: slot, offset: chance(60) ? below(4096) : offset(), count: count())
        case .read: return .read(slot: slot, count: count())
        case .ftruncate: return .ftruncate(slot: slot, size: size())
        case .truncate: return .truncate(path: filePath(), size: size())
        case .fsync: return .fsync(slot: slot)
        case .fstat: return .fstat(slot: slot)
        case .stat: return .stat(path: path())
        case .lstat: return .lstat(path: !linked.isEmpty && chance(50) ? pick(linked) : path())
        case .unlink: return .unlink(path: path())
        case .mkdir: return .mkdir(path: directoryPath(), mode: pick([0o755, 0o700, 0o750]))
        case .rmdir: return .rmdir(path: directoryPath())
        case .rename:
            let from = chance(50) ? directoryPath() : path()
            var to = path()
            // Into its own subdirectory (EINVAL for a directory) more often than chance would.
            let inside = Self.names.filter { $0.hasPrefix(from + "/") }
            if !inside.isEmpty && chance(20) { to = pick(inside) }
            let mode: RenameMode = chance(60) ? .plain : (chance(50) ? .noReplace : .exchange)
            return .rename(from: from, to: to, mode: mode)
        case .link: return .link(from: path(), to: path())
        case .symlink:
            let path = chance(60) ? pick(Self.linkNames) : path()
            if !linked.contains(path) { linked.append(path) }
            return .symlink(target: pick(Self.targets), path: path)
        case .readlink: return .readlink(path: !linked.isEmpty && chance(60) ? pick(linked) : path())
        case .chmod: return .chmod(path: path(), mode: pick([0o644, 0o600, 0o755, 0o700, 0o444]))
        case .setTimes:
            let base = 1_000_000_000
            return .setTimes(path: path(), accessed: base + below(1000), modified: base + below(1000))
        case .readdir: return .readdir(path: chance(20) ? "" : directoryPath())
        }
    }
}

// MARK: - Comparing two roots

/// Where the subject first did something other than the reference.
public struct Divergence: Sendable, CustomStringConvertible {
    public var step: Int
    public var operation: FileOperation
    public var reference: StepResult
    public var subject: StepResult

    public var description: String {
        var text = "step #\(step) \(operation)\n  reference: \(reference)\n  subject:   \(subject)"
        if case .bytes(let left) = reference, case .bytes(let right) = subject,
            let difference = byteDifference(right, left)
        {
            text += "\n  subject vs reference: \(difference)"
        }
        return text
    }
}

/// The outcome of one differential run.
public struct DifferentialReport: Sendable, CustomStringConvertible {
    public var seed: UInt64
    /// The operations run (up to and including a divergence).
    public var operations: [FileOperation]
    public var divergence: Divergence?
    /// Where an item's identity first differed (st_ino changed while the reference's did not, or
    /// two items shared one number; `IdentityTracker`), with the step it followed.
    public var identityDifference: (step: Int, operation: FileOperation, problem: String)?
    /// Differences of the final trees (empty when they agree, or when a step diverged).
    public var treeDifferences: [String]
    /// Each known deviation's reason and how many steps it excused (every one listed, 0 too).
    public var deviationsUsed: [(reason: String, steps: Int)]
    public var referenceRoot: String
    public var subjectRoot: String

    public var passed: Bool { divergence == nil && identityDifference == nil && treeDifferences.isEmpty }

    public var description: String {
        var lines: [String] = []
        if let divergence {
            lines.append("differential run, seed \(seed): diverged at \(divergence)")
        } else if let identityDifference {
            lines.append(
                "differential run, seed \(seed): identity differs after step #\(identityDifference.step) \(identityDifference.operation): \(identityDifference.problem)"
            )
        } else if !treeDifferences.isEmpty {
            lines.append("differential run, seed \(seed): every step agreed, the final trees differ:")
            lines += treeDifferences.map { "  " + $0 }
        } else {
            lines.append("differential run, seed \(seed): \(operations.count) steps agreed, trees equal")
        }
        lines.append("reference \(referenceRoot), subject \(subjectRoot)")
        for deviation in deviationsUsed {
            lines.append("known deviation used \(deviation.steps)×: \(deviation.reason)")
        }
        if !passed {
            lines.append("sequence:")
            for (index, operation) in operations.enumerated() { lines.append("  #\(index) \(operation)") }
            lines.append(
                "replay: PROVIDERFS_DIFF_SEED=\(seed) PROVIDERFS_DIFF_SEQUENCES=1 PROVIDERFS_DIFF_STEPS=\(operations.count)"
            )
        }
        return lines.joined(separator: "\n")
    }
}

/// Runs sequences on a reference and a subject and compares them.
public enum DifferentialTester {
    /// Runs the sequence for `seed` (`steps` long) on both runners, comparing each step; stops at
    /// the first divergence. Without one, closes every descriptor and compares the trees under the
    /// two roots (`ignoring` top-level names of the subject, such as a mount's own entries).
    public static func run(
        seed: UInt64, steps: Int, reference: any FileOperationRunner, subject: any FileOperationRunner,
        deviations: [KnownDeviation] = [], comparePermissions: Bool = true, ignoring: Set<String> = [],
        checkIdentity: Bool = true
    ) -> DifferentialReport {
        let excluded = deviations.reduce(into: Set<FileOperation.Kind>()) { $0.formUnion($1.excludedKinds) }
        var generator = FileOperationGenerator(
            seed: seed, excluding: excluded, excludes: deviations.compactMap(\.excludes))
        var used = [Int](repeating: 0, count: deviations.count)
        var report = DifferentialReport(
            seed: seed, operations: [], divergence: nil, treeDifferences: [], deviationsUsed: [],
            referenceRoot: reference.root, subjectRoot: subject.root)
        defer {
            reference.closeAll()
            subject.closeAll()
        }
        var identities = IdentityTracker()
        // PROVIDERFS_DIFF_TRACE=1 prints every step with both results, for reading a replay.
        let trace = getenv("PROVIDERFS_DIFF_TRACE").map { String(cString: $0) } == "1"
        for step in 0..<steps {
            let operation = generator.next()
            report.operations.append(operation)
            let expected = reference.perform(operation)
            let actual = subject.perform(operation)
            if trace {
                let differs = expected == actual ? "" : " | subject \(actual)"
                print("trace #\(step) \(operation) → \(expected)\(differs)")
            }
            if expected != actual {
                guard let index = deviations.firstIndex(where: { $0.accepts(operation, expected, actual) }) else {
                    report.divergence = Divergence(
                        step: step, operation: operation, reference: expected, subject: actual)
                    break
                }
                used[index] += 1
            }
            // Every item keeps its st_ino as long as the reference's keeps its own (D-389).
            if checkIdentity,
                let problem = identities.check(reference: reference.root, subject: subject.root, ignoring: ignoring)
            {
                report.identityDifference = (step, operation, problem)
                break
            }
        }
        report.deviationsUsed = zip(deviations, used).map { ($0.reason, $1) }
        guard report.divergence == nil, report.identityDifference == nil else { return report }
        reference.closeAll()
        subject.closeAll()
        let expectedTree = FileTreeSnapshot.capture(reference.root)
        let actualTree = FileTreeSnapshot.capture(subject.root, ignoring: ignoring)
        report.treeDifferences = actualTree.differences(from: expectedTree, comparePermissions: comparePermissions)
        return report
    }
}

// MARK: - Identity

/// Judges the subject's st_ino against the reference's, step by step: two paths show one number
/// on the subject exactly when they do on the reference (hard links), and an item the reference
/// kept (its number unchanged from one step to the next) kept its number on the subject too,
/// through renames, writes and everything else. Numbers themselves are never compared, and a
/// number the reference freed may come back for another item on either side.
public struct IdentityTracker: Sendable {
    /// The reference's number → the subject's, for the items of the last check.
    private var mapping: [UInt64: UInt64] = [:]

    public init() {}

    /// Relative path → st_ino (lstat) of everything under `root`.
    public static func numbers(_ root: String, ignoring: Set<String> = []) -> [String: UInt64] {
        var numbers: [String: UInt64] = [:]
        func walk(_ relative: String) {
            let directory = relative.isEmpty ? root : root + "/" + relative
            guard case .success(let names) = directoryNames(directory) else { return }
            for name in names where !(relative.isEmpty && ignoring.contains(name)) {
                let child = relative.isEmpty ? name : relative + "/" + name
                var info = stat()
                guard lstat(root + "/" + child, &info) == 0 else { continue }
                numbers[child] = UInt64(info.st_ino)
                if FileKind(mode: info.st_mode) == .directory { walk(child) }
            }
        }
        walk("")
        return numbers
    }

    /// nil when the subject's identities agree with the reference's, else what differs. Paths
    /// on one side only are left to the comparison of trees.
    public mutating func check(reference: String, subject: String, ignoring: Set<String> = []) -> String? {
        let expected = Self.numbers(reference)
        let actual = Self.numbers(subject, ignoring: ignoring)
        var next: [UInt64: UInt64] = [:]
        var owner: [UInt64: (reference: UInt64, path: String)] = [:]
        for (path, number) in expected.sorted(by: { $0.key < $1.key }) {
            guard let shown = actual[path] else { continue }
            if let other = next[number], other != shown {
                return "\(path) shows st_ino \(shown), another name of the same item shows \(other)"
            }
            if let taken = owner[shown], taken.reference != number {
                return "\(path) shows st_ino \(shown), which \(taken.path), another item, shows too"
            }
            if let before = mapping[number], before != shown {
                return "\(path) changed its st_ino from \(before) to \(shown) (the reference's stayed \(number))"
            }
            next[number] = shown
            owner[shown] = (number, path)
        }
        mapping = next
        return nil
    }
}

// MARK: - Trees

/// Everything about a tree that two file systems must agree on: per relative path, the kind, the
/// permissions, a file's bytes, a link's target. Symbolic links are not followed.
public struct FileTreeSnapshot: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        public var kind: FileKind
        public var permissions: UInt32
        /// A regular file's bytes.
        public var contents: [UInt8]?
        /// A symbolic link's target.
        public var target: String?
        /// When the entry could not be read (the errno).
        public var error: Int32?
    }

    public var entries: [String: Entry]

    public init(entries: [String: Entry]) { self.entries = entries }

    /// The tree under `root` (not including `root` itself); `ignoring` names directly under it.
    public static func capture(_ root: String, ignoring: Set<String> = []) -> FileTreeSnapshot {
        var entries: [String: Entry] = [:]
        func walk(_ relative: String) {
            let directory = relative.isEmpty ? root : root + "/" + relative
            guard case .success(let names) = directoryNames(directory) else { return }
            for name in names where !(relative.isEmpty && ignoring.contains(name)) {
                let child = relative.isEmpty ? name : relative + "/" + name
                let full = root + "/" + child
                var info = stat()
                guard lstat(full, &info) == 0 else {
                    entries[child] = Entry(kind: .other, permissions: 0, error: errno)
                    continue
                }
                var entry = Entry(kind: FileKind(mode: info.st_mode), permissions: UInt32(info.st_mode) & 0o777)
                switch entry.kind {
                case .regular:
                    do {
                        entry.contents = try readFile(full)
                    } catch {
                        entry.error = errno
                    }
                case .symbolicLink:
                    var buffer = [CChar](repeating: 0, count: 4097)
                    let count = readlink(full, &buffer, 4096)
                    if count >= 0 {
                        entry.target = String(
                            decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                    } else {
                        entry.error = errno
                    }
                case .directory:
                    walk(child)
                case .other:
                    break
                }
                entries[child] = entry
            }
        }
        walk("")
        return FileTreeSnapshot(entries: entries)
    }

    /// One line per difference of `self` (the subject) from `expected`, sorted by path.
    public func differences(from expected: FileTreeSnapshot, comparePermissions: Bool = true) -> [String] {
        var lines: [String] = []
        for path in Set(entries.keys).union(expected.entries.keys).sorted() {
            switch (entries[path], expected.entries[path]) {
            case (nil, let wanted?): lines.append("\(path): missing (expected a \(wanted.kind.rawValue))")
            case (let found?, nil): lines.append("\(path): unexpected \(found.kind.rawValue)")
            case (let found?, let wanted?):
                if let error = found.error ?? wanted.error {
                    if found.error != wanted.error {
                        lines.append("\(path): unreadable (\(Errno(error).name)) on one side only")
                    }
                    continue
                }
                if found.kind != wanted.kind {
                    lines.append("\(path): a \(found.kind.rawValue), expected a \(wanted.kind.rawValue)")
                    continue
                }
                if comparePermissions && found.permissions != wanted.permissions {
                    lines.append(
                        "\(path): mode 0\(String(found.permissions, radix: 8)), expected 0\(String(wanted.permissions, radix: 8))"
                    )
                }
                if let actual = found.contents, let wanted = wanted.contents,
                    let difference = byteDifference(actual, wanted)
                {
                    lines.append("\(path): \(difference)")
                }
                if found.target != wanted.target {
                    lines.append("\(path): target \(found.target ?? "-"), expected \(wanted.target ?? "-")")
                }
            case (nil, nil): break
            }
        }
        return lines
    }
}
