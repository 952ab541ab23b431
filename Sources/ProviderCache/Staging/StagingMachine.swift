// The rule of one item's staging copy, as a pure state machine in the Arbiter style: state in,
// actions out; its host (LocalWrites+Staging.swift, LocalWrites+Publish.swift) carries them out.
//
// `StagingMachine`: one item's staging copy while write handles are open: who writes, whether
// anything changed since the last publish, and when to publish or drop it.

/// One item's staging copy (docs/SEMANTICS.md, "Writes").
struct StagingMachine: Sendable, Equatable {
    enum Action: Sendable, Equatable {
        /// Publish the staging file as a new version (it is renamed into the content store; a
        /// writer that changes it afterwards copies it back first, D-379).
        case publish
        /// Nothing to publish and no writer left: delete the staging file.
        case discard
    }
    /// Open write handles.
    private(set) var writers = 0
    /// Bytes changed (write, truncate, or an O_TRUNC/create start) since the last publish.
    private(set) var modified = false
    /// A publish is to come (at the last close, or the next fsync): a chmod or utimens now can
    /// ride on it instead of reaching the provider on its own (D-385).
    var publishes: Bool { modified && !closed }
    /// The staging file is gone (published by moving, or discarded): no more writes.
    private(set) var closed = false

    init(startsModified: Bool) { modified = startsModified }

    mutating func openWriter() { writers += 1 }

    mutating func changed() { modified = true }

    /// fsync or a flush of the only writer: publish what changed, keep writing.
    mutating func sync() -> Action? {
        guard modified, !closed else { return nil }
        modified = false
        return .publish
    }

    /// A publish failed: the changes are still to be published.
    mutating func publishFailed() { modified = true }

    /// A write handle is released; the last one publishes or discards.
    mutating func closeWriter() -> Action? {
        writers = max(0, writers - 1)
        guard writers == 0, !closed else { return nil }
        closed = true
        if modified {
            modified = false
            return .publish
        }
        return .discard
    }
}
