// The lazy materialization engine: a façade over its two parts, so that the file system keeps one
// handle. The `Catalog` is the provider's namespace as last seen (listings, TTLs, lookups, misses,
// pushed changes); the `ContentStore` is the life of content entries (sparse files, range maps,
// pins, downloads' status). The façade builds both from one store and directory, answers what
// needs both (`status`, `pinContent`), and shuts both down.
//
// Lock order: `Catalog.state` → `ContentStore.state` → `ContentEntry.state`.

public import Diagnostics
public import ProviderModel
public import SystemSupport

/// The state of one item as `providerfs status` and the xattrs show it.
public struct ItemStatus: Sendable, Equatable {
    public enum State: String, Sendable, Equatable {
        case dataless, downloading, partial, materialized, error
        /// Local edits not uploaded yet; `uploading` while the upload runs (issue 14).
        case dirty, uploading
        /// A FIFO, socket or device the mount keeps alone, never at the provider (D-398).
        case localOnly = "local-only"
    }
    public var identifier: ItemIdentifier
    public var kind: ItemKind
    public var state: State
    public var presentBytes: Int64
    public var totalBytes: Int64
    public var version: ContentVersion
    public var lastError: RecordedError?
    /// The write-back record, when the item was written through the mount (WriteBack/).
    public var upload: UploadRecord? = nil
}

/// Provider metadata plus local content, with the persistence and refresh rules of
/// docs/SEMANTICS.md ("Remote changes").
public final class ProviderCache: Sendable {
    /// The cache directory (`content/` holds the sparse files).
    public let directory: String
    /// The namespace: items, listings, their freshness.
    public let catalog: Catalog
    /// The content entries of the catalog's files.
    public let content: ContentStore
    /// Staging copies and the write-back queue (LocalWrites.swift, Staging/, WriteBack/).
    public let writes: LocalWrites
    let environment: CacheEnvironment
    /// chmod and utimens the provider does not store (AttributeOverrides.swift).
    let attributeOverrides: AttributeOverrides
    /// The store as the cache writes it: rows a full disk refused are kept to write again.
    let storeWrites: FullDiskStore

    /// Opens the cache in `directory` (created if needed), loading the items and range maps the
    /// store kept from earlier sessions. `fileSync` makes a cache file's bytes durable: before its
    /// range map is saved, a staging file's before a publish renames it into the content store,
    /// and an unsynced published one's at fsync (fdatasync; tests record or fail it). `freeSpace`
    /// says what the cache's file system has free (fstatvfs; tests make it full, D-390).
    /// `providerChanges` hears of changes the provider made (D-403: the mount's presenters).
    public init(
        provider: any Provider, directory: String, store: any MetadataStore,
        clock: any Clock<Duration> = ContinuousClock(), options: CacheOptions = CacheOptions(),
        pool: BlockingIOPool = .shared, logger: Logger = Logger(label: "providerfs.cache"),
        fileSync: @escaping FileSync = fileDataSync, freeSpace: @escaping FreeSpace = fileSystemFreeSpace,
        providerChanges: (any ProviderChangeListener)? = nil, catalogHooks: CatalogHooks = CatalogHooks()
    ) throws(CacheError) {
        self.directory = directory
        // Rows a full disk refused are written again later (D-390).
        storeWrites = FullDiskStore(store)
        let environment = CacheEnvironment(
            provider: provider, store: storeWrites, timeline: Timeline(clock), options: options, pool: pool,
            logger: logger,
            fileSync: fileSync, freeSpace: freeSpace)
        self.environment = environment
        attributeOverrides = AttributeOverrides(environment: environment)
        do {
            try makeDirectories(directory + "/content", mode: 0o700)
        } catch {
            throw CacheError(.io, "cannot create cache directory \(directory): \(error.errno.message)")
        }
        let storedItems: [StoredItem]
        let storedContents: [ContentRecord]
        do {
            storedItems = try store.loadItems()
            storedContents = try store.loadContents()
        } catch {
            throw CacheError(.io, "cannot read the metadata store: \(error)")
        }
        // Checksums listed before the restart verify fetches as they did then (D-526).
        let checksummed = storedItems.lazy.filter { $0.item.statedChecksums != nil }.map(\.item)
        if !checksummed.isEmpty { provider.restoreStatedChecksums(of: Array(checksummed)) }
        var versions: [ItemIdentifier: (ContentVersion, ItemKind)] = [:]
        for stored in storedItems { versions[stored.item.identifier] = (stored.item.contentVersion, stored.item.kind) }
        content = ContentStore(directory: directory, records: storedContents, environment: environment) { record in
            guard let (version, kind) = versions[record.identifier] else { return false }
            return version == record.version && kind == .file
        }
        catalog = Catalog(
            stored: storedItems, content: content, environment: environment, providerChanges: providerChanges,
            hooks: catalogHooks)
        if providerChanges != nil {
            // A fetch that finds a new version: the catalog learns it for presenters (D-403).
            let catalog = self.catalog
            content.versionGone.withLock {
                $0 = Callback { [weak catalog] identifier in catalog?.versionGone(identifier) }
            }
        }
        writes = LocalWrites(
            environment: environment, catalog: catalog, content: content, initialBackoff: options.uploadRetryDelay,
            maximumBackoff: options.maximumUploadRetryDelay)
        writes.resume()
        pins = Pins(environment: environment)
        if options.hasLimits {
            let limiter = CacheLimiter(
                options: options, content: content, environment: environment, directory: directory)
            self.limiter = limiter
            limiter.setEvict { [weak self] identifier in try? await self?.evict(identifier) }
            content.stored.withLock { $0 = Callback { limiter.stored($0) } }
            content.released.withLock { $0 = Callback { _ in limiter.released() } }
            limiter.start()
        } else {
            limiter = nil
        }
        // Pushed changes in pinned directories are downloaded (D-445).
        catalog.afterProviderChanges.withLock {
            $0 = Callback { [weak self] changes in self?.pinnedProviderChanged(changes) }
        }
        catalog.startObservingProvider()
        startPins()
    }

    /// Pin states (D-445) and the pinned downloads' queue (ProviderCache+Pins.swift).
    let pins: Pins

    /// The cache's limits (nil: none set).
    let limiter: CacheLimiter?

    /// What the cache's limits are and did; nil when none is set.
    public var limitsStatus: CacheLimitsStatus? { limiter?.status }

    /// Checks the cache's limits now and evicts what they need (tests; the limits are checked on
    /// their own as downloads store bytes and periodically).
    public func checkLimits() async { await limiter?.check() }

    /// What the provider offers beyond reading (`ProviderCapabilities`; `.writing` above all).
    public var providerCapabilities: ProviderCapabilities { environment.provider.capabilities }

    /// The provider's fingerprint of `item` (`Provider.fingerprint(of:)`), nil when it has none.
    public func fingerprint(of item: ProviderItem) -> String? { environment.provider.fingerprint(of: item) }

    // MARK: Both parts

    /// The content entry of `item`'s version, pinned (call `content.unpin` when done). Its file
    /// is created on the I/O pool on first use; an entry made while the catalog moved on to
    /// another version is born retired (missing bytes fail as stale).
    public func pinContent(of item: ProviderItem) async throws(CacheError) -> ContentEntry {
        if let reason = limiter?.blockedReason, !hasAllContent(of: item) {
            throw CacheError(.noSpace, "\(item.identifier) cannot be downloaded: \(reason)")
        }
        let catalog = self.catalog
        let identifier = item.identifier
        return try await content.pin(item) { catalog.currentVersion(of: identifier) == $0 }
    }

    /// The immediate twin of `pinContent(of:)`: the same entry, on the calling thread (which may
    /// block on local file I/O: a new entry opens its cache file). Nil on any error, for the
    /// async form to report.
    public func pinContentNow(of item: ProviderItem) -> ContentEntry? {
        if limiter?.blockedReason != nil, !hasAllContent(of: item) { return nil }
        let catalog = self.catalog
        let identifier = item.identifier
        return content.pinNow(item) { catalog.currentVersion(of: identifier) == $0 }
    }

    /// The state of an item, from the cache only (no provider call).
    public func status(of identifier: ItemIdentifier) -> ItemStatus? {
        guard var status = contentStatus(of: identifier) else { return nil }
        // Written through the mount: the write-back's state comes first while it is pending.
        if let upload = writes.uploadRecord(of: identifier) {
            status.upload = upload
            switch upload.phase {
            case .dirty: status.state = .dirty
            case .uploading: status.state = .uploading
            case .attributes:
                // Uploaded; a held chmod or utimens still to make (D-460).
                status.state = upload.lastError == nil ? .uploading : .error
                if upload.lastError != nil {
                    status.lastError = RecordedError(
                        code: upload.lastErrorCode ?? .io, message: "chmod or utimens failed: \(upload.lastError ?? "")"
                    )
                }
            case .error:
                status.state = .error
                // Its errno is the failure's (ENOSPC for a full provider), EIO when it names none.
                status.lastError = RecordedError(
                    code: upload.lastErrorCode ?? .io, message: "upload failed: \(upload.lastError ?? "")")
            case .materialized: break
            }
        }
        return status
    }

    private func contentStatus(of identifier: ItemIdentifier) -> ItemStatus? {
        guard let item = catalog.knownItem(identifier) else { return nil }
        if item.special != nil {
            return ItemStatus(
                identifier: identifier, kind: item.kind, state: .localOnly, presentBytes: 0, totalBytes: 0,
                version: item.contentVersion, lastError: nil)
        }
        switch item.kind {
        case .directory, .symbolicLink:
            let listed = item.kind == .directory && catalog.isListed(identifier)
            let state: ItemStatus.State = item.kind == .symbolicLink || listed ? .materialized : .dataless
            return ItemStatus(
                identifier: identifier, kind: item.kind, state: state, presentBytes: 0, totalBytes: 0,
                version: item.contentVersion, lastError: nil)
        case .file:
            let progress =
                content.progress(of: item)
                ?? ContentProgress(present: 0, total: item.size, downloading: false, lastError: nil)
            let state: ItemStatus.State =
                if progress.downloading {
                    .downloading
                } else if progress.present >= item.size {
                    .materialized
                } else if progress.lastError != nil {
                    .error
                } else if progress.present > 0 {
                    .partial
                } else {
                    .dataless
                }
            return ItemStatus(
                identifier: identifier, kind: .file, state: state, presentBytes: progress.present,
                totalBytes: item.size,
                version: item.contentVersion, lastError: state == .materialized ? nil : progress.lastError)
        }
    }

    /// Every byte of `item`'s current version is stored (true for what is not a file).
    public func hasAllContent(of item: ProviderItem) -> Bool {
        item.kind != .file || (content.progress(of: item)?.present ?? 0) >= item.size
    }

    /// Stops listening to the provider and every download, fails waiting readers, saves range
    /// maps. Later content requests fail.
    public func shutdown() async {
        limiter?.stop()
        stopPins()
        if environment.provider.capabilities.contains(.changeNotifying) { environment.provider.observeChanges(nil) }
        await writes.shutdown()
        await catalog.shutdown()
        await content.shutdown()
        await drainPins()
        // Rows a full disk refused, now that space may be back (a delete must not be undone by
        // the next start, D-390).
        if !storeWrites.flush() {
            environment.logger.warning(
                "\(storeWrites.pendingCount) rows of the metadata store could not be written (the cache's disk is full)"
            )
        }
    }
}
