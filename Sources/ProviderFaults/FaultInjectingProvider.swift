// Faults on cue: a wrapper that makes a real provider fail the way networks and servers do. Used by
// the demo (one item that always fails halfway), by tests, and later by `providerfs fault`.

public import ProviderModel
import SystemSupport

/// One injected fault. Offsets are absolute positions in the item's content, so a fault "at 50%"
/// hits every fetch that crosses that point, whatever range it started at.
public enum Fault: Sendable, Equatable, CustomStringConvertible {
    /// The stream throws `.io` (with `errno`, EIO by default) when it reaches `offset`.
    case failAfter(offset: Int64, errno: Int32)
    /// The stream stops delivering at `offset` and waits until cancelled (a dead connection).
    case stall(offset: Int64)
    /// The stream ends cleanly at `offset`, short of the requested range (a lying server).
    case truncate(offset: Int64)
    /// The stream throws `.versionChanged` at `offset` (the item changed on the server).
    case changeVersion(offset: Int64)
    /// Every call about this item throws `.unreachable` (and for the root: every call at all).
    case offline

    public var description: String {
        switch self {
        case .failAfter(let offset, let errno): "fail-after \(offset) errno \(errno)"
        case .stall(let offset): "stall at \(offset)"
        case .truncate(let offset): "truncate at \(offset)"
        case .changeVersion(let offset): "change-version at \(offset)"
        case .offline: "offline"
        }
    }
}

/// A fault on one item, for a number of fetches (`times == nil`: every fetch).
public struct FaultRule: Sendable, Equatable {
    public var identifier: ItemIdentifier
    public var fault: Fault
    public var times: Int?
    public init(identifier: ItemIdentifier, fault: Fault, times: Int? = nil) {
        self.identifier = identifier
        self.fault = fault
        self.times = times
    }
}

/// The mutable set of fault rules a `FaultInjectingProvider` consults on every call.
public final class FaultPlan: @unchecked Sendable {
    // Safe: `rules` is only read or written while `lock` is held.
    private let lock = Lock()
    private var rules: [FaultRule]

    public init(_ rules: [FaultRule] = []) { self.rules = rules }

    public func add(_ rule: FaultRule) { lock.withLock { rules.append(rule) } }
    public func clear(_ identifier: ItemIdentifier? = nil) {
        lock.withLock { rules.removeAll { identifier == nil || $0.identifier == identifier } }
    }
    public var all: [FaultRule] { lock.withLock { rules } }

    /// The first fault for `identifier`, consuming one of its `times`.
    func take(for identifier: ItemIdentifier, offline: Bool) -> Fault? {
        lock.withLock {
            guard
                let index = rules.firstIndex(where: {
                    ($0.identifier == identifier || ($0.identifier == .root && $0.fault == .offline))
                        && (($0.fault == .offline) == offline)
                })
            else { return nil }
            let fault = rules[index].fault
            if let times = rules[index].times {
                if times <= 1 { rules.remove(at: index) } else { rules[index].times = times - 1 }
            }
            return fault
        }
    }

    /// Whether any item (or the whole provider) is offline.
    var anyOffline: Bool { lock.withLock { rules.contains { $0.fault == .offline } } }

    func isOffline(_ identifier: ItemIdentifier) -> Bool {
        lock.withLock {
            rules.contains { $0.fault == .offline && ($0.identifier == identifier || $0.identifier == .root) }
        }
    }
}

/// Wraps a provider and applies a `FaultPlan` to its calls. One wrapper for every base: it
/// forwards each call and the base's `capabilities` (so a local directory wrapped for the demo
/// still looks names up, tracks and pushes changes and answers metadata at once, D-229), and
/// offline faults win over all of it: an offline item is not answered at once, and while
/// anything is offline no listing counts as unchanged, so the cache asks (and meets the fault)
/// as it would without tracking.
public struct FaultInjectingProvider: Provider {
    public let base: any Provider
    public let plan: FaultPlan
    /// The base's, read once (opens ask on every call).
    public let capabilities: ProviderCapabilities

    public init(wrapping base: any Provider, plan: FaultPlan) {
        self.base = base
        self.plan = plan
        capabilities = base.capabilities
    }

    func checkOffline(_ identifier: ItemIdentifier) throws {
        if plan.isOffline(identifier) {
            throw ProviderError(.unreachable, "provider is offline (injected fault)")
        }
    }

    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try checkOffline(identifier)
        return try await base.item(for: identifier)
    }

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try checkOffline(identifier)
        return try await base.children(of: identifier)
    }

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try checkOffline(identifier)
        let stream = try await base.fetchContents(of: identifier, version: version, range: range)
        guard let fault = plan.take(for: identifier, offline: false) else { return stream }
        return FaultyStream(base: stream, fault: fault, position: range.lowerBound)
    }

    public func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        try checkOffline(directory)
        return try await base.child(named: name, of: directory)
    }

    /// Declines (nil) for an offline item: the slow path meets the fault.
    public func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? {
        guard !plan.isOffline(identifier) else { return nil }
        return try base.itemNow(for: identifier)
    }

    public func trackedChildren(
        of identifier: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        try checkOffline(identifier)
        return try await base.trackedChildren(of: identifier)
    }

    /// Unsure (true) while anything is offline.
    public func hasChanges(since token: ListingChangeToken) -> Bool {
        plan.anyOffline || base.hasChanges(since: token)
    }

    public func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        base.observeChanges(observer)
    }

    public func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {
        base.downloadEnded(of: identifier, version: version, succeeded: succeeded)
    }
}

/// A stream that delivers its base stream's bytes until the fault's offset, then misbehaves. It
/// offers no direct transfer (whatever its base offers): every byte goes through `next`, where
/// the fault is applied.
final class FaultyStream: ContentStream, @unchecked Sendable {
    // Safe: `position` is only touched while `lock` is held; `base` is Sendable.
    private let lock = Lock()
    private let base: any ContentStream
    private let fault: Fault
    private var position: Int64

    init(base: any ContentStream, fault: Fault, position: Int64) {
        self.base = base
        self.fault = fault
        self.position = position
    }

    private var faultOffset: Int64 {
        switch fault {
        case .failAfter(let offset, _), .stall(let offset), .truncate(let offset), .changeVersion(let offset): offset
        case .offline: 0
        }
    }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        let position = lock.withLock { self.position }
        let limit = faultOffset
        if position >= limit {
            switch fault {
            case .failAfter(_, let code):
                throw ProviderError(.io, "transfer failed at byte \(position) (injected fault)", errno: code)
            case .stall:
                // A dead connection: nothing arrives until someone gives up on us.
                while true { try await Task.sleep(for: .seconds(3600)) }
            case .truncate:
                return nil
            case .changeVersion:
                throw ProviderError(.versionChanged, "item changed on the provider (injected fault)")
            case .offline:
                throw ProviderError(.unreachable, "provider is offline (injected fault)")
            }
        }
        let allowed = Int(min(Int64(maximumLength), limit - position))
        guard let chunk = try await base.next(maximumLength: allowed) else { return nil }
        lock.withLock { self.position += Int64(chunk.count) }
        return chunk
    }

    func close() { base.close() }
}
