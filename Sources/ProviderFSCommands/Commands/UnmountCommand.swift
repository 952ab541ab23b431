// `providerfs unmount MOUNTPOINT [--lazy] [--timeout DURATION]`: unmounts, then waits for the
// daemon to finish and exit. Also cleans a stale mount left by a crashed daemon.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct UnmountCommand: CLICommand {
    static let name = "unmount"
    static let summary = "unmount a ProviderFS mount and wait for its daemon to exit"
    static let usage = "providerfs unmount MOUNTPOINT [--lazy] [--timeout DURATION]"

    struct Output: Encodable {
        var mountpoint: String
        var result: String
    }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let lazy = try arguments.flag("--lazy")
        let timeout = try arguments.duration("--timeout") ?? .seconds(30)
        let mountpoint = mountPointPath(try arguments.requiredPositional("MOUNTPOINT"))
        try arguments.finish()

        let record = MountRegistry.record(for: mountpoint)
        let daemonAlive = record?.daemonIsAlive ?? false
        let entry = MountTable.entry(at: mountpoint)

        func report(_ result: String, _ sentence: String) -> Int32 {
            if io.json { io.emit(Output(mountpoint: mountpoint, result: result)) } else { io.line(sentence) }
            return ExitStatus.success
        }

        guard let entry else {
            if record != nil && !daemonAlive {
                MountRegistry.remove(mountpoint: mountpoint)
                return report("cleaned", "\(mountpoint) was not mounted; removed the record its crashed daemon left.")
            }
            throw CommandFailure("\(mountpoint) is not mounted")
        }
        guard entry.fileSystemType == "fuse.providerfs" else {
            throw CommandFailure("\(mountpoint) is not a ProviderFS mount (it is \(entry.fileSystemType))")
        }

        let stale = inspectMountPoint(mountpoint) == .stale || (record != nil && !daemonAlive)
        if stale {
            let result = runHelper(fusermountPath, ["-uz", mountpoint])
            guard result.status == 0 else {
                throw CommandFailure("cannot clean the stale mount \(mountpoint): \(result.error)")
            }
            MountRegistry.remove(mountpoint: mountpoint)
            return report("cleaned-stale", "Cleaned up the stale mount at \(mountpoint) (its daemon was gone).")
        }

        let result = runHelper(fusermountPath, lazy ? ["-uz", mountpoint] : ["-u", mountpoint])
        guard result.status == 0 else {
            if result.error.contains("busy") {
                throw CommandFailure(
                    "\(mountpoint) is busy: a process still has a file or directory open there "
                        + "(see 'fuser -vm \(mountpoint)'); close it and retry, or use --lazy")
            }
            throw CommandFailure("cannot unmount \(mountpoint): \(result.error)")
        }
        if let record, daemonAlive {
            let deadline = ContinuousClock.now + timeout
            while record.daemonIsAlive {
                guard ContinuousClock.now < deadline else {
                    throw CommandFailure(
                        "\(mountpoint) is unmounted but its daemon (pid \(record.pid)) did not exit within "
                            + "\(timeout.humanReadable); see \(record.logFile)")
                }
                usleep(20_000)
            }
        }
        MountRegistry.remove(mountpoint: mountpoint)
        return report("unmounted", "Unmounted \(mountpoint).")
    }
}
