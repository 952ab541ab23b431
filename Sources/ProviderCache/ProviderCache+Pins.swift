// Pinned content (issue 27 item 2, D-445): `providerfs pin`, `unpin`, `pin --inherit` and
// `user.providerfs.pin` set an item's state (Pins.swift); a pinned item's files are downloaded in
// the background, a few at a time, and kept: eviction refuses them (`EvictionRefusal.pinned`, so
// `providerfs evict` and the cache's limits both). A pinned item is looked at (listed to the
// bottom, every file not complete queued) when it is pinned, when the cache starts, when the
// provider reports a change in a directory under a pin (a file created or rewritten there is
// downloaded at once), when an item is moved into a pinned directory through the mount, and every
// `pinnedRefreshPeriod` (providers that push no changes).

import Diagnostics
public import ProviderModel
import SystemSupport

extension ProviderCache {
    /// How long an item's metadata counts as current here unless the provider reported it changed:
    /// a look at a pinned directory does not ask the provider for each of its files.
    private static let trusted = Duration.seconds(365 * 86_400)
    /// Pinned files downloading at once.
    private static let pinnedWorkers = 4

    // MARK: States and policies

    /// The item's own pin state.
    public func pinState(of identifier: ItemIdentifier) -> PinState { pins.state(of: identifier) }

    /// The item's effective policy: its own state, else its nearest ancestor's, else download on
    /// read (the root's default).
    public func pinPolicy(of identifier: ItemIdentifier) -> PinPolicy {
        let catalog = self.catalog
        return pins.policy(of: identifier) { catalog.knownItem($0)?.parent }
    }

    /// Sets the item's own state (kept across restarts). Pinned: its files are downloaded in the
    /// background from now on. Unpinned: nothing is evicted here; the caller evicts
    /// (`filesWithContent(atOrUnder:)`, through `evict`, which asks whoever must be asked).
    /// Throws `.notFound` for an unknown item, `.unsupported` for a symbolic link or a node the
    /// mount keeps alone.
    public func setPinState(_ pin: PinState, of identifier: ItemIdentifier) throws(CacheError) {
        guard let item = catalog.knownItem(identifier) else {
            throw CacheError(.notFound, "\(identifier) is not known")
        }
        guard item.kind == .file || item.kind == .directory, item.special == nil else {
            throw CacheError(.unsupported, "\(identifier): only files and directories take a pin state")
        }
        let previous = pins.set(pin, for: identifier)
        if previous != pin {
            environment.logger.info("\(identifier): pin state \(previous.rawValue) → \(pin.rawValue)")
        }
        if pinPolicy(of: identifier).pinned {
            startPinRefresh()
            lookAtPinned([identifier])
        }
    }

    /// Whether eviction must keep the item's content: its policy is pinned.
    func isPinned(_ identifier: ItemIdentifier) -> Bool {
        pins.anyPinned && pinPolicy(of: identifier).pinned
    }

    /// The files at or under `identifier` with stored content (from the cache only): what an
    /// unpin evicts.
    public func filesWithContent(atOrUnder identifier: ItemIdentifier) -> [ItemIdentifier] {
        let catalog = self.catalog
        return content.identifiersWithContent.filter { candidate in
            var current = candidate
            for _ in 0..<4096 {
                if current == identifier { return true }
                guard current != .root, let parent = catalog.knownItem(current)?.parent else { return false }
                current = parent
            }
            return false
        }.sorted()
    }

    // MARK: Status

    /// What pinning holds and does; nil when no item has a state of its own.
    public func pinsStatus() -> PinsStatus? {
        let explicit = pins.explicitStates
        guard !explicit.isEmpty else { return nil }
        var status = PinsStatus(
            pinnedItems: explicit.values.count { $0 == .pinned },
            unpinnedItems: explicit.values.count { $0 == .unpinned },
            files: 0, downloadedFiles: 0, presentBytes: 0, totalBytes: 0, queued: 0, downloading: 0, failures: [])
        // The known tree under each pin, without its unpinned parts; each file once.
        var seen: Set<ItemIdentifier> = []
        var pending = explicit.filter { $0.value == .pinned }.map(\.key)
        while let next = pending.popLast() {
            guard seen.insert(next).inserted, let item = catalog.knownItem(next) else { continue }
            switch item.kind {
            case .directory:
                for child in catalog.cachedChildNames(of: next) where explicit[child.identifier] != .unpinned {
                    pending.append(child.identifier)
                }
            case .file where item.special == nil:
                let present = min(item.size, content.progress(of: item)?.present ?? 0)
                status.files += 1
                status.totalBytes += item.size
                status.presentBytes += present
                if present >= item.size { status.downloadedFiles += 1 }
            default: break
            }
        }
        pins.state.withLock { state in
            status.queued = state.downloads.count
            status.downloading = state.running.count
            status.failures = state.failures.map { PinFailure(identifier: $0.key, error: $0.value) }
                .sorted { $0.identifier < $1.identifier }
        }
        return status
    }

    // MARK: Triggers

    /// The cache started: every pinned item is looked at (downloads a restart interrupted go on),
    /// and again every `pinnedRefreshPeriod`.
    func startPins() {
        guard pins.anyPinned else { return }
        lookAtPinned(pinnedItems())
        startPinRefresh()
    }

    /// The periodic look, started with the first pin (a cache without pins keeps no timer).
    private func startPinRefresh() {
        guard let period = environment.options.pinnedRefreshPeriod else { return }
        let start = pins.state.withLock { state -> Bool in
            defer { state.refreshing = true }
            return !state.refreshing && !state.stopped
        }
        guard start else { return }
        let timeline = environment.timeline
        spawnPinTask { [weak self] in
            while !Task.isCancelled {
                do { try await timeline.sleep(for: period) } catch { return }
                guard let self else { return }
                self.lookAtPinned(self.pinnedItems())
            }
        }
    }

    private func pinnedItems() -> [ItemIdentifier] {
        pins.explicitStates.filter { $0.value == .pinned }.map(\.key).sorted()
    }

    /// The provider reported changes (after the catalog applied them): directories under a pin
    /// are looked at again, so that what was created or rewritten there is downloaded now.
    func pinnedProviderChanged(_ changes: [ProviderChange]?) {
        guard pins.anyPinned else { return }
        guard let changes else {
            lookAtPinned(pinnedItems())
            return
        }
        var directories: Set<ItemIdentifier> = []
        for change in changes {
            switch change {
            case .entry(let directory, _), .membership(let directory, _), .entries(let directory):
                directories.insert(directory)
            }
        }
        lookAtPinned(directories.filter { pinPolicy(of: $0).pinned }.sorted())
    }

    /// Moved through the mount: the states follow re-keyed identifiers, and an item moved under
    /// a pin is downloaded.
    func pinsMoved(_ item: ProviderItem, moves: [ItemIdentifier: ItemIdentifier]) {
        pins.rekey(moves)
        if isPinned(item.identifier) { lookAtPinned([item.identifier]) }
    }

    /// Queues looks at `identifiers` (pinned files or directories).
    func lookAtPinned(_ identifiers: [ItemIdentifier]) {
        guard !identifiers.isEmpty else { return }
        let start = pins.state.withLock { state -> Bool in
            guard !state.stopped else { return false }
            for identifier in identifiers { state.looks.push(identifier) }
            guard !state.looking else { return false }
            state.looking = true
            return true
        }
        if start { spawnPinTask { [self] in await self.runLooks() } }
    }

    // MARK: Work

    /// Runs `body` as a task kept in `tasks` (cancelled by `stopPins`, awaited by `drainPins`);
    /// made with no lock held.
    private func spawnPinTask(_ body: @escaping @Sendable () async -> Void) {
        let reserved = pins.state.withLock { state -> UInt64? in
            guard !state.stopped else { return nil }
            defer { state.nextTask += 1 }
            return state.nextTask
        }
        guard let number = reserved else { return }
        let task = Task { [pins] in
            await body()
            pins.state.withLock { state in
                if state.tasks.removeValue(forKey: number) == nil { state.finished.insert(number) }
            }
        }
        let cancel = pins.state.withLock { state -> Bool in
            if state.finished.remove(number) != nil { return false }
            state.tasks[number] = task
            return state.stopped
        }
        if cancel { task.cancel() }
    }

    private func runLooks() async {
        while true {
            let (next, idle) = pins.state.withLock { state -> (ItemIdentifier?, [CheckedContinuation<Void, Never>]) in
                guard !state.stopped, let next = state.looks.pop() else {
                    state.looking = false
                    return (nil, state.takeIdleWaiters())
                }
                return (next, [])
            }
            for waiter in idle { waiter.resume() }
            guard let next else { return }
            await look(at: next)
        }
    }

    /// Lists a pinned item to the bottom (listings younger than `directoryTTL` as they are) and
    /// queues each file whose current version is not complete here. Parts with their own
    /// `unpinned` state are skipped.
    private func look(at identifier: ItemIdentifier) async {
        guard let item = try? await catalog.item(identifier, maximumAge: Self.trusted), pinPolicy(of: identifier).pinned
        else { return }
        if item.kind == .file {
            queuePinnedDownloads([identifier])
            return
        }
        guard item.kind == .directory else { return }
        var directories = [identifier]
        while let directory = directories.popLast() {
            if Task.isCancelled { return }
            guard
                let children = try? await catalog.children(
                    of: directory, maximumAge: environment.options.directoryTTL)
            else { continue }
            var wanted: [ItemIdentifier] = []
            for child in children where pins.state(of: child.identifier) != .unpinned {
                switch child.kind {
                case .directory: directories.append(child.identifier)
                case .file where child.special == nil:
                    // Known current (not reported changed since) and complete: nothing to do.
                    if let current = catalog.itemNow(child.identifier, maximumAge: Self.trusted, askingProvider: false),
                        hasAllContent(of: current)
                    {
                        continue
                    }
                    wanted.append(child.identifier)
                default: continue
                }
            }
            queuePinnedDownloads(wanted)
        }
    }

    private func queuePinnedDownloads(_ identifiers: [ItemIdentifier]) {
        guard !identifiers.isEmpty else { return }
        let workers = pins.state.withLock { state -> Int in
            guard !state.stopped else { return 0 }
            for identifier in identifiers {
                if state.running.contains(identifier) {
                    state.again.insert(identifier)
                } else {
                    state.downloads.push(identifier)
                }
            }
            let more = min(Self.pinnedWorkers - state.workers, state.downloads.count)
            guard more > 0 else { return 0 }
            state.workers += more
            return more
        }
        for _ in 0..<workers { spawnPinTask { [self] in await self.runPinnedDownloads() } }
    }

    private func runPinnedDownloads() async {
        while true {
            let (next, idle) = pins.state.withLock { state -> (ItemIdentifier?, [CheckedContinuation<Void, Never>]) in
                guard !state.stopped, let next = state.downloads.pop() else {
                    state.workers -= 1
                    return (nil, state.takeIdleWaiters())
                }
                state.running.insert(next)
                return (next, [])
            }
            for waiter in idle { waiter.resume() }
            guard let next else { return }
            let failure = await downloadPinned(next)
            pins.state.withLock { state in
                state.running.remove(next)
                state.failures[next] = failure
                // Changed while it downloaded: this worker takes it again.
                if state.again.remove(next) != nil { state.downloads.push(next) }
            }
        }
    }

    /// Downloads every missing byte of a pinned file's current version; the failure, if any.
    private func downloadPinned(_ identifier: ItemIdentifier) async -> RecordedError? {
        do throws(CacheError) {
            let item = try await catalog.item(identifier, maximumAge: Self.trusted)
            // Written through the mount: its bytes are here already, as its local version.
            guard item.kind == .file, item.special == nil, !catalog.isUnborn(identifier),
                !catalog.hasLocalVersion(identifier), pinPolicy(of: identifier).pinned, !hasAllContent(of: item)
            else { return nil }
            let entry = try await pinContent(of: item)
            defer { content.unpin(entry) }
            if !entry.isMaterialized {
                entry.startBackgroundDownload()
                try await entry.ensurePresent(0..<entry.size)
                // Until its loop ended: the worker's slot is the download's.
                await entry.waitForDownload()
                // No reader made the kernel ask: its attributes (st_blocks, what du shows) are
                // dropped so that the next stat sees the bytes.
                catalog.tell([.attributes(identifier)])
            }
            return nil
        } catch {
            if error.code == .cancelled || error.code == .notFound { return nil }
            environment.logger.warning("\(identifier): the pinned download failed: \(error.message)")
            return RecordedError(code: error.code, message: error.message)
        }
    }

    /// The cache ends: no new look or download starts, running ones are cancelled.
    func stopPins() {
        let tasks = pins.state.withLock { state -> [Task<Void, Never>] in
            state.stopped = true
            state.looks.removeAll()
            state.downloads.removeAll()
            return Array(state.tasks.values)
        }
        for task in tasks { task.cancel() }
    }

    /// Waits for the pinned work's tasks to end (after `stopPins` and the content's shutdown,
    /// which fails the downloads they wait for); then no waiter is left waiting.
    func drainPins() async {
        let tasks = pins.state.withLock { Array($0.tasks.values) }
        for task in tasks { await task.value }
        let waiters = pins.state.withLock { state in
            defer { state.idleWaiters = [] }
            return state.idleWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Waits until no pinned look or download is queued or running (tests).
    public func waitForPinnedDownloads() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = pins.state.withLock { state -> Bool in
                if state.isIdle { return true }
                state.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }
}
