// The downloader: one content version of one item, its sparse file, its present ranges, and the
// single download shared by every reader of it.
//
// Lock discipline: `state` is a pure record mutated inside `withLock`; continuations are resumed,
// files written, stores saved and tasks started only after the lock is dropped.

import Diagnostics
public import ProviderModel
public import SystemSupport

/// What a content entry reports about itself.
public struct ContentProgress: Sendable, Equatable {
    public var present: Int64
    public var total: Int64
    public var downloading: Bool
    public var lastError: RecordedError?
}

/// One (item, content version): reads wait for the ranges they need; one download task fills
/// the file, reader-first, then read-ahead, then the rest.
public final class ContentEntry: Sendable {
    public let identifier: ItemIdentifier
    public let version: ContentVersion
    public let size: Int64
    let fileNumber: Int64
    let file: ContentFile
    let environment: CacheEnvironment
    private let state: Locked<State>
    /// Serializes range-map saves of this entry (see `persist()`).
    private let persistGate = AsyncGate()
    /// Called when the entry becomes idle (no pin, no download), so the cache can close it.
    private let onIdle: Locked<(@Sendable (ContentEntry) -> Void)?> = Locked(nil)
    /// Takes over the range-map save at the end of a download (ProviderCache batches them).
    private let deferredPersist: Locked<(@Sendable (ContentEntry) -> Void)?> = Locked(nil)

    func setDeferredPersist(_ handler: @escaping @Sendable (ContentEntry) -> Void) {
        deferredPersist.withLock { $0 = handler }
    }

    private struct Waiter {
        var id: UInt64
        var range: Range<Int64>
        var continuation: CheckedContinuation<Result<Void, CacheError>, Never>
    }

    private struct State {
        var present: ByteRanges
        var waiters: [Waiter] = []
        var cancelledWaiters: Set<UInt64> = []
        var nextWaiterID: UInt64 = 1
        /// Bytes are being fetched (what `progress` and the `downloading` state show).
        var downloading = false
        /// The download task exists (fetching, or saving the range map before it ends).
        var loopRunning = false
        var downloadTask: Task<Void, Never>?
        /// Where the current (or last) stream is.
        var position: Int64 = 0
        /// Start and end of the last range a reader asked for (read-ahead in ranges-only mode).
        var lastRequest: Range<Int64> = 0..<0
        var lastError: RecordedError?
        /// Set when this version can no longer be fetched (superseded, deleted, shut down):
        /// missing bytes fail with this error at once.
        var retiredError: CacheError?
        var unsyncedBytes: Int64 = 0
        /// When (timeline) the last range-map save started; nil before the first in this session.
        var lastPersistAt: Duration?
        /// A save started beside the download is running (another is not started meanwhile).
        var backgroundPersist = false
        /// What the store holds (nil: nothing saved in this session).
        var saved: (ByteRanges, RecordedError?)?
        var pins = 0
        var fetchCount = 0
    }

    init(record: ContentRecord, file: ContentFile, environment: CacheEnvironment) {
        identifier = record.identifier
        version = record.version
        size = record.size
        fileNumber = record.fileNumber
        self.file = file
        self.environment = environment
        var initial = State(present: record.present)
        initial.lastError = record.lastError
        state = Locked(initial)
    }

    /// Present bytes, total, whether a download runs, and the last failure.
    public var progress: ContentProgress {
        state.withLock {
            ContentProgress(
                present: $0.present.count, total: size, downloading: $0.downloading, lastError: $0.lastError)
        }
    }

    /// The ranges on disk (a copy).
    public var presentRanges: ByteRanges { state.withLock { $0.present } }

    /// True when every byte is on disk.
    public var isMaterialized: Bool { state.withLock { $0.present.contains(0..<size) } }

    /// The cache file, when every byte of this version is in it; nil while any range is missing
    /// (a hole reads as zeros, not as the content). Once complete, the file is never written,
    /// truncated or replaced again while the entry exists (downloads write only missing ranges;
    /// superseded content is unlinked, never rewritten in place), so a pinned entry's complete
    /// file may be read directly by others — the kernel, through FUSE passthrough — for as long as
    /// the pin is held.
    public var materializedFilePath: String? { isMaterialized ? file.path : nil }

    /// Disk blocks (512 bytes) the sparse file really uses.
    public var allocatedBlocks: Int64 { file.allocatedBlocks }

    /// Number of provider fetches this entry has started (tests and status).
    public var fetchCount: Int { state.withLock { $0.fetchCount } }

    var pins: Int { state.withLock { $0.pins } }

    /// No handle pins it and no download runs: it may be closed (its record kept).
    var isIdle: Bool { state.withLock { $0.pins == 0 && !$0.loopRunning } }

    /// The record to keep when the entry is closed.
    var record: ContentRecord {
        state.withLock {
            ContentRecord(
                identifier: identifier, version: version, size: size, fileNumber: fileNumber, present: $0.present,
                lastError: $0.lastError)
        }
    }

    func setIdleHandler(_ handler: @escaping @Sendable (ContentEntry) -> Void) {
        onIdle.withLock { $0 = handler }
    }

    private func notifyIfIdle() {
        guard isIdle, let handler = onIdle.withLock({ $0 }) else { return }
        handler(self)
    }

    func pin() { state.withLock { $0.pins += 1 } }

    /// Returns the remaining pin count.
    func unpin() -> Int {
        state.withLock {
            $0.pins -= 1
            return $0.pins
        }
    }

    /// Reads up to `count` bytes at `offset`, waiting for the download to bring them if needed.
    /// Fewer bytes only at the end of the content.
    public func read(offset: Int64, count: Int) async throws(CacheError) -> ReadData {
        let end = min(size, offset + Int64(count))
        guard offset < end else { return ReadData(buffer: AlignedBuffer(capacity: 0), count: 0) }
        try await ensurePresent(offset..<end)
        return file.range(at: offset, count: Int(end - offset))
    }

    /// The bytes at `offset` when every one of them is already on disk (nil otherwise), without
    /// waiting: the fast path a FUSE thread takes before handing a read to a task.
    public func readIfPresent(offset: Int64, count: Int) -> ReadData? {
        let end = min(size, offset + Int64(count))
        guard offset < end else { return ReadData(buffer: AlignedBuffer(capacity: 0), count: 0) }
        guard state.withLock({ $0.present.contains(offset..<end) }) else { return nil }
        return file.range(at: offset, count: Int(end - offset))
    }

    /// Waits until `range` is on disk (starting or joining the download), or fails.
    public func ensurePresent(_ range: Range<Int64>) async throws(CacheError) {
        let range = range.clamped(to: 0..<size)
        enum Fast { case ready, failed(CacheError), wait(UInt64) }
        let fast = state.withLock { state -> Fast in
            if state.present.contains(range) { return .ready }
            if let error = state.retiredError { return .failed(error) }
            state.nextWaiterID += 1
            return .wait(state.nextWaiterID)
        }
        let id: UInt64
        switch fast {
        case .ready: return
        case .failed(let error): throw error
        case .wait(let waiterID): id = waiterID
        }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<Void, CacheError>, Never>) in
                enum Registration { case resume(Result<Void, CacheError>), waiting(startDownload: Bool) }
                let registration = state.withLock { state -> Registration in
                    if state.cancelledWaiters.remove(id) != nil {
                        return .resume(.failure(CacheError(.cancelled, "read interrupted")))
                    }
                    if state.present.contains(range) { return .resume(.success(())) }
                    if let error = state.retiredError { return .resume(.failure(error)) }
                    state.waiters.append(Waiter(id: id, range: range, continuation: continuation))
                    state.lastRequest = range
                    if state.loopRunning { return .waiting(startDownload: false) }
                    state.loopRunning = true
                    state.downloading = true
                    return .waiting(startDownload: true)
                }
                switch registration {
                case .resume(let result): continuation.resume(returning: result)
                case .waiting(let startDownload): if startDownload { self.startDownload() }
                }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Result<Void, CacheError>, Never>? in
                if let index = state.waiters.firstIndex(where: { $0.id == id }) {
                    return state.waiters.remove(at: index).continuation
                }
                state.cancelledWaiters.insert(id)
                return nil
            }
            continuation?.resume(returning: .failure(CacheError(.cancelled, "read interrupted")))
        }
        try result.get()
    }

    /// Starts the download without a reader (e.g. `providerfs download`, or after a restart when
    /// background completion should resume). No-op when complete or already running.
    public func startBackgroundDownload() {
        let start = state.withLock { state -> Bool in
            guard !state.loopRunning, state.retiredError == nil, !state.present.contains(0..<size) else {
                return false
            }
            state.loopRunning = true
            state.downloading = true
            return true
        }
        if start { startDownload() }
    }

    /// Marks this version unfetchable: waiters and later reads of missing bytes fail with `error`;
    /// the download stops. Present bytes stay readable for handles that pinned this version.
    func retire(_ error: CacheError) {
        let (waiters, task) = state.withLock { state -> ([Waiter], Task<Void, Never>?) in
            if state.retiredError == nil { state.retiredError = error }
            let waiters = state.waiters
            state.waiters = []
            return (waiters, state.downloadTask)
        }
        task?.cancel()
        for waiter in waiters { waiter.continuation.resume(returning: .failure(error)) }
    }

    /// Waits for the download task (if any) to end. For shutdown and tests.
    func waitForDownload() async {
        let task = state.withLock { $0.downloadTask }
        await task?.value
    }

    // MARK: The download

    private func startDownload() {
        let task = Task { await self.downloadLoop() }
        state.withLock { state in
            // The loop may already have finished; keep no stale handle then.
            if state.loopRunning { state.downloadTask = task }
        }
    }

    private enum Outcome {
        case completed(progress: Bool)
        case retarget
        case failed(CacheError, progress: Bool)
    }

    private func downloadLoop() async {
        let options = environment.options
        var failuresInARow = 0
        while true {
            let target = state.withLock { state -> Range<Int64>? in
                let next = state.retiredError == nil ? Self.nextTarget(state, size: size, options: options) : nil
                state.downloading = next != nil
                if state.present.contains(0..<size) { state.lastError = nil }
                return next
            }
            guard let target else {
                // Save the range map now, or (when a deferred saver is set) let the cache batch it
                // shortly after: one fdatasync per small file is the main cost of opening many
                // small files. The cache flushes pending saves at shutdown.
                if let deferred = deferredPersist.withLock({ $0 }) {
                    deferred(self)
                } else {
                    await persist()
                }
                if finishUnlessNeeded() { continue }
                notifyIfIdle()
                return
            }
            switch await fetch(target) {
            case .completed(let progress):
                if progress { failuresInARow = 0 }
            case .retarget:
                failuresInARow = 0
            case .failed(let error, let progress):
                if progress { failuresInARow = 0 }
                failuresInARow += 1
                let fatal: Bool
                switch error.code {
                case .downloadFailed, .unreachable, .io: fatal = failuresInARow >= options.maximumAttempts
                default: fatal = true
                }
                if !fatal {
                    environment.logger.info("\(identifier): attempt \(failuresInARow) failed (\(error)); retrying")
                    try? await environment.timeline.sleep(for: options.retryDelay)
                    continue
                }
                fail(with: error)
                await persist()
                // Readers that came after the failure start a fresh series of attempts.
                if finishUnlessNeeded() {
                    failuresInARow = 0
                    continue
                }
                notifyIfIdle()
                return
            }
        }
    }

    /// Ends the download task unless a reader waits for bytes this version can still get;
    /// returns true when the loop must go on.
    private func finishUnlessNeeded() -> Bool {
        let options = environment.options
        return state.withLock { state in
            if state.retiredError == nil, !state.waiters.isEmpty,
                Self.nextTarget(state, size: size, options: options) != nil
            {
                return true
            }
            state.downloading = false
            state.loopRunning = false
            state.downloadTask = nil
            return false
        }
    }

    /// Ends the download with `error`: every waiter gets it and it is recorded for the xattrs.
    private func fail(with error: CacheError) {
        let waiters = state.withLock { state -> [Waiter] in
            if error.code != .cancelled { state.lastError = RecordedError(code: error.code, message: error.message) }
            if error.code == .stale || error.code == .notFound || error.code == .deletedRemotely {
                let retired =
                    error.code == .stale
                    ? error : CacheError(.deletedRemotely, "\(identifier) was deleted on the provider")
                if state.retiredError == nil { state.retiredError = retired }
            }
            state.downloading = false
            let waiters = state.waiters
            state.waiters = []
            return waiters
        }
        if error.code != .cancelled {
            environment.logger.warning("\(identifier) @\(version): download failed: \(error)")
        }
        let delivered =
            error.code == .notFound ? CacheError(.deletedRemotely, "\(identifier) was deleted on the provider") : error
        for waiter in waiters { waiter.continuation.resume(returning: .failure(delivered)) }
    }

    /// Where to fetch next: the oldest waiter's first missing gap; else (background) the next gap
    /// after the stream position, wrapping to the start; else (ranges only) the read-ahead window.
    private static func nextTarget(_ state: State, size: Int64, options: CacheOptions) -> Range<Int64>? {
        let present = state.present
        if present.contains(0..<size) { return nil }
        for waiter in state.waiters {
            if let missing = present.firstMissing(in: waiter.range) {
                return present.gap(startingAt: missing, limit: size)
            }
        }
        if options.backgroundCompletion {
            let start = min(state.position, size)
            if let missing = present.firstMissing(in: start..<size) ?? present.firstMissing(in: 0..<size) {
                return present.gap(startingAt: missing, limit: size)
            }
            return nil
        }
        let limit = min(size, state.lastRequest.upperBound + options.readAheadWindow)
        if let missing = present.firstMissing(in: state.lastRequest.lowerBound..<limit) {
            return present.gap(startingAt: missing, limit: limit)
        }
        return nil
    }

    /// One provider stream over `target`: each chunk is written, then marked present, then the
    /// waiters it completes are resumed.
    private func fetch(_ target: Range<Int64>) async -> Outcome {
        let environment = self.environment
        let options = environment.options
        let identifier = self.identifier
        let version = self.version
        state.withLock {
            $0.fetchCount += 1
            $0.position = target.lowerBound
        }
        let stream: any ContentStream
        do {
            stream = try await withDeadline(options.stallTimeout, on: environment.timeline) {
                try await environment.provider.fetchContents(of: identifier, version: version, range: target)
            }
        } catch {
            return .failed(CacheError.from(error), progress: false)
        }
        defer { stream.close() }
        // A stream that can write into our file itself (the local source) does;
        // others hand us chunks that we write.
        let direct = stream.capabilities.contains(.directTransfer) ? stream : nil
        let startedAt = environment.timeline.now
        let file = self.file
        var position = target.lowerBound
        var progress = false
        var previousChunk: Int?
        while position < target.upperBound {
            if Task.isCancelled { return .failed(CacheError(.cancelled, "download cancelled"), progress: progress) }
            let length = state.withLock { state in
                Self.chunkLength(state, at: position, end: target.upperBound, options: options, previous: previousChunk)
            }
            previousChunk = length
            if let direct {
                // The stream writes into our file itself, in steps of at most chunkSize, and tells
                // us each verified step on its own thread: the bytes are marked present and their
                // readers resumed at once, with no thread hop per step (D-219).
                let at = position
                let outcome = Locked<(position: Int64, retarget: Bool)>((at, false))
                let placed: Int?
                do {
                    placed = try await withDeadline(options.stallTimeout, on: environment.timeline) {
                        try await direct.transfer(
                            to: file.fd, at: at, firstStep: length, step: options.chunkSize,
                            maximumLength: Int(min(Int64(options.directBatchSize), target.upperBound - at))
                        ) { count in
                            let start = outcome.withLock { $0.position }
                            let step = start..<min(target.upperBound, start + Int64(count))
                            let retarget = self.deliver(step, fetchStartedAt: startedAt)
                            outcome.withLock { $0 = (step.upperBound, retarget) }
                            return !retarget
                        }
                    }
                } catch {
                    let reached = outcome.withLock { $0.position }
                    return .failed(file.transferFailure(error), progress: progress || reached > at)
                }
                let (reached, retarget) = outcome.withLock { ($0.position, $0.retarget) }
                if reached > position { progress = true }
                position = reached
                guard let placed, placed > 0 else {
                    return .failed(Self.endedEarly(at: position, of: target), progress: progress)
                }
                if retarget { return .retarget }
                continue
            }
            let chunk: [UInt8]?
            do {
                chunk = try await withDeadline(options.stallTimeout, on: environment.timeline) {
                    try await stream.next(maximumLength: length)
                }
            } catch {
                return .failed(CacheError.from(error), progress: progress)
            }
            guard var bytes = chunk, !bytes.isEmpty else {
                return .failed(Self.endedEarly(at: position, of: target), progress: progress)
            }
            if Int64(bytes.count) > target.upperBound - position {
                bytes.removeLast(bytes.count - Int(target.upperBound - position))
            }
            do {
                try await file.write(bytes, at: position)
            } catch {
                return .failed(error, progress: progress)
            }
            // The bytes are in the file (pwrite returned): only now do they count as present.
            let written = position..<(position + Int64(bytes.count))
            position = written.upperBound
            progress = true
            if deliver(written, fetchStartedAt: startedAt) { return .retarget }
        }
        return .completed(progress: progress)
    }

    /// Marks `written` present (its bytes are in the file), resumes the readers it completes,
    /// starts a range-map save beside the download when one is due, and tells whether the fetch
    /// should stop to retarget (a waiter needs bytes behind or far ahead of the stream, or, in
    /// ranges-only mode, nobody waits and the read-ahead window is covered). Callable from any
    /// thread.
    private func deliver(_ written: Range<Int64>, fetchStartedAt: Duration) -> Bool {
        let options = environment.options
        let now = environment.timeline.now
        let (ready, shouldPersist, retarget) = state.withLock { state -> ([Waiter], Bool, Bool) in
            state.present.insert(written)
            state.position = written.upperBound
            state.unsyncedBytes += Int64(written.count)
            var ready: [Waiter] = []
            state.waiters.removeAll { waiter in
                guard state.present.contains(waiter.range) else { return false }
                ready.append(waiter)
                return true
            }
            var retarget = state.waiters.contains { waiter in
                guard let missing = state.present.firstMissing(in: waiter.range) else { return false }
                return missing < written.upperBound || missing >= written.upperBound + options.readAheadWindow
            }
            if !options.backgroundCompletion && state.waiters.isEmpty
                && written.upperBound >= state.lastRequest.upperBound + options.readAheadWindow
            {
                retarget = true
            }
            // A superseded or shut-down version stops here too.
            if state.retiredError != nil { retarget = true }
            let due =
                state.unsyncedBytes >= options.persistInterval
                || now - (state.lastPersistAt ?? fetchStartedAt) >= options.persistPeriod
            let persistNow = due && !state.backgroundPersist
            if persistNow { state.backgroundPersist = true }
            return (ready, persistNow, retarget)
        }
        for waiter in ready { waiter.continuation.resume(returning: .success(())) }
        if shouldPersist {
            // Beside the download: the fetch goes on while the sync runs. Saves of this entry are
            // serialized (persistGate), so the download's final save still comes last.
            Task {
                await self.persist()
                self.state.withLock { $0.backgroundPersist = false }
            }
        }
        return retarget
    }

    /// A clean end before the range's end is a lie about the length, not an end of file: never
    /// mark a range present that was not delivered (rclone-under-faults 2b/2c).
    private static func endedEarly(at position: Int64, of target: Range<Int64>) -> CacheError {
        CacheError(.downloadFailed, "the provider ended the transfer at byte \(position) of \(target.upperBound)")
    }

    /// The next chunk. The first of a fetch, when a reader waits at `position`, is just what it
    /// needs (rounded up to 64 KiB, at least `firstChunkSize`): time to first byte depends on the
    /// read, not on the file or chunk size. Later chunks double, up to `chunkSize`, so a stream
    /// that readers follow closely is not cut into read-sized pieces (each chunk costs a few
    /// thread hops and a deadline).
    private static func chunkLength(
        _ state: State, at position: Int64, end: Int64, options: CacheOptions, previous: Int?
    ) -> Int {
        var length = Int64(options.chunkSize)
        if let previous {
            length = min(length, 2 * Int64(previous))
        } else if let waiter = state.waiters.first(where: { $0.range.contains(position) }) {
            let needed = (waiter.range.upperBound - position + 65535) / 65536 * 65536
            length = min(length, max(needed, Int64(options.firstChunkSize)))
        }
        return Int(max(1, min(length, end - position)))
    }

    /// fdatasync, then save the range map as it was before the sync: a range is persisted only
    /// once its bytes are durable, so a crash or power cut never makes unwritten bytes "present".
    /// Saves of one entry run one at a time, in call order, and a call returns only after a save
    /// that started after it (or found nothing new): an older snapshot never overwrites a newer one.
    func persist() async {
        await persistGate.acquire()
        await persistLocked()
        persistGate.release()
    }

    private func persistLocked() async {
        let work = state.withLock { state -> (ByteRanges, RecordedError?)? in
            // A superseded or deleted version is never saved again (its record was deleted).
            if let retired = state.retiredError, retired.code != .cancelled { return nil }
            // Nothing new since the last save: no sync, no write.
            if let saved = state.saved, saved.0 == state.present, saved.1 == state.lastError { return nil }
            state.unsyncedBytes = 0
            state.lastPersistAt = environment.timeline.now
            return (state.present, state.lastError)
        }
        guard let (snapshot, lastError) = work else { return }
        do {
            try await file.sync()
        } catch {
            environment.logger.warning("\(identifier): \(error); range map not saved")
            return
        }
        let record = ContentRecord(
            identifier: identifier, version: version, size: size, fileNumber: fileNumber, present: snapshot,
            lastError: lastError)
        let store = environment.store
        do {
            try await environment.pool.run { () throws -> Void in try store.saveContent(record) }
            state.withLock { $0.saved = (snapshot, lastError) }
        } catch {
            environment.logger.warning("\(identifier): cannot save range map: \(error)")
        }
    }
}

extension ContentEntry {
    /// Waits until no download runs for this entry (tests: "the background part has finished").
    public func waitForDownloadForTesting() async {
        await waitForDownload()
    }
}
