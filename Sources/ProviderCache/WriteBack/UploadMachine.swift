// The rules of the write-back, as a pure state machine in the Arbiter style: state in, actions out;
// its host (LocalWrites+Queue.swift) carries the actions out with the lock dropped.
//
// `UploadMachine`: one item's write-back: dirty → uploading → materialized, or error with retries
// and exponential backoff, and a new publish that arrives while an upload runs.

public import ProviderModel

/// Where an item's write-back stands.
public enum UploadPhase: String, Sendable, Equatable {
    /// Published locally, not uploaded yet (or waiting for a retry after a failure).
    case dirty
    case uploading
    /// The last upload failed; retried after the backoff (the message is kept).
    case error
    /// Uploaded: the local version is the provider's `providerVersion`.
    case materialized
    /// Uploaded as `providerVersion`, but a chmod or utimens held by the record came after the
    /// upload call read what it carries: made at the provider next (D-460). Still pending.
    case attributes
}

/// One item's durable write-back entry (a row of the `uploads` table).
public struct UploadRecord: Sendable, Equatable {
    public var identifier: ItemIdentifier
    /// The newest locally published version ("local:…").
    public var localVersion: ContentVersion
    /// The provider's version the local edit started from (nil: a file created through the
    /// mount that the provider has never had content of beyond its empty creation).
    public var baseVersion: ContentVersion?
    public var phase: UploadPhase
    /// Failed attempts since the last success.
    public var attempts: Int
    public var lastError: String?
    /// Once uploaded: the provider's version the local version stands for.
    public var providerVersion: ContentVersion?
    /// When the local edit was kept beside a conflicting provider version: the conflict copy's name.
    public var conflictName: String?
    /// Permission bits a chmod during the edit set (D-385), or one held while the upload is
    /// queued or running (D-460), for the upload to carry; nil: the provider's stay.
    public var permissions: UInt16?
    /// An mtime a utimens set while the upload is queued or running (D-460), for the upload to
    /// carry; nil: the local version's own (its publish's, or the item's).
    public var modificationTime: ItemTime?
    /// The provider does not have the file yet (created through the mount, D-386): the upload is
    /// a `.create` under the item's name. Cleared once it got through.
    public var creates: Bool
    public init(
        identifier: ItemIdentifier, localVersion: ContentVersion, baseVersion: ContentVersion?,
        phase: UploadPhase = .dirty, attempts: Int = 0, lastError: String? = nil,
        providerVersion: ContentVersion? = nil, conflictName: String? = nil, permissions: UInt16? = nil,
        creates: Bool = false, modificationTime: ItemTime? = nil
    ) {
        self.identifier = identifier
        self.localVersion = localVersion
        self.baseVersion = baseVersion
        self.phase = phase
        self.attempts = attempts
        self.lastError = lastError
        self.providerVersion = providerVersion
        self.conflictName = conflictName
        self.permissions = permissions
        self.creates = creates
        self.modificationTime = modificationTime
    }

    /// The chmod and utimens the record holds for the provider (D-385, D-460).
    public var heldAttributes: HeldAttributes {
        HeldAttributes(permissions: permissions, modificationTime: modificationTime)
    }

    /// What the last failure was: the code its message starts with ("noSpace: …", as
    /// `CacheError` prints itself, D-390), nil when there is none or it names no code.
    public var lastErrorCode: CacheError.Code? {
        guard let lastError, let colon = lastError.firstIndex(of: ":") else { return nil }
        return CacheError.Code(rawValue: String(lastError[..<colon]))
    }

    /// Still to upload (dirty, uploading, error): the local version must be served meanwhile.
    public var isPending: Bool { phase != .materialized }
}

/// A mode and an mtime an upload record holds for the provider (nil: none).
public struct HeldAttributes: Sendable, Equatable {
    public var permissions: UInt16?
    public var modificationTime: ItemTime?
    /// An atime a utimens set (D-460): never carried by an upload (it makes a new file), made
    /// after it; held in memory only (`UploadMachine.heldAccessTime`).
    public var accessTime: ItemTime?

    public init(permissions: UInt16? = nil, modificationTime: ItemTime? = nil, accessTime: ItemTime? = nil) {
        self.permissions = permissions
        self.modificationTime = modificationTime
        self.accessTime = accessTime
    }

    /// Whether anything is held.
    var isEmpty: Bool { permissions == nil && modificationTime == nil && accessTime == nil }

    /// Whether this holds something that `sent` did not carry (a chmod or utimens held after the
    /// call read its terms; an atime an upload call could not carry).
    func isNews(since sent: HeldAttributes?) -> Bool {
        (permissions != nil && permissions != sent?.permissions)
            || (modificationTime != nil && modificationTime != sent?.modificationTime)
            || (accessTime != nil && accessTime != sent?.accessTime)
    }

    /// The mode and times of a chmod or utimens (not its owner).
    init(_ changes: ItemAttributeChanges) {
        self.init(
            permissions: changes.permissions, modificationTime: changes.modificationTime,
            accessTime: changes.accessTime)
    }

    /// `item` showing what is held.
    func apply(to item: inout ProviderItem) {
        if let permissions { item.permissions = permissions }
        if let modificationTime { item.modificationTime = modificationTime }
        if let accessTime { item.accessTime = accessTime }
    }

    /// As the provider's `setAttributes` takes them.
    var changes: ItemAttributeChanges {
        ItemAttributeChanges(permissions: permissions, modificationTime: modificationTime, accessTime: accessTime)
    }
}

/// The write-back of one item. Time is the host's timeline (injected clock).
struct UploadMachine: Sendable, Equatable {
    enum Action: Sendable, Equatable {
        /// Upload `version` against `base`, then report `uploaded` or `failed`.
        case upload(version: ContentVersion, base: ContentVersion?)
        /// Try again after the delay: call `retryDue` on the machine of `version` (wherever a
        /// rename has moved it meanwhile).
        case retry(after: Duration, version: ContentVersion)
        /// Save the record (durable queue).
        case save(UploadRecord)
        /// The write-back settle (D-405): call `settleDue` on the machine of `version` after the
        /// delay.
        case settle(after: Duration, version: ContentVersion)
        /// Make the held chmod and utimens at the provider (`sendingAttributes` says which), then
        /// report `attributesMade` or `failed` (D-460).
        case setAttributes(version: ContentVersion)

        /// The record a `.save` saves.
        var savedRecord: UploadRecord? {
            if case .save(let record) = self { record } else { nil }
        }
    }
    private(set) var record: UploadRecord
    /// The version the running upload sends (nil: none runs); in phase `.attributes`, the
    /// version whose held attributes the running call makes.
    private(set) var inFlight: ContentVersion?
    /// The held attributes the running call carries, as it read them (`sendingAttributes`; nil:
    /// not read yet): what is held beyond them is made after it (D-460).
    private(set) var carried: HeldAttributes?
    /// An atime held (D-460), made by the call that makes held attributes after the upload (an
    /// upload makes a new file, with an atime of its own). Not in the record: a restart loses
    /// it (SEMANTICS.md, atime).
    private(set) var heldAccessTime: ItemTime?
    /// When the newest local version may start its upload (D-405): set by a publish made with a
    /// settle, cleared when an upload starts. On the host's timeline.
    private(set) var settleDeadline: Duration?
    /// When the item's last upload was recorded (the host's timeline; nil: none since the
    /// daemon started). It is the item's, so it follows renames with the record and goes with
    /// it: a staging copy made after it took its base from the provider's news (D-451, D-477).
    private(set) var uploadedAt: Duration?
    /// When the oldest publish still waiting out the settle was made: bounds the settle.
    private var settlingSince: Duration?
    let initialBackoff: Duration
    let maximumBackoff: Duration

    init(record: UploadRecord, initialBackoff: Duration = .seconds(1), maximumBackoff: Duration = .seconds(300)) {
        var record = record
        // A restart finds an upload that was running: it is dirty again (the provider's call is
        // atomic, so it either happened, which the base version check then sees, or not).
        if record.phase == .uploading { record.phase = .dirty }
        self.record = record
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// What to do at start (after a restart: resume).
    mutating func start() -> [Action] {
        if record.phase == .attributes { return makeAttributes() }
        guard record.phase == .dirty || record.phase == .error else { return [] }
        return begin()
    }

    /// Everything held: the record's, and the atime.
    var held: HeldAttributes {
        var held = record.heldAttributes
        held.accessTime = heldAccessTime
        return held
    }

    /// The running call reads what it carries: the held attributes, noted as carried (the atime
    /// only by the call that makes them in phase `.attributes`).
    mutating func sendingAttributes() -> HeldAttributes {
        let sending = record.phase == .attributes ? held : record.heldAttributes
        carried = sending
        return sending
    }

    /// A chmod or utimens of the item while its upload is queued or running (D-460): held by
    /// the record, carried by the next upload call, or made after the running one. Each given
    /// field replaces the one held.
    mutating func hold(_ attributes: HeldAttributes) -> [Action] {
        if let permissions = attributes.permissions { record.permissions = permissions }
        if let time = attributes.modificationTime { record.modificationTime = time }
        if let time = attributes.accessTime { heldAccessTime = time }
        return [.save(record)]
    }

    private mutating func makeAttributes() -> [Action] {
        record.phase = .attributes
        inFlight = record.localVersion
        carried = nil
        return [.save(record), .setAttributes(version: record.localVersion)]
    }

    private mutating func begin() -> [Action] {
        guard inFlight == nil else { return [] }
        settleDeadline = nil
        settlingSince = nil
        record.phase = .uploading
        inFlight = record.localVersion
        return [.save(record), .upload(version: record.localVersion, base: record.baseVersion)]
    }

    /// A new local version was published; `base`: the provider's version the edit started from
    /// (used when nothing was pending; a pending edit keeps its own base). `permissions`: a
    /// chmod the edit carries (D-385); one an earlier pending version carries stays unless
    /// this one sets its own.
    /// `settle` (D-405): the upload starts that long after the newest publish, and no later than
    /// `maximumSettle` after the oldest one it waits for (`now`: the host's timeline).
    mutating func published(
        _ version: ContentVersion, base: ContentVersion?, baseIsNewer: Bool = false, permissions: UInt16? = nil,
        now: Duration = .zero, settle: Duration = .zero, maximumSettle: Duration = .zero
    ) -> [Action] {
        if record.phase == .attributes {
            // Uploaded, its held attributes not made yet: the next upload replaces what the
            // last one made, and carries them (D-460).
            record.baseVersion = record.providerVersion ?? record.baseVersion
            record.providerVersion = nil
        } else if record.phase == .materialized {
            // After an upload the provider's version is the local one: the next edit starts
            // there (a writer that fsynced, was uploaded, and wrote on: its staging began from
            // the upload's own base or a local version); else from `base`. A writer whose copy
            // was made after that upload from another provider version (`baseIsNewer`: changed
            // elsewhere since, another machine's write, D-451) starts from that one, or its
            // upload was a false conflict. A copy older than the upload keeps the upload's
            // version: its base is history (a long-lived writer that fsyncs).
            let since =
                baseIsNewer
                && base.map { $0 != record.baseVersion && !$0.rawValue.hasPrefix("local:") && !$0.isUnborn } ?? false
            record.baseVersion = since ? base : record.providerVersion ?? base
            record.providerVersion = nil
            record.permissions = nil
        }
        if let permissions { record.permissions = permissions }
        // The new version brings its own mtime (a write after a utimens moves it, and a publish
        // without a change keeps the item's, which shows the one held), D-460.
        record.modificationTime = nil
        record.localVersion = version
        record.attempts = 0
        record.conflictName = nil
        var waits: [Action] = []
        if settle > .zero {
            let since = settlingSince ?? now
            settlingSince = since
            let deadline = min(now + settle, since + max(settle, maximumSettle))
            settleDeadline = deadline
            waits = [.settle(after: max(.zero, deadline - now), version: version)]
        }
        if inFlight != nil {
            record.phase = .uploading
            return [.save(record)] + waits
        }
        record.phase = .dirty
        // Starting at once: saved once, as uploading (a restart resumes it as dirty, D-362), not
        // as dirty and then as uploading (a commit per new file of `tar x`, D-522).
        return waits.isEmpty ? begin() : [.save(record)] + waits
    }

    /// The settle of `version` has passed (D-405): its upload starts, unless a newer publish
    /// waits for its own, an upload runs (its end starts the next), or one started already.
    mutating func settleDue(_ version: ContentVersion, now: Duration) -> [Action] {
        guard version == record.localVersion, let deadline = settleDeadline, now >= deadline, inFlight == nil,
            record.phase == .dirty
        else { return [] }
        return begin()
    }

    /// Starts the upload of a version waiting out its settle now (an unmount's flush, D-405).
    mutating func expedite() -> [Action] {
        guard settleDeadline != nil, inFlight == nil, record.phase == .dirty else { return [] }
        return begin()
    }

    /// The upload of `version` made the provider's `providerVersion`.
    mutating func uploaded(
        _ version: ContentVersion, providerVersion: ContentVersion, now: Duration = .zero
    ) -> [Action] {
        inFlight = nil
        uploadedAt = now
        let sent = carried
        carried = nil
        record.attempts = 0
        record.lastError = nil
        record.creates = false  // the provider has the file now
        if version == record.localVersion {
            record.providerVersion = providerVersion
            // A chmod or utimens held after the call read its terms: made next (D-460).
            if held.isNews(since: sent) { return makeAttributes() }
            record.phase = .materialized
            record.permissions = nil  // the provider has them now
            record.modificationTime = nil
            return [.save(record)]
        }
        // A newer version was published meanwhile: it is uploaded next, from what this one made
        // (once its settle has passed: its timer starts it then).
        record.baseVersion = providerVersion
        if let deadline = settleDeadline, now < deadline {
            record.phase = .dirty
            return [.save(record)]
        }
        return begin()
    }

    /// The upload failed with `message`; retried after the backoff (doubling, bounded).
    /// In phase `.attributes` the call that failed made the held attributes: retried as such.
    mutating func failed(_ version: ContentVersion, message: String) -> [Action] {
        inFlight = nil
        carried = nil
        if version != record.localVersion {
            // A newer version is waiting: try it at once.
            return begin()
        }
        record.attempts += 1
        if record.phase != .attributes { record.phase = .error }
        record.lastError = message
        return [.save(record), .retry(after: backoff, version: record.localVersion)]
    }

    /// The backoff after `record.attempts` failures: initial × 2^(attempts-1), at most the maximum.
    var backoff: Duration {
        var delay = initialBackoff
        for _ in 1..<max(1, record.attempts) where delay < maximumBackoff { delay = delay * 2 }
        return min(delay, maximumBackoff)
    }

    /// The backoff has passed.
    mutating func retryDue() -> [Action] {
        if record.phase == .attributes, inFlight == nil { return makeAttributes() }
        guard record.phase == .error else { return [] }
        return begin()
    }

    /// The held attributes of `version` were made at the provider (or `gone`: the item is no
    /// longer there, nothing to make them on). Those held since are made next; a version
    /// published meanwhile is uploaded next, carrying them (D-460). The host rebased the record
    /// to the version the change made first (`rebase`).
    mutating func attributesMade(_ version: ContentVersion, gone: Bool = false) -> [Action] {
        guard inFlight == version else { return [] }
        inFlight = nil
        let sent = carried
        carried = nil
        record.attempts = 0
        record.lastError = nil
        if version != record.localVersion { return begin() }
        if !gone, held.isNews(since: sent) { return makeAttributes() }
        record.phase = .materialized
        record.permissions = nil
        record.modificationTime = nil
        heldAccessTime = nil
        return [.save(record)]
    }

    /// The item was renamed (its identifier changed).
    mutating func rename(to identifier: ItemIdentifier) { record.identifier = identifier }

    /// The mount itself changed the provider's version `from` into `to` (chmod, utimens, D-375):
    /// the queued edit's base, and the provider version that the next edit will start from
    /// after an upload (`providerVersion` while materialized), follow. Returns whether anything
    /// changed.
    mutating func rebase(from: ContentVersion, to: ContentVersion) -> Bool {
        var changed = false
        if record.baseVersion == from {
            record.baseVersion = to
            changed = true
        }
        if record.providerVersion == from {
            record.providerVersion = to
            changed = true
        }
        return changed
    }

    /// A chmod or utimens reached the provider while this record waits: what the record holds of
    /// them (D-385, D-460) is that now, or its upload would undo it.
    mutating func carry(_ made: HeldAttributes) -> Bool {
        var changed = false
        if record.permissions != nil, let permissions = made.permissions {
            record.permissions = permissions
            changed = true
        }
        if record.modificationTime != nil, let time = made.modificationTime {
            record.modificationTime = time
            changed = true
        }
        if heldAccessTime != nil, let time = made.accessTime { heldAccessTime = time }
        return changed
    }

    /// The file, not at the provider yet, was created there empty as `created` (D-386): the
    /// upload is a replace of that version now.
    mutating func bornEmpty(as created: ContentVersion) {
        record.creates = false
        record.baseVersion = created
    }

    /// The provider's version changed since the edit began: the local edit was kept under
    /// `conflictName`; the item is the provider's again.
    mutating func conflictResolved(conflictName: String) -> [Action] {
        inFlight = nil
        carried = nil
        record.phase = .materialized
        record.conflictName = conflictName
        record.permissions = nil
        record.modificationTime = nil
        record.creates = false
        record.attempts = 0
        record.lastError = nil
        return [.save(record)]
    }
}

extension ContentVersion {
    /// The version of a file created through the mount that neither a publish nor the provider
    /// has given content yet (D-386): empty, its bytes nowhere.
    static func unborn(_ number: Int64) -> ContentVersion {
        ContentVersion("unborn:\(number).\(UInt32.random(in: 0...UInt32.max))")
    }

    var isUnborn: Bool { rawValue.hasPrefix("unborn:") }
    /// A version a publish through the mount made ("local:…"), not the provider's.
    var isLocal: Bool { rawValue.hasPrefix("local:") }
}
