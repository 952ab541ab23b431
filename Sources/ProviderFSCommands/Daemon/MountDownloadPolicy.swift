// Processes that must not download (issue 27, D-433): the VirtualFileSystem's `DownloadPolicy`
// port over /proc. A caller is named by the file its process runs (the basename of
// /proc/<tid>/exe, which only an exec changes) or by its process's command name (the kernel's
// `comm`, which a process may set for itself: matching it can only keep a process from
// downloading, never let one through). Asked only by opens of files not all here.

import SystemSupport
package import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `DownloadPolicy` refusing the processes named in `names`.
package struct MountDownloadPolicy: DownloadPolicy {
    /// Indexers and thumbnailers of GNOME, KDE and the locate databases: they open every file
    /// they find, and would download a whole provider.
    package static let defaultNames: [String] = [
        "tracker-miner-fs-3", "tracker-extract-3", "tracker-miner-fs", "tracker-extract", "localsearch-3",
        "localsearch-extractor-3", "baloo_file", "baloo_file_extractor", "updatedb", "updatedb.plocate",
        "updatedb.mlocate", "plocate-build", "gnome-desktop-thumbnailer", "totem-video-thumbnailer",
        "evince-thumbnailer", "ffmpegthumbnailer", "gdk-pixbuf-thumbnailer", "gst-discoverer-1.0", "tumblerd",
    ]

    /// What tells callers apart (tests substitute fakes for /proc).
    package struct ProcessFacts: Sendable {
        /// The file name a thread's process runs; nil when it cannot be read.
        var executableName: @Sendable (Int32) -> String?
        /// The process (thread group) of a thread and its command name.
        var process: @Sendable (Int32) -> (pid: Int32, name: String)?

        package init(
            executableName: @escaping @Sendable (Int32) -> String?,
            process: @escaping @Sendable (Int32) -> (pid: Int32, name: String)?
        ) {
            self.executableName = executableName
            self.process = process
        }

        package static let system = ProcessFacts(
            executableName: { tid in
                var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
                let length = readlink("/proc/\(tid)/exe", &buffer, buffer.count - 1)
                guard length > 0 else { return nil }
                var path = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
                return path.split(separator: "/").last.map(String.init)
            },
            process: { tid in
                guard let pid = ProcessInfoFiles.threadGroup(ofThread: tid),
                    let identity = ProcessInfoFiles.identity(of: pid)
                else { return nil }
                return (pid, identity.name)
            })
    }

    /// Executable names refused.
    package let names: Set<String>
    /// The same, as `comm` holds them (at most 15 bytes).
    let commandNames: Set<String>
    let facts: ProcessFacts

    /// The defaults plus `refused`, less `allowed`.
    package init(refused: [String] = [], allowed: [String] = [], facts: ProcessFacts = .system) {
        names = Set(Self.defaultNames + refused).subtracting(allowed)
        // `comm` keeps 15 bytes, so two names can share one (tracker-miner-fs and -fs-3): a name
        // let through lets its 15 bytes through.
        func command(_ name: String) -> String { String(decoding: name.utf8.prefix(15), as: UTF8.self) }
        commandNames = Set(names.map(command)).subtracting(allowed.map(command))
        self.facts = facts
    }

    package func refusal(_ context: RequestContext) -> String? {
        let executable = facts.executableName(context.threadID)
        let process = facts.process(context.threadID)
        let matched: String
        if let executable, names.contains(executable) {
            matched = executable
        } else if let name = process?.name, commandNames.contains(name) {
            matched = name
        } else {
            return nil
        }
        return "\(matched) (pid \(process?.pid ?? context.threadID)) is a process that must not download"
    }
}
