// The façade's part of writing: a file created through the mount (at once, or deferred to its
// first upload, D-386), and the deferred ones created at the provider before a namespace change
// needs them there. Staging copies are in Staging/, the write-back queue in WriteBack/, their host
// `LocalWrites` in LocalWrites.swift.

import Diagnostics
public import ProviderModel
import SystemSupport

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
            // Not looked up at the provider (a remote's deferral, D-491): a name the catalog
            // holds for an item at the provider is taken.
            if !deferred.nameChecked, catalog.knownItem(deferred.identifier) != nil,
                !catalog.isUnborn(deferred.identifier)
            {
                throw CacheError(.exists, "'\(name)' exists")
            }
            let item = ProviderItem(
                identifier: deferred.identifier, parent: parent, name: name, kind: .file, size: 0,
                modificationTime: wallClockTime(), contentVersion: .unborn(content.reserveFileNumber()),
                permissions: permissions, owner: owner)
            // The item and its parked record in one transaction (D-529); the catalog decides
            // first whether the name is free, then the write-back holds the record.
            let record = LocalWrites.parkedCreate(item)
            guard catalog.createdUnborn(item, directory: deferred.directory, record: record) else {
                throw CacheError(.exists, "'\(name)' exists")
            }
            writes.park(record)
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

// MARK: Write handles

/// What the file system's write handles call (D-440): the façade passes each to `LocalWrites`
/// (Staging/), so that the file system reaches writing through `ProviderCache` alone.
extension ProviderCache {
    /// `LocalWrites.openWriter`: a write handle opens on `item`'s staging copy.
    public func openWriter(
        _ item: ProviderItem, truncating: Bool, touching: Bool = false, owner: String? = nil
    ) async throws(CacheError) -> StagingFile {
        try await writes.openWriter(item, truncating: truncating, touching: touching, owner: owner)
    }

    /// `LocalWrites.write`: bytes into a write handle's staging copy.
    public func write(_ staging: StagingFile, _ bytes: [UInt8], at offset: Int64) async throws(CacheError) {
        try await writes.write(staging, bytes, at: offset)
    }

    /// `LocalWrites.writeNow`: `write` on the calling thread when the copy takes it at once.
    public func writeNow(_ staging: StagingFile, _ bytes: [UInt8], at offset: Int64) -> Result<Void, CacheError>? {
        writes.writeNow(staging, bytes, at: offset)
    }

    /// `LocalWrites.truncate`: the staging copy's length set.
    public func truncate(_ staging: StagingFile, to size: Int64) async throws(CacheError) {
        try await writes.truncate(staging, to: size)
    }

    /// `LocalWrites.allocate`: fallocate(2) through a write handle.
    public func allocate(
        _ staging: StagingFile, offset: Int64, length: Int64, keepSize: Bool
    ) async throws(CacheError) {
        try await writes.allocate(staging, offset: offset, length: length, keepSize: keepSize)
    }

    /// `LocalWrites.sync`: fsync or a flush publishes what changed.
    public func sync(_ staging: StagingFile, durable: Bool = true) async throws(CacheError) -> PublishedVersion? {
        try await writes.sync(staging, durable: durable)
    }

    /// `LocalWrites.makeDurable`: fsync(2) through any handle of `identifier`.
    public func makeDurable(_ identifier: ItemIdentifier) async throws(CacheError) {
        try await writes.makeDurable(identifier)
    }

    /// `LocalWrites.closeWriter`: a write handle closes; the last one publishes or drops the copy.
    public func closeWriter(_ staging: StagingFile) async throws(CacheError) -> PublishedVersion? {
        try await writes.closeWriter(staging)
    }

    /// `LocalWrites.closeWriterNow`: `closeWriter` on the calling thread when it publishes nothing.
    public func closeWriterNow(_ staging: StagingFile) -> Bool { writes.closeWriterNow(staging) }

    /// `LocalWrites.abandon`: the writes of a token that ended are dropped.
    @discardableResult
    public func abandon(_ staging: StagingFile) async -> Bool { await writes.abandon(staging) }

    /// `LocalWrites.staging(of:owner:)`: the staging copy write handles have open.
    public func staging(of identifier: ItemIdentifier, owner: String? = nil) -> StagingFile? {
        writes.staging(of: identifier, owner: owner)
    }

    /// `LocalWrites.staged`: what stat shows of an item's shared staging copy.
    public func staged(_ identifier: ItemIdentifier) -> (size: Int64, modified: ItemTime?, permissions: UInt16?)? {
        writes.staged(identifier)
    }

    /// `LocalWrites.holdAttributes`: chmod or utimens kept with an open edit (D-385).
    public func holdAttributes(_ changes: ItemAttributeChanges, of identifier: ItemIdentifier) -> Bool {
        writes.holdAttributes(changes, of: identifier)
    }

    /// `LocalWrites.modificationSet`: utimens set the mtime open staging copies show.
    public func modificationSet(of identifier: ItemIdentifier) { writes.modificationSet(of: identifier) }
}
