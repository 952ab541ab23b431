// The downloader: one content version of one item, its sparse file, its present ranges, and the
// single download shared by every reader of it.
//
// The rules (who waits, what to fetch, when to retry, fail, save) are `DownloadMachine`'s; this
// is its host. Lock discipline: the machine is mutated inside `withLock`, and its actions —
// continuations resumed, tasks started or cancelled, range maps saved — are carried out only
// after the lock is dropped; files are written and streams read without the lock.

import CryptoSupport
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
    private let onIdle: Locked<Callback<ContentEntry>?> = Locked(nil)
    /// Takes over the range-map save at the end of a download (the ContentStore batches them).
    private let deferredPersist: Locked<Callback<ContentEntry>?> = Locked(nil)

    func setDeferredPersist(_ handler: @escaping @Sendable (ContentEntry) -> Void) {
        deferredPersist.withLock { $0 = Callback(handler) }
    }

    /// Hears of a download that found the provider's version changed (its readers get ESTALE):
    /// the catalog learns the new version for whoever wants to hear of it (D-403).
    private let versionGone: Locked<Callback<ItemIdentifier>?> = Locked(nil)

    func setVersionGone(_ handler: (@Sendable (ItemIdentifier) -> Void)?) {
        versionGone.withLock { $0 = handler.map(Callback.init) }
    }

    /// The machine, the continuations of its waiters, and the download task.
    private struct State {
        var machine: DownloadMachine
        var continuations: [UInt64: CheckedContinuation<Result<Void, CacheError>, Never>] = [:]
        var downloadTask: Task<Void, Never>?
    }

    init(record: ContentRecord, file: ContentFile, environment: CacheEnvironment) {
        identifier = record.identifier
        version = record.version
        size = record.size
        fileNumber = record.fileNumber
        self.file = file
        self.environment = environment
        state = Locked(
            State(
                machine: DownloadMachine(
                    size: record.size, present: record.present, lastError: record.lastError,
                    options: environment.options, identifier: record.identifier.rawValue)))
    }

    /// Present bytes, total, whether a download runs, and the last failure.
    public var progress: ContentProgress {
        state.withLock {
            ContentProgress(
                present: $0.machine.present.count, total: size, downloading: $0.machine.downloading,
                lastError: $0.machine.lastError)
        }
    }

    /// The ranges on disk (a copy).
    public var presentRanges: ByteRanges { state.withLock { $0.machine.present } }

    /// True when every byte is on disk.
    public var isMaterialized: Bool { state.withLock { $0.machine.isComplete } }

    /// The cache file, when every byte of this version is in it; nil while any range is missing
    /// (a hole reads as zeros, not as the content). Once complete, the file is never written,
    /// truncated or replaced again while the entry exists (downloads write only missing ranges;
    /// superseded content is unlinked, never rewritten in place), so a pinned entry's complete
    /// file may be read directly by others — the kernel, through FUSE passthrough — for as long as
    /// the pin is held.
    public var materializedFilePath: String? { isMaterialized ? file.path : nil }

    /// The cache file's path, complete or not (logs).
    public var filePath: String { file.path }

    /// Disk blocks (512 bytes) the sparse file really uses.
    public var allocatedBlocks: Int64 { file.allocatedBlocks }

    /// Number of provider fetches this entry has started (tests and status).
    public var fetchCount: Int { state.withLock { $0.machine.fetchCount } }

    var pins: Int { state.withLock { $0.machine.pins } }

    /// No handle pins it and no download runs: it may be closed (its record kept).
    var isIdle: Bool { state.withLock { $0.machine.isIdle } }

    /// Told of the bytes a download stores (the cache's limits); nil: nobody.
    private let stored = Locked<(@Sendable (Int64) -> Void)?>(nil)
    func setStored(_ hook: (@Sendable (Int64) -> Void)?) { stored.withLock { $0 = hook } }

    /// A download (a reader's or a background one) runs.
    var isDownloading: Bool { state.withLock { $0.machine.loopRunning } }

    /// The record to keep when the entry is closed.
    var record: ContentRecord {
        state.withLock {
            ContentRecord(
                identifier: identifier, version: version, size: size, fileNumber: fileNumber,
                present: $0.machine.present, lastError: $0.machine.lastError)
        }
    }

    func setIdleHandler(_ handler: @escaping @Sendable (ContentEntry) -> Void) {
        onIdle.withLock { $0 = Callback(handler) }
    }

    private func notifyIfIdle() {
        guard isIdle, let handler = onIdle.withLock({ $0 })?.call else { return }
        handler(self)
    }

    func pin() { state.withLock { $0.machine.pin() } }

    /// Returns the remaining pin count.
    func unpin() -> Int { state.withLock { $0.machine.unpin() } }

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
        guard state.withLock({ $0.machine.present.contains(offset..<end) }) else { return nil }
        return file.range(at: offset, count: Int(end - offset))
    }

    /// Waits until `range` is on disk (starting or joining the download), or fails.
    public func ensurePresent(_ range: Range<Int64>) async throws(CacheError) {
        let range = range.clamped(to: 0..<size)
        let id: UInt64
        switch state.withLock({ $0.machine.beginRead(range) }) {
        case .ready: return
        case .failed(let error): throw error
        case .wait(let waiterID): id = waiterID
        }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<Void, CacheError>, Never>) in
                let actions = state.withLock { state in
                    state.continuations[id] = continuation
                    return state.machine.register(id, range: range)
                }
                perform(actions)
            }
        } onCancel: {
            perform(state.withLock { $0.machine.cancel(id) })
        }
        try result.get()
    }

    /// Starts the download without a reader (e.g. `providerfs download`, or after a restart when
    /// background completion should resume). No-op when complete or already running.
    public func startBackgroundDownload() {
        perform(state.withLock { $0.machine.requestBackgroundDownload() })
    }

    /// This version is no longer the item's, superseded by the mount's own publish, but still
    /// the provider's until the upload, which waits for it: while a handle pins it, its handles
    /// go on reading it and the rest of it is fetched (D-494). False: no handle pins it.
    func detach() -> Bool {
        let (detached, actions) = state.withLock { $0.machine.detach() }
        perform(actions)
        return detached
    }
    var isDetached: Bool { state.withLock { $0.machine.detached } }
    /// Retired: its missing bytes can no longer be fetched (superseded, deleted, shut down).
    var isRetired: Bool { state.withLock { $0.machine.retiredError != nil } }
    /// Readers waiting for bytes (tests: the upload that waits for a detached version, D-494).
    var waiterCount: Int { state.withLock { $0.machine.waiters.count } }

    /// Marks this version unfetchable: waiters and later reads of missing bytes fail with `error`;
    /// the download stops. Present bytes stay readable for handles that pinned this version.
    func retire(_ error: CacheError) {
        perform(state.withLock { $0.machine.retire(error) })
    }

    /// The identifier a move gave the item while this entry was live: its file is the moved
    /// record's now, and is not discarded with the entry (D-371).
    var movedTo: ItemIdentifier? { moved.withLock { $0 } }
    private let moved = Locked<ItemIdentifier?>(nil)

    func noteMoved(to identifier: ItemIdentifier) { moved.withLock { $0 = identifier } }

    /// Waits for the download task (if any) to end. For shutdown and tests.
    func waitForDownload() async {
        let task = state.withLock { $0.downloadTask }
        await task?.value
    }

    /// Carries out the machine's actions, in order, with the lock dropped.
    private func perform(_ actions: [DownloadAction]) {
        for action in actions {
            switch action {
            case .startDownload: startDownload()
            case .cancelDownload: state.withLock { $0.downloadTask }?.cancel()
            case .complete(let waiter, let error):
                // Registered before the machine knew the waiter: always present here.
                let continuation = state.withLock { $0.continuations.removeValue(forKey: waiter) }
                continuation?.resume(returning: error.map { .failure($0) } ?? .success(()))
            case .persistBeside:
                // Beside the download: the fetch goes on while the sync runs. Saves of this entry
                // are serialized (persistGate), so the download's final save still comes last.
                Task {
                    await self.persist()
                    self.state.withLock { $0.machine.backgroundPersistEnded() }
                }
            }
        }
    }

    // MARK: The download

    private func startDownload() {
        let task = Task { await self.downloadLoop() }
        state.withLock { state in
            // The loop may already have finished; keep no stale handle then.
            if state.machine.loopRunning { state.downloadTask = task }
        }
    }

    /// Ends the loop unless the machine says a reader still needs it; true: go on.
    private func finishUnlessNeeded(afterFailure: Bool) -> Bool {
        state.withLock { state in
            if state.machine.finishUnlessNeeded(afterFailure: afterFailure) { return true }
            state.downloadTask = nil
            return false
        }
    }

    private func downloadLoop() async {
        // Fetches made since the provider was last told a download ended (`downloadEnded`).
        var fetchedInDownload = false
        while true {
            guard let target = state.withLock({ $0.machine.nextFetch() }) else {
                if fetchedInDownload {
                    fetchedInDownload = false
                    environment.provider.downloadEnded(of: identifier, version: version, succeeded: true)
                }
                // Save the range map now, or (when a deferred saver is set) let the cache batch it
                // shortly after: one fdatasync per small file is the main cost of opening many
                // small files. The cache flushes pending saves at shutdown.
                if let deferred = deferredPersist.withLock({ $0 })?.call {
                    deferred(self)
                } else {
                    await persist()
                }
                if finishUnlessNeeded(afterFailure: false) { continue }
                notifyIfIdle()
                return
            }
            let end = await fetch(target)
            fetchedInDownload = true
            switch state.withLock({ $0.machine.fetchEnded(end) }) {
            case .next:
                continue
            case .retryAfterDelay(let attempt):
                if case .failed(let error, _) = end {
                    environment.logger.info("\(identifier): attempt \(attempt) failed (\(error)); retrying")
                }
                try? await environment.timeline.sleep(for: environment.options.retryDelay)
                continue
            case .fail(let actions):
                if case .failed(let error, _) = end, error.code != .cancelled {
                    environment.logger.warning("\(identifier) @\(version): download failed: \(error)")
                }
                // The provider hears of the end before the readers do: a reader that retries at
                // once starts a new download as the provider counts them.
                fetchedInDownload = false
                environment.provider.downloadEnded(of: identifier, version: version, succeeded: false)
                perform(actions)
                if case .failed(let error, _) = end, error.code == .stale {
                    versionGone.withLock({ $0 })?.call(identifier)
                }
                await persist()
                // Readers that came after the failure start a fresh series of attempts (a new
                // download, as the provider counts them).
                if finishUnlessNeeded(afterFailure: true) { continue }
                notifyIfIdle()
                return
            }
        }
    }

    /// One provider stream over `target`: each chunk is written, then marked present, then the
    /// waiters it completes are resumed.
    private func fetch(_ target: Range<Int64>) async -> DownloadMachine.FetchEnd {
        let environment = self.environment
        let options = environment.options
        let identifier = self.identifier
        let version = self.version
        state.withLock { $0.machine.fetchStarted(target) }
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
        if direct == nil && stream.capabilities.contains(.checksummed) {
            return await fetchVerified(stream, target)
        }
        let startedAt = environment.timeline.now
        let file = self.file
        var position = target.lowerBound
        var progress = false
        var previousChunk: Int?
        while position < target.upperBound {
            if Task.isCancelled { return .failed(CacheError(.cancelled, "download cancelled"), progress: progress) }
            let length = state.withLock { state in
                state.machine.chunkLength(at: position, end: target.upperBound, previous: previousChunk)
            }
            previousChunk = length
            // A save beside the download that has not kept up: save (and wait) before fetching
            // more, so a crash never refetches more than `persistInterval` (D-277).
            let batch =
                direct == nil ? Int64(length) : min(Int64(options.directBatchSize), target.upperBound - position)
            if state.withLock({ $0.machine.mustSave(before: batch) }) { await persist() }
            if let direct {
                // The stream writes into our file itself, in steps of at most chunkSize, and tells
                // us each verified step on its own thread: the bytes are marked present and their
                // readers resumed at once, with no thread hop per step (D-219).
                let at = position
                // `abandoned`: the deadline passed (or the transfer failed) and this fetch has
                // ended; a step the stream still finishes later (a source read that blocked past
                // the deadline) is then not delivered: the fetch's state is gone, and its bytes
                // are fetched again. The stream's job keeps this entry, and so its file, alive.
                let outcome = Locked<(position: Int64, retarget: Bool, abandoned: Bool)>((at, false, false))
                let placed: Int?
                do {
                    placed = try await withDeadline(options.stallTimeout, on: environment.timeline) {
                        try await direct.transfer(
                            to: file.fd, at: at, firstStep: length, step: options.chunkSize,
                            maximumLength: Int(min(Int64(options.directBatchSize), target.upperBound - at))
                        ) { count in
                            outcome.withLock { outcome -> Bool in
                                guard !outcome.abandoned else { return false }
                                let step = outcome.position..<min(target.upperBound, outcome.position + Int64(count))
                                outcome.retarget = self.deliver(step, fetchStartedAt: startedAt)
                                outcome.position = step.upperBound
                                return !outcome.retarget
                            }
                        }
                    }
                } catch {
                    let reached = outcome.withLock { outcome -> Int64 in
                        outcome.abandoned = true
                        return outcome.position
                    }
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

    /// One fetch of a `.checksummed` stream: every byte is hashed as it arrives and written to the
    /// file, but none counts as present (none is served, none is saved in the range map) until
    /// the stream has ended and its checksum matches the digest of exactly the bytes received
    /// for `target`; then all of them are delivered at once. A mismatch, a stream that sends more
    /// than the range, or one that ends without a checksum fails the fetch with `.corrupt`
    /// (retried like a failed download; one that ends early fails as any short stream does,
    /// `.downloadFailed`), and its bytes are left as if never fetched:
    /// they are written only into missing ranges, which a later fetch overwrites. So the unit of
    /// verification is one fetch, and a reader of such a stream waits for the fetch's end.
    private func fetchVerified(_ stream: any ContentStream, _ target: Range<Int64>) async -> DownloadMachine.FetchEnd {
        let options = environment.options
        let timeline = environment.timeline
        let startedAt = timeline.now
        let algorithm = stream.checksumAlgorithm
        var hasher = Digest(algorithm)
        var position = target.lowerBound
        var previousChunk: Int?
        while position < target.upperBound {
            if Task.isCancelled { return .failed(CacheError(.cancelled, "download cancelled"), progress: false) }
            let length = state.withLock { state in
                state.machine.chunkLength(at: position, end: target.upperBound, previous: previousChunk)
            }
            previousChunk = length
            let chunk: [UInt8]?
            do {
                chunk = try await withDeadline(options.stallTimeout, on: timeline) {
                    try await stream.next(maximumLength: length)
                }
            } catch {
                return .failed(CacheError.from(error), progress: false)
            }
            guard let bytes = chunk, !bytes.isEmpty else {
                return .failed(Self.endedEarly(at: position, of: target), progress: false)
            }
            if Int64(bytes.count) > target.upperBound - position {
                return .failed(
                    CacheError(
                        .corrupt,
                        "bytes \(target.lowerBound)..<\(target.upperBound): the provider sent more bytes than the range"
                    ), progress: false)
            }
            hasher.update(bytes)
            do {
                try await file.write(bytes, at: position)
            } catch {
                return .failed(error, progress: false)
            }
            position += Int64(bytes.count)
        }
        // The checksum comes after the last byte (like an HTTP trailer): the stream must end here.
        let rest: [UInt8]?
        do {
            rest = try await withDeadline(options.stallTimeout, on: timeline) {
                try await stream.next(maximumLength: 1)
            }
        } catch {
            return .failed(CacheError.from(error), progress: false)
        }
        let range = "bytes \(target.lowerBound)..<\(target.upperBound)"
        if let rest, !rest.isEmpty {
            return .failed(
                CacheError(.corrupt, "\(range): the provider sent more bytes than the range"), progress: false)
        }
        let received = ContentChecksum(algorithm, digest: hasher.finalize())
        guard let expected = stream.checksum else {
            return .failed(CacheError(.corrupt, "\(range): the provider sent no checksum"), progress: false)
        }
        guard expected.algorithm == received.algorithm, constantTimeEquals(expected.digest, received.digest) else {
            return .failed(
                CacheError(.corrupt, "\(range) do not match their checksum: expected \(expected), got \(received)"),
                progress: false)
        }
        // Verified: only now do the bytes count as present, and their readers resume.
        _ = deliver(target, fetchStartedAt: startedAt)
        return .completed(progress: true)
    }

    /// `written` is in the file: the machine marks it present; its actions (readers resumed, a
    /// save beside the download) are carried out; true when the fetch should stop to retarget.
    /// Callable from any thread.
    private func deliver(_ written: Range<Int64>, fetchStartedAt: Duration) -> Bool {
        let now = environment.timeline.now
        let (actions, retarget) = state.withLock {
            $0.machine.delivered(written, now: now, fetchStartedAt: fetchStartedAt)
        }
        perform(actions)
        if let hook = stored.withLock({ $0 }) { hook(Int64(written.count)) }
        return retarget
    }

    /// A clean end before the range's end is a lie about the length, not an end of file: never
    /// mark a range present that was not delivered (rclone-under-faults 2b/2c).
    private static func endedEarly(at position: Int64, of target: Range<Int64>) -> CacheError {
        CacheError(.downloadFailed, "the provider ended the transfer at byte \(position) of \(target.upperBound)")
    }

    /// fdatasync, then save the range map as it was before the sync: a range is persisted only
    /// once its bytes are durable, so a crash or power cut never makes unwritten bytes "present".
    /// Saves of one entry run one at a time, in call order, and a call returns only after a save
    /// that started after it (or found nothing new): an older snapshot never overwrites a newer one.
    /// Returns once no range-map save of this entry is running (a retired entry starts none).
    func waitForPersists() async {
        await persistGate.acquire()
        persistGate.release()
    }

    func persist() async {
        await persistGate.acquire()
        await persistLocked()
        persistGate.release()
    }

    private func persistLocked() async {
        // Nothing when nothing is new, or when the version was superseded or deleted.
        let now = environment.timeline.now
        let work = state.withLock { $0.machine.persistSnapshot(now: now) }
        guard let (snapshot, lastError) = work else { return }
        do {
            try await file.sync()
        } catch {
            environment.logger.warning("\(identifier): \(error); range map not saved")
            state.withLock { $0.machine.persistFailed() }
            return
        }
        let record = ContentRecord(
            identifier: identifier, version: version, size: size, fileNumber: fileNumber, present: snapshot,
            lastError: lastError)
        let store = environment.store
        do {
            try await environment.pool.run { () throws -> Void in try store.saveContent(record) }
            state.withLock { $0.machine.persisted(snapshot, lastError: lastError) }
        } catch {
            environment.logger.warning("\(identifier): cannot save range map: \(error)")
            state.withLock { $0.machine.persistFailed() }
        }
    }
}

extension ContentEntry {
    /// Waits until no download runs for this entry (tests: "the background part has finished").
    public func waitForDownloadForTesting() async {
        await waitForDownload()
    }

    /// Readers waiting for bytes this entry's download has not delivered yet (tests: "every
    /// reader is registered behind the stream").
    public var waitingReaderCountForTesting: Int { state.withLock { $0.machine.waiters.count } }
}
