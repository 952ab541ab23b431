// A cache of path resolutions (canonical path, identity, package root), kept exact by inotify:
// every directory a cached resolution depends on is watched, and one poll per look-up says
// whether anything changed. Saves the realpath, lstat and package-marker system calls of a claim
// on an unchanged path (decision D-111).

import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Resolutions of canonical paths on local file systems, valid as long as no watched directory
/// changed. What a resolution of `/a/b/f` depends on: the entries `a` in `/`, `b` in `/a`, `f` in
/// `/a/b` (symlinks, renames, replacement), package markers in `/`, `/a`, `/a/b` (and in `f` when
/// it is a directory), and the mounts. So `/`, `/a`, `/a/b` (and `f` if a directory) are watched
/// for entry changes, and /proc/self/mountinfo for mount changes. inotify reports an event before
/// the system call that caused it returns, so a change that happened before a look-up is always
/// seen by it. Only file systems whose every change passes through this kernel are cached
/// (inotify does not see changes made by another machine or a FUSE server's back end).
package final class ResolutionCache: @unchecked Sendable {
    // Safe: all mutable state is in `state` (a Locked).
    private struct State {
        var notifyFD: Int32 = -1
        var mountFD: Int32 = -1
        /// The mount table (mount points with their file-system type, deepest last); nil until read.
        var mounts: [MountInfoEntry]?
        var watchPaths: [Int32: String] = [:]
        var watches: [String: Int32] = [:]
        var entries: [String: ResolvedItem] = [:]
        /// Bumped whenever an event arrives: a resolution computed across an event is not stored.
        var generation: UInt64 = 0
    }

    /// The process-wide cache used by `ItemResolver.resolve`.
    static let shared = ResolutionCache()

    /// More entries than this and the cache starts over (bounds memory and inotify watches).
    static let capacity = 2048

    // inotify constants (the Glibc module imports some of them as enums, so spelled out here).
    /// IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF.
    private static let entryEvents: UInt32 = 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
    private static let onlyDirectoryNoFollow: UInt32 = 0x0100_0000 | 0x0200_0000
    private static let isDirectoryFlag: UInt32 = 0x4000_0000
    private static let queueOverflow: UInt32 = 0x4000
    private static let unmounted: UInt32 = 0x2000
    private static let ignored: UInt32 = 0x8000

    private let state = Locked(State())

    /// An empty cache with its own inotify instance and mount-table descriptor.
    package init() {
        let fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
        state.withLock { $0.mountFD = fd }
    }

    deinit {
        state.withLock { state in
            if state.notifyFD >= 0 { close(state.notifyFD) }
            if state.mountFD >= 0 { close(state.mountFD) }
        }
    }

    /// The cached resolution of the canonical `path`, after checking (one poll) that nothing
    /// it depends on changed.
    package func lookup(_ path: String) -> ResolvedItem? {
        state.withLock { state in
            Self.validate(&state)
            return state.entries[path]
        }
    }

    /// Resolves `path` (lexically normalised, last symlink not followed) with `compute`, caching
    /// the result when `path` is canonical and on a local file system.
    func resolve(_ path: String, compute: (String) -> ResolvedItem) -> ResolvedItem {
        if let hit = lookup(path) { return hit }
        // Watch before computing, so a change made while computing is reported afterwards.
        guard let generation = prepare(path) else { return compute(path) }
        let item = compute(path)
        guard item.path == path else { return item }  // a symlink in the parent: not cached
        state.withLock { state in
            Self.validate(&state)
            guard state.generation == generation, state.notifyFD >= 0 else { return }
            if item.isDirectory && state.watches[path] == nil { return }  // became a directory meanwhile
            if state.entries.count >= Self.capacity { Self.reset(&state) } else { state.entries[path] = item }
        }
        return item
    }

    /// Watches every directory `path` depends on; nil when it cannot be cached.
    private func prepare(_ path: String) -> UInt64? {
        state.withLock { state -> UInt64? in
            Self.validate(&state)
            guard path != "/", Self.isLocal(path, mounts: &state) else { return nil }
            if state.notifyFD < 0 {
                state.notifyFD = inotify_init1(Int32(O_NONBLOCK | O_CLOEXEC))
                guard state.notifyFD >= 0 else { return nil }
            }
            // The ancestors must be real directories (IN_ONLYDIR | IN_DONT_FOLLOW fails on a symlink).
            var directories = ["/"]
            var prefix = ""
            let components = path.utf8.split(separator: UInt8(ascii: "/"))
            for component in components.dropLast() {
                prefix += "/" + String(decoding: component, as: UTF8.self)
                directories.append(prefix)
            }
            for directory in directories where state.watches[directory] == nil {
                guard Self.watch(directory, in: &state) else { return nil }
            }
            // The item itself when it is a directory (its own package marker); failing is fine.
            if state.watches[path] == nil { _ = Self.watch(path, in: &state) }
            return state.generation
        }
    }

    private static func watch(_ directory: String, in state: inout State) -> Bool {
        let wd = inotify_add_watch(state.notifyFD, directory, entryEvents | onlyDirectoryNoFollow)
        guard wd >= 0 else { return false }
        // The same directory under another path (a bind mount): events could name only one of
        // the paths, so neither is trusted for this one.
        if let other = state.watchPaths[wd], other != directory { return false }
        state.watchPaths[wd] = directory
        state.watches[directory] = wd
        return true
    }

    /// Whether every mount `path` passes through is a local file system.
    private static func isLocal(_ path: String, mounts: inout State) -> Bool {
        if mounts.mounts == nil { mounts.mounts = MountTable.load(from: mounts.mountFD) }
        guard let table = mounts.mounts, !table.isEmpty else { return false }
        for entry in table where entry.mountPoint == path || Arbiter.isAncestor(entry.mountPoint, of: path) {
            if !MountTable.localFileSystemTypes.contains(entry.fileSystemType) { return false }
        }
        return true
    }

    /// One poll: mount changes and inotify events; drops what they invalidate.
    private static func validate(_ state: inout State) {
        var fds = (
            pollfd(fd: state.mountFD, events: Int16(POLLPRI), revents: 0),
            pollfd(fd: state.notifyFD, events: Int16(POLLIN), revents: 0)
        )
        let count: nfds_t = state.notifyFD >= 0 ? 2 : 1
        let ready = withUnsafeMutablePointer(to: &fds) {
            $0.withMemoryRebound(to: pollfd.self, capacity: 2) { poll($0, count, 0) }
        }
        guard ready > 0 else { return }
        if fds.0.revents & Int16(POLLPRI | POLLERR) != 0 {
            state.mounts = nil
            reset(&state)
            return
        }
        if fds.1.revents != 0 { drainEvents(&state) }
    }

    private static func drainEvents(_ state: inout State) {
        readInotifyEvents(state.notifyFD) { events -> Bool in
            state.generation &+= 1
            for event in events {
                let (wd, mask, name) = (event.watch, event.mask, event.name)
                if mask & queueOverflow != 0 || mask & unmounted != 0 {
                    reset(&state)  // closes the descriptor: stop reading it
                    return false
                }
                guard let directory = state.watchPaths[wd] else { continue }  // a watch already dropped
                if mask & ignored != 0 {
                    state.watchPaths[wd] = nil
                    if state.watches[directory] == wd { state.watches[directory] = nil }
                    forget(subtree: directory, in: &state)
                } else if name.isEmpty {
                    // The directory itself changed (attributes, deleted, moved): everything at
                    // or below it, its own watch included (a moved directory takes it along).
                    forget(subtree: directory, in: &state, includingItsWatch: true)
                } else if name == filePackageMarkerName {
                    forget(subtree: directory, in: &state)  // a package marker came or went
                } else {
                    let child = directory == "/" ? "/" + name : directory + "/" + name
                    if mask & isDirectoryFlag != 0 {
                        // A renamed directory takes its subtree (and the watches in it) along.
                        forget(subtree: child, in: &state, includingItsWatch: true)
                    } else {
                        state.entries[child] = nil
                    }
                }
            }
            return true
        }
    }

    /// Drops the entries and watches at or below `directory` (their paths may mean other items now).
    private static func forget(subtree directory: String, in state: inout State, includingItsWatch: Bool = false) {
        let prefix = directory == "/" ? "/" : directory + "/"
        func inside(_ path: String) -> Bool { path == directory || path.hasPrefix(prefix) }
        state.entries = state.entries.filter { !inside($0.key) }
        for (path, wd) in state.watches where inside(path) && (includingItsWatch || path != directory) {
            inotify_rm_watch(state.notifyFD, wd)
            state.watches[path] = nil
            state.watchPaths[wd] = nil
        }
    }

    /// Forgets everything; closing the inotify descriptor removes every watch at once.
    private static func reset(_ state: inout State) {
        if state.notifyFD >= 0 { close(state.notifyFD) }
        state.notifyFD = -1
        state.watchPaths.removeAll()
        state.watches.removeAll()
        state.entries.removeAll()
        state.generation &+= 1
    }
}
