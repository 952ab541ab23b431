// The download rules of one content entry as a pure state machine (the way FileCoordination's
// `Arbiter` holds the claim rules): events in, actions out, no I/O, no locks, no tasks, and the
// clock passed in as a value. `ContentEntry` is its host: it keeps the machine under its lock,
// holds the readers' continuations by waiter id, and carries out the actions with the lock
// dropped (resuming readers, starting or cancelling the download task, saving the range map).
//
// Events: a read requested for a range (`beginRead`, then `register` once its continuation
// exists), a reader cancelled (`cancel`), a background download requested, the version retired
// (superseded, deleted, shut down), the download loop asking what to fetch (`nextFetch`), a fetch
// started, bytes delivered (written to the file; for a checksummed stream, verified), a fetch
// ended (completed — checked against the range it started with —, retargeted, failed — a stall
// is a failure with `.timedOut`, a checksum mismatch one with `.corrupt`), the loop asking
// whether it may end (`finishUnlessNeeded`), and a range-map save taken, saved or failed.
// Actions: start the download, cancel it, complete a waiter (with success or an error), start a
// range-map save beside the download; the loop's own questions answer with a range to fetch, a
// chunk length, "save first" (`mustSave`), "retarget", "retry after the delay" or "fail".

/// What the host must do after an event, in order, with its lock dropped.
enum DownloadAction: Equatable, Sendable {
    /// Start the download task (none runs).
    case startDownload
    /// Cancel the running download task.
    case cancelDownload
    /// Resume the reader `waiter`: its bytes are present (`error` nil), or it fails with `error`.
    /// Each waiter is completed exactly once.
    case complete(waiter: UInt64, error: CacheError?)
    /// Save the range map beside the download, then report `backgroundPersistEnded`.
    case persistBeside
}

/// The download state of one (item, content version): which bytes are present, who waits for
/// which, whether a download runs, what failed, what is saved.
struct DownloadMachine: Sendable {
    let size: Int64
    let options: CacheOptions
    /// For error messages only.
    let identifier: String

    /// Ranges whose bytes are in the file.
    private(set) var present: ByteRanges
    /// Readers waiting for a range, oldest first.
    private(set) var waiters: [(id: UInt64, range: Range<Int64>)] = []
    /// Waiters cancelled before their continuation was registered.
    private var cancelledWaiters: Set<UInt64> = []
    private var nextWaiterID: UInt64 = 1
    /// Bytes are being fetched (what `progress` and the `downloading` state show).
    private(set) var downloading = false
    /// The download task exists (fetching, or saving the range map before it ends).
    private(set) var loopRunning = false
    /// Where the current (or last) stream is.
    private(set) var position: Int64 = 0
    /// Start and end of the last range a reader asked for (read-ahead in ranges-only mode).
    private(set) var lastRequest: Range<Int64> = 0..<0
    private(set) var lastError: RecordedError?
    /// Set when this version can no longer be fetched (superseded, deleted, shut down):
    /// missing bytes fail with this error at once.
    private(set) var retiredError: CacheError?
    private var unsyncedBytes: Int64 = 0
    /// When (timeline) the last range-map save started; nil before the first in this session.
    private var lastPersistAt: Duration?
    /// A save started beside the download is running (another is not started meanwhile).
    private var backgroundPersist = false
    /// What the store holds (nil: nothing saved in this session).
    private var saved: (ByteRanges, RecordedError?)?
    /// Present bytes the store knows of: loaded at start, then those of the last snapshot saved.
    private var savedCount: Int64
    /// The last save failed (its sync or its write): no save is forced before more is fetched
    /// (`mustSave`) until one succeeds again.
    private var saveFailing = false
    private(set) var pins = 0
    private(set) var fetchCount = 0
    /// Failed fetches in a row without progress (the retry budget).
    private var failuresInARow = 0
    /// A background download was requested while the loop ran and after its last failure: the
    /// loop goes on instead of ending.
    private var restartRequested = false
    /// The range the running fetch set out to bring (nil between fetches): a fetch that ends
    /// "completed" without all of it ended early.
    private(set) var fetchTarget: Range<Int64>?
    /// Superseded by a local publish and kept for its handles until it is here in full
    /// (`detach`, D-494).
    private(set) var detached = false
    /// Whether bytes past the readers' ranges are fetched: background completion, or a detached
    /// version (D-494).
    private var wholeFile: Bool { options.backgroundCompletion || detached }

    init(size: Int64, present: ByteRanges, lastError: RecordedError?, options: CacheOptions, identifier: String) {
        self.size = size
        self.present = present
        self.savedCount = present.count
        self.lastError = lastError
        self.options = options
        self.identifier = identifier
    }

    var isComplete: Bool { present.contains(0..<size) }
    /// No handle pins it and no download runs: it may be closed (its record kept).
    var isIdle: Bool { pins == 0 && !loopRunning }

    mutating func pin() { pins += 1 }
    mutating func unpin() -> Int {
        pins -= 1
        return pins
    }

    // MARK: Readers

    enum ReadStart: Equatable {
        case ready
        case failed(CacheError)
        /// Register a continuation under this waiter id (`register`).
        case wait(UInt64)
    }

    /// A reader needs `range` (clamped to the content).
    mutating func beginRead(_ range: Range<Int64>) -> ReadStart {
        if present.contains(range) { return .ready }
        if let error = retiredError { return .failed(error) }
        nextWaiterID += 1
        return .wait(nextWaiterID)
    }

    /// The reader `id` (from `beginRead`) is ready to be resumed: it waits, or is completed at
    /// once (its bytes came meanwhile, the version was retired, or it was cancelled first).
    mutating func register(_ id: UInt64, range: Range<Int64>) -> [DownloadAction] {
        if cancelledWaiters.remove(id) != nil {
            return [.complete(waiter: id, error: CacheError(.cancelled, "read interrupted"))]
        }
        if present.contains(range) { return [.complete(waiter: id, error: nil)] }
        if let error = retiredError { return [.complete(waiter: id, error: error)] }
        waiters.append((id, range))
        lastRequest = range
        if loopRunning { return [] }
        loopRunning = true
        downloading = true
        return [.startDownload]
    }

    /// The reader `id` was cancelled (its task): completed now if it waits, else when it registers.
    mutating func cancel(_ id: UInt64) -> [DownloadAction] {
        if let index = waiters.firstIndex(where: { $0.id == id }) {
            waiters.remove(at: index)
            return [.complete(waiter: id, error: CacheError(.cancelled, "read interrupted"))]
        }
        cancelledWaiters.insert(id)
        return []
    }

    /// Download without a reader; nothing when complete or retired. While the loop runs, it goes
    /// on: a request that comes while a failed (or finished) download is still saving its range
    /// map makes it go on instead of ending (`finishUnlessNeeded`), and shows as downloading at
    /// once, so `providerfs download` of an item in `error` retries it.
    mutating func requestBackgroundDownload() -> [DownloadAction] {
        guard retiredError == nil, !isComplete else { return [] }
        downloading = true
        if loopRunning {
            restartRequested = true
            return []
        }
        loopRunning = true
        return [.startDownload]
    }

    /// The catalog went on to a version the mount published itself (D-494): this one is no
    /// longer the item's, but the provider still has it until the upload replaces it, and the
    /// upload waits until it is here in full (`ContentStore.secureReplaced`). Only while a handle
    /// pins it (false, nothing changed: no handle reads it, it is retired as before). Detached,
    /// it is fetched whole, whatever the download mode, and its range map is not saved any more
    /// (the store has no record of it).
    mutating func detach() -> (detached: Bool, actions: [DownloadAction]) {
        guard pins > 0 else { return (false, []) }
        detached = true
        return (true, requestBackgroundDownload())
    }

    /// This version can no longer be fetched: waiters fail with `error` (the first retirement's
    /// error stays), and the download stops.
    mutating func retire(_ error: CacheError) -> [DownloadAction] {
        if retiredError == nil { retiredError = error }
        let failed = waiters.map { DownloadAction.complete(waiter: $0.id, error: error) }
        waiters = []
        return failed + (loopRunning ? [.cancelDownload] : [])
    }

    // MARK: The download loop

    /// What to fetch next (nil: nothing; the loop saves the range map and asks
    /// `finishUnlessNeeded`): the oldest waiter's first missing gap (ranges only: up to the
    /// read-ahead window after the waiter's range); else (background) the next
    /// gap after the stream position, wrapping to the start; else (ranges only) the read-ahead
    /// window.
    mutating func nextFetch() -> Range<Int64>? {
        let next = retiredError == nil ? nextTarget() : nil
        downloading = next != nil
        if isComplete { lastError = nil }
        return next
    }

    private func nextTarget() -> Range<Int64>? {
        if isComplete { return nil }
        for waiter in waiters {
            if let missing = present.firstMissing(in: waiter.range) {
                // Ranges only: the reader's bytes and the read-ahead window after them (at least
                // one first chunk), so that a stream which cannot be cut short (a checksummed one
                // is verified only at its end) does not fetch the rest of the file.
                let limit =
                    wholeFile
                    ? size
                    : min(
                        size,
                        max(waiter.range.upperBound + options.readAheadWindow, missing + Int64(options.firstChunkSize)))
                return present.gap(startingAt: missing, limit: limit)
            }
        }
        if wholeFile {
            let start = min(position, size)
            if let missing = present.firstMissing(in: start..<size) ?? present.firstMissing(in: 0..<size) {
                return present.gap(startingAt: missing, limit: size)
            }
            return nil
        }
        let limit = min(size, lastRequest.upperBound + options.readAheadWindow)
        if let missing = present.firstMissing(in: lastRequest.lowerBound..<limit) {
            return present.gap(startingAt: missing, limit: limit)
        }
        return nil
    }

    /// A provider stream over `target` begins.
    mutating func fetchStarted(_ target: Range<Int64>) {
        fetchCount += 1
        position = target.lowerBound
        fetchTarget = target
    }

    /// The next chunk. The first of a fetch, when a reader waits at `position`, is just what it
    /// needs (rounded up to 64 KiB, at least `firstChunkSize`): time to first byte depends on the
    /// read, not on the file or chunk size. Later chunks double, up to `chunkSize`, so a stream
    /// that readers follow closely is not cut into read-sized pieces (each chunk costs a few
    /// thread hops and a deadline).
    func chunkLength(at position: Int64, end: Int64, previous: Int?) -> Int {
        var length = Int64(options.chunkSize)
        if let previous {
            length = min(length, 2 * Int64(previous))
        } else if let waiter = waiters.first(where: { $0.range.contains(position) }) {
            let needed = (waiter.range.upperBound - position + 65535) / 65536 * 65536
            length = min(length, max(needed, Int64(options.firstChunkSize)))
        }
        return Int(max(1, min(length, end - position)))
    }

    /// `written` is in the file (its write returned): marked present, the readers it completes
    /// are resumed, a range-map save starts beside the download when one is due (half of
    /// `persistInterval` or half of `persistPeriod` since the last one started, so that the next
    /// starts while the bytes and time unsaved are still within the bounds; D-277), and
    /// `retarget` tells whether the fetch should stop (a
    /// waiter needs bytes behind or far ahead of the stream; in ranges-only mode nobody waits and
    /// the read-ahead window is covered; the version was retired).
    mutating func delivered(
        _ written: Range<Int64>, now: Duration, fetchStartedAt: Duration
    ) -> (actions: [DownloadAction], retarget: Bool) {
        present.insert(written)
        position = written.upperBound
        unsyncedBytes += Int64(written.count)
        var actions: [DownloadAction] = []
        waiters.removeAll { waiter in
            guard present.contains(waiter.range) else { return false }
            actions.append(.complete(waiter: waiter.id, error: nil))
            return true
        }
        var retarget = waiters.contains { waiter in
            guard let missing = present.firstMissing(in: waiter.range) else { return false }
            return missing < written.upperBound || missing >= written.upperBound + options.readAheadWindow
        }
        if !wholeFile && waiters.isEmpty
            && written.upperBound >= lastRequest.upperBound + options.readAheadWindow
        {
            retarget = true
        }
        if retiredError != nil { retarget = true }
        let due =
            unsyncedBytes >= options.persistInterval / 2
            || now - (lastPersistAt ?? fetchStartedAt) >= options.persistPeriod / 2
        if due && !backgroundPersist {
            backgroundPersist = true
            actions.append(.persistBeside)
        }
        return (actions, retarget)
    }

    /// How a fetch ended.
    enum FetchEnd: Equatable {
        case completed(progress: Bool)
        case retarget
        case failed(CacheError, progress: Bool)
    }

    /// What the loop does after a fetch ended.
    enum AfterFetch: Equatable {
        /// Ask `nextFetch` again.
        case next
        /// Sleep `retryDelay`, then ask `nextFetch` again.
        case retryAfterDelay(attempt: Int)
        /// The download failed for good: done with `failed`'s actions; save the range map, then
        /// ask `finishUnlessNeeded` (readers that came after the failure start a fresh series).
        case fail([DownloadAction])
    }

    /// A fetch ended: transient failures are retried up to `maximumAttempts` in a row without
    /// progress; others, and the last attempt, fail every waiter. A fetch reported completed that
    /// did not bring every byte of its range (a stream that ended early, taken at its word) is a
    /// failure too: the machine checks the range itself, so a short stream can never make the
    /// loop fetch the same gap forever.
    mutating func fetchEnded(_ end: FetchEnd) -> AfterFetch {
        var end = end
        if case .completed(let progress) = end, let target = fetchTarget, retiredError == nil,
            let missing = present.firstMissing(in: target)
        {
            end = .failed(
                CacheError(
                    .downloadFailed, "the provider ended the transfer at byte \(missing) of \(target.upperBound)"),
                progress: progress)
        }
        fetchTarget = nil
        switch end {
        case .completed(let progress):
            if progress { failuresInARow = 0 }
            return .next
        case .retarget:
            failuresInARow = 0
            return .next
        case .failed(let error, let progress):
            if progress { failuresInARow = 0 }
            failuresInARow += 1
            let fatal: Bool
            switch error.code {
            case .downloadFailed, .unreachable, .io, .corrupt: fatal = failuresInARow >= options.maximumAttempts
            default: fatal = true
            }
            if !fatal { return .retryAfterDelay(attempt: failuresInARow) }
            return .fail(failed(error))
        }
    }

    /// Ends the download with `error`: every waiter gets it (a version gone from the provider
    /// as `.deletedRemotely`), it is recorded for the xattrs as the waiters got it, with the
    /// stream position where it happened (for a checksum mismatch, where the bad fetch began:
    /// none of its bytes were delivered), and a stale or deleted version is retired.
    private mutating func failed(_ error: CacheError) -> [DownloadAction] {
        let deleted = CacheError(.deletedRemotely, "\(identifier) was deleted on the provider")
        let delivered = error.code == .notFound ? deleted : error
        if error.code != .cancelled {
            lastError = RecordedError(code: delivered.code, message: delivered.message, offset: position)
        }
        if error.code == .stale || error.code == .notFound || error.code == .deletedRemotely {
            if retiredError == nil { retiredError = error.code == .stale ? error : deleted }
        }
        downloading = false
        // A request made during the download that failed ends with it.
        restartRequested = false
        let failed = waiters.map { DownloadAction.complete(waiter: $0.id, error: delivered) }
        waiters = []
        return failed
    }

    /// The loop found nothing to fetch (or failed): it ends unless a reader waits for bytes this
    /// version can still get, or a background download was asked for meanwhile. True: go on
    /// (after a failure, with a fresh retry budget).
    mutating func finishUnlessNeeded(afterFailure: Bool) -> Bool {
        let requested = restartRequested
        restartRequested = false
        if retiredError == nil, requested || !waiters.isEmpty, nextTarget() != nil {
            if afterFailure { failuresInARow = 0 }
            downloading = true
            return true
        }
        downloading = false
        loopRunning = false
        return false
    }

    // MARK: Range-map saves

    /// A save begins at `now`: the snapshot to save once the file is synced, or nil when there
    /// is nothing new (or the version was superseded or deleted: its record is gone).
    mutating func persistSnapshot(now: Duration) -> (ByteRanges, RecordedError?)? {
        if let retired = retiredError, retired.code != .cancelled { return nil }
        if detached { return nil }
        if let saved, saved.0 == present, saved.1 == lastError { return nil }
        unsyncedBytes = 0
        lastPersistAt = now
        return (present, lastError)
    }

    /// The snapshot is in the store.
    mutating func persisted(_ snapshot: ByteRanges, lastError: RecordedError?) {
        saved = (snapshot, lastError)
        savedCount = snapshot.count
        saveFailing = false
    }

    /// A save failed (the file's sync or the store's write): the store keeps what it had.
    mutating func persistFailed() { saveFailing = true }

    /// Present bytes the store does not know of yet: what a crash now would fetch again.
    var unsavedBytes: Int64 { present.count - savedCount }

    /// Before `length` more bytes are fetched: true when they would take the bytes the store
    /// does not know of past `persistInterval`, so the host saves first and waits for it (a save
    /// beside the download that did not finish in time; the bound on what a crash refetches
    /// holds whatever the speed of the sync). False while saves fail (nothing to wait for).
    func mustSave(before length: Int64) -> Bool {
        !saveFailing && retiredError == nil && unsavedBytes > 0
            && unsavedBytes + length > options.persistInterval
    }

    /// A save started by `.persistBeside` ended.
    mutating func backgroundPersistEnded() { backgroundPersist = false }
}
