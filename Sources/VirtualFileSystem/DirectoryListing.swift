// The entries of one open directory's listing, filled as the provider's batches arrive (D-470)
// and read from any cookie: a readdir waits only until there are entries past its cookie or the
// listing has ended, so the first entries reach the caller before the whole directory is read.

import ProviderModel
import SystemSupport

/// A pure table of a listing's entries and of the readers waiting for more; every change returns
/// the waiters to resume (outside the lock).
struct ListingEntries {
    typealias Waiter = CheckedContinuation<Void, Never>

    private(set) var entries: [DirectoryEntry] = []
    /// Each entry's item as listed (nil for "." and ".."), for readdirplus.
    private(set) var items: [ProviderItem?] = []
    /// What has been added, by identifier (a provider listing an item twice, or the listing's
    /// answer after its batches, adds nothing twice).
    private var added: Set<ItemIdentifier> = []
    /// Entries are held back until they are more than the first batch: a listing that ends in
    /// one batch is answered from its final, sorted form, as before streaming.
    private(set) var published = 0
    private(set) var ended = false
    private(set) var failure: FileSystemError?
    private var waiters: [UInt64: Waiter] = [:]
    private var nextWaiter: UInt64 = 0

    /// Which of `identifiers` are not in the listing yet (each counted as added from now).
    mutating func unseen(_ identifiers: [ItemIdentifier]) -> [Bool] {
        identifiers.map { added.insert($0).inserted }
    }

    /// Adds entries (their cookies are given here: the position after each). `publish`: make
    /// everything added so far readable.
    mutating func append(_ new: [ListedEntry], publish: Bool) -> [Waiter] {
        entries.reserveCapacity(entries.count + new.count)
        items.reserveCapacity(entries.count + new.count)
        for entry in new {
            items.append(entry.item)
            entries.append(
                DirectoryEntry(
                    name: entry.name, inode: entry.inode, serialNumber: entry.serialNumber, type: entry.type,
                    cookie: UInt64(entries.count + 1)))
        }
        return publish ? self.publish() : []
    }

    /// Drops what was added, while none of it was published (a listing answered in one piece
    /// is built again from its final form).
    mutating func restart() {
        guard published == 0 else { return }
        entries.removeAll()
        items.removeAll()
        added.removeAll()
    }

    mutating func publish() -> [Waiter] {
        guard published < entries.count else { return [] }
        published = entries.count
        return takeWaiters()
    }

    /// The listing is complete (or failed: readers past what was published get `failure`).
    mutating func end(failure: FileSystemError?) -> [Waiter] {
        self.failure = failure
        ended = true
        published = entries.count
        return takeWaiters()
    }

    /// Entries after `cookie`, at most `limit`; nil when the reader must wait.
    func answer(after cookie: UInt64, limit: Int) -> Result<[DirectoryEntry], FileSystemError>? {
        answerRange(after: cookie, limit: limit).map { $0.map { Array(entries[$0]) } }
    }

    /// `answer` with each entry's item.
    func answerWithItems(
        after cookie: UInt64, limit: Int
    ) -> Result<[(DirectoryEntry, ProviderItem?)], FileSystemError>? {
        answerRange(after: cookie, limit: limit).map { $0.map { Array(zip(entries[$0], items[$0])) } }
    }

    private func answerRange(after cookie: UInt64, limit: Int) -> Result<Range<Int>, FileSystemError>? {
        if cookie < UInt64(published) {
            let start = Int(cookie)
            return .success(start..<min(published, start + max(0, limit)))
        }
        guard ended else { return nil }
        if let failure { return .failure(failure) }
        return .success(0..<0)
    }

    mutating func wait(_ waiter: Waiter) -> UInt64 {
        nextWaiter += 1
        waiters[nextWaiter] = waiter
        return nextWaiter
    }

    mutating func cancel(_ id: UInt64) -> Waiter? { waiters.removeValue(forKey: id) }

    private mutating func takeWaiters() -> [Waiter] {
        defer { waiters.removeAll() }
        return Array(waiters.values)
    }
}

/// An entry as the file system makes it, before the listing gives it its cookie.
struct ListedEntry {
    /// The item as listed (nil for "." and "..").
    var item: ProviderItem?
    var name: String
    var inode: InodeNumber
    var serialNumber: UInt64
    var type: NodeType
}

/// One listing of an open directory, shared by the task that fills it and the readdirs that read
/// it.
final class DirectoryListing: Sendable {
    private let state = Locked(ListingEntries())

    func unseen(_ identifiers: [ItemIdentifier]) -> [Bool] {
        state.withLock { $0.unseen(identifiers) }
    }

    func append(_ entries: [ListedEntry], publish: Bool) {
        for waiter in state.withLock({ $0.append(entries, publish: publish) }) { waiter.resume() }
    }

    func publish() {
        for waiter in state.withLock({ $0.publish() }) { waiter.resume() }
    }

    func restart() { state.withLock { $0.restart() } }

    func end(failure: FileSystemError? = nil) {
        for waiter in state.withLock({ $0.end(failure: failure) }) { waiter.resume() }
    }

    /// What a readdir after `cookie` gets now, or nil when it would wait.
    func entriesNow(after cookie: UInt64, limit: Int) -> Result<[DirectoryEntry], FileSystemError>? {
        state.withLock { $0.answer(after: cookie, limit: limit) }
    }

    func entriesWithItemsNow(
        after cookie: UInt64, limit: Int
    ) -> Result<[(DirectoryEntry, ProviderItem?)], FileSystemError>? {
        state.withLock { $0.answerWithItems(after: cookie, limit: limit) }
    }

    /// Entries after `cookie` (at most `limit`), waiting for the listing to bring them; empty at
    /// its end. A cancelled reader (FUSE_INTERRUPT) stops waiting with `.interrupted`.
    func entries(after cookie: UInt64, limit: Int) async throws(FileSystemError) -> [DirectoryEntry] {
        try await waitFor(after: cookie, limit: limit) { $0.answer(after: cookie, limit: limit) }
    }

    /// `entries(after:limit:)` with each entry's item (readdirplus).
    func entriesWithItems(
        after cookie: UInt64, limit: Int
    ) async throws(FileSystemError) -> [(DirectoryEntry, ProviderItem?)] {
        try await waitFor(after: cookie, limit: limit) { $0.answerWithItems(after: cookie, limit: limit) }
    }

    private func waitFor<T>(
        after cookie: UInt64, limit: Int, _ answer: (ListingEntries) -> Result<T, FileSystemError>?
    ) async throws(FileSystemError) -> T {
        while true {
            if let answer = state.withLock({ answer($0) }) { return try answer.get() }
            if Task.isCancelled { throw FileSystemError(.interrupted, "readdir interrupted") }
            // The waiter's id, and whether the reader was cancelled before it was registered.
            let token = Locked<(id: UInt64, cancelled: Bool)>((0, false))
            await withTaskCancellationHandler {
                await withCheckedContinuation { (waiter: ListingEntries.Waiter) in
                    let registered = token.withLock { token -> Bool in
                        if token.cancelled { return false }
                        let id = state.withLock { entries -> UInt64? in
                            // Checked again under the lock: what arrived since is not waited for.
                            if entries.answer(after: cookie, limit: limit) != nil { return nil }
                            return entries.wait(waiter)
                        }
                        guard let id else { return false }
                        token.id = id
                        return true
                    }
                    if !registered { waiter.resume() }
                }
            } onCancel: {
                let id = token.withLock { token -> UInt64 in
                    token.cancelled = true
                    return token.id
                }
                if id != 0, let waiter = state.withLock({ $0.cancel(id) }) { waiter.resume() }
            }
        }
    }
}
