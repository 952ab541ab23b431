// Pin states (issue 27 item 2, D-445): an item is pinned (keep downloaded), unpinned (download on
// read) or inherits its parent's policy. Only explicit states are kept (in memory and in the
// store's `pins` table); an item's policy is resolved by walking up its parents to the nearest
// explicit state, the root's default being "download on read". So a directory's policy covers
// whatever is in it now — items added later, by the mount or at the provider, and items moved
// into it — without a row per item. This file holds the states and the pinned downloads' queue;
// ProviderCache+Pins.swift does the work.

import Diagnostics
public import ProviderModel
import SystemSupport

/// An item's own pin state, as `user.providerfs.pin` shows and takes it.
public enum PinState: String, Sendable, Equatable, CaseIterable {
    /// Keep downloaded: fetched now and again on every change, never evicted.
    case pinned
    /// Download on read; evicted when it is set.
    case unpinned
    /// No state of its own: the parent's policy.
    case inherited
}

/// An item's effective policy.
public struct PinPolicy: Sendable, Equatable {
    /// Kept downloaded (a pinned item or one inheriting a pin).
    public var pinned: Bool
    /// The item whose explicit state decides (the item itself or its nearest ancestor with one);
    /// nil: nothing above has one, the root's default (download on read).
    public var decidedBy: ItemIdentifier?
    public init(pinned: Bool, decidedBy: ItemIdentifier?) {
        self.pinned = pinned
        self.decidedBy = decidedBy
    }
}

/// What pinning holds and does (`providerfs status`).
public struct PinsStatus: Sendable, Equatable {
    /// Items with an explicit state.
    public var pinnedItems: Int
    public var unpinnedItems: Int
    /// Files the mount knows under pinned items (listed so far), how many of them are complete,
    /// and their bytes present and total.
    public var files: Int
    public var downloadedFiles: Int
    public var presentBytes: Int64
    public var totalBytes: Int64
    /// Pinned files waiting for their download, and downloading now.
    public var queued: Int
    public var downloading: Int
    /// Pinned files whose last download failed (retried by the next look at them).
    public var failures: [PinFailure]
}

public struct PinFailure: Sendable, Equatable {
    public var identifier: ItemIdentifier
    public var error: RecordedError
}

/// A first-in first-out queue of identifiers without duplicates.
struct IdentifierQueue {
    private var items: [ItemIdentifier] = []
    private var head = 0
    private(set) var members: Set<ItemIdentifier> = []

    var count: Int { members.count }

    /// Appends `identifier` unless it is queued already.
    mutating func push(_ identifier: ItemIdentifier) {
        guard members.insert(identifier).inserted else { return }
        items.append(identifier)
    }

    mutating func pop() -> ItemIdentifier? {
        guard head < items.count else { return nil }
        let next = items[head]
        head += 1
        if head > 1024, head * 2 > items.count {
            items.removeFirst(head)
            head = 0
        }
        members.remove(next)
        return next
    }

    mutating func removeAll() {
        items = []
        head = 0
        members = []
    }
}

/// The explicit pin states and the pinned downloads' bookkeeping.
final class Pins: Sendable {
    struct State {
        /// `.pinned` or `.unpinned` per item; absent: inherited.
        var explicit: [ItemIdentifier: PinState] = [:]
        /// Pinned items (files or directories) to look at: listed, and their missing files queued.
        var looks = IdentifierQueue()
        var looking = false
        /// Pinned files to download, and those downloading now.
        var downloads = IdentifierQueue()
        var running: Set<ItemIdentifier> = []
        /// Queued again while downloading (the provider changed it meanwhile): downloaded again
        /// once that download ends.
        var again: Set<ItemIdentifier> = []
        var workers = 0
        var failures: [ItemIdentifier: RecordedError] = [:]
        /// Background tasks (the looks, the download workers, the periodic look), by number.
        var tasks: [UInt64: Task<Void, Never>] = [:]
        var nextTask: UInt64 = 0
        /// Tasks that ended before they were kept in `tasks`.
        var finished: Set<UInt64> = []
        /// The periodic look runs (started with the first pin).
        var refreshing = false
        /// `waitForPinnedDownloads` callers, resumed once no look and no download runs.
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        var isIdle: Bool { !looking && workers == 0 }

        /// The waiters to resume now, if the work is done.
        mutating func takeIdleWaiters() -> [CheckedContinuation<Void, Never>] {
            guard isIdle, !idleWaiters.isEmpty else { return [] }
            defer { idleWaiters = [] }
            return idleWaiters
        }
        var stopped = false
    }

    let state = Locked(State())
    private let store: any MetadataStore
    private let logger: Logger

    init(environment: CacheEnvironment) {
        store = environment.store
        logger = environment.logger
        do {
            let stored = try environment.store.loadPins()
            state.withLock { $0.explicit = stored.filter { $0.value != .inherited } }
        } catch {
            environment.logger.warning("cannot read the pin states from the metadata store: \(error)")
        }
    }

    /// The item's own state.
    func state(of identifier: ItemIdentifier) -> PinState {
        state.withLock { $0.explicit[identifier] } ?? .inherited
    }

    /// Every explicit state.
    var explicitStates: [ItemIdentifier: PinState] { state.withLock { $0.explicit } }

    /// Whether anything is pinned at all (nothing is: every policy is the default, at once).
    var anyPinned: Bool { state.withLock { state in state.explicit.values.contains(.pinned) } }

    /// Sets the item's own state (kept in the store); returns the previous one.
    @discardableResult
    func set(_ pin: PinState, for identifier: ItemIdentifier) -> PinState {
        let previous = state.withLock { state -> PinState in
            defer { state.explicit[identifier] = pin == .inherited ? nil : pin }
            return state.explicit[identifier] ?? .inherited
        }
        save(pin, for: identifier)
        return previous
    }

    private func save(_ pin: PinState, for identifier: ItemIdentifier) {
        do { try store.savePin(pin, for: identifier) } catch {
            logger.warning("cannot save the pin state of \(identifier) to the metadata store: \(error)")
        }
    }

    /// The policy of `identifier`: its own state, else its nearest ancestor's, else the root's
    /// default. `parent` names an item's parent (nil: not known, the walk ends at the default).
    func policy(of identifier: ItemIdentifier, parent: (ItemIdentifier) -> ItemIdentifier?) -> PinPolicy {
        let explicit = state.withLock { $0.explicit }
        guard !explicit.isEmpty else { return PinPolicy(pinned: false, decidedBy: nil) }
        var current = identifier
        for _ in 0..<4096 {
            if let pin = explicit[current] { return PinPolicy(pinned: pin == .pinned, decidedBy: current) }
            guard current != .root, let next = parent(current), next != current else { break }
            current = next
        }
        return PinPolicy(pinned: false, decidedBy: nil)
    }

    /// Identifiers re-keyed (a move at a provider whose identifiers are paths): states follow.
    func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        guard !moves.isEmpty else { return }
        let changed = state.withLock { state -> [(ItemIdentifier, PinState)] in
            let moved = moves.compactMap { old, new in state.explicit[old].map { (old, new, $0) } }
            guard !moved.isEmpty else { return [] }
            for (old, _, _) in moved { state.explicit[old] = nil }
            for (_, new, pin) in moved { state.explicit[new] = pin }
            return moved.map { ($0.0, .inherited) } + moved.map { ($0.1, $0.2) }
        }
        for (identifier, pin) in changed { save(pin, for: identifier) }
    }
}
