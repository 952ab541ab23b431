// The poll of remote changes (issue 26, D-450): a provider that does not push its changes (a
// WebDAV server) is asked again, every `--poll-interval`, for the listing of every directory the
// mount listed this session (Catalog.pollListedDirectories: one PROPFIND Depth 1 each). What
// changed is applied as any provider answer: kernel caches told, ESTALE for open readers of a
// changed version, presenters told.

import Diagnostics
import ProviderCache

/// The mount's poll loop; `stop` cancels it and waits for it.
final class MountPolling: Sendable {
    private let task: Task<Void, Never>

    /// Polls `catalog` every `interval` (> 0): listings at least half an interval old are listed
    /// again, so a change is seen within about one interval (plus the listing's time).
    init(catalog: Catalog, interval: Duration, logger: Logger) {
        task = Task {
            logger.info("polling the provider for remote changes every \(interval)")
            while !Task.isCancelled {
                do { try await Task.sleep(for: interval) } catch { return }
                await catalog.pollListedDirectories(olderThan: interval / 2)
            }
        }
    }

    func stop() async {
        task.cancel()
        await task.value
    }

    /// The default interval: a WebDAV server is polled every minute; a local directory tells its
    /// changes itself (inotify) and is not polled.
    static func defaultInterval(remote: Bool) -> Duration { remote ? .seconds(60) : .zero }
}
