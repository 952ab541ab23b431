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
    /// Permission bits a chmod during the edit set (D-385), for the upload to carry; nil: the
    /// provider's stay.
    public var permissions: UInt16?
    /// The provider does not have the file yet (created through the mount, D-386): the upload is
    /// a `.create` under the item's name. Cleared once it got through.
    public var creates: Bool
    public init(
        identifier: ItemIdentifier, localVersion: ContentVersion, baseVersion: ContentVersion?,
        phase: UploadPhase = .dirty, attempts: Int = 0, lastError: String? = nil,
        providerVersion: ContentVersion? = nil, conflictName: String? = nil, permissions: UInt16? = nil,
        creates: Bool = false
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
    }
    private(set) var record: UploadRecord
    /// The version the running upload sends (nil: none runs).
    private(set) var inFlight: ContentVersion?
    /// When the newest local version may start its upload (D-405): set by a publish made with a
    /// settle, cleared when an upload starts. On the host's timeline.
    private(set) var settleDeadline: Duration?
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
        guard record.phase == .dirty || record.phase == .error else { return [] }
        return begin()
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
        if record.phase == .materialized {
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
        return waits.isEmpty ? [.save(record)] + begin() : [.save(record)] + waits
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
        record.attempts = 0
        record.lastError = nil
        record.creates = false  // the provider has the file now
        if version == record.localVersion {
            record.phase = .materialized
            record.providerVersion = providerVersion
            record.permissions = nil  // the provider has them now
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
    mutating func failed(_ version: ContentVersion, message: String) -> [Action] {
        inFlight = nil
        if version != record.localVersion {
            // A newer version is waiting: try it at once.
            return begin()
        }
        record.attempts += 1
        record.phase = .error
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
        guard record.phase == .error else { return [] }
        return begin()
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

    /// A chmod reached the provider while this record waits: it carries that mode now (D-385).
    mutating func carry(permissions: UInt16) { record.permissions = permissions }

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
        record.phase = .materialized
        record.conflictName = conflictName
        record.permissions = nil
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
}
