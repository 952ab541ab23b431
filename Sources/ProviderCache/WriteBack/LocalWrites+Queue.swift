// The write-back queue: one upload record per item, saved in the store and run by an
// `UploadMachine` (settle, upload, retry with backoff); the creates the provider gets later
// (D-386); what tests and `providerfs status` read of it. One attempt is LocalWrites+Upload.swift.

import Diagnostics
public import ProviderModel
import SystemSupport

extension LocalWrites {
    /// The write-back record of a file created through the mount that the provider gets later:
    /// a `.create` of `item`'s version, the empty "unborn:" one until a publish replaces it. The
    /// catalog saves it with the item (`Catalog.createdUnborn`, D-529), then `park` holds it.
    static func parkedCreate(_ item: ProviderItem) -> UploadRecord {
        UploadRecord(
            identifier: item.identifier, localVersion: item.contentVersion, baseVersion: nil, phase: .dirty,
            creates: true)
    }

    /// Holds `record` (`parkedCreate`, saved) without starting it. The first publish starts it
    /// with its bytes; a last close with nothing written, or a restart, starts it as it is (the
    /// empty file).
    func park(_ record: UploadRecord) {
        state.withLock { state in
            state.uploads[record.identifier] = UploadMachine(
                record: record, initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
        }
    }

    /// Starts the parked create of `identifier`, if it has one that nothing started (no publish).
    func startParkedCreate(_ identifier: ItemIdentifier) {
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
    func dropOrphanedCreate(_ identifier: ItemIdentifier, version: ContentVersion) -> Bool {
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

    /// A chmod or utimens of `identifier` reached the provider: a queued upload that carries
    /// attributes held earlier (D-385, D-460) carries these now, or it would undo them.
    func attributesCarried(_ identifier: ItemIdentifier, _ made: HeldAttributes) {
        let saved = state.withLock { state -> UploadRecord? in
            guard state.uploads[identifier]?.record.isPending == true, state.uploads[identifier]!.carry(made) else {
                return nil
            }
            return state.uploads[identifier]!.record
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

    /// Where the write-back entry running (or retrying) `version` is now: `identifier`, unless a
    /// rename moved it while the upload ran or waited (local versions are unique, D-360).
    func uploadKey(_ identifier: ItemIdentifier, version: ContentVersion) -> ItemIdentifier {
        state.withLock { Self.uploadKey(identifier, version: version, in: $0.uploads) }
    }

    static func uploadKey(
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
    func applyToUpload(
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

    func save(_ record: UploadRecord) {
        do { try environment.store.saveUpload(record) } catch {
            environment.logger.warning("\(record.identifier): cannot save its upload record: \(error)")
        }
    }

    func perform(_ identifier: ItemIdentifier, _ actions: [UploadMachine.Action]) {
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
            case .setAttributes(let version):
                spawn { await self.makeHeldAttributes(identifier, version: version) }
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

    func spawn(_ work: @escaping @Sendable () async -> Void) {
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
}
