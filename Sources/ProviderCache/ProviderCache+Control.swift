// What the mount's control socket asks of the cache (`providerfs status MOUNTPOINT`,
// `providerfs download`): the items whose content is moving or failed, a probe of the provider,
// and "download this file fully". Each needs both parts of the cache (the catalog's items, the
// content store's entries), so they sit on the façade; `ContentStore.usage()` answers disk use.

public import ProviderModel

extension ProviderCache {
    /// The status of every file whose content is downloading, partly present, or failed (not the
    /// materialized or untouched ones), and of every node kept by the mount alone (D-398), in no
    /// particular order. From the cache only.
    public func contentActivity() -> [ItemStatus] {
        content.identifiersWithContent.union(writes.pendingUploads.map(\.identifier))
            .union(catalog.localOnly(atOrUnder: [.root])).compactMap {
                identifier -> ItemStatus? in
                guard let status = status(of: identifier), status.kind == .file else { return nil }
                switch status.state {
                case .downloading, .partial, .error, .dirty, .uploading, .localOnly: return status
                case .dataless, .materialized: return nil
                }
            }
    }

    /// What a provider probe found.
    public struct ProviderProbe: Sendable, Equatable {
        /// The provider answered for its root item within the deadline.
        public var reachable: Bool
        /// How long the answer (or the failure) took.
        public var elapsed: Duration
        /// The failure, when it did not answer.
        public var error: RecordedError?
    }

    /// Asks the provider for its root item (never the cached copy), bounded by `deadline`. Returns
    /// at the deadline even when the provider call hangs.
    public func probeProvider(deadline: Duration) async -> ProviderProbe {
        let provider = environment.provider
        let start = ContinuousClock.now
        do {
            _ = try await withDeadline(deadline, on: environment.timeline) {
                try await provider.item(for: .root)
            }
            return ProviderProbe(reachable: true, elapsed: ContinuousClock.now - start, error: nil)
        } catch {
            let failure = CacheError.from(error)
            return ProviderProbe(
                reachable: false, elapsed: ContinuousClock.now - start,
                error: RecordedError(code: failure.code, message: failure.message))
        }
    }

    /// How a full download was asked for.
    public enum FullDownload: Sendable, Equatable {
        /// Every byte of the current version is already here.
        case alreadyPresent
        /// The download runs (started now, or joined); `status(of:)` shows its progress.
        case started
    }

    /// Starts fetching every missing byte of the file's current version and returns at once. The
    /// content entry stays pinned until the download ends (done or failed); progress and the last
    /// error show in `status(of:)`. Fails for an unknown item or one that is not a file.
    public func startFullDownload(of identifier: ItemIdentifier) async throws(CacheError) -> FullDownload {
        let item = try await catalog.item(identifier, maximumAge: environment.options.attributeTTL)
        let entry = try await pinContent(of: item)
        if entry.isMaterialized {
            content.unpin(entry)
            return .alreadyPresent
        }
        // Marks the entry downloading before returning, so that a status asked right after this
        // reply already says so.
        entry.startBackgroundDownload()
        Task {
            try? await entry.ensurePresent(0..<entry.size)
            self.content.unpin(entry)
        }
        return .started
    }
}

// Eviction (issue 27, `providerfs evict`): a file's local content goes and the item is a
// placeholder again. Refused for what only this machine has (writes not uploaded, a file made by
// the mount alone), for content in use (a handle open, a download running) and for what is pinned.
extension ProviderCache {
    /// What an eviction did.
    public enum Eviction: Sendable, Equatable {
        /// The content is gone; `freedBytes` were allocated to its files.
        case evicted(freedBytes: Int64)
        /// Nothing was stored: already a placeholder.
        case alreadyPlaceholder
        case refused(EvictionRefusal)
    }

    /// Why an item was not evicted.
    public enum EvictionRefusal: String, Sendable, Equatable, CaseIterable {
        /// A directory, a symbolic link, or a node the mount keeps alone (D-398).
        case notAFile = "not a file"
        /// Written through the mount and not uploaded yet (or made by the mount and not created
        /// at the provider): this machine has the only copy.
        case notUploaded = "changes not uploaded yet"
        /// A handle has it open (for reading or writing).
        case open = "open"
        /// A download of it is running.
        case downloading = "downloading"
        /// Written through the mount under one of several hard-linked names: its other names are
        /// asked for again once the provider lists them, and are not evicted by this.
        case severalNames = "written through one of several names"
        /// Pinned, or in a pinned directory (D-445): kept downloaded until unpinned.
        case pinned = "pinned"
    }

    /// Why `identifier` cannot be evicted now, or nil when it can (checked again by `evict`).
    /// Throws `.notFound` for an item the catalog does not know.
    public func evictionRefusal(of identifier: ItemIdentifier) throws(CacheError) -> EvictionRefusal? {
        guard let item = catalog.knownItem(identifier) else {
            throw CacheError(.notFound, "\(identifier) is not known")
        }
        guard item.kind == .file, item.special == nil else { return .notAFile }
        if isPinned(identifier) { return .pinned }
        if catalog.isUnborn(identifier) || catalog.hasPendingLocal(identifier)
            || writes.uploadRecord(of: identifier)?.isPending == true
        {
            return .notUploaded
        }
        if writes.hasStaging(identifier) { return .open }
        if catalog.hasLocalVersion(identifier) && !catalog.otherNames(of: identifier).isEmpty { return .severalNames }
        switch content.use(of: identifier) {
        case .open: return .open
        case .downloading: return .downloading
        case nil: return nil
        }
    }

    /// Evicts `identifier`'s local content: every stored version's file and record go, and the
    /// item reads as a placeholder (`dataless`); the next read downloads again. Throws
    /// `.notFound` for an item the catalog does not know.
    public func evict(_ identifier: ItemIdentifier) async throws(CacheError) -> Eviction {
        if let refusal = try evictionRefusal(of: identifier) { return .refused(refusal) }
        let local = catalog.hasLocalVersion(identifier)
        let result = await content.evict(identifier)
        switch result {
        case .blocked(.open): return .refused(.open)
        case .blocked(.downloading): return .refused(.downloading)
        case .nothingStored, .evicted:
            // A file written through the mount is served from its local version, whose bytes
            // were just removed: it goes back to the provider's version of them.
            if local { _ = catalog.returnToProviderVersion(identifier) }
            if case .evicted(let freed) = result { return .evicted(freedBytes: freed) }
            return .alreadyPlaceholder
        }
    }
}
