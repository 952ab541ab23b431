import SystemSupport

/// A source of items: a local directory, a WebDAV server, a test double.
///
/// Every method may suspend, may be cancelled (honour `Task.isCancelled` / throw
/// `CancellationError`), and throws `ProviderError` on failure. Metadata methods never read
/// content: ProviderFS relies on that to list and stat without downloading.
///
/// Beyond the three calls every provider answers (`item`, `children`, `fetchContents`), a provider
/// may offer the calls of `ProviderCapabilities`. They are requirements here too, with defaults
/// that decline (or answer the slow way), and `capabilities` says which ones the provider really
/// offers: callers check it, never the provider's type. So a wrapper forwards every call and
/// `capabilities` to its base, and keeps all of them (see `ProviderCapabilities`).
public protocol Provider: Sendable {
    /// Which of the optional calls below this provider really offers. A wrapper reports its
    /// base's (minus what it deliberately turns off).
    var capabilities: ProviderCapabilities { get }

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

    /// `.namedChildLookup`: the child of `directory` named exactly `name` (bytes), or nil when
    /// there is none, without listing the directory (a local directory: one lstat). Throws like
    /// `children(of:)` (`.noSuchItem` when the directory itself is gone). The default lists.
    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem?

    /// `.immediateMetadata`: what `item(for:)` would return (or throw), answered on the calling
    /// thread with no wait on a network, another process or a lock the provider does not own; or
    /// nil when answering might wait (the caller then calls `item(for:)`). The default declines.
    func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem?

    /// `.immediateMetadata` with `.namedChildLookup`: what `child(named:of:)` would return (or
    /// throw), answered on the calling thread under the same rules as `itemNow`; `.declined`
    /// when answering might wait (the caller then calls `child(named:of:)`). The default
    /// declines.
    func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild

    /// `.listingChangeTracking`: lists like `children(of:)`, plus a token taken before the
    /// listing began; nil when changes there cannot be tracked (the cache then lists again
    /// whenever the listing expires). The default lists and gives no token.
    func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    )

    /// `trackedChildren(of:)` that also hands the children over in batches as they are read
    /// (`batch`: called in order, from any thread, before this returns; the batches together are
    /// the children returned), so a caller can answer with the first ones before the last are read
    /// (a directory of 100,000 entries, D-470). The default lists with `trackedChildren(of:)` and
    /// hands everything over as one batch. Callers check `.listingChangeTracking` for the token as
    /// for `trackedChildren(of:)`.
    func trackedChildren(
        of directory: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    )

    /// `.listingChangeTracking`: false only when nothing a listing of the token's directory shows
    /// (its names, its children's metadata, its own metadata) can have changed since the token was
    /// taken; true when anything did or when unsure. Never waits. The default is unsure (true).
    func hasChanges(since token: ListingChangeToken) -> Bool

    /// `.changeNotifying`: starts handing changes to `observer` soon after they happen, in
    /// batches, from a thread of the provider's: each about a directory whose listing carried a
    /// token (`trackedChildren`). Nil: events were lost and anything may have changed. Nil
    /// observer: stop. The default never calls the observer.
    func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?)

    /// The cache tells the provider that one download of `version` of `identifier` has ended:
    /// the series of `fetchContents` calls it made for it, its own retries included, succeeded
    /// (every byte it set out to fetch arrived) or failed for good. Called once per download, on
    /// any thread, after the download's last fetch was closed. Providers may ignore it (the
    /// default does); the fault wrapper counts a fault's `--times` in downloads with it.
    func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool)

    /// The cache hands over, once at its start before it asks anything, the items its store kept
    /// from an earlier run that carry `statedChecksums`, so that the provider verifies fetches
    /// by them as it did before the restart (D-526). The default ignores them.
    func restoreStatedChecksums(of items: [ProviderItem])

    /// A short text that stays the same for the item across moves and renames (when the provider
    /// can tell), and differs between two items existing at once; nil when the provider has none.
    /// Finding a moved item again when its identifier changed with its path (a bookmark, docs/
    /// SCOPED-ACCESS.md) compares it. No call to the provider: from the item's metadata only.
    /// The default has none.
    func fingerprint(of item: ProviderItem) -> String?

    // MARK: Writing (`.writing`; ProviderWriting.swift has the rules every call keeps, and the
    // defaults, which decline with `.notSupported`)

    /// Creates the directory `name` in `parent`. `.alreadyExists` when the name is taken.
    func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem

    /// `.symbolicLinks`: creates the symbolic link `name` in `parent`, pointing at `target`
    /// (stored as given, never resolved). `.alreadyExists` when the name is taken.
    func createSymbolicLink(named name: String, in parent: ItemIdentifier, target: String) async throws -> ProviderItem

    /// Writes the whole content of the local file at `localFile` to `target`, atomically: the
    /// provider's readers see the old content or the new, never a mix or a part. The caller does
    /// not change the file during the call. `permissions` and `modificationTime` are applied when
    /// given (and the provider stores them). Returns the item with its new content version.
    func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem

    /// `.hardLinks`: a second name `name` in `parent` for the file or symbolic link `identifier`
    /// (link(2), the link itself, not followed). Returns the new name's item (its own
    /// identifier, the shared `hardLinkIdentity`). `.alreadyExists` when the name is taken,
    /// `.wrongKind` (EPERM) for a directory.
    func link(_ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String) async throws -> ProviderItem

    /// Deletes the item, a directory only when it is empty (`.notEmpty` otherwise). `kind` is
    /// what the caller believes it is: `.wrongKind` when it is another kind (unlink(2) of a
    /// directory, rmdir(2) of a file), `.noSuchItem` when it is gone.
    func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws

    /// Moves the item to `name` in `parent` (a rename when `parent` is its own), as `mode` says.
    /// Returns the item at its new place. Its identifier may change with its path (a local
    /// directory's does); the identifiers of everything inside a moved directory then change
    /// the same way, and the caller re-keys what it holds under the old ones.
    func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem

    /// Changes the item's permissions and modification time (what `.storesAttributes` says the
    /// provider keeps; without it the call may succeed and keep nothing). Returns the item after.
    func setAttributes(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) async throws -> ProviderItem

    /// A file the caller creates now and gives the provider later, with a `.create(name:in:)`
    /// upload (D-386): checks the name as that upload would (`.invalidName`; `.alreadyExists`
    /// when taken), moves the directory's metadata as a create does (its mtime to now), and
    /// returns the identifier the upload will give the file. The later upload then leaves the
    /// directory's times as they are by then (the create already moved them, and an explicit
    /// mtime set since stays). Nil: the provider does not defer here (the caller creates the
    /// file at once). Answered at once, never waiting on a network, like `itemNow`.
    func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate?

    /// The deferred create of `identifier` will not be uploaded (the file was deleted, or its
    /// create failed, before it reached the provider): whatever the provider keeps for it goes.
    func forgetDeferredCreate(_ identifier: ItemIdentifier)

    /// Whether two versions of one item name the same content although their text differs (a
    /// WebDAV ETag turns from weak to strong a second after a change, D-422). The catalog then
    /// keeps the version it holds, and with it the content cached for it (D-510). Default: the
    /// same text.
    func isSameContent(_ version: ContentVersion, as other: ContentVersion) -> Bool

    /// `setAttributes` on the calling thread (D-426), under the same rules as `itemNow`: only
    /// where the provider answers at once, never waiting on a network. Nil: declined (the caller
    /// uses `setAttributes`).
    func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem?
}

/// What `Provider.deferCreateNow` promises.
public struct DeferredCreate: Sendable, Equatable {
    /// The identifier the `.create` upload will give the file.
    public var identifier: ItemIdentifier
    /// The directory after its metadata moved, when the provider can tell it at once.
    public var directory: ProviderItem?
    /// The provider looked the name up and found it free. False: it could not without a
    /// network round trip (a remote's deferral, D-491); the caller checks what it knows, and
    /// the `.create` upload meets a name taken since as `.alreadyExists` (a conflict copy).
    public var nameChecked: Bool
    public init(identifier: ItemIdentifier, directory: ProviderItem?, nameChecked: Bool = true) {
        self.identifier = identifier
        self.directory = directory
        self.nameChecked = nameChecked
    }
}

/// What a provider offers beyond `item`, `children` and `fetchContents`. Each capability names
/// calls of `Provider` that every provider has (with defaults that decline or answer the slow
/// way); the capability says the provider's answers are the real thing, so callers use them.
///
/// - `namedChildLookup`: `child(named:of:)` answers one name without a listing (a lookup miss in
///   a directory of 100,000 entries costs one call).
/// - `immediateMetadata`: `itemNow(for:)` answers some items at once (the mount revalidates an
///   open this way on the FUSE thread that received it, D-229).
/// - `listingChangeTracking`: `trackedChildren(of:)` gives tokens and `hasChanges(since:)` checks
///   them (a listing past its TTL is revalidated for the cost of one check, D-224).
/// - `changeNotifying`: `observeChanges(_:)` pushes changes as they happen (the kernel's caches
///   are told at once, D-228). Implies `listingChangeTracking` (changes concern tracked listings).
/// - `writing`, `symbolicLinks`, `exchangingMoves`, `storesAttributes`: the calls that change the
///   provider (ProviderWriting.swift).
///
/// A provider's capabilities do not change over its life (the cache reads them once). What a
/// provider cannot answer for a time or for some items it declines call by call, the way the
/// defaults do (`itemNow` nil, `hasChanges` true, a `trackedChildren` token nil).
///
/// **Wrappers.** A provider that wraps another (fault injection today; an access-token check and
/// a remote provider's local layer later) is one type, whatever its base offers: it implements
/// every requirement by forwarding to its base (after its own checks), and reports
/// `base.capabilities`, minus any it deliberately never offers. It declines, call by call, what
/// it refuses for a time (`FaultInjectingProvider`: an offline item gets no immediate answer, and
/// no listing counts as unchanged while anything is offline). Callers never cast to find a
/// capability, so nothing a base offers is lost by wrapping it.
/// An immediate answer about one name of a directory (`Provider.childNow`).
public enum ImmediateChild: Sendable, Equatable {
    /// The directory has the child.
    case found(ProviderItem)
    /// The directory has no such child.
    case absent
    /// Not answered at once: ask `child(named:of:)`.
    case declined
}

public struct ProviderCapabilities: OptionSet, Sendable, Hashable {
    public let rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public static let namedChildLookup = ProviderCapabilities(rawValue: 1 << 0)
    public static let immediateMetadata = ProviderCapabilities(rawValue: 1 << 1)
    public static let listingChangeTracking = ProviderCapabilities(rawValue: 1 << 2)
    public static let changeNotifying = ProviderCapabilities(rawValue: 1 << 3)
}

extension Provider {
    public func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        try await children(of: directory).first { $0.name == name }
    }

    public func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? { nil }

    public func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild { .declined }

    public func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? { nil }

    public func forgetDeferredCreate(_ identifier: ItemIdentifier) {}

    public func isSameContent(_ version: ContentVersion, as other: ContentVersion) -> Bool { version == other }

    public func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem?
    {
        nil
    }

    public func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        (try await children(of: directory), nil)
    }

    public func trackedChildren(
        of directory: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        let listed = try await trackedChildren(of: directory)
        if !listed.children.isEmpty { batch(listed.children) }
        return listed
    }

    public func hasChanges(since token: ListingChangeToken) -> Bool { true }

    public func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {}

    public func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {}

    public func restoreStatedChecksums(of items: [ProviderItem]) {}

    public func fingerprint(of item: ProviderItem) -> String? { nil }
}

/// Successive chunks of a content fetch. Not shared between tasks: one consumer drives it.
///
/// Same shape as `Provider`: the optional `transfer` is a requirement with a default (through
/// `next`), and `capabilities` says whether the stream really places bytes itself.
public protocol ContentStream: Sendable {
    /// Whether `transfer` is the stream's own (`.directTransfer`). Default: none.
    var capabilities: ContentStreamCapabilities { get }

    /// The next chunk (at most `maximumLength` bytes), or nil at the end of the requested range
    /// (or earlier, if the provider ended the stream early: the consumer detects the short count).
    func next(maximumLength: Int) async throws -> [UInt8]?
    /// Stops the transfer and frees its resources. Idempotent; later `next` calls return nil.
    func close()

    /// `.directTransfer`: places the next bytes into `descriptor` at `offset` (the stream's own
    /// position maps to `offset`), step by step: the first step at most `firstStep` bytes, later
    /// ones at most `step`, `maximumLength` in all, stopping early after about half a second so
    /// the caller regains control. After each step, once its bytes are known good (version
    /// checked), `delivered(count)` is called — on the stream's thread — and returning false
    /// stops the transfer. Returns the bytes placed, or nil when the range had already ended.
    /// Bytes that are a hole in the source may be left unwritten where `descriptor` already reads
    /// zeros (a sparse source stays sparse). Same version rules as `next`: a stream whose item
    /// changed throws `.versionChanged` and bytes of that step are not delivered. The default
    /// writes one chunk of `next` (at most `firstStep` bytes) with pwrite.
    func transfer(
        to descriptor: Int32, at offset: Int64, firstStep: Int, step: Int, maximumLength: Int,
        delivered: @escaping @Sendable (Int) -> Bool
    ) async throws -> Int?

    /// `.checksummed`: the provider's checksum of every byte of the requested range, as it meant
    /// to send them; known once `next` has returned nil at the end of the range (like an HTTP
    /// trailer), nil before that and for streams that carry none. A checksummed stream's bytes
    /// count as received only once the cache's own digest of them matches.
    var checksum: ContentChecksum? { get }

    /// `.checksummed`: the algorithm `checksum` will be in, known as soon as the stream is
    /// returned (the cache hashes the bytes with it as they arrive). Default: SHA-256.
    var checksumAlgorithm: ContentChecksum.Algorithm { get }
}

/// What a content stream offers beyond `next` and `close` (see `ProviderCapabilities` for the
/// pattern). `directTransfer`: the stream places its bytes straight into a file (for a local
/// source: from a mapping of the source with pwrite, no chunk handed over, no thread hop per
/// step); the cache uses it when offered.
public struct ContentStreamCapabilities: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let directTransfer = ContentStreamCapabilities(rawValue: 1 << 0)
    /// The stream carries a `checksum` of its range (it never offers `directTransfer` too: the
    /// cache hashes the bytes as `next` hands them over).
    public static let checksummed = ContentStreamCapabilities(rawValue: 1 << 1)
}

extension ContentStream {
    public var capabilities: ContentStreamCapabilities { [] }

    public var checksum: ContentChecksum? { nil }

    public var checksumAlgorithm: ContentChecksum.Algorithm { .sha256 }

    public func transfer(
        to descriptor: Int32, at offset: Int64, firstStep: Int, step: Int, maximumLength: Int,
        delivered: @escaping @Sendable (Int) -> Bool
    ) async throws -> Int? {
        guard let chunk = try await next(maximumLength: max(1, min(firstStep, maximumLength))) else { return nil }
        let written = chunk.withUnsafeBytes { raw -> Result<Void, Errno> in
            guard let base = raw.baseAddress else { return .success(()) }
            return writeFully(descriptor, from: base, count: raw.count, at: offset)
        }
        if case .failure(let error) = written {
            throw ProviderError(.io, "write failed: \(error.message)", errno: error.rawValue)
        }
        _ = delivered(chunk.count)
        return chunk.count
    }
}

/// One change a `.changeNotifying` provider reports.
public enum ProviderChange: Sendable, Hashable {
    /// The item under `name` in `directory` was written or had its metadata changed (a
    /// directory's own metadata, its entries' included, is its entry in its parent).
    case entry(directory: ItemIdentifier, name: String)
    /// `name` was created in, deleted from, or renamed into or out of `directory`.
    case membership(directory: ItemIdentifier, name: String)
    /// Some entries of `directory` changed; which is not known (a name that is not UTF-8).
    case entries(directory: ItemIdentifier)
}

/// What `Provider.hasChanges(since:)` compares against; opaque to the cache.
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
