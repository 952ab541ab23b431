// Faults on cue: a wrapper that makes a real provider fail the way networks and servers do. Every
// mount wraps its provider in it (`providerfs fault`, the demo's failing item); unit tests use it
// with an injected clock.

import CryptoSupport
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Wraps a provider and applies a `FaultPlan` to its calls.
///
/// - **Content**: a fetch meets the first rule (in the order added) about the item or one of its
///   ancestors; the stream it returns misbehaves as the `Fault` says. A fetch that meets no rule
///   gets the base's stream untouched (its direct transfer kept); with no rules at all the check
///   is one flag read.
/// - **Downloads**: a `.downloads(N)` rule is consumed by the first fetch of a download and strikes
///   every fetch of that download (the cache's retries) until the cache calls `downloadEnded`
///   (call it yourself when driving `fetchContents` by hand).
/// - **Metadata**: offline rules, and rules with `metadata`, make `item`, `children`, `child`,
///   `trackedChildren` fail (or stall) for the item and everything inside it, `itemNow` decline,
///   and `hasChanges` say "unsure", so the cache asks and meets the fault.
/// - **Directories**: the wrapper learns each item's parent from the items it passes on (and asks
///   the base, `itemNow` else `item`, for one it has not seen), so a rule on a directory strikes
///   everything inside it, and a rule on the root everything.
///
/// One wrapper for every base: it forwards each call and the base's `capabilities` (D-229).
public struct FaultInjectingProvider: Provider {
    public let base: any Provider
    public let plan: FaultPlan
    /// Stall durations and pacing (`.stall(…, duration:)`, `.slow`) sleep on this clock.
    public let clock: any Clock<Duration>
    /// The base's, read once (opens ask on every call).
    public let capabilities: ProviderCapabilities
    private let lineage = Lineage()

    public init(wrapping base: any Provider, plan: FaultPlan, clock: any Clock<Duration> = ContinuousClock()) {
        self.base = base
        self.plan = plan
        self.clock = clock
        capabilities = base.capabilities
    }

    // MARK: Metadata

    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try await strikeMetadata(identifier)
        return record(try await base.item(for: identifier))
    }

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await strikeMetadata(identifier)
        return record(try await base.children(of: identifier))
    }

    public func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        try await strikeMetadata(directory)
        guard let found = try await base.child(named: name, of: directory) else { return nil }
        // A lookup of an item is a call about it too.
        if !plan.isEmpty { try await strikeMetadata(record(found).identifier) }
        return found
    }

    /// Declines (nil) for an item a metadata rule strikes, or whose ancestors cannot be told at
    /// once while such rules exist: the slow path meets the fault.
    public func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? {
        guard plan.hasMetadataRules else {
            let found = try base.itemNow(for: identifier)
            if let found, !plan.isEmpty { _ = record(found) }
            return found
        }
        guard let ancestors = lineage.ancestorsNow(of: identifier, base: base),
            plan.metadataFault(for: identifier, lineage: ancestors) == nil
        else { return nil }
        return try base.itemNow(for: identifier).map(record)
    }

    /// Declines while any rule strikes metadata (the slow path meets the fault); else the base's
    /// answer.
    public func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild {
        guard !plan.hasMetadataRules else { return .declined }
        let answer = try base.childNow(named: name, of: directory)
        if case .found(let found) = answer, !plan.isEmpty { _ = record(found) }
        return answer
    }

    /// Declines while an upload fault is armed (the create then reaches the provider at once, and
    /// meets the fault there); else the base's answer. An offline rule does not decline: a
    /// provider that defers makes a create offline as it would without a network (D-434, D-491),
    /// and its `.create` upload meets the rule until it is cleared.
    public func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? {
        guard !plan.hasUploadFaults else { return nil }
        return try base.deferCreateNow(named: name, in: parent)
    }

    public func forgetDeferredCreate(_ identifier: ItemIdentifier) { base.forgetDeferredCreate(identifier) }

    public func isSameContent(_ version: ContentVersion, as other: ContentVersion) -> Bool {
        base.isSameContent(version, as: other)
    }

    public func restoreStatedChecksums(of items: [ProviderItem]) { base.restoreStatedChecksums(of: items) }

    /// Declines while any rule strikes writes (the change then reaches `setAttributes`, and meets
    /// the fault there); else the base's answer.
    public func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem?
    {
        guard !plan.hasWriteRules else { return nil }
        return try base.setAttributesNow(identifier, changes).map(record)
    }

    public func trackedChildren(
        of identifier: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        try await strikeMetadata(identifier)
        let (children, token) = try await base.trackedChildren(of: identifier)
        return (record(children), token)
    }

    public func trackedChildren(
        of identifier: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        try await strikeMetadata(identifier)
        let (children, token) = try await base.trackedChildren(of: identifier, batch: batch)
        return (record(children), token)
    }

    /// Unsure (true) while any rule strikes metadata.
    public func hasChanges(since token: ListingChangeToken) -> Bool {
        plan.hasMetadataRules || base.hasChanges(since: token)
    }

    public func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        base.observeChanges(observer)
    }

    // MARK: Content

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        guard !plan.isEmpty else {
            return try await base.fetchContents(of: identifier, version: version, range: range)
        }
        let ancestors = await lineage.ancestors(of: identifier, base: base)
        // Offline rules too: one counted like the others when it has `times`.
        let matched = plan.fault(forFetchOf: identifier, version: version, lineage: ancestors)
        if matched?.fault == .offline { throw Self.offlineError }
        let stream = try await base.fetchContents(of: identifier, version: version, range: range)
        guard let (fault, serial) = matched else { return stream }
        let plan = self.plan
        return FaultyStream(
            base: stream, fault: fault, range: range, clock: clock, active: { plan.isActive(serial) }
        ) {
            plan.struck(identifier, version: version)
        }
    }

    public func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {
        if !plan.isEmpty { plan.downloadEnded(of: identifier, version: version, succeeded: succeeded) }
        base.downloadEnded(of: identifier, version: version, succeeded: succeeded)
    }

    public func fingerprint(of item: ProviderItem) -> String? { base.fingerprint(of: item) }

    // MARK: Writing (forwarded after the write rules; the base's capabilities say which calls
    // really work)
    //
    // A call about a new item (create, upload of a new file) is about its parent directory; a
    // move is about its item and its destination directory. Offline rules strike every write
    // call; `--on upload` rules strike uploads (failure, stall) and, offline, every write call.

    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        try await strikeWrite(parent)
        return record(try await base.createDirectory(named: name, in: parent, permissions: permissions))
    }

    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String
    ) async throws -> ProviderItem {
        try await strikeWrite(parent)
        return record(try await base.createSymbolicLink(named: name, in: parent, target: target))
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        if plan.hasWriteRules {
            let about: ItemIdentifier
            switch target {
            case .create(_, let parent): about = parent
            case .replace(let identifier, _): about = identifier
            }
            var info = stat()
            let size = stat(localFile, &info) == 0 ? Int64(info.st_size) : 0
            try await strikeWrite(about, uploadSize: size)
        }
        return record(
            try await base.upload(
                from: localFile, to: target, permissions: permissions, modificationTime: modificationTime))
    }

    public func link(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String
    ) async throws -> ProviderItem {
        try await strikeWrite(parent)
        return record(try await base.link(identifier, to: parent, named: name))
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        try await strikeWrite(identifier)
        try await base.delete(identifier, kind: kind)
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        try await strikeWrite(identifier)
        try await strikeWrite(parent)
        return record(try await base.move(identifier, to: parent, named: name, mode: mode))
    }

    public func setAttributes(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws -> ProviderItem {
        try await strikeWrite(identifier)
        return record(try await base.setAttributes(identifier, changes))
    }

    // MARK: Helpers

    static let offlineError = ProviderError(.unreachable, "provider is offline (injected fault)")

    /// Throws (or stalls) when a metadata rule strikes `identifier`.
    private func strikeMetadata(_ identifier: ItemIdentifier) async throws {
        guard plan.hasMetadataRules else { return }
        let ancestors = await lineage.ancestors(of: identifier, base: base)
        guard let fault = plan.metadataFault(for: identifier, lineage: ancestors) else { return }
        switch fault {
        case .offline:
            throw Self.offlineError
        case .failAfter(_, let errno):
            throw Fault.error(errno: errno, "\(identifier): metadata call failed (injected fault)")
        case .stall(_, let duration):
            try await stall(duration, clock: clock)
        default:
            return
        }
    }

    /// Throws (or stalls) when a write rule strikes a write call about `identifier` (an upload
    /// of `uploadSize` bytes, or nil: another write call).
    private func strikeWrite(_ identifier: ItemIdentifier, uploadSize: Int64? = nil) async throws {
        guard plan.hasWriteRules else { return }
        let ancestors = await lineage.ancestors(of: identifier, base: base)
        guard let (fault, serial) = plan.writeFault(for: identifier, lineage: ancestors, uploadSize: uploadSize)
        else { return }
        switch fault {
        case .failAfter(let offset, let errno):
            throw Fault.uploadError(
                errno: errno, "\(identifier): upload failed after \(offset) bytes, nothing published (injected fault)")
        case .stall(_, let duration):
            let plan = self.plan
            defer { plan.writeEnded(serial) }
            try await stall(duration, clock: clock, while: { plan.isActive(serial) })
        default:
            throw Self.offlineError
        }
    }

    private func record(_ item: ProviderItem) -> ProviderItem {
        if !plan.isEmpty { lineage.record(item) }
        return item
    }

    private func record(_ items: [ProviderItem]) -> [ProviderItem] {
        if !plan.isEmpty { lineage.record(items) }
        return items
    }
}

/// Sleeps `duration` on `clock`, or (nil) until cancelled — a dead connection: nothing arrives
/// until someone gives up on us. Ends early once `active()` is false (the fault was cleared),
/// looked at every `stallCheck` of the clock.
func stall(
    _ duration: Duration?, clock: any Clock<Duration>, while active: @Sendable () -> Bool = { true }
) async throws {
    try await stall(duration, on: clock, while: active)
}

private func stall<C: Clock<Duration>>(
    _ duration: Duration?, on clock: C, while active: @Sendable () -> Bool
) async throws {
    let end = duration.map { clock.now.advanced(by: $0) }
    while active() {
        let now = clock.now
        if let end, now >= end { return }
        let check = now.advanced(by: stallCheck)
        try await clock.sleep(until: end.map { min($0, check) } ?? check, tolerance: nil)
    }
}

/// How often a stalled stream looks whether its fault was cleared.
let stallCheck: Duration = .milliseconds(50)

/// What the wrapper knows of each item's parent (learned from the items it passes on while rules
/// exist). Bounded: past `capacity` entries it starts again (the base is asked for what is missing).
final class Lineage: Sendable {
    private let parents = Locked<[ItemIdentifier: ItemIdentifier]>([:])
    static let capacity = 200_000
    /// Ancestors deeper than this are not followed (a cycle in a broken provider ends here).
    static let maximumDepth = 256

    func record(_ item: ProviderItem) {
        guard item.identifier != .root else { return }
        parents.withLock { parents in
            if parents.count >= Self.capacity { parents.removeAll(keepingCapacity: true) }
            parents[item.identifier] = item.parent
        }
    }

    func record(_ items: [ProviderItem]) {
        guard !items.isEmpty else { return }
        parents.withLock { parents in
            if parents.count + items.count > Self.capacity { parents.removeAll(keepingCapacity: true) }
            for item in items where item.identifier != .root { parents[item.identifier] = item.parent }
        }
    }

    /// `identifier`'s ancestors, nearest first, ending with the root; an ancestor the base cannot
    /// tell ends the list there (the root is always included).
    func ancestors(of identifier: ItemIdentifier, base: any Provider) async -> [ItemIdentifier] {
        var result: [ItemIdentifier] = []
        var current = identifier
        while current != .root && result.count < Self.maximumDepth {
            var parent = parents.withLock { $0[current] }
            if parent == nil {
                let found: ProviderItem?
                if let now = try? base.itemNow(for: current) {
                    found = now
                } else {
                    found = try? await base.item(for: current)
                }
                if let found {
                    record(found)
                    parent = found.parent
                }
            }
            guard let parent, parent != current else { break }
            result.append(parent)
            current = parent
        }
        if result.last != .root { result.append(.root) }
        return result
    }

    /// The same, without waiting: nil when an ancestor is unknown and the base cannot tell it at once.
    func ancestorsNow(of identifier: ItemIdentifier, base: any Provider) -> [ItemIdentifier]? {
        var result: [ItemIdentifier] = []
        var current = identifier
        while current != .root && result.count < Self.maximumDepth {
            var parent = parents.withLock { $0[current] }
            if parent == nil {
                guard let found = try? base.itemNow(for: current) else { return nil }
                record(found)
                parent = found.parent
            }
            guard let parent, parent != current else { break }
            result.append(parent)
            current = parent
        }
        if result.last != .root { result.append(.root) }
        return result
    }
}

/// A stream that delivers its base stream's bytes and misbehaves as its fault says. It offers no
/// direct transfer (whatever its base offers): every byte goes through `next`, where the fault is
/// applied. A `.corrupt` stream is `.checksummed`: its checksum is the SHA-256 of the bytes its
/// base delivered (the unmodified bytes), known once `next` has returned nil.
final class FaultyStream: ContentStream, @unchecked Sendable {
    // Safe: one consumer drives a stream (ContentStream's contract); `state` is only touched while
    // `lock` is held, and `next` runs one call at a time.
    private let lock = Lock()
    private let base: any ContentStream
    private let fault: Fault
    private let clock: any Clock<Duration>
    private let range: Range<Int64>
    /// Called each time the fault strikes (the stream misbehaves), so that a download it never
    /// struck is not counted.
    private let onStrike: @Sendable () -> Void
    /// Whether the rule behind the fault still exists (a stall ends when it is cleared).
    private let active: @Sendable () -> Bool
    private struct State {
        var position: Int64
        var stalled = false
        var hasher: SHA256Box?
        var checksum: ContentChecksum?
    }
    private var state: State

    init(
        base: any ContentStream, fault: Fault, range: Range<Int64>, clock: any Clock<Duration>,
        active: @escaping @Sendable () -> Bool = { true }, onStrike: @escaping @Sendable () -> Void = {}
    ) {
        self.onStrike = onStrike
        self.active = active
        self.base = base
        self.fault = fault
        self.clock = clock
        self.range = range
        state = State(position: range.lowerBound, hasher: fault.isCorrupt ? SHA256Box() : nil)
    }

    var capabilities: ContentStreamCapabilities { fault.isCorrupt ? .checksummed : [] }

    var checksum: ContentChecksum? { lock.withLock { state.checksum } }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        let position = lock.withLock { state.position }
        var allowed = Int64(max(1, maximumLength))
        switch fault {
        case .failAfter(let offset, let code):
            if position >= offset {
                onStrike()
                throw Fault.error(errno: code, "transfer failed at byte \(position) (injected fault)")
            }
            allowed = min(allowed, offset - position)
        case .stall(let offset, let duration):
            if position >= offset, !lock.withLock({ state.stalled }) {
                onStrike()
                try await stall(duration, clock: clock, while: active)
                lock.withLock { state.stalled = true }
            } else if position < offset {
                allowed = min(allowed, offset - position)
            }
        case .truncate(let offset):
            if position >= offset {
                if position < range.upperBound { onStrike() }
                return nil
            }
            allowed = min(allowed, offset - position)
        case .changeVersion(let offset):
            if position >= offset {
                onStrike()
                throw ProviderError(.versionChanged, "item changed on the provider (injected fault)")
            }
            allowed = min(allowed, offset - position)
        case .slow(let rate):
            // A tenth of a second's worth at most, and the time it takes at `rate` slept first.
            allowed = min(allowed, max(1, rate / 10))
        case .corrupt, .offline:
            break
        }
        guard var chunk = try await base.next(maximumLength: Int(allowed)) else {
            finishChecksum()
            return nil
        }
        if case .slow(let rate) = fault {
            onStrike()
            try await clock.sleep(for: .nanoseconds(Int64(chunk.count) * 1_000_000_000 / max(1, rate)))
        }
        if case .corrupt(let offset) = fault {
            lock.withLock { state.hasher?.update(chunk) }
            let end = offset + Fault.corruptLength
            let chunkEnd = position + Int64(chunk.count)
            if position < end && chunkEnd > offset {
                onStrike()
                for index in Int(max(offset, position) - position)..<Int(min(end, chunkEnd) - position) {
                    chunk[index] ^= 0xFF
                }
            }
        }
        lock.withLock { state.position += Int64(chunk.count) }
        return chunk
    }

    private func finishChecksum() {
        lock.withLock {
            guard let hasher = state.hasher else { return }
            state.hasher = nil
            state.checksum = ContentChecksum(.sha256, digest: hasher.finalize())
        }
    }

    func close() { base.close() }
}

extension Fault {
    var isCorrupt: Bool {
        if case .corrupt = self { return true }
        return false
    }
}

/// A copyable handle on a streaming SHA-256 (the hasher itself is non-copyable).
final class SHA256Box: @unchecked Sendable {
    // Safe: used under the owning stream's lock only.
    private var hasher: SHA256? = SHA256()

    func update(_ bytes: [UInt8]) { hasher?.update(bytes) }

    func finalize() -> [UInt8] {
        guard let hasher = hasher.take() else { return [] }
        return hasher.finalize()
    }
}
