// Eviction (issue 27): an item's stored content goes, its file and records with it, so that the
// item is a placeholder again and its disk space is free. Only content nobody uses: an entry
// pinned by a handle or downloading refuses (the caller above refuses items with writes not
// uploaded). The check and the removal happen under the entry-creation lock and the store lock,
// and the item's entries with a range-map save queued or running are retired and waited for
// before any file goes, so no save or first open can bring a record of the removed file back (a
// revived record over a deleted file would serve zeros).

import Diagnostics
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension ContentStore {
    /// Why stored content could not be evicted.
    enum EvictionBlock: Sendable, Equatable {
        /// A handle has the content open (pinned).
        case open
        /// A download of it is running.
        case downloading
    }

    /// What an eviction of stored content did.
    enum ContentEviction: Sendable, Equatable {
        /// Every stored version is gone; `freedBytes` were allocated to their files.
        case evicted(freedBytes: Int64)
        /// Nothing was stored.
        case nothingStored
        case blocked(EvictionBlock)
    }

    /// Removes every stored version of `identifier` (files and records) unless one is in use.
    func evict(_ identifier: ItemIdentifier) async -> ContentEviction {
        let outcome = await environment.pool.run { () -> (ContentEviction, [ContentRecord], [ContentEntry]) in
            self.creationLock.withLock { self.removeContent(of: identifier) }
        }
        let (result, records, entries) = outcome
        guard case .evicted = result else { return result }
        // A range-map save of an entry of this item (the live ones removed, or closed ones whose
        // save is queued or running in a batch) would write its record back after the removal,
        // over a deleted file: each is retired (a retired entry saves nothing) and its running
        // save waited for, before any file or row goes. Only this item's saves are waited for.
        let error = CacheError(.stale, "\(identifier): its local content was evicted")
        let saving = takePersists(of: identifier)
        for entry in entries + saving { entry.retire(error) }
        for entry in entries + saving { await entry.waitForPersists() }
        var freed: Int64 = 0
        for record in records { freed += allocatedBytes(record.fileNumber) }
        for entry in entries { freed += allocatedBytes(entry.fileNumber) }
        unsynced.withLock { numbers in
            for record in records { numbers.remove(record.fileNumber) }
            for entry in entries { numbers.remove(entry.fileNumber) }
        }
        for record in records { discardRecordFile(record) }
        for entry in entries { discardRecordFile(entry.record) }
        environment.logger.info(
            "\(identifier): evicted \(records.count + entries.count) stored version(s), \(freed) bytes")
        return .evicted(freedBytes: freed)
    }

    /// One item's stored content, for the cache's limits.
    struct StoredContent: Sendable, Equatable {
        var identifier: ItemIdentifier
        /// Bytes present, over every stored version.
        var bytes: Int64
        /// Last given back (timeline time); nil: not in this session.
        var lastUse: Duration?
        /// Pinned by a handle or downloading.
        var inUse: Bool
    }

    /// Every item with stored content: its bytes, last use and whether it is in use now.
    func storedContent() -> [StoredContent] {
        let uses = lastUse.withLock { $0 }
        return withState { state in
            var found: [ItemIdentifier: StoredContent] = [:]
            for (key, record) in state.records {
                found[
                    key.identifier,
                    default: StoredContent(
                        identifier: key.identifier, bytes: 0, lastUse: uses[key.identifier], inUse: false)
                ].bytes +=
                    record.present.count
            }
            for (key, entry) in state.entries {
                let progress = entry.progress
                var content =
                    found[key.identifier]
                    ?? StoredContent(identifier: key.identifier, bytes: 0, lastUse: uses[key.identifier], inUse: false)
                content.bytes += progress.present
                if entry.pins > 0 || entry.isDownloading { content.inUse = true }
                found[key.identifier] = content
            }
            return Array(found.values)
        }
    }

    /// Whether stored content of `identifier` is in use now (pinned or downloading).
    func use(of identifier: ItemIdentifier) -> EvictionBlock? {
        withState { state in
            for entry in state.entries.versions(of: identifier).values {
                if entry.isDownloading { return .downloading }
                if entry.pins > 0 { return .open }
            }
            return nil
        }
    }

    /// Under the creation lock: the item's entries and records leave the tables when none is
    /// pinned or downloading.
    private func removeContent(of identifier: ItemIdentifier) -> (ContentEviction, [ContentRecord], [ContentEntry]) {
        withState { state in
            let live = state.entries.versions(of: identifier)
            for entry in live.values {
                // A download pins its entry while it runs: said as what it is.
                if entry.isDownloading { return (.blocked(.downloading), [], []) }
                if entry.pins > 0 { return (.blocked(.open), [], []) }
            }
            let stored = state.records.versions(of: identifier)
            if live.isEmpty && stored.isEmpty { return (.nothingStored, [], []) }
            for version in live.keys { state.entries[ContentKey(identifier: identifier, version: version)] = nil }
            for version in stored.keys { state.records[ContentKey(identifier: identifier, version: version)] = nil }
            return (.evicted(freedBytes: 0), Array(stored.values), Array(live.values))
        }
    }

    /// Disk bytes allocated to content file `fileNumber` (0 when it is gone).
    private func allocatedBytes(_ fileNumber: Int64) -> Int64 {
        var info = stat()
        guard SystemCalls.stat("\(directory)/content/\(fileNumber)", &info) == 0 else { return 0 }
        return Int64(info.st_blocks) * 512
    }
}
