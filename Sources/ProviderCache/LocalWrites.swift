// The host of writing (issue 14): one item's staging copy shared by its write handles
// (Staging/), its publish as a local version, and the durable write-back queue that uploads it
// (WriteBack/). One state under one lock holds both, so that a rename or a delete moves or drops
// an item's staging copies and its upload record at once. The rules are the pure machines'
// (Staging/StagingMachine.swift, WriteBack/UploadMachine.swift); the extensions carry out their
// actions with the lock dropped.
//
// Lock order: `LocalWrites.state` is a leaf (never held while calling the catalog, the content
// store, the store or the provider).

import Diagnostics
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Staging copies and the write-back of one cache.
public final class LocalWrites: Sendable {
    let environment: CacheEnvironment
    /// The catalog and the content store, each only as the port of the part that calls it
    /// (D-440): staging's (Staging/StagingPorts.swift) and the write-back's
    /// (WriteBack/WriteBackPorts.swift).
    let stagingCatalog: any StagingCatalog
    let stagingContent: any StagingContent
    let writeBackCatalog: any WriteBackCatalog
    let writeBackContent: any WriteBackContent

    struct Staged {
        var machine: StagingMachine
        var file: StagingFile
        /// The provider version the edit started from, for a first upload record.
        var base: ContentVersion?
        /// The edit started from an empty version (a new file): its publishes at close do not
        /// force the bytes to disk; fsync's do (D-381).
        var startedEmpty = false
        /// When the copy was made (`timeline.now`): a base taken after the item's last upload is
        /// news from the provider, one taken before it is not (D-451).
        var since: Duration = .zero
    }

    /// Whose staging copy: the item's shared one (`owner` nil: plain paths), or a token's own
    /// (`owner`: the token's id), so that a token's writes can be dropped when it ends without
    /// touching anyone else's (D-369).
    struct Key: Hashable {
        var identifier: ItemIdentifier
        var owner: String?
    }

    /// The key a staging file is under (its identifier follows renames).
    static func key(of staging: StagingFile) -> Key {
        Key(identifier: staging.identifier, owner: staging.owner)
    }

    /// Whether `candidate` is `root` or lies under it ("root/…").
    static func lies(_ candidate: ItemIdentifier, atOrUnder root: ItemIdentifier) -> Bool {
        rekeyed(candidate, from: root, to: root) != nil
    }

    struct State {
        var staged: [Key: Staged] = [:]
        var uploads: [ItemIdentifier: UploadMachine] = [:]
        var tasks: [UInt64: Task<Void, Never>] = [:]
        var nextTask: UInt64 = 1
        var closed = false
        /// Upload calls at the provider, by the identifier they address (D-372).
        var callsInFlight: [ItemIdentifier: Int] = [:]
        /// Items a move through the mount is moving (with what lies under them).
        var moving: [ItemIdentifier] = []
        var blockedCalls: [CheckedContinuation<Void, Never>] = []
        /// Moves waiting for upload calls to end, by ticket (an interrupted one leaves, D-400).
        var blockedMoves: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextMoveTicket: UInt64 = 1
    }

    let state = Locked(State())

    /// Serializes staging creation, writer opens and closes, and publishes: each is short except a
    /// first open that must download the content first.
    let gate = AsyncGate()

    /// Backoff of failed uploads.
    let initialBackoff: Duration
    let maximumBackoff: Duration

    init(
        environment: CacheEnvironment, catalog: any StagingCatalog & WriteBackCatalog,
        content: any StagingContent & WriteBackContent,
        initialBackoff: Duration = .seconds(1), maximumBackoff: Duration = .seconds(300)
    ) {
        self.environment = environment
        stagingCatalog = catalog
        stagingContent = content
        writeBackCatalog = catalog
        writeBackContent = content
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// After a restart: staging leftovers removed, local versions served again, pending uploads
    /// resumed.
    func resume() {
        stagingContent.removeStagingLeftovers()
        let records: [UploadRecord]
        do { records = try environment.store.loadUploads() } catch {
            environment.logger.warning("cannot read the write-back queue: \(error)")
            return
        }
        var actions: [(ItemIdentifier, [UploadMachine.Action])] = []
        for record in records {
            // (A create closed unwritten has no local version: its empty file is still to make.)
            if !record.localVersion.isUnborn { writeBackCatalog.restoreLocal(record) }
            if record.creates {
                // Its item is gone from the catalog: nothing to create (D-386).
                guard writeBackCatalog.knownItem(record.identifier) != nil else {
                    do { try environment.store.deleteUpload(record.identifier) } catch {
                        environment.logger.warning("cannot delete an upload record: \(error)")
                    }
                    continue
                }
                writeBackCatalog.restoreUnborn(record.identifier)
            }
            // A chmod or utimens the record holds is shown again (D-460).
            if record.isPending, !record.heldAttributes.isEmpty {
                writeBackCatalog.attributesHeld(record.identifier, record.heldAttributes)
            }
            let started = state.withLock { state -> [UploadMachine.Action] in
                var machine = UploadMachine(
                    record: record, initialBackoff: initialBackoff, maximumBackoff: maximumBackoff)
                let started = machine.start()
                state.uploads[record.identifier] = machine
                return started
            }
            actions.append((record.identifier, started))
        }
        for (identifier, started) in actions { perform(identifier, started) }
    }

    /// Cancels retries and running uploads (a restart resumes them from the queue). Does not wait
    /// for an upload call that ignores cancellation: its outcome, if it comes, is still recorded
    /// (the provider's call is atomic, and the base version check sees a repeated one).
    func shutdown() async {
        await flush(within: environment.options.shutdownFlush)
        let tasks = state.withLock { state -> [Task<Void, Never>] in
            state.closed = true
            return Array(state.tasks.values)
        }
        for task in tasks { task.cancel() }
    }
}

/// The wall clock now, as an item time (mtime of a publish).
func wallClockTime() -> ItemTime {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return ItemTime(seconds: Int64(now.tv_sec), nanoseconds: Int32(now.tv_nsec))
}
