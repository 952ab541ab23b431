// The set of fault rules a FaultInjectingProvider consults, with the accounting of `times` in
// downloads, and (for a mount) its store: a JSON file rewritten atomically on every change.

public import ProviderModel
import SystemSupport

/// The mutable set of fault rules a `FaultInjectingProvider` consults on every call. Thread-safe;
/// changes apply to the next call (a stream already faulted keeps its fault).
///
/// A plan made with `init(_:)` lives in memory; `FaultPlan.stored(at:…)` keeps it in a file, so
/// faults survive a restart of the mount (docs/MOUNT.md, "Faults on cue").
public final class FaultPlan: @unchecked Sendable {
    // Safe: `state` is only touched while `lock` is held; `store` is immutable and serializes
    // its writes itself.
    private let lock = Lock()
    private var state = State()
    private let store: FaultStore?

    struct Entry {
        var serial: UInt64
        var rule: FaultRule
        var used = 0
        var running = 0

        var exhausted: Bool {
            switch rule.times {
            case .downloads(let count), .fetches(let count): used >= count
            case .untilCleared: false
            }
        }
    }

    struct DownloadKey: Hashable {
        var identifier: ItemIdentifier
        var version: ContentVersion
    }

    struct State {
        var entries: [Entry] = []
        var nextSerial: UInt64 = 1
        /// Downloads a `.downloads` rule caught, and which rule (by serial).
        var downloads: [DownloadKey: UInt64] = [:]
        /// Those of them the fault struck (a stream misbehaved); the others are not counted.
        var struck: Set<DownloadKey> = []
        /// Bumped on every change, so that the store never writes an older state over a newer one.
        var generation: UInt64 = 0
    }

    /// Cheap flags read on every provider call (no rules: the wrapper forwards untouched).
    private let flags = Locked(Flags())
    struct Flags {
        var any = false
        var metadata = false
        var writes = false
        /// A rule strikes writes that is not an offline one (an upload fault).
        var uploadFaults = false
    }

    public init(_ rules: [FaultRule] = []) {
        store = nil
        for rule in rules { state.entries.append(Entry(serial: nextSerial(), rule: rule)) }
        flags.withLock { $0 = Self.flags(of: state.entries) }
    }

    private init(store: FaultStore, entries: [(FaultRule, Int)]) {
        self.store = store
        for (rule, used) in entries { state.entries.append(Entry(serial: nextSerial(), rule: rule, used: used)) }
        flags.withLock { $0 = Self.flags(of: state.entries) }
    }

    private func nextSerial() -> UInt64 {
        defer { state.nextSerial += 1 }
        return state.nextSerial
    }

    /// A plan kept in the JSON file at `path` (written atomically: temporary file, fsync, rename,
    /// fsync of the directory, on every change, a consumed download included). An existing file is
    /// loaded; a missing one is created holding `seed` (the demo's failing item), so clearing the
    /// seed sticks. A file that cannot be read as a fault store is logged, moved aside (renamed
    /// `<path>.bad-<unix time>`) and replaced by an empty plan: a bad file never stops a mount.
    public static func stored(
        at path: String, seed: [FaultRule] = [],
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) -> FaultPlan {
        let store = FaultStore(path: path, log: log)
        switch store.load() {
        case .loaded(let entries):
            return FaultPlan(store: store, entries: entries)
        case .missing:
            let plan = FaultPlan(store: store, entries: seed.map { ($0, 0) })
            plan.save()
            return plan
        case .malformed:
            let plan = FaultPlan(store: store, entries: [])
            plan.save()
            return plan
        }
    }

    /// The file the plan is kept in (nil: memory only).
    public var storePath: String? { store?.path }

    // MARK: Changing the rules

    /// Adds a rule after the others (rules are matched in the order they were added).
    public func add(_ rule: FaultRule) {
        change { state in
            state.entries.append(Entry(serial: state.nextSerial, rule: rule))
            state.nextSerial += 1
        }
    }

    /// Removes the rules about `identifier` (nil: every rule). Downloads they caught stop being
    /// faulted at their next fetch. Returns how many rules went.
    @discardableResult
    public func clear(_ identifier: ItemIdentifier? = nil) -> Int {
        change { state in
            let before = state.entries.count
            state.entries.removeAll { identifier == nil || $0.rule.identifier == identifier }
            return before - state.entries.count
        }
    }

    /// Removes the rules whose `path` is `path`. Returns how many went.
    @discardableResult
    public func clear(path: String) -> Int {
        change { state in
            let before = state.entries.count
            state.entries.removeAll { $0.rule.path == path }
            return before - state.entries.count
        }
    }

    /// The rules, in matching order.
    public var all: [FaultRule] { lock.withLock { state.entries.map(\.rule) } }

    /// The rules with what each has used of its times.
    public var states: [FaultRuleState] {
        lock.withLock { state.entries.map { FaultRuleState(rule: $0.rule, used: $0.used, running: $0.running) } }
    }

    /// True when there is no rule (the wrapper's fast path).
    public var isEmpty: Bool { !flags.withLock { $0.any } }

    /// Any rule that strikes metadata calls (offline, or `metadata`).
    var hasMetadataRules: Bool { flags.withLock { $0.metadata } }

    /// Any rule that strikes write calls (offline, or on uploads).
    var hasWriteRules: Bool { flags.withLock { $0.writes } }

    /// Whether a rule strikes writes that is not an offline one: an upload fault a create must meet.
    var hasUploadFaults: Bool { flags.withLock { $0.uploadFaults } }

    // MARK: What the wrapper asks

    /// The fault a fetch of `identifier` (whose ancestors, nearest first, are `lineage`) meets, if
    /// any, consuming one of a rule's times when it starts a new download.
    func fault(
        forFetchOf identifier: ItemIdentifier, version: ContentVersion, lineage: [ItemIdentifier]
    ) -> (fault: Fault, serial: UInt64)? {
        let key = DownloadKey(identifier: identifier, version: version)
        let (fault, changed) = lock.withLock { () -> ((fault: Fault, serial: UInt64)?, Bool) in
            if let serial = state.downloads[key] {
                if let entry = state.entries.first(where: { $0.serial == serial }) {
                    return ((entry.rule.fault, serial), false)
                }
                state.downloads[key] = nil  // its rule was cleared
            }
            guard
                let index = state.entries.firstIndex(where: { entry in
                    entry.rule.strikesFetches && !entry.exhausted
                        && (entry.rule.identifier == identifier || lineage.contains(entry.rule.identifier))
                })
            else { return (nil, false) }
            var entry = state.entries[index]
            switch entry.rule.times {
            case .downloads:
                entry.used += 1
                entry.running += 1
                state.downloads[key] = entry.serial
                state.entries[index] = entry
            case .fetches:
                entry.used += 1
                if entry.exhausted { state.entries.remove(at: index) } else { state.entries[index] = entry }
            case .untilCleared:
                return ((entry.rule.fault, entry.serial), false)
            }
            state.generation += 1
            return ((entry.rule.fault, entry.serial), true)
        }
        if changed { publish() }
        return fault
    }

    /// Whether the rule `serial` still exists (a stall of one of its streams ends once it is
    /// cleared, so that a read after `fault clear` is not held by a download stalled before).
    func isActive(_ serial: UInt64) -> Bool {
        lock.withLock { state.entries.contains { $0.serial == serial } }
    }

    /// The fault of a download's stream struck (the stream misbehaved).
    func struck(_ identifier: ItemIdentifier, version: ContentVersion) {
        let key = DownloadKey(identifier: identifier, version: version)
        lock.withLock {
            if state.downloads[key] != nil { state.struck.insert(key) }
        }
    }

    /// A download ended: a `.downloads` rule it held is released (its use given back when the
    /// fault never struck it), and removed when used up.
    func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {
        let key = DownloadKey(identifier: identifier, version: version)
        let changed = lock.withLock { () -> Bool in
            let struck = state.struck.remove(key) != nil
            guard let serial = state.downloads.removeValue(forKey: key),
                let index = state.entries.firstIndex(where: { $0.serial == serial })
            else { return false }
            state.entries[index].running -= 1
            // A download the fault never struck (it ended before the fault's byte) is not one of
            // the rule's times: the next download gets it.
            if !struck { state.entries[index].used -= 1 }
            if state.entries[index].exhausted && state.entries[index].running <= 0 {
                state.entries.remove(at: index)
            }
            state.generation += 1
            return true
        }
        if changed { publish() }
    }

    /// The fault a write call about `identifier` (ancestors `lineage`) meets, if any: the first
    /// rule in order that strikes it. `uploadSize` is the size of the upload (nil: another write
    /// call, which only offline rules strike). A download rule strikes writes only when offline,
    /// and consumes nothing by it; an upload rule consumes one of its times per call struck (an
    /// upload's `failAfter` strikes only an upload of at least its offset's size).
    func writeFault(
        for identifier: ItemIdentifier, lineage: [ItemIdentifier], uploadSize: Int64?
    ) -> (fault: Fault, serial: UInt64)? {
        let (found, changed) = lock.withLock { () -> ((fault: Fault, serial: UInt64)?, Bool) in
            for index in state.entries.indices {
                let entry = state.entries[index]
                guard entry.rule.strikesWrites, !entry.exhausted,
                    entry.rule.identifier == identifier || lineage.contains(entry.rule.identifier)
                else { continue }
                switch (entry.rule.on, entry.rule.fault) {
                case (.download, _): return ((.offline, entry.serial), false)
                case (.upload, .offline): break
                case (.upload, .failAfter(let offset, _)):
                    guard let uploadSize, uploadSize >= offset else { continue }
                case (.upload, .stall):
                    guard uploadSize != nil else { continue }
                case (.upload, _): continue
                }
                switch entry.rule.times {
                case .downloads, .fetches:
                    state.entries[index].used += 1
                    if case .stall = entry.rule.fault {
                        // Kept while it stalls (`writeEnded`), so that clearing it ends the stall.
                        state.entries[index].running += 1
                    } else if state.entries[index].exhausted {
                        state.entries.remove(at: index)
                    }
                case .untilCleared:
                    return ((entry.rule.fault, entry.serial), false)
                }
                state.generation += 1
                return ((entry.rule.fault, entry.serial), true)
            }
            return (nil, false)
        }
        if changed { publish() }
        return found
    }

    /// A stalled upload the rule `serial` struck has gone on (or was cancelled): the rule goes
    /// once its times are used up and no upload stalls on it any more.
    func writeEnded(_ serial: UInt64) {
        let changed = lock.withLock { () -> Bool in
            guard let index = state.entries.firstIndex(where: { $0.serial == serial }),
                state.entries[index].running > 0
            else { return false }
            state.entries[index].running -= 1
            if state.entries[index].exhausted && state.entries[index].running == 0 { state.entries.remove(at: index) }
            state.generation += 1
            return true
        }
        if changed { publish() }
    }

    /// The rule a metadata call about `identifier` (ancestors `lineage`) meets, if any. Metadata
    /// calls consume nothing.
    func metadataFault(for identifier: ItemIdentifier, lineage: [ItemIdentifier]) -> Fault? {
        lock.withLock {
            state.entries.first { entry in
                entry.rule.strikesMetadata && !(entry.exhausted && entry.running == 0)
                    && (entry.rule.identifier == identifier || lineage.contains(entry.rule.identifier))
            }?.rule.fault
        }
    }

    // MARK: Bookkeeping

    private func change<Result>(_ body: (inout State) -> Result) -> Result {
        let result = lock.withLock { () -> Result in
            let result = body(&state)
            state.generation += 1
            return result
        }
        publish()
        return result
    }

    /// Refreshes the flags and writes the store (when there is one) after a change.
    private func publish() {
        let (entries, generation) = lock.withLock { () -> ([(FaultRule, Int)], UInt64) in
            flags.withLock { $0 = Self.flags(of: state.entries) }
            return (state.entries.map { ($0.rule, $0.used) }, state.generation)
        }
        store?.save(entries, generation: generation)
    }

    private func save() {
        let (entries, generation) = lock.withLock { (state.entries.map { ($0.rule, $0.used) }, state.generation) }
        store?.save(entries, generation: generation)
    }

    private static func flags(of entries: [Entry]) -> Flags {
        Flags(
            any: !entries.isEmpty, metadata: entries.contains { $0.rule.strikesMetadata },
            writes: entries.contains { $0.rule.strikesWrites },
            uploadFaults: entries.contains { $0.rule.strikesWrites && $0.rule.fault != .offline })
    }
}
