// The host of writing (issue 14): staging copies shared by an item's write handles, their publish
// as local versions, and the durable write-back queue that uploads them. The rules are the pure
// machines' (WriteMachines.swift); this carries out their actions with the lock dropped.
//
// Lock order: `LocalWrites.state` is a leaf (never held while calling the catalog, the content
// store, the store or the provider).

import Diagnostics
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a publish made.
public struct PublishedVersion: Sendable, Equatable {
    public var item: ProviderItem
}

/// Staging copies and the write-back of one cache.
public final class LocalWrites: Sendable {
    let environment: CacheEnvironment
    let catalog: Catalog
    let content: ContentStore

    private struct Staged {
        var machine: StagingMachine
        var file: StagingFile
        /// The provider version the edit started from, for a first upload record.
        var base: ContentVersion?
        /// The edit started from an empty version (a new file): its publishes at close do not
        /// force the bytes to disk; fsync's do (D-381).
        var startedEmpty = false
    }

    /// Whose staging copy: the item's shared one (`owner` nil: plain paths), or a token's own
    /// (`owner`: the token's id), so that a token's writes can be dropped when it ends without
    /// touching anyone else's (D-369).
    private struct Key: Hashable {
        var identifier: ItemIdentifier
        var owner: String?
    }

    /// The key a staging file is under (its identifier follows renames).
    private static func key(of staging: StagingFile) -> Key {
        Key(identifier: staging.identifier, owner: staging.owner)
    }

    /// Whether `candidate` is `root` or lies under it ("root/…").
    private static func lies(_ candidate: ItemIdentifier, atOrUnder root: ItemIdentifier) -> Bool {
        rekeyed(candidate, from: root, to: root) != nil
    }

    private struct State {
        var staged: [Key: Staged] = [:]
        var uploads: [ItemIdentifier: UploadMachine] = [:]
        var tasks: [UInt64: Task<Void, Never>] = [:]
        var nextTask: UInt64 = 1
        var closed = false
        /// Upload calls at the provider, by the identifier they address (D-372).
        var callsInFlight: [ItemIdentifier: Int] = [:]
        /// Items a move through the mount is moving (with what lies under them).
        var moving: [ItemIdentifier] = []
        var blockedCalls: [CheckedContinuation<Void, Never>] = []
        /// Moves waiting for upload calls to end, by ticket (an interrupted one leaves, D-400).
        var blockedMoves: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextMoveTicket: UInt64 = 1
    }

    private let state = Locked(State())
    /// Serializes staging creation, writer opens and closes, and publishes: each is short except a
    /// first open that must download the content first.
    private let gate = AsyncGate()
    /// Backoff of failed uploads.
    let initialBackoff: Duration
    let maximumBackoff: Duration

    init(
        environment: CacheEnvironment, catalog: Catalog, content: ContentStore,
        initialBackoff: Duration = .seconds(1), maximumBackoff: Duration = .seconds(300)
    ) {
        self.environment = environment
        self.catalog = catalog
        self.content = content
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// After a restart: staging leftovers removed, local versions served again, pending uploads
    /// resumed.
    func resume() {
        content.removeStagingLeftovers()
        let records: [UploadRecord]
        do { records = try environment.store.loadUploads() } catch {
            environment.logger.warning("cannot read the write-back queue: \(error)")
            return
        }
        var actions: [(ItemIdentifier, [UploadMachine.Action])] = []
        for record in records {
            // (A create closed unwritten has no local version: its empty file is still to make.)
            if !record.localVersion.isUnborn { catalog.restoreLocal(record) }
            if record.creates {
                // Its item is gone from the catalog: nothing to create (D-386).
                guard catalog.knownItem(record.identifier) != nil else {
                    do { try environment.store.deleteUpload(record.identifier) } catch {
                        environment.logger.warning("cannot delete an upload record: \(error)")
                    }
                    continue
                }
                catalog.restoreUnborn(record.identifier)
            }
            let started = state.withLock { state -> [UploadMachine.Action] in
                var machine = UploadMachine(
                    record: record, initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
                let started = machine.start()
                state.uploads[record.identifier] = machine
                return started
            }
            actions.append((record.identifier, started))
        }
        for (identifier, started) in actions { perform(identifier, started) }
    }

    // MARK: Staging

    /// A write handle opens on `item` (its current version): joins the item's staging file, or
    /// makes one — empty when `truncating`, else a copy of the current content, downloaded first
    /// when not all present. `owner`: the token id of an access path's writer, whose staging file
    /// is its token's own (nil: the item's shared one). `touching`: a change even when the file
    /// is empty (O_TRUNC of an existing file moves its mtime; a create's own open does not).
    public func openWriter(
        _ item: ProviderItem, truncating: Bool, touching: Bool = false, owner: String? = nil
    ) async throws(CacheError) -> StagingFile {
        guard item.kind == .file else { throw CacheError(.wrongKind, "\(item.identifier) is not a file") }
        await gate.acquire()
        defer { gate.release() }
        let key = Key(identifier: item.identifier, owner: owner)
        if let file = state.withLock({ state -> StagingFile? in
            guard state.staged[key] != nil else { return nil }
            state.staged[key]!.machine.openWriter()
            if truncating { state.staged[key]!.machine.changed() }
            return state.staged[key]!.file
        }) {
            environment.logger.debug(
                "\(item.identifier): a writer joins staging \(file.path) (\(writerCount(of: item.identifier, owner: owner)) writers)"
            )
            if truncating {
                try await file.truncate(to: 0)
                file.setModified(wallClockTime())
            }
            return file
        }
        var source: ContentEntry?
        if !truncating && item.size > 0 {
            let entry = try await content.pin(item) { [catalog] in catalog.currentVersion(of: item.identifier) == $0 }
            source = entry
            do {
                try await entry.ensurePresent(0..<item.size)
            } catch {
                content.unpin(entry)
                throw error
            }
        }
        let file: StagingFile
        do {
            file = try await content.makeStaging(item.identifier, copying: source, owner: owner)
        } catch {
            if let source { content.unpin(source) }
            throw error
        }
        if let source { content.unpin(source) }
        // O_TRUNC of a file with bytes, or of an existing one (`touching`), is a change (st_mtime now).
        let changed = truncating && (item.size > 0 || touching)
        if changed { file.setModified(wallClockTime()) }
        let base = catalog.providerBase(of: item.identifier)
        state.withLock { state in
            var machine = StagingMachine(startsModified: changed)
            machine.openWriter()
            state.staged[key] = Staged(machine: machine, file: file, base: base, startedEmpty: item.size == 0)
        }
        environment.logger.debug(
            "\(item.identifier): a writer opens new staging \(file.path) from \(source.map { "\($0.version)" } ?? "nothing")"
        )
        return file
    }

    /// The staging file of `identifier` (the shared one, or `owner`'s), when write handles have
    /// one open.
    public func staging(of identifier: ItemIdentifier, owner: String? = nil) -> StagingFile? {
        state.withLock { $0.staged[Key(identifier: identifier, owner: owner)]?.file }
    }

    /// The staged length of `identifier`'s shared staging file while it has one (stat shows it;
    /// a token's own copy is not shown, D-369).
    public func stagedSize(of identifier: ItemIdentifier) -> Int64? { staged(identifier)?.size }

    /// The length, last change and held permissions of the item's shared staging file while
    /// write handles have it open (nil: none; `modified` nil: unchanged since it was made or
    /// since an explicit mtime; `permissions` nil: none held, D-385).
    public func staged(_ identifier: ItemIdentifier) -> (size: Int64, modified: ItemTime?, permissions: UInt16?)? {
        state.withLock { state in
            guard !state.staged.isEmpty, let staged = state.staged[Key(identifier: identifier, owner: nil)]
            else { return nil }
            return (staged.file.size, staged.file.modified, staged.file.permissions)
        }
    }

    /// chmod or utimens of `identifier` while its shared staging copy has changes to publish and
    /// no token has a copy of its own: kept with the edit, which publishes and uploads them (the
    /// upload carries the permissions and the mtime), instead of a provider call of their own
    /// (D-385). A write after an explicit mtime moves it again, as on a local file system. False
    /// (nothing kept) otherwise.
    public func holdAttributes(_ changes: ItemAttributeChanges, of identifier: ItemIdentifier) -> Bool {
        let key = Key(identifier: identifier, owner: nil)
        return state.withLock { state in
            guard let staged = state.staged[key], staged.machine.publishes,
                !state.staged.keys.contains(where: { $0.identifier == identifier && $0.owner != nil })
            else { return false }
            // On the file: a handle whose item is deleted meanwhile still shows them (fstat).
            if let permissions = changes.permissions { staged.file.holdPermissions(permissions) }
            // Under the lock: a publish that takes the staged edit sees the time with it.
            if let time = changes.modificationTime { staged.file.setModified(time) }
            return true
        }
    }

    /// `bytes` written at `offset` into the item's staging file.
    public func write(_ staging: StagingFile, _ bytes: [UInt8], at offset: Int64) async throws(CacheError) {
        try await staging.write(bytes, at: offset)
        markChanged(staging)
    }

    /// `write` on the calling thread when the staging file takes it at once (`StagingFile.writeNow`:
    /// a small file's bytes, D-387); nil otherwise.
    public func writeNow(_ staging: StagingFile, _ bytes: [UInt8], at offset: Int64) -> Result<Void, CacheError>? {
        guard let outcome = staging.writeNow(bytes, at: offset, limit: 1 << 20) else { return nil }
        if case .success = outcome { markChanged(staging) }
        return outcome
    }

    /// The staging file's length set to `size`.
    public func truncate(_ staging: StagingFile, to size: Int64) async throws(CacheError) {
        try await staging.truncate(to: size)
        markChanged(staging)
    }

    /// fallocate(2) through a write handle: space reserved in the staging file; a length that
    /// grows is a change (published like a write).
    public func allocate(
        _ staging: StagingFile, offset: Int64, length: Int64, keepSize: Bool
    ) async throws(CacheError) {
        let before = staging.size
        try await staging.allocate(offset: offset, length: length, keepSize: keepSize)
        if staging.size != before { markChanged(staging) }
    }

    private func markChanged(_ staging: StagingFile) {
        staging.setModified(wallClockTime())
        let key = Self.key(of: staging)
        state.withLock { state in
            if state.staged[key]?.file === staging {
                state.staged[key]!.machine.changed()
            }
        }
    }

    /// Whether `identifier` has a staging file open, shared or an access path's own.
    public func hasStaging(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { state in state.staged.keys.contains { $0.identifier == identifier } }
    }

    /// Number of write handles open on `identifier`'s shared staging file (or `owner`'s).
    public func writerCount(of identifier: ItemIdentifier, owner: String? = nil) -> Int {
        state.withLock { $0.staged[Key(identifier: identifier, owner: owner)]?.machine.writers ?? 0 }
    }

    /// fsync (`durable`) or a flush (close(2)): publishes what changed in `identifier`'s shared
    /// staging file. Nil when nothing did. `durable`: the bytes are forced to disk, also those of
    /// a publish before it that did not (D-381).
    public func sync(_ identifier: ItemIdentifier, durable: Bool = true) async throws(CacheError) -> PublishedVersion? {
        try await sync(Key(identifier: identifier, owner: nil), expected: nil, durable: durable)
    }

    /// `sync` of a write handle's staging file, wherever a rename moved it; nil when it is no
    /// longer the item's (dropped: its item was replaced or its token ended).
    public func sync(_ staging: StagingFile, durable: Bool = true) async throws(CacheError) -> PublishedVersion? {
        try await sync(Self.key(of: staging), expected: staging, durable: durable)
    }

    private func sync(_ key: Key, expected: StagingFile?, durable: Bool) async throws(CacheError) -> PublishedVersion? {
        await gate.acquire()
        defer { gate.release() }
        let identifier = key.identifier
        guard
            let (action, staged) = state.withLock({ state -> (StagingMachine.Action?, Staged)? in
                guard state.staged[key] != nil, expected == nil || state.staged[key]!.file === expected else {
                    return nil
                }
                return (state.staged[key]!.machine.sync(), state.staged[key]!)
            })
        else {
            if durable { try await makeDurable(identifier) }
            return nil
        }
        guard case .publish? = action else {
            // Nothing changed since the last publish; an fsync still forces its bytes to disk.
            if durable { try await makeDurable(identifier) }
            return nil
        }
        environment.logger.debug("\(identifier): sync publishes staging \(staged.file.path)")
        do {
            let published = try await publish(staged, syncing: durable || !staged.startedEmpty)
            // Whatever another handle published before without syncing (D-381).
            if durable { try await makeDurable(identifier) }
            return published
        } catch {
            state.withLock { $0.staged[key]?.machine.publishFailed() }
            throw error
        }
    }

    /// fsync(2) through any handle of `identifier`: its current version's content file is
    /// forced to disk if a publish at close left it unsynced (D-381).
    public func makeDurable(_ identifier: ItemIdentifier) async throws(CacheError) {
        guard let version = catalog.currentVersion(of: identifier) else { return }
        try await content.syncIfUnsynced(identifier, version)
    }

    // MARK: Files created through the mount (D-386)

    /// A file created through the mount that the provider gets later: its write-back record
    /// (a `.create` of `item`'s version, the empty "unborn:" one until a publish replaces it) is
    /// saved but not started. The first publish starts it with its bytes; a last close with
    /// nothing written, or a restart, starts it as it is (the empty file).
    func parkCreate(_ item: ProviderItem) {
        let record = UploadRecord(
            identifier: item.identifier, localVersion: item.contentVersion, baseVersion: nil, phase: .dirty,
            creates: true)
        state.withLock { state in
            state.uploads[item.identifier] = UploadMachine(
                record: record, initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
        }
        save(record)
    }

    /// Starts the parked create of `identifier`, if it has one that nothing started (no publish).
    private func startParkedCreate(_ identifier: ItemIdentifier) {
        let actions = state.withLock { state -> [UploadMachine.Action] in
            guard let machine = state.uploads[identifier], machine.record.creates,
                machine.record.localVersion.isUnborn, machine.inFlight == nil, machine.record.phase == .dirty
            else { return [] }
            return state.uploads[identifier]!.start()
        }
        perform(identifier, actions)
    }

    /// Drops the record of `identifier` when it is a create whose running version is `version`
    /// (its item gone from the catalog). True when dropped.
    private func dropOrphanedCreate(_ identifier: ItemIdentifier, version: ContentVersion) -> Bool {
        let dropped = state.withLock { state -> Bool in
            guard let machine = state.uploads[identifier], machine.record.creates, machine.inFlight == version else {
                return false
            }
            state.uploads[identifier] = nil
            return true
        }
        guard dropped else { return false }
        environment.provider.forgetDeferredCreate(identifier)
        environment.logger.notice("\(identifier): its item is gone before its create reached the provider: dropped")
        do { try environment.store.deleteUpload(identifier) } catch {
            environment.logger.warning("cannot delete an upload record: \(error)")
        }
        return true
    }

    /// A chmod of `identifier` reached the provider: a queued upload that carries permissions held
    /// earlier (D-385) carries these now, or it would undo the chmod.
    func permissionsSet(_ identifier: ItemIdentifier, to permissions: UInt16) {
        let saved = state.withLock { state -> UploadRecord? in
            guard var machine = state.uploads[identifier], machine.record.isPending, machine.record.permissions != nil
            else { return nil }
            machine.carry(permissions: permissions)
            state.uploads[identifier] = machine
            return machine.record
        }
        if let saved { save(saved) }
    }

    /// `identifier`, unborn, was created at the provider as the empty `created` by a namespace
    /// change that needed it there first (`ProviderCache.bearUnborn`): a record still to upload
    /// replaces that version next; one that had nothing but the empty file is done. Open edits
    /// start from `created`.
    func bornEmpty(_ identifier: ItemIdentifier, as created: ContentVersion, unborn: ContentVersion) {
        let (saved, deleted) = state.withLock { state -> (UploadRecord?, Bool) in
            for key in state.staged.keys where key.identifier == identifier && state.staged[key]!.base == unborn {
                state.staged[key]!.base = created
            }
            guard var machine = state.uploads[identifier], machine.record.creates else { return (nil, false) }
            if machine.record.localVersion.isUnborn {
                state.uploads[identifier] = nil
                return (nil, true)
            }
            machine.bornEmpty(as: created)
            state.uploads[identifier] = machine
            return (machine.record, false)
        }
        if let saved { save(saved) }
        if deleted {
            do { try environment.store.deleteUpload(identifier) } catch {
                environment.logger.warning("cannot delete an upload record: \(error)")
            }
        }
    }

    /// `closeWriter` of a write handle on the calling thread, when it publishes nothing (other
    /// writers remain, or nothing changed since the last publish: `tar`'s RELEASE after the
    /// FLUSH that published) and the gate is free now (D-387). False: nothing done, for
    /// `closeWriter`.
    public func closeWriterNow(_ staging: StagingFile) -> Bool {
        guard gate.tryAcquire() else { return false }
        defer { gate.release() }
        let key = Self.key(of: staging)
        let outcome = state.withLock { state -> (done: Bool, discard: Bool) in
            // No longer the item's (dropped, replaced): nothing to publish, as `closeWriter`.
            guard state.staged[key]?.file === staging else { return (true, false) }
            var machine = state.staged[key]!.machine
            let action = machine.closeWriter()
            if action == .publish { return (false, false) }
            // A parked create would start (a record saved): not on the FUSE thread (D-386).
            if action == .discard, let upload = state.uploads[staging.identifier], upload.record.creates,
                upload.record.localVersion.isUnborn
            {
                return (false, false)
            }
            state.staged[key]!.machine = machine
            guard action == .discard else { return (true, false) }
            state.staged[key] = nil
            return (true, true)
        }
        guard outcome.done else { return false }
        if outcome.discard {
            content.discardStaging(staging)
            content.retireStaging(staging)
            startParkedCreate(staging.identifier)
        }
        return true
    }

    /// The writes of a token that ended are dropped: its staging file `staging` is discarded
    /// unpublished, at once, whatever its handles do next (their token checks refuse them; their
    /// closes find nothing to publish). Nothing already published changes. False when `staging`
    /// is no longer the token's current one (published by moving, or dropped before).
    @discardableResult
    public func abandon(_ staging: StagingFile) async -> Bool {
        await gate.acquire()
        defer { gate.release() }
        let key = Self.key(of: staging)
        let dropped = state.withLock { state -> Bool in
            guard state.staged[key]?.file === staging else { return false }
            state.staged[key] = nil
            return true
        }
        guard dropped else { return false }
        startParkedCreate(staging.identifier)  // (none: a token's creates are not deferred)
        environment.logger.notice(
            "\(staging.identifier): the writes through token \(staging.owner ?? "-") are dropped unpublished (its access ended)"
        )
        content.discardStaging(staging)
        return true
    }

    /// A write handle closes; the last one publishes what changed or drops the staging file.
    public func closeWriter(_ identifier: ItemIdentifier) async throws(CacheError) -> PublishedVersion? {
        try await closeWriter(Key(identifier: identifier, owner: nil), expected: nil)
    }

    /// `closeWriter` of a write handle's staging file, wherever a rename moved it; nil when it
    /// is no longer the item's (dropped: its item was replaced or its token ended).
    public func closeWriter(_ staging: StagingFile) async throws(CacheError) -> PublishedVersion? {
        try await closeWriter(Self.key(of: staging), expected: staging)
    }

    private func closeWriter(_ key: Key, expected: StagingFile?) async throws(CacheError) -> PublishedVersion? {
        await gate.acquire()
        defer { gate.release() }
        let identifier = key.identifier
        guard
            let (action, staged) = state.withLock({ state -> (StagingMachine.Action?, Staged)? in
                guard state.staged[key] != nil, expected == nil || state.staged[key]!.file === expected else {
                    return nil
                }
                let action = state.staged[key]!.machine.closeWriter()
                let staged = state.staged[key]!
                if action != nil { state.staged[key] = nil }
                return (action, staged)
            })
        else { return nil }
        environment.logger.debug(
            "\(identifier): a writer of staging \(staged.file.path) closes: \(action.map { "\($0)" } ?? "others remain")"
        )
        switch action {
        case nil: return nil
        case .discard:
            content.discardStaging(staged.file)
            content.retireStaging(staged.file)
            // A new file closed unwritten (`touch`): created at the provider empty (D-386).
            startParkedCreate(identifier)
            return nil
        case .publish:
            // No handle writes it any more: its descriptor goes now, published or not (D-390).
            defer { content.retireStaging(staged.file) }
            do {
                return try await publish(staged, syncing: !staged.startedEmpty)
            } catch {
                // The close(2) before this release got the same error (its flush published).
                environment.logger.error(
                    "\(identifier): the last write handle closed, and its publish failed: \(error); "
                        + "the unpublished writes are dropped")
                content.discardStaging(staged.file)
                // A new file: created at the provider as the mount shows it, empty (D-386, D-390).
                if let upload = uploadRecord(of: identifier), upload.creates, upload.localVersion.isUnborn {
                    environment.logger.notice("\(identifier): created at the provider empty, as nothing was published")
                }
                startParkedCreate(identifier)
                throw error
            }
        }
    }

    /// The staging file as a new local version: a complete content record, the catalog's item,
    /// the upload queued.
    /// `syncing`: the bytes are forced to disk before the record is saved (not for a new file's
    /// publish at close, D-381).
    private func publish(_ staged: Staged, syncing: Bool) async throws(CacheError) -> PublishedVersion {
        let identifier = staged.file.identifier
        let version = ContentVersion("local:\(content.reserveFileNumber()).\(UInt32.random(in: 0...UInt32.max))")
        let record = try await content.publish(staged.file, as: version, syncing: syncing)
        environment.logger.debug(
            "\(identifier): published \(version) (\(record.size) bytes) as content file \(record.fileNumber)")
        // The last change's time (close and fsync change nothing, as on a local file system); an
        // explicit mtime set after it (utimens during the edit, D-375) stays.
        let modified =
            staged.file.modified ?? catalog.knownItem(identifier)?.modificationTime ?? wallClockTime()
        // A chmod held during the edit (D-385), taken with the bytes (a later one is the next
        // publish's).
        let key = Self.key(of: staged.file)
        let permissions = staged.file.takePermissions()
        var published = catalog.publishLocal(
            identifier, version: version, size: record.size, modificationTime: modified, permissions: permissions)
        if published == nil, (try? await catalog.item(identifier, maximumAge: .zero)) != nil {
            // Not known under this identifier: a move of a directory above it (RENAME_EXCHANGE of
            // two directories) may have left the catalog to list it again. The provider says.
            published = catalog.publishLocal(
                identifier, version: version, size: record.size, modificationTime: modified, permissions: permissions)
        }
        guard let item = published else {
            throw CacheError(.notFound, "\(identifier) is gone from the catalog")
        }
        let actions = state.withLock { state -> [UploadMachine.Action] in
            if state.uploads[identifier] == nil {
                state.uploads[identifier] = UploadMachine(
                    record: UploadRecord(
                        identifier: identifier, localVersion: version, baseVersion: staged.base, phase: .materialized),
                    initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
            }
            return state.uploads[identifier]!.published(
                version, base: staged.base, permissions: permissions, now: environment.timeline.now,
                settle: environment.options.uploadSettle, maximumSettle: environment.options.maximumUploadSettle)
        }
        perform(identifier, actions)
        // Its next publishes replace bytes the provider will have: synced (D-381).
        state.withLock { state in
            if state.staged[key]?.file === staged.file { state.staged[key]!.startedEmpty = false }
        }
        return PublishedVersion(item: item)
    }

    // MARK: Write-back

    /// The write-back record of `identifier`, if it has one.
    public func uploadRecord(of identifier: ItemIdentifier) -> UploadRecord? {
        state.withLock { $0.uploads[identifier]?.record }
    }

    /// Items still to upload (dirty, uploading, error).
    public var pendingUploads: [UploadRecord] {
        state.withLock { $0.uploads.values.map(\.record).filter(\.isPending) }
    }

    /// Waits until `identifier` has nothing left to upload (tests), or `timeout` of real time.
    public func waitUntilUploaded(_ identifier: ItemIdentifier, timeout: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if uploadRecord(of: identifier)?.isPending != true { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return false
    }

    /// Moves every record under `old` (the item, or a directory and its contents when identifiers
    /// are paths) to the same place under `new`: the namespace's renames call this.
    /// `subtree` false: `old` is a file, nothing lies under it, and only its own entries are
    /// looked up (no scan of every write-back entry, D-401).
    public func rekey(from old: ItemIdentifier, to new: ItemIdentifier, subtree: Bool = true) {
        rekey(among: subtree ? nil : old) { Self.rekeyed($0, from: old, to: new) }
    }

    /// One name of a file with other names goes (D-396): the staging copies of its open writers
    /// become `heir`'s, another name of the same file, and publish under it (its base version is
    /// the same file's). A copy `heir` already has for the same owner stays, and the other goes
    /// with the name. What the name uploaded last (its bytes published by an fsync, uploaded
    /// before the name went) is the copy's base from now on: its write-back record, which
    /// knew it, goes with the name, and the heir's first publish starts a record from the
    /// copy's base (D-412).
    public func handOverStaging(from old: ItemIdentifier, to heir: ItemIdentifier) {
        state.withLock { state in
            let uploaded = state.uploads[old].flatMap {
                $0.record.phase == .materialized ? $0.record.providerVersion : nil
            }
            for key in Array(state.staged.keys) where key.identifier == old {
                let target = Key(identifier: heir, owner: key.owner)
                guard state.staged[target] == nil, var staged = state.staged.removeValue(forKey: key) else { continue }
                staged.file.rename(to: heir)
                if let uploaded { staged.base = uploaded }
                state.staged[target] = staged
            }
        }
    }

    /// Two items swapped places (RENAME_EXCHANGE at a provider whose identifiers are paths):
    /// each one's records, and those below it, take the other's identifiers.
    public func exchange(_ one: ItemIdentifier, _ other: ItemIdentifier) {
        rekey { Self.rekeyed($0, from: one, to: other) ?? Self.rekeyed($0, from: other, to: one) }
    }

    /// The item `identifier` was replaced by a rename (or deleted) at the provider: its
    /// unpublished staging copies are dropped (their handles write on into nothing, as into an
    /// unlinked file) and its write-back entry and local version are forgotten, so that the item
    /// that takes its identifier starts clean (D-411).
    /// Also what lies under `identifier` (a directory deleted with its contents: D-374).
    /// `subtree` false: `identifier` is a file, and only its own entries are looked up (D-401).
    public func forget(_ identifier: ItemIdentifier, subtree: Bool = true) {
        func under(_ candidate: ItemIdentifier) -> Bool { Self.lies(candidate, atOrUnder: identifier) }
        let dropped = state.withLock { state -> ([StagingFile], [ItemIdentifier]) in
            var files: [StagingFile] = []
            for key in Array(state.staged.keys) where under(key.identifier) {
                files.append(state.staged.removeValue(forKey: key)!.file)
            }
            let uploads =
                subtree ? state.uploads.keys.filter(under) : state.uploads[identifier] == nil ? [] : [identifier]
            for upload in uploads { state.uploads[upload] = nil }
            return (files, uploads)
        }
        for file in dropped.0 { content.discardStaging(file) }
        catalog.forgetLocal(identifier, subtree: subtree)  // D-411
        for upload in dropped.1 {
            do { try environment.store.deleteUpload(upload) } catch {
                environment.logger.warning("cannot delete an upload record: \(error)")
            }
        }
    }

    /// Moves the staging copies (which later publish under the new identifier, D-371) and the
    /// write-back entries whose identifier `target` maps, all at once (a swap works).
    /// `candidate`: the only identifier that can move (a file), else every entry is asked.
    private func rekey(among candidate: ItemIdentifier? = nil, _ target: (ItemIdentifier) -> ItemIdentifier?) {
        let moved = state.withLock { state -> [(ItemIdentifier, UploadMachine)] in
            // Staged copies are the open writers: few. Matches are collected before a table
            // changes (one changed while iterated is copied whole first).
            var stagedMoves: [(Key, Staged)] = []
            for (key, staged) in state.staged {
                guard let identifier = target(key.identifier) else { continue }
                stagedMoves.append((key, staged))
                staged.file.rename(to: identifier)
            }
            for (key, _) in stagedMoves { state.staged[key] = nil }
            for (key, staged) in stagedMoves {
                state.staged[Key(identifier: staged.file.identifier, owner: key.owner)] = staged
            }
            var moved: [(ItemIdentifier, UploadMachine)] = []
            var machines: [(ItemIdentifier, UploadMachine)] = []
            let matching: [(ItemIdentifier, UploadMachine)] =
                if let candidate {
                    state.uploads[candidate].map { [(candidate, $0)] } ?? []
                } else {
                    state.uploads.filter { target($0.key) != nil }.map { ($0.key, $0.value) }
                }
            for (identifier, machine) in matching {
                guard let newIdentifier = target(identifier) else { continue }
                state.uploads[identifier] = nil
                var machine = machine
                machine.rename(to: newIdentifier)
                machines.append((newIdentifier, machine))
                moved.append((identifier, machine))
            }
            for (identifier, machine) in machines { state.uploads[identifier] = machine }
            return moved
        }
        // Deleted first: in a swap, a previous identifier is another entry's new one.
        for (previous, _) in moved {
            do { try environment.store.deleteUpload(previous) } catch {
                environment.logger.warning("cannot delete an upload record: \(error)")
            }
        }
        for (_, machine) in moved { save(machine.record) }
    }

    /// Where the write-back entry running (or retrying) `version` is now: `identifier`, unless a
    /// rename moved it while the upload ran or waited (local versions are unique, D-360).
    private func uploadKey(_ identifier: ItemIdentifier, version: ContentVersion) -> ItemIdentifier {
        state.withLock { Self.uploadKey(identifier, version: version, in: $0.uploads) }
    }

    private static func uploadKey(
        _ identifier: ItemIdentifier, version: ContentVersion, in uploads: [ItemIdentifier: UploadMachine]
    ) -> ItemIdentifier {
        if let machine = uploads[identifier], machine.inFlight == version || machine.record.localVersion == version {
            return identifier
        }
        return uploads.first { $0.value.inFlight == version }?.key
            ?? uploads.first { $0.value.record.localVersion == version }?.key ?? identifier
    }

    /// Finds the entry of `version` (`uploadKey`) and applies `change` to it under one lock, so
    /// that a rename cannot move it, or put another item's entry under `identifier`, in between.
    private func applyToUpload(
        _ identifier: ItemIdentifier, version: ContentVersion,
        _ change: (inout UploadMachine) -> [UploadMachine.Action]
    ) -> (ItemIdentifier, [UploadMachine.Action], UploadPhase?) {
        state.withLock { state in
            let key = Self.uploadKey(identifier, version: version, in: state.uploads)
            guard state.uploads[key] != nil else { return (key, [], nil) }
            let actions = change(&state.uploads[key]!)
            return (key, actions, state.uploads[key]!.record.phase)
        }
    }

    /// utimens set `identifier`'s mtime: its open staging copies show and publish that one until
    /// their next change.
    public func modificationSet(of identifier: ItemIdentifier) {
        let files = state.withLock { state in
            state.staged.filter { $0.key.identifier == identifier }.map(\.value.file)
        }
        for file in files { file.setModified(nil) }
    }

    /// The mount itself changed `identifier`'s provider version `from` into `to` (D-375): edits
    /// that started from `from` (a queued upload, open staging copies) now start from `to`, so
    /// their upload does not take the mount's own chmod or utimens for a conflicting change.
    func rebase(_ identifier: ItemIdentifier, from: ContentVersion, to: ContentVersion) {
        let saved = state.withLock { state -> UploadRecord? in
            for key in state.staged.keys where key.identifier == identifier && state.staged[key]!.base == from {
                state.staged[key]!.base = to
            }
            guard state.uploads[identifier]?.rebase(from: from, to: to) == true else { return nil }
            return state.uploads[identifier]!.record
        }
        if let saved { save(saved) }
    }

    // MARK: Moves and upload calls (D-372)

    /// A move through the mount of `identifiers` begins: new upload calls for them (and what lies
    /// under them) wait, and this waits for the ones at the provider to end, so that no upload
    /// addresses an item by a name the move is changing (it would write the old name anew, or
    /// replace another item that took it). Call `endMove` after the move and its re-keying.
    /// Cancelling the task (an interrupted request) ends the wait: the move is given up (its names
    /// let go, as `endMove` does) and this throws `.cancelled` (D-400).
    func beginMove(_ identifiers: [ItemIdentifier]) async throws(CacheError) {
        state.withLock { $0.moving += identifiers }
        while true {
            if Task.isCancelled {
                endMove(identifiers)
                throw CacheError(.cancelled, "interrupted while waiting for an upload of the item to end")
            }
            var clear = false
            let ticket = state.withLock { state -> UInt64 in
                defer { state.nextMoveTicket += 1 }
                return state.nextMoveTicket
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let waits = state.withLock { state -> Bool in
                        let busy = state.callsInFlight.keys.contains { key in
                            identifiers.contains { Self.lies(key, atOrUnder: $0) }
                        }
                        if !busy { clear = true }
                        // Cancelled before the handler could find it: not registered at all.
                        guard busy, !Task.isCancelled else { return false }
                        state.blockedMoves[ticket] = continuation
                        return true
                    }
                    if !waits { continuation.resume() }
                }
            } onCancel: {
                state.withLock { $0.blockedMoves.removeValue(forKey: ticket) }?.resume()
            }
            if clear { return }
        }
    }

    /// `beginMove` on the calling thread, when no upload call of the items runs (D-426): true
    /// when begun (then `endMove`), false when one runs (nothing begun).
    func tryBeginMove(_ identifiers: [ItemIdentifier]) -> Bool {
        state.withLock { state -> Bool in
            let busy = state.callsInFlight.keys.contains { key in identifiers.contains { Self.lies(key, atOrUnder: $0) }
            }
            if !busy { state.moving += identifiers }
            return !busy
        }
    }

    func endMove(_ identifiers: [ItemIdentifier]) {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            for identifier in identifiers {
                if let index = state.moving.firstIndex(of: identifier) { state.moving.remove(at: index) }
            }
            defer { state.blockedCalls = [] }
            return state.blockedCalls
        }
        for waiter in waiting { waiter.resume() }
    }

    /// Registers an upload call of `version` at the provider, once no move is changing its item's
    /// name; returns the identifier to address (where renames have moved the entry).
    private func beginUploadCall(_ identifier: ItemIdentifier, version: ContentVersion) async -> ItemIdentifier {
        while true {
            var key: ItemIdentifier?
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let proceed = state.withLock { state -> Bool in
                    let current = Self.uploadKey(identifier, version: version, in: state.uploads)
                    if state.moving.contains(where: { Self.lies(current, atOrUnder: $0) }) {
                        state.blockedCalls.append(continuation)
                        return false
                    }
                    state.callsInFlight[current, default: 0] += 1
                    key = current
                    return true
                }
                if proceed { continuation.resume() }
            }
            if let key { return key }
        }
    }

    private func endUploadCall(_ key: ItemIdentifier) {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.callsInFlight[key, default: 1] -= 1
            if state.callsInFlight[key] == 0 { state.callsInFlight[key] = nil }
            defer { state.blockedMoves = [:] }
            return Array(state.blockedMoves.values)
        }
        for waiter in waiting { waiter.resume() }
    }

    /// `identifier` under `new` when it is `old` or lies under it ("old/…").
    static func rekeyed(
        _ identifier: ItemIdentifier, from old: ItemIdentifier, to new: ItemIdentifier
    ) -> ItemIdentifier? {
        if identifier == old { return new }
        let prefix = old.rawValue + "/"
        guard !old.rawValue.isEmpty, identifier.rawValue.hasPrefix(prefix) else { return nil }
        return ItemIdentifier(new.rawValue + "/" + identifier.rawValue.dropFirst(prefix.count))
    }

    private func save(_ record: UploadRecord) {
        do { try environment.store.saveUpload(record) } catch {
            environment.logger.warning("\(record.identifier): cannot save its upload record: \(error)")
        }
    }

    private func perform(_ identifier: ItemIdentifier, _ actions: [UploadMachine.Action]) {
        for action in actions {
            switch action {
            case .save(let record): save(record)
            case .upload(let version, let base):
                spawn { await self.upload(identifier, version: version, base: base) }
            case .settle(let delay, let version):
                let timeline = environment.timeline
                spawn {
                    do { try await timeline.sleep(for: delay) } catch { return }
                    let (current, next, _) = self.applyToUpload(identifier, version: version) {
                        $0.settleDue(version, now: timeline.now)
                    }
                    self.perform(current, next)
                }
            case .retry(let delay, let version):
                let timeline = environment.timeline
                spawn {
                    do { try await timeline.sleep(for: delay) } catch { return }
                    let (current, next, _) = self.applyToUpload(identifier, version: version) { $0.retryDue() }
                    self.perform(current, next)
                }
            }
        }
    }

    private func spawn(_ work: @escaping @Sendable () async -> Void) {
        state.withLock { state in
            guard !state.closed else { return }
            let id = state.nextTask
            state.nextTask += 1
            state.tasks[id] = Task {
                await work()
                _ = self.state.withLock { $0.tasks.removeValue(forKey: id) }
            }
        }
    }

    /// One upload attempt of `version`. A rename while it runs moves its entry: the identifier
    /// is looked up again before and after the provider's call.
    private func upload(_ requested: ItemIdentifier, version: ContentVersion, base: ContentVersion?) async {
        var identifier = uploadKey(requested, version: version)
        let provider = environment.provider
        let result: Result<ProviderItem, any Error>
        var conflictName: String?
        var entry: ContentEntry?
        // A file created through the mount and closed unwritten: the empty file (D-386).
        let empty = version.isUnborn ? try? await content.emptyFile() : nil
        if !version.isUnborn, let item = catalog.knownItem(identifier), item.contentVersion == version,
            let pinned = try? await content.pin(item, isCurrent: { _ in true })
        {
            entry = pinned
        }
        defer { if let entry { content.unpin(entry) } }
        // Every byte of the version must be in its content file: a pin of a version the store
        // has no complete record of (a race with a move) makes an empty entry, whose file would
        // upload as zeros.
        // A file to create whose item the catalog lost (its directory removed outside the mount,
        // D-386): there is nothing to create it from or in; the record goes, or it would retry
        // forever.
        if catalog.knownItem(identifier) == nil, dropOrphanedCreate(identifier, version: version) { return }
        guard let item = catalog.knownItem(identifier),
            let path = empty
                ?? entry.flatMap({ $0.isMaterialized ? content.contentFilePath(identifier, version) : nil })
        else {
            // (A move during the pin retires the pinned entry: retried under the new identifier.)
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: "the local version is no longer stored")
            }
            return perform(current, next)
        }
        // No move through the mount changes the item's name while the provider's call runs.
        identifier = await beginUploadCall(identifier, version: version)
        // The record went while this waited (a delete, or a birth that left nothing to upload,
        // D-386): nothing to send, and its identifier may name another file by now.
        guard state.withLock({ $0.uploads[identifier]?.inFlight == version }) else {
            endUploadCall(identifier)
            return
        }
        // What the provider shows of the item until its result is recorded is this upload
        // (D-403: not told as a change of the provider's).
        let own = catalog.beginOwnChange(of: [identifier])
        // Its directory's metadata is passing until the call ends (D-384).
        let directory = catalog.knownItem(identifier)?.parent ?? item.parent
        let holding = catalog.beginWriting(into: directory, current: try? provider.itemNow(for: directory))
        // The base as it is now: a chmod or utimens through the mount may have rebased it while
        // this call waited (D-375).
        // The permissions a chmod during the edit set (D-385) ride along.
        let (base, permissions, creates) = state.withLock { state -> (ContentVersion?, UInt16?, Bool) in
            guard let machine = state.uploads[identifier], machine.inFlight == version else {
                return (base, nil, false)
            }
            return (machine.record.baseVersion, machine.record.permissions, machine.record.creates)
        }
        let current = catalog.knownItem(identifier) ?? item
        do {
            // Not at the provider yet (D-386): created under its name, with its mode and mtime.
            let target: UploadTarget =
                creates ? .create(name: current.name, in: current.parent) : .replace(identifier, baseVersion: base)
            let uploaded = try await provider.upload(
                from: path, to: target, permissions: creates ? permissions ?? current.permissions : permissions,
                modificationTime: current.modificationTime)
            // Made by the upload: given to whoever created it through the mount (D-397).
            result = .success(
                creates
                    ? await environment.owned(
                        uploaded, by: current.owner, permissions: permissions ?? current.permissions)
                    : uploaded)
        } catch let error as ProviderError
            where error.code == .versionChanged || (creates && error.code == .alreadyExists)
        {
            // Keep both: the local edit under a conflict name, the provider's under the original.
            environment.logger.notice("\(identifier): the provider's version changed since the edit began: \(error)")
            do {
                let (name, created) = try await uploadConflictCopy(current, from: path)
                conflictName = name
                result = .success(created)
            } catch {
                result = .failure(error)
            }
        } catch {
            result = .failure(error)
        }
        // The result is applied before the call counts as ended: a move or a chmod/utimens that
        // waited for it (D-372, D-375) then sees the provider version this upload made, and
        // rebases from it (applied after, it was left with the version before its own change,
        // and the next edit became a conflict copy).
        defer {
            if holding { catalog.endWriting(into: directory) }
            catalog.endOwnChange(own)
            endUploadCall(identifier)
        }
        switch result {
        case .success(let uploaded):
            // Created (or kept as a conflict copy): the provider's answers about the identifier
            // count again (D-386).
            if creates { catalog.born(identifier) }
            if let conflictName {
                catalog.dropLocal(identifier)
                catalog.applyCreated(uploaded)
                _ = try? await catalog.item(identifier, maximumAge: .zero)
                let (current, next, _) = applyToUpload(identifier, version: version) {
                    $0.conflictResolved(conflictName: conflictName)
                }
                environment.logger.notice("\(current): conflict; the local edit is kept as \(conflictName)")
                perform(current, next)
            } else {
                let (current, next, phase) = applyToUpload(identifier, version: version) {
                    $0.uploaded(version, providerVersion: uploaded.contentVersion, now: self.environment.timeline.now)
                }
                if phase == .materialized {
                    catalog.localUploaded(
                        current, version: version, providerVersion: uploaded.contentVersion, base: base)
                }
                // The file's other names (hard links, D-396) have the new version too: an edit
                // through one of them that started from the version replaced starts from it now,
                // and what they showed is asked for again (D-410).
                for name in catalog.otherNames(of: current) {
                    if let base { rebase(name, from: base, to: uploaded.contentVersion) }
                    catalog.otherNameUploaded(name, from: base, to: uploaded.contentVersion)
                }
                // An empty file created unwritten: the provider's empty version is the item's now.
                if creates { catalog.apply(uploaded) }
                perform(current, next)
            }
        case .failure(let error):
            let message = "\(CacheError.from(error))"
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: message)
            }
            environment.logger.warning("\(current): upload failed: \(message)")
            perform(current, next)
        }
    }

    /// Uploads the local edit beside the provider's version, as "name (conflict YYYY-MM-DD
    /// HHMMSS).ext" (with " 2", " 3"… before the extension when taken).
    private func uploadConflictCopy(_ item: ProviderItem, from path: String) async throws -> (String, ProviderItem) {
        let stamp = Self.conflictStamp(wallClockTime())
        var attempt = 1
        while true {
            let name = Self.conflictName(item.name, stamp: stamp, attempt: attempt)
            do {
                let created = try await environment.provider.upload(
                    from: path, to: .create(name: name, in: item.parent), permissions: item.permissions,
                    modificationTime: item.modificationTime)
                return (name, created)
            } catch let error as ProviderError where error.code == .alreadyExists && attempt < 100 {
                attempt += 1
            }
        }
    }

    /// "YYYY-MM-DD HHMMSS" (UTC) of `time`.
    static func conflictStamp(_ time: ItemTime) -> String {
        var seconds = time_t(time.seconds)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday)) "
            + "\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec))"
    }

    /// `name` with " (conflict STAMP)" before its extension ("a.txt" → "a (conflict …).txt"; a
    /// leading dot is not an extension).
    static func conflictName(_ name: String, stamp: String, attempt: Int = 1) -> String {
        let suffix = attempt > 1 ? " (conflict \(stamp) \(attempt))" : " (conflict \(stamp))"
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return String(name[..<dot]) + suffix + String(name[dot...])
        }
        return name + suffix
    }

    /// Starts `identifier`'s upload now if it waits out its settle (D-405): what must reach the
    /// provider before a change of the namespace does not wait for it.
    func expedite(_ identifier: ItemIdentifier) {
        let actions = state.withLock { $0.uploads[identifier]?.expedite() } ?? []
        perform(identifier, actions)
    }

    /// Starts the uploads waiting out their settle (D-405) and waits, up to `limit`, for them and
    /// for those running to end. Failed ones retry at the next start, as every queued one does.
    func flush(within limit: Duration) async {
        guard limit > .zero else { return }
        let started = state.withLock { state -> [(ItemIdentifier, [UploadMachine.Action])] in
            var started: [(ItemIdentifier, [UploadMachine.Action])] = []
            for identifier in Array(state.uploads.keys) {
                let actions = state.uploads[identifier]!.expedite()
                if !actions.isEmpty { started.append((identifier, actions)) }
            }
            return started
        }
        for (identifier, actions) in started { perform(identifier, actions) }
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            let running = state.withLock { state in state.uploads.values.contains { $0.inFlight != nil } }
            guard running else { return }
            try? await Task.sleep(for: .milliseconds(10))
        }
        environment.logger.warning("uploads still running after \(limit): they resume at the next start")
    }

    /// Cancels retries and running uploads (a restart resumes them from the queue). Does not wait
    /// for an upload call that ignores cancellation: its outcome, if it comes, is still recorded
    /// (the provider's call is atomic, and the base version check sees a repeated one).
    func shutdown() async {
        await flush(within: environment.options.shutdownFlush)
        let tasks = state.withLock { state -> [Task<Void, Never>] in
            state.closed = true
            return Array(state.tasks.values)
        }
        for task in tasks { task.cancel() }
    }
}

/// The wall clock now, as an item time (mtime of a publish).
func wallClockTime() -> ItemTime {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return ItemTime(seconds: Int64(now.tv_sec), nanoseconds: Int32(now.tv_nsec))
}

extension ProviderCache {
    /// A new empty file `name` in `parent`, as create(2) through the mount makes it.
    ///
    /// Where the provider defers creates (`deferCreateNow`, D-386) nothing is made there now: the
    /// name is checked free, the directory's mtime moves, and the catalog holds the file (its
    /// identifier the one the provider will give it) until the write-back's `.create` upload of
    /// its first version, or of the empty file when it is closed unwritten. Elsewhere the empty
    /// file is made at the provider at once (an empty `.create` upload, D-361), so its identifier
    /// is the provider's from the start.
    /// `deferring` false: made at once whatever the provider offers (a create through a token's
    /// access path, whose expiry must find the file at the provider, D-386).
    /// `owner`: who made it (D-397); a deferred file carries it to its `.create` upload.
    public func createFile(
        named name: String, in parent: ItemIdentifier, permissions: UInt16, deferring: Bool = true,
        owner: ItemOwner? = nil
    ) async throws(CacheError) -> ProviderItem {
        let provider = environment.provider
        var deferred: DeferredCreate?
        if deferring {
            do { deferred = try provider.deferCreateNow(named: name, in: parent) } catch {
                throw CacheError.from(error)
            }
        }
        if let deferred {
            let item = ProviderItem(
                identifier: deferred.identifier, parent: parent, name: name, kind: .file, size: 0,
                modificationTime: wallClockTime(), contentVersion: .unborn(content.reserveFileNumber()),
                permissions: permissions, owner: owner)
            // The catalog first: a crash before the record leaves an item the provider never had,
            // which the next revalidation drops (the other order left a record of nothing).
            guard catalog.createdUnborn(item, directory: deferred.directory) else {
                throw CacheError(.exists, "'\(name)' exists")
            }
            writes.parkCreate(item)
            return item
        }
        let created: ProviderItem
        let own = catalog.beginOwnChange(of: [], naming: [(parent, name)])  // D-403
        defer { catalog.endOwnChange(own) }
        do {
            let empty = try await content.emptyFile()
            created = try await provider.upload(
                from: empty, to: .create(name: name, in: parent), permissions: permissions,
                modificationTime: wallClockTime())
        } catch {
            throw CacheError.from(error)
        }
        return catalog.applyCreated(await environment.owned(created, by: owner, permissions: permissions))
    }

    /// Creates at the provider, now and empty, the files at or under `roots` that were created
    /// through the mount and are not there yet (D-386): a namespace change (a rename, an rmdir, a
    /// chmod at the provider) needs them there first. Their queued uploads then replace that
    /// empty version. Call with `writes.beginMove(roots)` held: no upload call of theirs runs.
    func bearUnborn(atOrUnder roots: [ItemIdentifier]) async throws(CacheError) {
        let provider = environment.provider
        for identifier in catalog.unborn(atOrUnder: roots) {
            guard let item = catalog.unbornItem(identifier) else { continue }
            let empty = try await content.emptyFile()
            let made = try await providerCall {
                try await provider.upload(
                    from: empty, to: .create(name: item.name, in: item.parent), permissions: item.permissions,
                    modificationTime: item.modificationTime)
            }
            let created = await environment.owned(made, by: item.owner, permissions: item.permissions)
            environment.logger.debug("\(identifier): created at the provider before a change of its name")
            writes.bornEmpty(identifier, as: created.contentVersion, unborn: item.contentVersion)
            catalog.born(identifier)
            if created.identifier != identifier { identifiersMoved(from: identifier, to: created.identifier) }
            catalog.apply(created)
        }
    }
}
