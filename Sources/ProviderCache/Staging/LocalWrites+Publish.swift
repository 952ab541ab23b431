// Staging's end: fsync and flush publish what changed as a new local version and queue its upload
// (WriteBack/); the last close publishes or drops the copy; a token that ends abandons its own.

import Diagnostics
public import ProviderModel
import SystemSupport

/// What a publish made.
public struct PublishedVersion: Sendable, Equatable {
    public var item: ProviderItem
}

extension LocalWrites {
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
        guard let version = stagingCatalog.currentVersion(of: identifier) else { return }
        try await stagingContent.syncIfUnsynced(identifier, version)
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
            stagingContent.discardStaging(staging)
            stagingContent.retireStaging(staging)
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
        stagingContent.discardStaging(staging)
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
            stagingContent.discardStaging(staged.file)
            stagingContent.retireStaging(staged.file)
            // A new file closed unwritten (`touch`): created at the provider empty (D-386).
            startParkedCreate(identifier)
            return nil
        case .publish:
            // No handle writes it any more: its descriptor goes now, published or not (D-390).
            defer { stagingContent.retireStaging(staged.file) }
            do {
                return try await publish(staged, syncing: !staged.startedEmpty)
            } catch {
                // The close(2) before this release got the same error (its flush published).
                environment.logger.error(
                    "\(identifier): the last write handle closed, and its publish failed: \(error); "
                        + "the unpublished writes are dropped")
                stagingContent.discardStaging(staged.file)
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
        let version = ContentVersion("local:\(stagingContent.reserveFileNumber()).\(UInt32.random(in: 0...UInt32.max))")
        let record = try await stagingContent.publish(staged.file, as: version, syncing: syncing)
        environment.logger.debug(
            "\(identifier): published \(version) (\(record.size) bytes) as content file \(record.fileNumber)")
        // The last change's time (close and fsync change nothing, as on a local file system); an
        // explicit mtime set after it (utimens during the edit, D-375) stays.
        let modified =
            staged.file.modified ?? stagingCatalog.knownItem(identifier)?.modificationTime ?? wallClockTime()
        // A chmod held during the edit (D-385), taken with the bytes (a later one is the next
        // publish's).
        let key = Self.key(of: staged.file)
        let permissions = staged.file.takePermissions()
        // The upload queued once the catalog holds the version, its record saved with the
        // catalog's item in one transaction (D-529).
        var actions: [UploadMachine.Action] = []
        let queue = { () -> [UploadRecord] in
            actions = self.queuePublished(version, of: identifier, staged: staged, permissions: permissions)
            return actions.compactMap(\.savedRecord)
        }
        var published = stagingCatalog.publishLocal(
            identifier, version: version, size: record.size, modificationTime: modified, permissions: permissions,
            savingWith: queue)
        if published == nil, (try? await stagingCatalog.item(identifier, maximumAge: .zero)) != nil {
            // Not known under this identifier: a move of a directory above it (RENAME_EXCHANGE of
            // two directories) may have left the catalog to list it again. The provider says.
            published = stagingCatalog.publishLocal(
                identifier, version: version, size: record.size, modificationTime: modified, permissions: permissions,
                savingWith: queue)
        }
        guard let item = published else {
            throw CacheError(.notFound, "\(identifier) is gone from the catalog")
        }
        perform(identifier, actions.filter { $0.savedRecord == nil })
        // Its next publishes replace bytes the provider will have: synced (D-381).
        state.withLock { state in
            if state.staged[key]?.file === staged.file { state.staged[key]!.startedEmpty = false }
        }
        return PublishedVersion(item: item)
    }

    /// The write-back's part of a publish: `version` queued in `identifier`'s machine. Its
    /// actions, the record's save among them.
    private func queuePublished(
        _ version: ContentVersion, of identifier: ItemIdentifier, staged: Staged, permissions: UInt16?
    ) -> [UploadMachine.Action] {
        state.withLock { state -> [UploadMachine.Action] in
            if state.uploads[identifier] == nil {
                state.uploads[identifier] = UploadMachine(
                    record: UploadRecord(
                        identifier: identifier, localVersion: version, baseVersion: staged.base, phase: .materialized),
                    initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
            }
            // The copy was made after the item's last upload: its base is the provider's news.
            // (The item's own record says when: a time kept by identifier outlived a rename or
            // unlink, and another item's older upload made a stale base "news", D-477.)
            let fresh = state.uploads[identifier]!.uploadedAt.map { staged.since > $0 } ?? false
            return state.uploads[identifier]!.published(
                version, base: staged.base, baseIsNewer: fresh, permissions: permissions, now: environment.timeline.now,
                settle: environment.options.uploadSettle, maximumSettle: environment.options.maximumUploadSettle)
        }
    }
}
