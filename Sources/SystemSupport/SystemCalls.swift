// The file and descriptor calls of the cache, the staging files and the local provider, in one
// place (D-516; swift-system's and swift-nio's model): each has its system call's own shape (a
// result, -1 with errno set on failure), is retried on EINTR (close never is: on Linux the
// descriptor is gone either way), and can be made to fail in tests (`SystemCallFaults`). The
// modules that use them call no raw Glibc file call (`SystemCallLayerTests`).

import Synchronization

#if canImport(Glibc)
public import Glibc
#elseif canImport(Musl)
public import Musl
#endif

/// A call `SystemCalls` makes, as a fault names it.
public enum SystemCall: String, Sendable, CaseIterable {
    case open, close, read, write, pread, pwrite, fsync, fdatasync, ftruncate, truncate, fstat, fstatat, lstat,
        stat, unlink, unlinkat, rename, renameat, renameat2, link, linkat, symlink, symlinkat, readlink,
        readlinkat, mkdir, mkdirat, rmdir, fchmod, fchmodat, chmod, futimens, utimensat, fchown, fchownat,
        lchown, fallocate, lseek, copyFileRange, access, mknod
}

public enum SystemCalls {
    /// Runs `body` (the call) unless a fault strikes it, again while it fails with EINTR.
    @inline(__always)
    static func run<T: BinaryInteger>(_ call: SystemCall, _ place: @autoclosure () -> String?, _ body: () -> T) -> T {
        while true {
            if SystemCallFaults.armed, let fault = SystemCallFaults.strike(call, at: place()) {
                errno = fault
            } else {
                let result = body()
                if result == -1 && errno == EINTR { continue }
                return result
            }
            if errno != EINTR { return -1 }
        }
    }

    // MARK: Descriptors

    @discardableResult
    public static func open(_ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: mode_t = 0) -> Int32 {
        run(.open, SystemCallFaults.place(path)) { Glibc.open(path, flags, mode) }
    }

    @discardableResult
    public static func openat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: mode_t = 0
    ) -> Int32 {
        run(.open, SystemCallFaults.place(directory, path)) { Glibc.openat(directory, path, flags, mode) }
    }

    /// close(2), never retried: after EINTR the descriptor is closed all the same (Linux).
    @discardableResult
    public static func close(_ descriptor: Int32) -> Int32 {
        if SystemCallFaults.armed, let fault = SystemCallFaults.strike(.close, at: SystemCallFaults.place(descriptor)) {
            _ = Glibc.close(descriptor)
            errno = fault
            return -1
        }
        return Glibc.close(descriptor)
    }

    @discardableResult
    public static func read(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
        run(.read, SystemCallFaults.place(descriptor)) { Glibc.read(descriptor, buffer, count) }
    }

    @discardableResult
    public static func write(_ descriptor: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
        run(.write, SystemCallFaults.place(descriptor)) { Glibc.write(descriptor, buffer, count) }
    }

    @discardableResult
    public static func pread(
        _ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int, _ offset: off_t
    ) -> Int {
        run(.pread, SystemCallFaults.place(descriptor)) { Glibc.pread(descriptor, buffer, count, offset) }
    }

    @discardableResult
    public static func pwrite(_ descriptor: Int32, _ buffer: UnsafeRawPointer?, _ count: Int, _ offset: off_t) -> Int {
        run(.pwrite, SystemCallFaults.place(descriptor)) { Glibc.pwrite(descriptor, buffer, count, offset) }
    }

    @discardableResult
    public static func fsync(_ descriptor: Int32) -> Int32 {
        run(.fsync, SystemCallFaults.place(descriptor)) { Glibc.fsync(descriptor) }
    }

    @discardableResult
    public static func fdatasync(_ descriptor: Int32) -> Int32 {
        run(.fdatasync, SystemCallFaults.place(descriptor)) { Glibc.fdatasync(descriptor) }
    }

    @discardableResult
    public static func ftruncate(_ descriptor: Int32, _ length: off_t) -> Int32 {
        run(.ftruncate, SystemCallFaults.place(descriptor)) { Glibc.ftruncate(descriptor, length) }
    }

    @discardableResult
    public static func truncate(_ path: UnsafePointer<CChar>, _ length: off_t) -> Int32 {
        run(.truncate, SystemCallFaults.place(path)) { Glibc.truncate(path, length) }
    }

    @discardableResult
    public static func fstat(_ descriptor: Int32, _ info: UnsafeMutablePointer<stat>) -> Int32 {
        run(.fstat, SystemCallFaults.place(descriptor)) { Glibc.fstat(descriptor, info) }
    }

    @discardableResult
    public static func fstatat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ info: UnsafeMutablePointer<stat>, _ flags: Int32
    ) -> Int32 {
        run(.fstatat, SystemCallFaults.place(directory, path)) { Glibc.fstatat(directory, path, info, flags) }
    }

    @discardableResult
    public static func lstat(_ path: UnsafePointer<CChar>, _ info: UnsafeMutablePointer<stat>) -> Int32 {
        run(.lstat, SystemCallFaults.place(path)) { Glibc.lstat(path, info) }
    }

    @discardableResult
    public static func stat(_ path: UnsafePointer<CChar>, _ info: UnsafeMutablePointer<stat>) -> Int32 {
        run(.stat, SystemCallFaults.place(path)) { statPath(path, info) }
    }

    @discardableResult
    public static func lseek(_ descriptor: Int32, _ offset: off_t, _ whence: Int32) -> off_t {
        run(.lseek, SystemCallFaults.place(descriptor)) { Glibc.lseek(descriptor, offset, whence) }
    }

    @discardableResult
    public static func fallocate(_ descriptor: Int32, keepSize: Bool, offset: Int64, length: Int64) -> Int32 {
        run(.fallocate, SystemCallFaults.place(descriptor)) {
            fileAllocate(descriptor, keepSize: keepSize, offset: offset, length: length)
        }
    }

    @discardableResult
    public static func copyFileRange(from source: Int32, to destination: Int32, count: Int) -> Int {
        run(.copyFileRange, SystemCallFaults.place(destination)) {
            SystemSupport.copyFileRange(from: source, to: destination, count: count)
        }
    }

    // MARK: Names

    @discardableResult
    public static func unlink(_ path: UnsafePointer<CChar>) -> Int32 {
        run(.unlink, SystemCallFaults.place(path)) { Glibc.unlink(path) }
    }

    @discardableResult
    public static func unlinkat(_ directory: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32) -> Int32 {
        run(.unlinkat, SystemCallFaults.place(directory, path)) { Glibc.unlinkat(directory, path, flags) }
    }

    @discardableResult
    public static func rmdir(_ path: UnsafePointer<CChar>) -> Int32 {
        run(.rmdir, SystemCallFaults.place(path)) { Glibc.rmdir(path) }
    }

    @discardableResult
    public static func rename(_ old: UnsafePointer<CChar>, _ new: UnsafePointer<CChar>) -> Int32 {
        run(.rename, SystemCallFaults.place(new)) { Glibc.rename(old, new) }
    }

    @discardableResult
    public static func renameat(
        _ oldDirectory: Int32, _ old: UnsafePointer<CChar>, _ newDirectory: Int32, _ new: UnsafePointer<CChar>
    ) -> Int32 {
        run(.renameat, SystemCallFaults.place(newDirectory, new)) {
            Glibc.renameat(oldDirectory, old, newDirectory, new)
        }
    }

    @discardableResult
    public static func renameat2(
        _ oldDirectory: Int32, _ old: UnsafePointer<CChar>, _ newDirectory: Int32, _ new: UnsafePointer<CChar>,
        flags: UInt32
    ) -> Int32 {
        run(.renameat2, SystemCallFaults.place(newDirectory, new)) {
            renameAt2(oldDirectory, old, newDirectory, new, flags: flags)
        }
    }

    @discardableResult
    public static func link(_ existing: UnsafePointer<CChar>, _ new: UnsafePointer<CChar>) -> Int32 {
        run(.link, SystemCallFaults.place(new)) { Glibc.link(existing, new) }
    }

    @discardableResult
    public static func linkat(
        _ oldDirectory: Int32, _ old: UnsafePointer<CChar>, _ newDirectory: Int32, _ new: UnsafePointer<CChar>,
        _ flags: Int32
    ) -> Int32 {
        run(.linkat, SystemCallFaults.place(newDirectory, new)) {
            Glibc.linkat(oldDirectory, old, newDirectory, new, flags)
        }
    }

    @discardableResult
    public static func symlink(_ target: UnsafePointer<CChar>, _ path: UnsafePointer<CChar>) -> Int32 {
        run(.symlink, SystemCallFaults.place(path)) { Glibc.symlink(target, path) }
    }

    @discardableResult
    public static func symlinkat(
        _ target: UnsafePointer<CChar>, _ directory: Int32, _ path: UnsafePointer<CChar>
    ) -> Int32 {
        run(.symlinkat, SystemCallFaults.place(directory, path)) { Glibc.symlinkat(target, directory, path) }
    }

    @discardableResult
    public static func readlink(_ path: UnsafePointer<CChar>, _ buffer: UnsafeMutablePointer<CChar>, _ size: Int) -> Int
    {
        run(.readlink, SystemCallFaults.place(path)) { Glibc.readlink(path, buffer, size) }
    }

    @discardableResult
    public static func readlinkat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ buffer: UnsafeMutablePointer<CChar>, _ size: Int
    ) -> Int {
        run(.readlinkat, SystemCallFaults.place(directory, path)) { Glibc.readlinkat(directory, path, buffer, size) }
    }

    @discardableResult
    public static func mkdir(_ path: UnsafePointer<CChar>, _ mode: mode_t) -> Int32 {
        run(.mkdir, SystemCallFaults.place(path)) { Glibc.mkdir(path, mode) }
    }

    @discardableResult
    public static func mkdirat(_ directory: Int32, _ path: UnsafePointer<CChar>, _ mode: mode_t) -> Int32 {
        run(.mkdirat, SystemCallFaults.place(directory, path)) { Glibc.mkdirat(directory, path, mode) }
    }

    @discardableResult
    public static func mknod(_ path: UnsafePointer<CChar>, _ mode: mode_t, _ device: dev_t) -> Int32 {
        run(.mknod, SystemCallFaults.place(path)) { Glibc.mknod(path, mode, device) }
    }

    @discardableResult
    public static func access(_ path: UnsafePointer<CChar>, _ mode: Int32) -> Int32 {
        run(.access, SystemCallFaults.place(path)) { Glibc.access(path, mode) }
    }

    // MARK: Attributes

    @discardableResult
    public static func fchmod(_ descriptor: Int32, _ mode: mode_t) -> Int32 {
        run(.fchmod, SystemCallFaults.place(descriptor)) { Glibc.fchmod(descriptor, mode) }
    }

    @discardableResult
    public static func fchmodat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ mode: mode_t, _ flags: Int32
    ) -> Int32 {
        run(.fchmodat, SystemCallFaults.place(directory, path)) { Glibc.fchmodat(directory, path, mode, flags) }
    }

    @discardableResult
    public static func chmod(_ path: UnsafePointer<CChar>, _ mode: mode_t) -> Int32 {
        run(.chmod, SystemCallFaults.place(path)) { Glibc.chmod(path, mode) }
    }

    @discardableResult
    public static func futimens(_ descriptor: Int32, _ times: UnsafePointer<timespec>?) -> Int32 {
        run(.futimens, SystemCallFaults.place(descriptor)) { Glibc.futimens(descriptor, times) }
    }

    @discardableResult
    public static func utimensat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ times: UnsafePointer<timespec>?, _ flags: Int32
    ) -> Int32 {
        run(.utimensat, SystemCallFaults.place(directory, path)) { Glibc.utimensat(directory, path, times, flags) }
    }

    @discardableResult
    public static func fchown(_ descriptor: Int32, _ owner: uid_t, _ group: gid_t) -> Int32 {
        run(.fchown, SystemCallFaults.place(descriptor)) { Glibc.fchown(descriptor, owner, group) }
    }

    @discardableResult
    public static func fchownat(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ owner: uid_t, _ group: gid_t, _ flags: Int32
    ) -> Int32 {
        run(.fchownat, SystemCallFaults.place(directory, path)) {
            Glibc.fchownat(directory, path, owner, group, flags)
        }
    }

    @discardableResult
    public static func lchown(_ path: UnsafePointer<CChar>, _ owner: uid_t, _ group: gid_t) -> Int32 {
        run(.lchown, SystemCallFaults.place(path)) { Glibc.lchown(path, owner, group) }
    }
}

/// stat(2) (inside `SystemCalls`, `stat(` names the struct or the method).
private func statPath(_ path: UnsafePointer<CChar>, _ info: UnsafeMutablePointer<stat>) -> Int32 { stat(path, info) }

/// Failures injected into `SystemCalls` (tests): a call made on a path under a directory fails
/// with an errno, a number of times. While none is armed a call pays one relaxed atomic load.
/// Places are paths; a descriptor's is where /proc/self/fd says it points (an unnamed O_TMPFILE
/// file's is its directory's path with "/#… (deleted)"), looked up only while a fault is armed.
public enum SystemCallFaults {
    struct Fault {
        let id: Int
        let call: SystemCall
        let errno: Int32
        let under: String
        var remaining: Int
        var struck = 0
    }

    private static let count = Atomic<Int>(0)
    private static let faults = Locked<(next: Int, list: [Fault])>((0, []))

    static var armed: Bool { count.load(ordering: .relaxed) > 0 }

    /// Arms a fault: the next `times` calls of `call` on a place under `directory` (a path
    /// prefix ending at a component) fail with `errno`. Returns its id for `disarm` and `struck`.
    @discardableResult
    public static func arm(_ call: SystemCall, errno: Int32, under directory: String, times: Int = 1) -> Int {
        let prefix = directory.hasSuffix("/") ? directory : directory + "/"
        let id = faults.withLock { state in
            state.next += 1
            state.list.append(Fault(id: state.next, call: call, errno: errno, under: prefix, remaining: times))
            return state.next
        }
        count.add(1, ordering: .relaxed)
        return id
    }

    /// Removes a fault (struck out or not); the number of calls it struck.
    @discardableResult
    public static func disarm(_ id: Int) -> Int {
        let removed = faults.withLock { state -> Fault? in
            guard let index = state.list.firstIndex(where: { $0.id == id }) else { return nil }
            return state.list.remove(at: index)
        }
        if removed != nil { count.subtract(1, ordering: .relaxed) }
        return removed?.struck ?? 0
    }

    /// How many calls the fault `id` has struck so far.
    @discardableResult
    public static func struck(_ id: Int) -> Int {
        faults.withLock { state in state.list.first(where: { $0.id == id })?.struck ?? 0 }
    }

    /// The errno of an armed fault for `call` at `place`, counted; nil when none strikes.
    static func strike(_ call: SystemCall, at place: String?) -> Int32? {
        guard let place else { return nil }
        return faults.withLock { state -> Int32? in
            guard
                let index = state.list.firstIndex(where: {
                    $0.call == call && $0.remaining > 0 && (place + "/").hasPrefix($0.under)
                })
            else { return nil }
            state.list[index].remaining -= 1
            state.list[index].struck += 1
            return state.list[index].errno
        }
    }

    /// Where `descriptor` points (only asked while a fault is armed).
    static func place(_ descriptor: Int32) -> String? {
        guard armed else { return nil }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = Glibc.readlink("/proc/self/fd/\(descriptor)", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// A path as a fault names it.
    static func place(_ path: UnsafePointer<CChar>) -> String? {
        armed ? String(cString: path) : nil
    }

    /// The path `path` names relative to `directory` (a descriptor or AT_FDCWD).
    static func place(_ directory: Int32, _ pointer: UnsafePointer<CChar>) -> String? {
        guard armed else { return nil }
        let path = String(cString: pointer)
        if path.hasPrefix("/") { return path }
        if directory == AT_FDCWD {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            guard getcwd(&buffer, buffer.count) != nil else { return nil }
            return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
                + "/" + path
        }
        return place(directory).map { path.isEmpty ? $0 : $0 + "/" + path }
    }
}
