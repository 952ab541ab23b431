/// A source of items: a local directory, a WebDAV server, a test double.
///
/// Every method may suspend, may be cancelled (honour `Task.isCancelled` / throw
/// `CancellationError`), and throws `ProviderError` on failure. Metadata methods never read
/// content: ProviderFS relies on that to list and stat without downloading.
public protocol Provider: Sendable {
    /// The metadata of one item. Throws `.noSuchItem` when it is gone.
    func item(for identifier: ItemIdentifier) async throws -> ProviderItem

    /// The children of a directory, in any order.
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem]

    /// Opens a stream of the bytes of `range` of content version `version`. The stream refuses
    /// (throws `.versionChanged`) as soon as the item no longer has that version, so bytes of two
    /// versions are never mixed. A stream may deliver fewer bytes than asked; the caller checks.
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream
}

/// Successive chunks of a content fetch. Not shared between tasks: one consumer drives it.
public protocol ContentStream: Sendable {
    /// The next chunk (at most `maximumLength` bytes), or nil at the end of the requested range
    /// (or earlier, if the provider ended the stream early: the consumer detects the short count).
    func next(maximumLength: Int) async throws -> [UInt8]?
    /// Stops the transfer and frees its resources. Idempotent; later `next` calls return nil.
    func close()
}

/// A stream that can place its bytes straight into a file (for a local source: pread + pwrite
/// through one buffer of its own, no chunk handed over, no thread hop per step). The cache uses
/// it when the stream offers it.
public protocol DirectContentStream: ContentStream {
    /// Places the next bytes into `descriptor` at `offset` (the stream's own position maps to
    /// `offset`), step by step: the first step at most `firstStep` bytes, later ones at most
    /// `step`, `maximumLength` in all, stopping early after about half a second so the caller
    /// regains control. After each step, once its bytes are known good (version checked),
    /// `delivered(count)` is called — on the stream's thread — and returning false stops the
    /// transfer. Returns the bytes placed, or nil when the range had already ended. Bytes that
    /// are a hole in the source may be left unwritten where `descriptor` already reads zeros (a
    /// sparse source stays sparse). Same version rules as `next`: a stream whose item changed
    /// throws `.versionChanged` and bytes of that step are not delivered.
    func transfer(
        to descriptor: Int32, at offset: Int64, firstStep: Int, step: Int, maximumLength: Int,
        delivered: @escaping @Sendable (Int) -> Bool
    ) async throws -> Int?
}

/// A provider that can tell whether one name exists in a directory without listing it (a local
/// directory: one lstat). The cache uses it for lookup misses, so that a name missing from a
/// directory of 100,000 entries costs one call, not a listing.
public protocol NamedChildLookup: Provider {
    /// The child of `directory` named exactly `name` (bytes), or nil when there is none. Throws
    /// like `children(of:)` (`.noSuchItem` when the directory itself is gone).
    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem?
}

/// A provider that can answer some `item(for:)` calls at once, with no wait on a network, another
/// process or a lock it does not own (a local directory on a local file system: realpath and lstat
/// served from the kernel's caches). The mount revalidates an open this way on the FUSE thread
/// that received it, without a task or a thread hop (D-229); anything it declines goes the async
/// way.
public protocol ImmediateMetadata: Provider {
    /// What `item(for:)` would return, or nil when answering might wait (the caller then calls
    /// `item(for:)`). Throws like `item(for:)`.
    func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem?
}

/// A provider that can tell, without listing again, whether a directory it listed may have
/// changed since (a local directory: inotify). The cache uses it to revalidate a listing past its
/// TTL for the cost of one check instead of a listing of every child (D-224).
public protocol ListingChangeTracking: Provider {
    /// Lists like `children(of:)`, plus a token taken before the listing began: nil when changes
    /// there cannot be tracked (the cache then lists again whenever the listing expires).
    func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    )

    /// False only when nothing a listing of the token's directory shows (its names, its children's
    /// metadata, its own metadata) can have changed since the token was taken; true when anything
    /// did or when unsure. Never waits.
    func hasChanges(since token: ListingChangeToken) -> Bool
}

/// A change tracker that also says what changed, as it happens (a local directory: inotify), so
/// that whatever caches the provider's items (the kernel's dentries and attributes, D-228) can be
/// told at once instead of expiring on a timer.
public protocol ChangeNotifying: ListingChangeTracking {
    /// Starts handing changes to `observer` soon after they happen, in batches, from a thread of
    /// the provider's: each about a directory whose listing carried a token (`trackedChildren`).
    /// Nil: events were lost and anything may have changed. Nil observer: stop.
    func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?)
}

/// One change a `ChangeNotifying` provider reports.
public enum ProviderChange: Sendable, Hashable {
    /// The item under `name` in `directory` was written or had its metadata changed (a
    /// directory's own metadata, its entries' included, is its entry in its parent).
    case entry(directory: ItemIdentifier, name: String)
    /// `name` was created in, deleted from, or renamed into or out of `directory`.
    case membership(directory: ItemIdentifier, name: String)
    /// Some entries of `directory` changed; which is not known (a name that is not UTF-8).
    case entries(directory: ItemIdentifier)
}

/// What `ListingChangeTracking.hasChanges(since:)` compares against; opaque to the cache.
public struct ListingChangeToken: Sendable, Equatable {
    /// The provider's watch and its state when the token was taken.
    public let watch: Int64
    public let serial: UInt64
    public let generation: UInt64

    public init(watch: Int64, serial: UInt64, generation: UInt64) {
        self.watch = watch
        self.serial = serial
        self.generation = generation
    }
}
