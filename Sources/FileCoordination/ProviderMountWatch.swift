// Which `fuse.providerfs` mounts exist, re-read only when the kernel says the mount table changed.

package import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The `fuse.providerfs` mounts of this process's mount namespace, re-read only when the kernel
/// says the table changed (poll on /proc/self/mountinfo reports POLLPRI/POLLERR).
final class ProviderMountWatch: @unchecked Sendable {
    // Safe: `fd` is immutable; `table` is a Locked.
    private let fd: Int32
    /// The ProviderFS mount points as last read (nil: never read or dropped), and a counter
    /// bumped whenever they are re-read or dropped.
    private let table = Locked<(points: [String]?, generation: UInt64)>((nil, 0))

    init() {
        fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
    }

    deinit { if fd >= 0 { close(fd) } }

    /// The deepest ProviderFS mount point containing `path`, if any. The poll and the reload
    /// happen under the lock: a change one thread's poll consumed is never missed by another.
    func providerMount(containing path: String) -> String? {
        guard fd >= 0 else { return nil }
        let points = table.withLock { table -> [String] in
            if let points = table.points, !Self.changed(pollfd(fd: fd, events: Int16(POLLPRI), revents: 0)) {
                return points
            }
            let points = reload()
            table.points = points
            table.generation &+= 1
            return points
        }
        return Self.deepest(containing: path, in: points)
    }

    /// The routing by the table as last read, without checking it for changes: nil when the
    /// table was never read, else the mount (nil: none contains `path`) and the table's
    /// generation. Only valid together with a later `pollChanges` that reports no change.
    func knownProviderMount(containing path: String) -> (mount: String?, generation: UInt64)? {
        guard fd >= 0,
            let (points, generation) = table.withLock({ table in table.points.map { ($0, table.generation) } })
        else { return nil }
        return (Self.deepest(containing: path, in: points), generation)
    }

    /// One poll: whether the mount table changed since `generation` was current (a change seen
    /// here drops the table: the next `providerMount` reads it again), and whether the peer of
    /// the socket `linkFD` hung up.
    func pollChanges(since generation: UInt64, alongWith linkFD: Int32) -> (tableChanged: Bool, hungUp: Bool) {
        table.withLock { table in
            var fds = (
                pollfd(fd: fd, events: Int16(POLLPRI), revents: 0),
                pollfd(fd: linkFD, events: Int16(POLLIN), revents: 0)
            )
            let ready = withUnsafeMutablePointer(to: &fds) {
                $0.withMemoryRebound(to: pollfd.self, capacity: 2) { poll($0, 2, 0) }
            }
            if ready > 0 && fds.0.revents & Int16(POLLPRI | POLLERR) != 0 {
                table.points = nil
                table.generation &+= 1
            }
            let hungUp = ready > 0 && fds.1.revents & Int16(POLLHUP | POLLERR) != 0
            return (table.generation != generation, hungUp)
        }
    }

    private static func changed(_ descriptor: pollfd) -> Bool {
        var pfd = descriptor
        return poll(&pfd, 1, 0) > 0 && pfd.revents & Int16(POLLPRI | POLLERR) != 0
    }

    private static func deepest(containing path: String, in points: [String]) -> String? {
        var best: String?
        for point in points where path == point || Arbiter.isAncestor(point, of: path) {
            if best == nil || point.utf8.count > best!.utf8.count { best = point }
        }
        return best
    }

    private func reload() -> [String] {
        CoordinationServer.providerMountPoints(in: MountTable.load(from: fd) ?? [])
    }
}

extension CoordinationServer {
    /// The file-system type of a ProviderFS mount in mountinfo.
    package static let providerFileSystemType = "fuse.providerfs"

    /// The mount points of `fuse.providerfs` file systems among `mounts` (as parsed by
    /// `MountTable`): paths under them are routed to that mount's embedded server.
    package static func providerMountPoints(in mounts: [MountInfoEntry]) -> [String] {
        mounts.filter { $0.fileSystemType == providerFileSystemType }.map(\.mountPoint)
    }
}
