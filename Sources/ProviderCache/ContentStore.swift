// The content store: the life of content entries, one per (item, content version) — their
// sparse files in `<cache>/content/`, pins, closing when idle, retiring when superseded, range-map
// persistence (batched), and what is downloading, failed or stored. Staging copies are in
// ContentStore+Staging.swift, eviction in ContentStore+Eviction.swift.
//
// Lock order: `Catalog.state` → `ContentStore.state` → `ContentEntry.state` (the catalog calls in
// only with its lock dropped; an entry is pinned under the store lock so an idle close cannot
// take it).

import Diagnostics
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The bytes the cache directory uses, and what its file system has left.
public struct ContentUsage: Sendable, Equatable {
    /// Disk bytes the cache directory really uses: content files (sparse: allocated blocks, not
    /// sizes) and the metadata store.
    public var usedBytes: Int64
    /// Bytes free for an unprivileged writer on the file system of the cache directory.
    public var availableBytes: Int64
    /// Number of content files (open entries and closed records).
    public var files: Int
}

/// Content entries and their records. `ProviderCache` owns one beside its `Catalog`.
public final class ContentStore: Sendable {
    /// The cache directory (`content/` holds the sparse files).
    public let directory: String
    let environment: CacheEnvironment
    private let state: Locked<State>
    /// Serializes creation of content entries (opening and sizing their file) so that two first
    /// opens of one item share one entry. Taken only on a pool thread (or a FUSE thread's
    /// `pinNow`), never with a lock of the cache held.
    let creationLock = Lock()
    /// Told of a download that found the provider's version changed (`ContentEntry.setVersionGone`).
    let versionGone = Locked<Callback<ItemIdentifier>?>(nil)
    /// Told of the bytes each download stores (the cache's limits, `CacheLimiter`).
    let stored = Locked<Callback<Int64>?>(nil)
    /// Told when an item's content is given back (its last pin), for the cache's limits.
    let released = Locked<Callback<ItemIdentifier>?>(nil)
    /// When each item's content was last given back by a handle or a download (timeline time),
    /// for least-recently-used eviction; an item not used in this session counts as oldest.
    let lastUse = Locked<[ItemIdentifier: Duration]>([:])
    /// Content files published without fdatasync (a new file's close, D-381), by file number:
    /// an fsync through the mount syncs the item's current one.
    let unsynced = Locked<Set<Int64>>([])
    /// Range-map saves queued for the next batch, and how many batch flushes are running (shutdown
    /// waits for those: an entry closed while idle is only reachable from a running flush).
    private let pendingPersists = Locked<
        (
            entries: [ObjectIdentifier: ContentEntry], scheduled: Bool, flushing: Int,
            flushWaiters: [CheckedContinuation<Void, Never>],
            /// Entries a running batch took and has not saved yet (an eviction finds them here).
            inFlight: [ObjectIdentifier: ContentEntry]
        )
    >(([:], false, 0, [], [:]))

    struct ContentKey: Hashable {
        var identifier: ItemIdentifier
        var version: ContentVersion
    }

    /// Values by (identifier, version), grouped by identifier: what one item has is found
    /// without a scan of everything (a publish supersedes the item's other versions; with one
    /// flat table that scan made untar quadratic, D-379).
    struct ContentTable<Value>: Sequence {
        private var byItem: [ItemIdentifier: [ContentVersion: Value]] = [:]
        private(set) var count = 0

        var isEmpty: Bool { count == 0 }

        subscript(key: ContentKey) -> Value? {
            get { byItem[key.identifier]?[key.version] }
            set {
                let had = byItem[key.identifier]?[key.version] != nil
                if let newValue {
                    byItem[key.identifier, default: [:]][key.version] = newValue
                    if !had { count += 1 }
                } else if had {
                    byItem[key.identifier]![key.version] = nil
                    if byItem[key.identifier]!.isEmpty { byItem[key.identifier] = nil }
                    count -= 1
                }
            }
        }

        /// The versions `identifier` has, with their values.
        func versions(of identifier: ItemIdentifier) -> [ContentVersion: Value] { byItem[identifier] ?? [:] }

        var identifiers: Dictionary<ItemIdentifier, [ContentVersion: Value]>.Keys { byItem.keys }

        var values: [Value] { byItem.values.flatMap(\.values) }

        func makeIterator() -> AnyIterator<(key: ContentKey, value: Value)> {
            var items = byItem.makeIterator()
            var current: (ItemIdentifier, Dictionary<ContentVersion, Value>.Iterator)?
            return AnyIterator {
                while true {
                    if let (identifier, _) = current, let (version, value) = current!.1.next() {
                        return (ContentKey(identifier: identifier, version: version), value)
                    }
                    guard let (identifier, versions) = items.next() else { return nil }
                    current = (identifier, versions.makeIterator())
                }
            }
        }
    }

    struct State {
        var entries = ContentTable<ContentEntry>()
        /// Content records loaded from the store and not opened yet (or closed while idle).
        var records = ContentTable<ContentRecord>()
        var nextFileNumber: Int64 = 1
        var isShutDown = false
        /// Provider versions a local publish replaced while handles read them, kept until their
        /// last handle goes; the item's upload waits until they are here in full (D-494).
        var detached: [ItemIdentifier: [ContentEntry]] = [:]
    }

    /// The store over `directory/content`, with the records kept from earlier sessions for which
    /// `isCurrent` holds; the others, and files no record names, are deleted.
    init(
        directory: String, records: [ContentRecord], environment: CacheEnvironment,
        isCurrent: (ContentRecord) -> Bool
    ) {
        self.directory = directory
        self.environment = environment
        var state = State()
        var orphans: [ContentRecord] = []
        for record in records {
            state.nextFileNumber = max(state.nextFileNumber, record.fileNumber + 1)
            if isCurrent(record) {
                state.records[ContentKey(identifier: record.identifier, version: record.version)] = record
            } else {
                orphans.append(record)
            }
        }
        self.state = Locked(state)
        for record in orphans { discard(record: record) }
        removeUnreferencedFiles()
    }

    private func contentPath(_ fileNumber: Int64) -> String { "\(directory)/content/\(fileNumber)" }

    /// Deletes content files no record names (a crash before their first range-map save, or a
    /// record deleted while its file was kept open), at startup before any entry exists.
    private func removeUnreferencedFiles() {
        let referenced = state.withLock { state in Set(state.records.map(\.value.fileNumber)) }
        guard let handle = opendir(directory + "/content") else { return }
        var stray: [String] = []
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard name != ".", name != ".." else { continue }
            if let number = Int64(name), referenced.contains(number) { continue }
            stray.append(name)
        }
        closedir(handle)
        for name in stray { SystemCalls.unlink(directory + "/content/" + name) }
        if !stray.isEmpty { environment.logger.info("removed \(stray.count) unreferenced cache files") }
    }

    /// Runs `body` under the store lock (ContentStore+Eviction.swift).
    func withState<T>(_ body: (inout State) -> T) -> T { state.withLock { body(&$0) } }

    /// Deletes a record's file and its stored row.
    func discardRecordFile(_ record: ContentRecord) { discard(record: record) }

    private func discard(record: ContentRecord) {
        SystemCalls.unlink(contentPath(record.fileNumber))
        do { try environment.store.deleteContent(identifier: record.identifier, version: record.version) } catch {
            environment.logger.warning("cannot delete a content record: \(error)")
        }
    }

    private func discard(entry: ContentEntry) {
        discard(
            record: ContentRecord(
                identifier: entry.identifier, version: entry.version, size: entry.size, fileNumber: entry.fileNumber,
                present: ByteRanges()))
    }

    // MARK: Pins

    /// The content entry of `item`'s current version, pinned (call `unpin` when done). Its file is
    /// created on the I/O pool on first use. `isCurrent` tells whether the catalog still holds
    /// that version (an entry made for a superseded one is born retired).
    func pin(
        _ item: ProviderItem, isCurrent: @escaping @Sendable (ContentVersion) -> Bool
    ) async throws(CacheError) -> ContentEntry {
        guard item.kind == .file else { throw CacheError(.wrongKind, "\(item.identifier) is not a file") }
        let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
        if let entry = pinOpenEntry(key) { return entry }
        return try await environment.pool.run { () throws(CacheError) -> ContentEntry in
            try self.creationLock.withLock { () throws(CacheError) -> ContentEntry in
                try self.createEntry(key, item: item, isCurrent: isCurrent)
            }
        }
    }

    /// The immediate twin of `pin`: the same entry, on the calling thread (which may block on
    /// local file I/O: a new entry opens its cache file). Nil on any error, for `pin` to report.
    func pinNow(_ item: ProviderItem, isCurrent: @escaping @Sendable (ContentVersion) -> Bool) -> ContentEntry? {
        guard item.kind == .file else { return nil }
        let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
        if let entry = pinOpenEntry(key) { return entry }
        return try? creationLock.withLock { () throws(CacheError) -> ContentEntry in
            try createEntry(key, item: item, isCurrent: isCurrent)
        }
    }

    /// The open entry of `key`, pinned under the store lock (so an idle close cannot take it).
    private func pinOpenEntry(_ key: ContentKey) -> ContentEntry? {
        state.withLock { state -> ContentEntry? in
            let entry = state.entries[key]
            entry?.pin()
            return entry
        }
    }

    private func createEntry(
        _ key: ContentKey, item: ProviderItem, isCurrent: @Sendable (ContentVersion) -> Bool
    ) throws(CacheError) -> ContentEntry {
        enum Existing {
            case entry(ContentEntry)
            case record(ContentRecord)
        }
        let existing = try state.withLock { state throws(CacheError) -> Existing in
            if state.isShutDown { throw CacheError(.cancelled, "the cache is shutting down") }
            if let entry = state.entries[key] {
                entry.pin()
                return .entry(entry)
            }
            if let record = state.records[key] { return .record(record) }
            let record = ContentRecord(
                identifier: key.identifier, version: key.version, size: item.size, fileNumber: state.nextFileNumber,
                present: ByteRanges())
            state.nextFileNumber += 1
            return .record(record)
        }
        let record: ContentRecord
        switch existing {
        case .entry(let entry): return entry
        case .record(let found):
            // A new record is saved by the first range-map save, not now: a file that never got
            // a saved range is an orphan, deleted at the next start (one SQLite write less per
            // first open).
            record = found
        }
        let file = try ContentFile(
            path: contentPath(record.fileNumber), size: record.size, pool: environment.pool,
            sync: environment.fileSync)
        let entry = ContentEntry(record: record, file: file, environment: environment)
        entry.pin()
        entry.setDeferredPersist { [weak self] entry in self?.schedulePersist(entry) }
        entry.setVersionGone(versionGone.withLock { $0 }?.call)
        entry.setStored(stored.withLock { $0 }?.call)
        entry.setIdleHandler { [weak self] entry in
            guard let self else { return }
            let key = ContentKey(identifier: entry.identifier, version: entry.version)
            if self.state.withLock({ $0.entries[key] === entry }) {
                self.close(ifIdle: entry)
            } else {
                self.discardIfUnused(entry)
            }
        }
        state.withLock { state in
            state.records[key] = nil
            state.entries[key] = entry
        }
        // Checked after the entry is in place: the catalog changes an item's version before it
        // supersedes the old content (`supersede`), so either this sees the new version, or that
        // finds this entry.
        if !isCurrent(key.version) {
            state.withLock { state in
                if state.entries[key] === entry { state.entries[key] = nil }
            }
            entry.retire(CacheError(.stale, "\(key.identifier) changed on the provider"))
        }
        return entry
    }

    /// Gives back a pin. A superseded entry is discarded at its last unpin; a current one is
    /// closed once idle (no pin, no download), keeping its record, so open descriptors stay
    /// bounded by open handles and running downloads, not by the number of files ever read.
    public func unpin(_ entry: ContentEntry) {
        let remaining = entry.unpin()
        guard remaining == 0 else { return }
        if environment.options.hasLimits {
            let now = environment.timeline.now
            lastUse.withLock { $0[entry.identifier] = now }
            released.withLock { $0 }?.call(entry.identifier)
        }
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        let live = state.withLock { $0.entries[key] === entry }
        if live {
            close(ifIdle: entry)
        } else {
            // A detached entry's last handle went (D-494): its download stops with it, and the
            // upload that waits for it goes on.
            if entry.isDetached { endDetached(entry) }
            discardIfUnused(entry)
        }
    }

    /// Deletes a superseded entry's file and record, unless the store still uses that file (the
    /// entry was closed into a record, or reopened as a new entry of the same file).
    private func discardIfUnused(_ entry: ContentEntry) {
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        let inUse = state.withLock { state in
            if state.entries[key]?.fileNumber == entry.fileNumber || state.records[key]?.fileNumber == entry.fileNumber
            {
                return true
            }
            // Its record may live on under another identifier: a move re-keys records and retires
            // the live entries of the old identifier (`identifiersMoved`), whose file is the
            // moved record's. Not discarded then (D-371; before, the moved item lost its bytes).
            let moved = ContentKey(identifier: entry.movedTo ?? entry.identifier, version: entry.version)
            return state.entries[moved]?.fileNumber == entry.fileNumber
                || state.records[moved]?.fileNumber == entry.fileNumber
        }
        if !inUse && entry.pins == 0 { discard(entry: entry) }
    }

    /// Replaces an idle live entry by its record (the entry's file descriptor closes with it).
    private func close(ifIdle entry: ContentEntry) {
        let key = ContentKey(identifier: entry.identifier, version: entry.version)
        state.withLock { state in
            // Lock order store → entry: a concurrent pin pins under the store lock, so an entry
            // found idle here cannot gain a pin before it is removed.
            guard state.entries[key] === entry, entry.isIdle else { return }
            state.entries[key] = nil
            state.records[key] = entry.record
        }
    }

    /// The content of `identifier` other than version `current` (nil: all) is no longer the
    /// catalog's: entries still pinned by handles are retired (their present bytes stay readable,
    /// missing ones fail with `error`) and discarded at their last unpin; others now.
    func supersede(_ identifier: ItemIdentifier, except current: ContentVersion?, error: CacheError) {
        let (entries, records) = state.withLock { state -> ([ContentEntry], [ContentRecord]) in
            // Most items were never opened: no scan.
            guard !state.entries.isEmpty || !state.records.isEmpty else { return ([], []) }
            var entries: [ContentEntry] = []
            var records: [ContentRecord] = []
            for (version, entry) in state.entries.versions(of: identifier) where version != current {
                state.entries[ContentKey(identifier: identifier, version: version)] = nil
                entries.append(entry)
            }
            for (version, record) in state.records.versions(of: identifier) where version != current {
                state.records[ContentKey(identifier: identifier, version: version)] = nil
                records.append(record)
            }
            return (entries, records)
        }
        for record in records { discard(record: record) }
        // Superseded by the mount's own publish (a local version), a provider version is still
        // the provider's until the upload replaces it, and the upload waits until the versions
        // open handles read are here in full (`secureReplaced`): those handles read on, and only
        // a change made elsewhere can cut them short (D-494; retired here, a reader that opened
        // before a rewrite met ESTALE unless its download happened to end first).
        let published = current?.isLocal ?? false
        for entry in entries {
            // Detached only while pinned (decided under the entry's lock, so that a last unpin
            // either comes after and ends it, or came before and it is retired here).
            // Listed first, detached then under the entry's lock while a handle pins it: a last
            // unpin after that ends it (`endDetached`); one before leaves it to be retired here.
            if published, !entry.version.isLocal {
                state.withLock { $0.detached[identifier, default: []].append(entry) }
                if entry.detach() { continue }
                endDetached(entry)
            }
            entry.retire(error)
            discardIfUnused(entry)
        }
    }

    /// A detached entry's last handle went (or none pinned it): its download stops, and an
    /// upload that waits for it goes on.
    private func endDetached(_ entry: ContentEntry) {
        entry.retire(CacheError(.cancelled, "\(entry.identifier): superseded, no handle reads it"))
        state.withLock { state in
            state.detached[entry.identifier]?.removeAll { $0 === entry }
            if state.detached[entry.identifier]?.isEmpty == true { state.detached[entry.identifier] = nil }
        }
    }

    /// Waits until the provider versions of `identifier` that a local publish replaced while
    /// handles read them (D-494) are here in full, or no handle reads them, or they can no
    /// longer be fetched (changed or deleted elsewhere): then an upload may replace them at the
    /// provider. False: a download failed otherwise (the provider unreachable, the cache's disk
    /// full): the upload waits for a later attempt, as for a failure of its own.
    func secureReplaced(_ identifier: ItemIdentifier) async -> Bool {
        let entries = state.withLock { $0.detached[identifier] ?? [] }
        for entry in entries where entry.pins > 0 {
            do {
                try await entry.ensurePresent(0..<entry.size)
            } catch {
                if entry.isRetired { continue }
                environment.logger.notice(
                    "\(identifier): the upload waits: a version open handles read is not here in full: \(error)")
                return false
            }
        }
        return true
    }

    /// Items were re-keyed (old → new identifier, nil: not moved; a move at a provider whose
    /// identifiers are paths, `Catalog.identifiersMoved`). Stored records follow their item under
    /// its new key; open entries cannot change their identifier, so they are retired (their
    /// present bytes stay readable through the handles that pin them; missing ones fail) and the
    /// moved item's next open makes a new entry. A swap of two subtrees works (every record
    /// leaves its key before any arrives).
    /// `candidates`: the only identifiers that can move (a file's move: itself), so that a move
    /// costs what it touches instead of a scan of every record (D-401); nil: every identifier.
    func identifiersMoved(among candidates: [ItemIdentifier]? = nil, _ moves: (ItemIdentifier) -> ItemIdentifier?) {
        // Matches are collected before the tables change: a table changed while it is iterated is
        // copied whole first.
        func matches<Value>(in table: ContentTable<Value>) -> [(key: ContentKey, value: Value, to: ItemIdentifier)] {
            var found: [(key: ContentKey, value: Value, to: ItemIdentifier)] = []
            if let candidates {
                for identifier in candidates {
                    guard let target = moves(identifier) else { continue }
                    for (version, value) in table.versions(of: identifier) {
                        found.append((ContentKey(identifier: identifier, version: version), value, target))
                    }
                }
            } else {
                for (key, value) in table {
                    if let target = moves(key.identifier) { found.append((key, value, target)) }
                }
            }
            return found
        }
        let (retired, moved) = state.withLock { state -> ([ContentEntry], [(old: ContentRecord, new: ContentRecord)]) in
            guard !state.entries.isEmpty || !state.records.isEmpty else { return ([], []) }
            var retired: [ContentEntry] = []
            var moved: [(old: ContentRecord, new: ContentRecord)] = []
            var liveMoved: [(old: ContentRecord, new: ContentRecord)] = []
            for (key, entry, identifier) in matches(in: state.entries) {
                // Noted before the entry leaves the table: its idle handler may run at once on
                // another thread, and must find the moved record (else it deletes the file).
                entry.noteMoved(to: identifier)
                state.entries[key] = nil
                retired.append(entry)
                // A live entry has no record in the table: the moved item gets one, of the bytes
                // present now, on the same file (before, a move while the item was open, or
                // while the write-back uploaded it, left the moved item with no content).
                let record = entry.record
                var new = record
                new.identifier = identifier
                liveMoved.append((record, new))
            }
            var arriving: [ContentRecord] = []
            for (key, record, identifier) in matches(in: state.records) {
                state.records[key] = nil
                var new = record
                new.identifier = identifier
                arriving.append(new)
                moved.append((record, new))
            }
            for new in arriving { state.records[ContentKey(identifier: new.identifier, version: new.version)] = new }
            for (old, new) in liveMoved {
                state.records[ContentKey(identifier: new.identifier, version: new.version)] = new
                moved.append((old, new))
            }
            return (retired, moved)
        }
        for (old, new) in moved {
            do {
                try environment.store.saveContent(new)
                try environment.store.deleteContent(identifier: old.identifier, version: old.version)
            } catch {
                environment.logger.warning("cannot re-key a content record: \(error)")
            }
        }
        for entry in retired {
            entry.retire(CacheError(.deletedRemotely, "\(entry.identifier) was moved while open"))
            discardIfUnused(entry)
        }
    }

    // MARK: Staging (ContentStore+Staging.swift)

    /// A file number no record or staging file uses.
    func reserveFileNumber() -> Int64 {
        state.withLock { state in
            defer { state.nextFileNumber += 1 }
            return state.nextFileNumber
        }
    }

    /// A published record, opened by the next pin.
    func addRecord(_ record: ContentRecord) {
        state.withLock { $0.records[ContentKey(identifier: record.identifier, version: record.version)] = record }
    }

    /// The file number of (`identifier`, `version`), open or recorded.
    func fileNumber(of identifier: ItemIdentifier, _ version: ContentVersion) -> Int64? {
        let key = ContentKey(identifier: identifier, version: version)
        return state.withLock { $0.entries[key]?.fileNumber ?? $0.records[key]?.fileNumber }
    }

    // MARK: Queries

    /// Number of content entries open (tests: descriptors are bounded).
    public var openEntryCount: Int { state.withLock { $0.entries.count } }

    /// How many bytes of the item's current content version are stored locally (0 for a
    /// placeholder, a directory or a symbolic link).
    public func presentBytes(of item: ProviderItem) -> Int64 {
        progress(of: item)?.present ?? 0
    }

    /// The progress of `item`'s content version: an open entry's, else its record's; nil when
    /// there is neither (never opened, or not a file).
    public func progress(of item: ProviderItem) -> ContentProgress? {
        // Most items were never opened: no key to build or hash.
        guard item.kind == .file else { return nil }
        enum Found {
            case entry(ContentEntry)
            case record(ContentRecord)
        }
        let found = state.withLock { state -> Found? in
            guard !state.entries.isEmpty || !state.records.isEmpty else { return nil }
            let key = ContentKey(identifier: item.identifier, version: item.contentVersion)
            if let entry = state.entries[key] { return .entry(entry) }
            return state.records[key].map { .record($0) }
        }
        switch found {
        case .entry(let entry): return entry.progress
        case .record(let record):
            return ContentProgress(
                present: record.present.count, total: record.size, downloading: false, lastError: record.lastError)
        case nil: return nil
        }
    }

    /// Items with content in the store: an open entry or a stored record, of their current or an
    /// older version (`ProviderCache.contentActivity()`).
    var identifiersWithContent: Set<ItemIdentifier> {
        state.withLock { Set($0.entries.identifiers).union($0.records.identifiers) }
    }

    /// Disk use of the cache directory (allocated blocks of the content files and of the metadata
    /// store beside them) and the space left where it lives. Reads the directories and stats each
    /// file: for `status`, not for a hot path.
    public func usage() -> ContentUsage {
        var used: Int64 = 0
        var files = 0
        let contentDirectory = directory + "/content"
        for folder in [directory, contentDirectory] {
            guard let handle = opendir(folder) else { continue }
            while let entry = readdir(handle) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                guard name != ".", name != ".." else { continue }
                var info = stat()
                guard SystemCalls.lstat(folder + "/" + name, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
                    continue
                }
                used += Int64(info.st_blocks) * 512
                if folder == contentDirectory { files += 1 }
            }
            closedir(handle)
        }
        var space = statvfs()
        let available = statvfs(directory, &space) == 0 ? Int64(space.f_bavail) * Int64(space.f_frsize) : 0
        return ContentUsage(usedBytes: used, availableBytes: available, files: files)
    }

    // MARK: Persistence

    /// Queues `entry`'s range-map save for a batch run `persistDelay` later (on the injected
    /// clock) or at shutdown, whichever comes first. A crash before it only loses the map (the
    /// bytes are fetched again), never claims bytes that are not on disk.
    func schedulePersist(_ entry: ContentEntry) {
        let start = pendingPersists.withLock { pending -> Bool in
            pending.entries[ObjectIdentifier(entry)] = entry
            if pending.scheduled { return false }
            pending.scheduled = true
            return true
        }
        guard start else { return }
        let delay = environment.options.persistDelay
        let timeline = environment.timeline
        Task { [weak self] in
            try? await timeline.sleep(for: delay)
            await self?.flushPendingPersists()
        }
    }

    /// Saves every queued range map now.
    public func flushPendingPersists() async {
        let entries = pendingPersists.withLock { pending -> [ContentEntry] in
            defer {
                pending.entries = [:]
                pending.scheduled = false
                pending.flushing += 1
            }
            for (key, entry) in pending.entries { pending.inFlight[key] = entry }
            return Array(pending.entries.values)
        }
        for entry in entries {
            await entry.persist()
            _ = pendingPersists.withLock { $0.inFlight.removeValue(forKey: ObjectIdentifier(entry)) }
        }
        let waiters = pendingPersists.withLock { pending -> [CheckedContinuation<Void, Never>] in
            pending.flushing -= 1
            guard pending.flushing == 0 else { return [] }
            defer { pending.flushWaiters = [] }
            return pending.flushWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Entries of `identifier` whose range-map save is queued or running in a batch: the queued
    /// ones leave the queue (an eviction: they are retired, their saves never run).
    func takePersists(of identifier: ItemIdentifier) -> [ContentEntry] {
        pendingPersists.withLock { pending in
            var found: [ContentEntry] = []
            for (key, entry) in pending.entries where entry.identifier == identifier {
                pending.entries[key] = nil
                found.append(entry)
            }
            for entry in pending.inFlight.values where entry.identifier == identifier { found.append(entry) }
            return found
        }
    }

    /// Returns once no batch flush is running.
    func waitForRunningFlushes() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = pendingPersists.withLock { pending -> Bool in
                if pending.flushing == 0 { return true }
                pending.flushWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }

    /// Stops every download, fails waiting readers, saves range maps. Later pins fail.
    func shutdown() async {
        let entries = state.withLock { state -> [ContentEntry] in
            state.isShutDown = true
            // Detached versions (D-494) download too: they stop as well.
            return Array(state.entries.values) + state.detached.values.joined()
        }
        for entry in entries {
            entry.retire(CacheError(.cancelled, "the file system is shutting down"))
            await entry.waitForDownload()
            await entry.persist()
        }
        await flushPendingPersists()
        // A batch that the persist timer started before shutdown may still be saving.
        await waitForRunningFlushes()
    }
}
