// `providerfs status [PATH] [--json]`: for a mount point, the mount as its daemon reports it
// through the control socket (transfers with progress, items in error, cache space, uptime,
// provider reachability); for a PATH inside a mount, the item's state read from its xattrs (what
// getfattr shows); without PATH, the mounts this user runs (pid, source, cache, log).

import FUSEAdapter
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct StatusCommand: CLICommand {
    static let name = "status"
    static let summary = "show an item's state, progress, version and last error, or list the mounts"
    static let usage = "providerfs status [MOUNTPOINT | PATH] [--json]"

    static let attributes = ["state", "progress", "version", "error", "pin", "policy"]

    struct ItemStatus: Encodable {
        var path: String
        var state: String?
        var progress: String?
        var version: String?
        var error: String?
        /// The item's own pin state and its effective policy (D-445).
        var pin: String?
        var policy: String?
    }

    struct MountStatus: Encodable {
        var mountpoint: String
        var state: String
        var pid: Int32
        var source: String
        var demo: Bool
        var cacheDirectory: String
        var logFile: String
        var version: String
        var startedAt: Date
        var requireToken: Bool
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let path = arguments.positional()
        try arguments.finish()
        if let path {
            // The mount point is recognized from the mount table, without a stat of it (which a
            // dead daemon's mount fails with ENOTCONN, and another user's with EACCES).
            if MountTable.entry(at: mountPointPath(path))?.fileSystemType == "fuse.providerfs" {
                return try await mount(path, io: io)
            }
            return try item(path, io: io)
        }
        return mounts(io: io)
    }

    /// A running mount, through its control socket.
    static func mount(_ path: String, io: CommandIO) async throws -> Int32 {
        let (client, _) = try ControlClient.forMount(containing: path)
        let status = try await client.status()
        if io.json {
            io.emit(status)
            return ExitStatus.success
        }
        io.line("\(status.mountpoint)  [running]")
        io.line("  source:   \(status.source)")
        io.line("  pid:      \(status.pid)")
        io.line(
            "  access:   "
                + (status.requireToken == true
                    ? "require-token (plain paths only for this user's providerfs commands; apps use access paths)"
                    : "plain paths open"))
        io.line("  uptime:   \(formatUptime(status.uptimeSeconds))")
        if let across = status.acrossMachines { io.line("  machines: \(across)") }
        let provider = status.provider
        io.line(
            "  provider: "
                + (provider.reachable
                    ? "reachable (answered in \(Int(provider.responseMilliseconds.rounded())) ms)"
                    : "unreachable\(provider.offlineSince.map { " (offline since \($0))" } ?? ""): "
                        + (provider.error.map { "\($0.errno): \($0.message)" } ?? "no answer")))
        io.line(
            "  cache:    \(formatSize(status.cache.usedBytes)) used, \(formatSize(status.cache.freeBytes)) free "
                + "(\(status.cache.directory))")
        if let limits = status.cache.limits {
            let set = [
                limits.maximumSize.map { "max size \(formatSize($0))" },
                limits.minimumFree.map { "min free \(formatSize($0))" },
                limits.maximumAgeSeconds.map { "max age \(Int($0))s" },
            ].compactMap { $0 }
            io.line(
                "  limits:   \(set.joined(separator: ", ")); \(formatSize(limits.storedBytes)) stored; "
                    + "\(limits.evictions) evicted (\(formatSize(limits.evictedBytes)))")
            if let reason = limits.blockedReason { io.line("            new downloads refused (ENOSPC): \(reason)") }
        }
        if let pins = status.cache.pins {
            io.line(
                "  pins:     \(pins.pinnedItems) pinned, \(pins.unpinnedItems) unpinned; "
                    + "\(pins.downloadedFiles) of \(pins.files) pinned files downloaded "
                    + "(\(formatSize(pins.presentBytes)) of \(formatSize(pins.totalBytes))); "
                    + "\(pins.downloading) downloading, \(pins.queued) queued, \(pins.failed.count) failed")
            for item in pins.failed { io.line("            \(item.path)  \(item.error?.text ?? "failed")") }
        }
        io.line("  transfers:" + (status.transfers.isEmpty ? " none" : ""))
        for item in status.transfers {
            let percent = item.totalBytes > 0 ? Int(Double(item.presentBytes) / Double(item.totalBytes) * 100) : 100
            io.line(
                "    \(item.path)  \(item.state)  \(formatSize(item.presentBytes)) of \(formatSize(item.totalBytes)) "
                    + "(\(percent)%)")
        }
        io.line("  errors:" + (status.errors.isEmpty ? " none" : ""))
        for item in status.errors {
            io.line("    \(item.path)  \(item.error?.text ?? "failed")")
        }
        return ExitStatus.success
    }

    static func item(_ path: String, io: CommandIO) throws -> Int32 {
        var info = stat()
        if stat(path, &info) != 0 {
            if Errno.current == .notConnected {
                throw CommandFailure(staleMountAdvice(staleMountPoint(containing: path)))
            }
            throw CommandFailure("\(path): \(Errno.current.message)")
        }
        guard MountTable.containing(path)?.fileSystemType == "fuse.providerfs" else {
            throw CommandFailure("\(path) is not inside a ProviderFS mount")
        }
        var status = ItemStatus(path: path)
        for name in attributes {
            switch ExtendedAttributes.value("user.providerfs." + name, of: path) {
            case .success(let bytes):
                let value = String(decoding: bytes, as: UTF8.self)
                switch name {
                case "state": status.state = value
                case "progress": status.progress = value
                case "version": status.version = value
                case "pin": status.pin = value
                case "policy": status.policy = value
                default: status.error = value.isEmpty ? nil : value
                }
            case .failure(let error) where error == .noData || error == .notSupported:
                continue
            case .failure(let error):
                throw CommandFailure("\(path): cannot read user.providerfs.\(name): \(error.message)")
            }
        }
        if io.json {
            io.emit(status)
        } else {
            io.line(path)
            io.line("  state:    \(status.state ?? "-")")
            io.line("  progress: \(status.progress ?? "-")")
            io.line("  version:  \(status.version ?? "-")")
            io.line("  error:    \(status.error ?? "-")")
            if let pin = status.pin { io.line("  pin:      \(pin) (policy: \(status.policy ?? "-"))") }
        }
        return ExitStatus.success
    }

    /// "2h 5m 3s", "4m 0s", "12s".
    static func formatUptime(_ seconds: Double) -> String {
        let total = max(0, Int(seconds))
        let (hours, minutes, rest) = (total / 3600, total % 3600 / 60, total % 60)
        if hours > 0 { return "\(hours)h \(minutes)m \(rest)s" }
        if minutes > 0 { return "\(minutes)m \(rest)s" }
        return "\(rest)s"
    }

    static func mounts(io: CommandIO) -> Int32 {
        let records = MountRegistry.all()
        let statuses = records.map { record in
            let alive = record.daemonIsAlive
            let mounted = MountTable.entry(at: record.mountpoint) != nil
            let state = alive && mounted ? "running" : (mounted ? "stale" : "gone")
            return MountStatus(
                mountpoint: record.mountpoint, state: state, pid: record.pid, source: record.source, demo: record.demo,
                cacheDirectory: record.cacheDirectory, logFile: record.logFile, version: record.version,
                startedAt: record.startedAt, requireToken: record.requireToken ?? false)
        }
        if io.json {
            io.emit(statuses)
            return ExitStatus.success
        }
        if statuses.isEmpty {
            io.line("No ProviderFS mounts. Start one with 'providerfs mount --demo ~/ProviderFS-demo'.")
            return ExitStatus.success
        }
        for status in statuses {
            io.line("\(status.mountpoint)  [\(status.state)]")
            io.line("  pid:    \(status.pid)")
            io.line("  source: \(status.demo ? "demo (\(status.source))" : status.source)")
            io.line("  cache:  \(status.cacheDirectory)")
            io.line("  log:    \(status.logFile)")
            if status.requireToken { io.line("  access: require-token") }
            if status.state != "running" {
                io.line("  the daemon is gone; clean up with 'providerfs unmount \(status.mountpoint)'")
            }
        }
        return ExitStatus.success
    }
}
