// What follows an item through the namespace, staging copies and upload records together under
// the one lock: a rename carries them (and an open writer's copy publishes under the new name,
// D-371), an exchange swaps them, a delete or replace forgets them (D-411), a hard link's name
// that goes hands its writers' copies to another name (D-396, D-412), and the mount's own
// chmod/utimens rebase them (D-375).

import Diagnostics
public import ProviderModel
import SystemSupport

extension LocalWrites {
    /// Moves every record under `old` (the item, or a directory and its contents when identifiers
    /// are paths) to the same place under `new`: the namespace's renames call this.
    /// `subtree` false: `old` is a file, nothing lies under it, and only its own entries are
    /// looked up (no scan of every write-back entry, D-401).
    public func rekey(from old: ItemIdentifier, to new: ItemIdentifier, subtree: Bool = true) {
        rekey(among: subtree ? nil : old) { Self.rekeyed($0, from: old, to: new) }
    }

    /// One name of a file with other names goes (D-396): the staging copies of its open writers
    /// become `heir`'s, another name of the same file, and publish under it (its base version is
    /// the same file's). A copy `heir` already has for the same owner stays, and the other goes
    /// with the name. What the name uploaded last (its bytes published by an fsync, uploaded
    /// before the name went) is the copy's base from now on: its write-back record, which
    /// knew it, goes with the name, and the heir's first publish starts a record from the
    /// copy's base (D-412).
    public func handOverStaging(from old: ItemIdentifier, to heir: ItemIdentifier) {
        state.withLock { state in
            let uploaded = state.uploads[old].flatMap {
                $0.record.phase == .materialized ? $0.record.providerVersion : nil
            }
            for key in Array(state.staged.keys) where key.identifier == old {
                let target = Key(identifier: heir, owner: key.owner)
                guard state.staged[target] == nil, var staged = state.staged.removeValue(forKey: key) else { continue }
                staged.file.rename(to: heir)
                if let uploaded { staged.base = uploaded }
                state.staged[target] = staged
            }
        }
    }

    /// Two items swapped places (RENAME_EXCHANGE at a provider whose identifiers are paths):
    /// each one's records, and those below it, take the other's identifiers.
    public func exchange(_ one: ItemIdentifier, _ other: ItemIdentifier) {
        rekey { Self.rekeyed($0, from: one, to: other) ?? Self.rekeyed($0, from: other, to: one) }
    }

    /// The item `identifier` was replaced by a rename (or deleted) at the provider: its
    /// unpublished staging copies are dropped (their handles write on into nothing, as into an
    /// unlinked file) and its write-back entry and local version are forgotten, so that the item
    /// that takes its identifier starts clean (D-411).
    /// Also what lies under `identifier` (a directory deleted with its contents: D-374).
    /// `subtree` false: `identifier` is a file, and only its own entries are looked up (D-401).
    public func forget(_ identifier: ItemIdentifier, subtree: Bool = true) {
        func under(_ candidate: ItemIdentifier) -> Bool { Self.lies(candidate, atOrUnder: identifier) }
        let dropped = state.withLock { state -> ([StagingFile], [ItemIdentifier]) in
            var files: [StagingFile] = []
            for key in Array(state.staged.keys) where under(key.identifier) {
                files.append(state.staged.removeValue(forKey: key)!.file)
            }
            let uploads =
                subtree ? state.uploads.keys.filter(under) : state.uploads[identifier] == nil ? [] : [identifier]
            for upload in uploads { state.uploads[upload] = nil }
            return (files, uploads)
        }
        for file in dropped.0 { stagingContent.discardStaging(file) }
        writeBackCatalog.forgetLocal(identifier, subtree: subtree)  // D-411
        for upload in dropped.1 {
            do { try environment.store.deleteUpload(upload) } catch {
                environment.logger.warning("cannot delete an upload record: \(error)")
            }
        }
    }

    /// Moves the staging copies (which later publish under the new identifier, D-371) and the
    /// write-back entries whose identifier `target` maps, all at once (a swap works).
    /// `candidate`: the only identifier that can move (a file), else every entry is asked.
    private func rekey(among candidate: ItemIdentifier? = nil, _ target: (ItemIdentifier) -> ItemIdentifier?) {
        let moved = state.withLock { state -> [(ItemIdentifier, UploadMachine)] in
            // Staged copies are the open writers: few. Matches are collected before a table
            // changes (one changed while iterated is copied whole first).
            var stagedMoves: [(Key, Staged)] = []
            for (key, staged) in state.staged {
                guard let identifier = target(key.identifier) else { continue }
                stagedMoves.append((key, staged))
                staged.file.rename(to: identifier)
            }
            for (key, _) in stagedMoves { state.staged[key] = nil }
            for (key, staged) in stagedMoves {
                state.staged[Key(identifier: staged.file.identifier, owner: key.owner)] = staged
            }
            var moved: [(ItemIdentifier, UploadMachine)] = []
            var machines: [(ItemIdentifier, UploadMachine)] = []
            let matching: [(ItemIdentifier, UploadMachine)] =
                if let candidate {
                    state.uploads[candidate].map { [(candidate, $0)] } ?? []
                } else {
                    state.uploads.filter { target($0.key) != nil }.map { ($0.key, $0.value) }
                }
            for (identifier, machine) in matching {
                guard let newIdentifier = target(identifier) else { continue }
                state.uploads[identifier] = nil
                var machine = machine
                machine.rename(to: newIdentifier)
                machines.append((newIdentifier, machine))
                moved.append((identifier, machine))
            }
            for (identifier, machine) in machines { state.uploads[identifier] = machine }
            return moved
        }
        // Deleted first: in a swap, a previous identifier is another entry's new one.
        for (previous, _) in moved {
            do { try environment.store.deleteUpload(previous) } catch {
                environment.logger.warning("cannot delete an upload record: \(error)")
            }
        }
        for (_, machine) in moved { save(machine.record) }
    }

    /// The mount itself changed `identifier`'s provider version `from` into `to` (D-375): edits
    /// that started from `from` (a queued upload, open staging copies) now start from `to`, so
    /// their upload does not take the mount's own chmod or utimens for a conflicting change.
    func rebase(_ identifier: ItemIdentifier, from: ContentVersion, to: ContentVersion) {
        let saved = state.withLock { state -> UploadRecord? in
            for key in state.staged.keys where key.identifier == identifier && state.staged[key]!.base == from {
                state.staged[key]!.base = to
            }
            guard state.uploads[identifier]?.rebase(from: from, to: to) == true else { return nil }
            return state.uploads[identifier]!.record
        }
        if let saved { save(saved) }
    }

    /// `identifier` under `new` when it is `old` or lies under it ("old/…").
    static func rekeyed(
        _ identifier: ItemIdentifier, from old: ItemIdentifier, to new: ItemIdentifier
    ) -> ItemIdentifier? {
        if identifier == old { return new }
        let prefix = old.rawValue + "/"
        guard !old.rawValue.isEmpty, identifier.rawValue.hasPrefix(prefix) else { return nil }
        return ItemIdentifier(new.rawValue + "/" + identifier.rawValue.dropFirst(prefix.count))
    }
}
