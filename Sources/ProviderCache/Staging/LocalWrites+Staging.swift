// Staging: a write handle opens on an item's staging copy (made empty, or copied from the
// current content), writes, truncates and allocates into it; stat and chmod/utimens see what it
// holds. Its publish, fsync and close are in LocalWrites+Publish.swift.

import Diagnostics
public import ProviderModel
import SystemSupport

extension LocalWrites {
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
            let entry = try await stagingContent.pin(item) { [stagingCatalog] in
                stagingCatalog.currentVersion(of: item.identifier) == $0
            }
            source = entry
            do {
                try await entry.ensurePresent(0..<item.size)
            } catch {
                stagingContent.unpin(entry)
                throw error
            }
        }
        let file: StagingFile
        do {
            file = try await stagingContent.makeStaging(item.identifier, copying: source, owner: owner)
        } catch {
            if let source { stagingContent.unpin(source) }
            throw error
        }
        if let source { stagingContent.unpin(source) }
        // O_TRUNC of a file with bytes, or of an existing one (`touching`), is a change (st_mtime now).
        let changed = truncating && (item.size > 0 || touching)
        if changed { file.setModified(wallClockTime()) }
        let base = stagingCatalog.providerBase(of: item.identifier)
        state.withLock { state in
            var machine = StagingMachine(startsModified: changed)
            machine.openWriter()
            state.staged[key] = Staged(
                machine: machine, file: file, base: base, startedEmpty: item.size == 0, since: environment.timeline.now)
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

    /// utimens set `identifier`'s mtime: its open staging copies show and publish that one until
    /// their next change.
    public func modificationSet(of identifier: ItemIdentifier) {
        let files = state.withLock { state in
            state.staged.filter { $0.key.identifier == identifier }.map(\.value.file)
        }
        for file in files { file.setModified(nil) }
    }
}
