// The port through which processes that must not download are kept from downloading (issue 27,
// D-433): indexers and thumbnailers that open every file they find. An open for reading of a file
// whose content is not all here asks the policy; a caller it names gets EDEADLK (Apple's answer
// to its non-materializing processes) and nothing is fetched, while stat, listings and opens of
// files already downloaded work as for anyone. The file system knows no processes: the daemon
// hands in an adapter (ProviderFSCommands/Daemon/MountDownloadPolicy.swift: the caller's
// executable and command name); tests hand in a fake. Nil (`FileSystemOptions.downloads`): every
// caller may download.

import ProviderCache
import ProviderModel

/// Decides whether a request's caller may start a download. Synchronous and short: asked only by
/// opens of files not all here, by the fast open on the FUSE thread too (D-523).
public protocol DownloadPolicy: Sendable {
    /// Nil: the caller may download; else who it is and why not, in a sentence's fragment
    /// ("tracker-miner-fs-3 (pid 812) is a process that must not download").
    func refusal(_ context: RequestContext) -> String?
}

extension ProviderFileSystem {
    /// EDEADLK when `item` is not all here and the policy refuses the caller; nil otherwise.
    func downloadRefusal(
        _ item: ProviderItem, path: String, context: RequestContext
    ) -> FileSystemError? {
        guard let policy = options.downloads, !cache.hasAllContent(of: item), let who = policy.refusal(context) else {
            return nil
        }
        return FileSystemError(
            .materializationRefused, "\(path) is not downloaded, and \(who) (mount --no-download-for)")
    }
}
