/// Tunables of the cache. Defaults are what `providerfs mount` uses; tests shrink them.
public struct CacheOptions: Sendable {
    /// Largest chunk asked of a provider stream at once (and written with one pwrite).
    public var chunkSize: Int = 1 << 20
    /// Most bytes one direct-transfer call moves (in steps of `chunkSize`, each delivered to
    /// readers as it lands) before control comes back to the download loop.
    public var directBatchSize: Int = 64 << 20
    /// Smallest chunk for the first bytes a waiting reader needs: small, so that time to first
    /// byte depends on the read size, not on the file size or `chunkSize`.
    public var firstChunkSize: Int = 128 << 10
    /// A waiting reader whose first missing byte lies within this distance after the current
    /// stream position is served by letting the stream run on; farther away, the stream is
    /// restarted at the reader's offset (reader first, then the rest).
    public var readAheadWindow: Int64 = 8 << 20
    /// After the bytes readers asked for, fetch the rest of the file in the background. False is
    /// "ranges only": fetch what readers need plus `readAheadWindow` after their last request.
    public var backgroundCompletion: Bool = true
    /// A fetch that delivers no byte for this long fails with `.timedOut` (ETIMEDOUT), at once.
    public var stallTimeout: Duration = .seconds(30)
    /// Attempts in a row without progress before a download gives up with `.downloadFailed`
    /// (an attempt that delivered bytes resets the count).
    public var maximumAttempts: Int = 3
    /// Pause between attempts.
    public var retryDelay: Duration = .milliseconds(200)
    /// A download saves its range map (fdatasync, then SQLite) once this many bytes are unsynced,
    /// or once `persistPeriod` has passed since its last save with any byte unsynced, whichever
    /// comes first; and when it ends. The save runs beside the download, which does not wait for
    /// it. So a kill -9 loses at most about `persistPeriod` of download progress and at most
    /// about `persistInterval` bytes (they are fetched again), and a short download is never
    /// slowed by a sync (issue 11: at most the last second and 256 MiB, D-277).
    public var persistInterval: Int64 = 256 << 20
    public var persistPeriod: Duration = .seconds(1)
    /// A download's final range-map save (fdatasync + SQLite) is batched with others this long
    /// after it ends (flushed at shutdown in any case).
    public var persistDelay: Duration = .seconds(1)
    /// How long a directory listing is trusted before the provider is asked again.
    public var directoryTTL: Duration = .seconds(5)
    /// A listing that answers a lookup when it is older than this is listed again (or, with a
    /// provider that tracks changes, revalidated: D-224) in the background, one refresh per
    /// directory at a time, so a directory in use is refreshed before its `directoryTTL` runs out
    /// instead of making a lookup wait for the listing. nil: never.
    public var listingRefreshAhead: Duration? = .milliseconds(2500)
    /// A provider that tracks changes (`.listingChangeTracking`; a local directory on a local file
    /// system) lets an expired listing be revalidated without listing again while nothing changed;
    /// a listing is taken anew at least this often anyway, so what the tracking cannot see (writes
    /// through mmap, changes through a hard link elsewhere) shows up within this time.
    public var fullListingInterval: Duration = .seconds(60)
    /// How long an item's metadata is trusted by getattr before the provider is asked again.
    public var attributeTTL: Duration = .seconds(1)
    /// A lookup of a name missing from a listing re-lists the directory if the listing is older
    /// than this (so a file created on the provider shows up at once, without a lookup storm).
    public var missRefreshInterval: Duration = .milliseconds(500)

    /// The first wait before an upload that failed is tried again; it doubles per failure, up to
    /// `maximumUploadRetryDelay` (issue 14, write-back).
    public var uploadRetryDelay: Duration = .seconds(1)
    public var maximumUploadRetryDelay: Duration = .seconds(300)
    /// The write-back settle (D-405): a publish's upload starts this long after it, so that the
    /// next publish of a file still being written (a database's next commit) replaces it, and a
    /// file deleted meanwhile (a journal) never reaches the provider; never later than
    /// `maximumUploadSettle` after the oldest publish waiting. Zero: at once. `providerfs mount`
    /// sets 500 ms and 5 s.
    public var uploadSettle: Duration = .zero
    public var maximumUploadSettle: Duration = .seconds(5)
    /// How long the end of the cache (an unmount) waits for uploads it starts or finds running;
    /// what is left stays queued for the next start. Zero: no wait.
    public var shutdownFlush: Duration = .zero
    /// Space on the cache's file system that writes into staging copies leave free: a write,
    /// fallocate or copy that needs new blocks and would leave less fails with ENOSPC (D-390), so
    /// that what was written before it can still be published (the metadata store's rows, a
    /// copy-back) and queued rows and deletes still reach the store.
    public var reservedSpace: Int64 = 8 << 20
    /// Limits on the stored content (issue 27, `mount --cache-max-size`, `--cache-min-free`,
    /// `--cache-max-age`): content that is clean, closed and not downloading is evicted, least
    /// recently used first, so that the content stays within `maximumSize` bytes, the cache's
    /// file system keeps `minimumFree` bytes free, and nothing unused for `maximumAge` stays.
    /// Checked as downloads store bytes (every `limitCheckBytes`), and every `limitCheckPeriod`.
    /// nil: no such limit.
    public var maximumSize: Int64? = nil
    public var minimumFree: Int64? = nil
    public var maximumAge: Duration? = nil
    public var limitCheckPeriod: Duration = .seconds(10)
    /// Pinned items (D-445) are looked at again this often (listed, files not complete queued),
    /// for providers that push no changes; nil: only when pinned, at the start and on pushed
    /// changes.
    public var pinnedRefreshPeriod: Duration? = .seconds(60)
    /// Bytes stored by downloads between two checks of the limits: a sixteenth of the size
    /// limit, at most 8 MiB (a check sums the stored content, O(items with content)).
    var limitCheckBytes: Int64 { min(8 << 20, max(64 << 10, (maximumSize ?? (128 << 20)) / 16)) }
    var hasLimits: Bool { maximumSize != nil || minimumFree != nil || maximumAge != nil }
    public init() {}
}
