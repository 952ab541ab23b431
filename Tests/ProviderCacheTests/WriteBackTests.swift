// Writing in the cache (issue 14): the staging and upload machines, staging copies and their
// publish as local versions, and the durable write-back queue (retries with backoff on the
// injected clock, a restart that resumes, conflicts kept as copies). The provider is an
// InMemoryProvider behind a wrapper with the write-back tests' hooks (`UploadingProvider`).

import Foundation
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import ProviderCache

/// An InMemoryProvider (`base`, which stores what is uploaded: `InMemoryProvider.upload`) with the
/// hooks of the write-back tests that InMemoryProvider has not: uploads held before they read
/// their file (`hold`; `base.holdUploads` holds after the read) and counted once past the hold
/// (`uploadCount`), the next ones failed by count, the targets and what the last upload carried
/// recorded, a replace made in two steps as rclone's MOVE does; listings, fetches (before the
/// version is checked; `base.hold` holds at the first chunk) and setattrs held; named lookups.
final class UploadingProvider: InMemoryProviderWrapper, @unchecked Sendable {
    let base = InMemoryProvider()
    private let control = Locked<
        (failures: Int, uploads: Int, started: Int, held: Bool, waiting: [CheckedContinuation<Void, Never>])
    >((0, 0, 0, false, []))
    /// The permissions and mtime the last upload that got through carried.
    let carried = Locked<(permissions: UInt16?, modificationTime: ItemTime?)>((nil, nil))
    /// Every upload call's target, in order (a replace's base version is the conflict check).
    let targets = Locked<[UploadTarget]>([])

    var capabilities: ProviderCapabilities {
        base.capabilities.union(looksUpNames.withLock { $0 } ? [.writing, .namedChildLookup] : .writing)
    }
    /// Whether a lookup asks for one name (`.namedChildLookup`; answered from a listing, so
    /// `holdNextListing` holds it too).
    let looksUpNames = Locked(false)
    func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? { try base.itemNow(for: identifier) }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        let children = try await base.children(of: identifier)
        // A held listing is taken now and answered when released.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = listingHold.withLock { hold -> Bool in
                guard hold.armed else { return false }
                hold.armed = false
                hold.waiting = continuation
                return true
            }
            if !wait { continuation.resume() }
        }
        return children
    }

    private let listingHold = Locked<(armed: Bool, waiting: CheckedContinuation<Void, Never>?)>((false, nil))
    /// The next listing is taken at once and answered only at `releaseListing`.
    func holdNextListing() { listingHold.withLock { $0.armed = true } }
    var isHoldingListing: Bool { listingHold.withLock { $0.waiting != nil } }
    func releaseListing() {
        let waiting = listingHold.withLock { hold in
            defer { hold.waiting = nil }
            return hold.waiting
        }
        waiting?.resume()
    }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = fetchHold.withLock { hold -> Bool in
                guard hold.held else { return false }
                hold.waiting.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        return try await base.fetchContents(of: identifier, version: version, range: range)
    }

    /// While held, fetches wait (before the version is checked) until `releaseFetches`.
    private let fetchHold = Locked<(held: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))
    func holdFetches() { fetchHold.withLock { $0.held = true } }
    var heldFetches: Int { fetchHold.withLock { $0.waiting.count } }
    func releaseFetches() {
        let waiting = fetchHold.withLock { hold -> [CheckedContinuation<Void, Never>] in
            hold.held = false
            defer { hold.waiting = [] }
            return hold.waiting
        }
        for waiter in waiting { waiter.resume() }
    }

    func setAttributes(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) async throws -> ProviderItem {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = attributeControl.withLock { state -> Bool in
                state.calls += 1
                guard state.held else { return false }
                state.waiting.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        let fail = attributeControl.withLock { state -> Bool in
            guard state.failures > 0 else { return false }
            state.failures -= 1
            return true
        }
        if fail { throw ProviderError(.io, "injected setattr failure", errno: EIO) }
        return try await base.setAttributes(identifier, changes)
    }

    /// setAttributes calls begun (held ones included); while held, each waits (before it changes
    /// anything) until `releaseAttributes`; the next `failures` fail with EIO once let go.
    private let attributeControl = Locked<
        (calls: Int, held: Bool, failures: Int, waiting: [CheckedContinuation<Void, Never>])
    >(
        (0, false, 0, []))
    var attributeCalls: Int { attributeControl.withLock { $0.calls } }
    func holdAttributes() { attributeControl.withLock { $0.held = true } }
    func releaseAttributes(failing failures: Int = 0) {
        let waiting = attributeControl.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.held = false
            state.failures = failures
            defer { state.waiting = [] }
            return state.waiting
        }
        for waiter in waiting { waiter.resume() }
    }

    func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem? {
        try base.setAttributesNow(identifier, changes)
    }

    /// Creates deferred to their upload as the local provider's (D-386): `base.defersCreates`.
    func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? {
        try base.deferCreateNow(named: name, in: parent)
    }

    /// The next `count` uploads fail with `error` (EIO unless told).
    func failNext(_ count: Int, with error: ProviderError = ProviderError(.io, "injected upload failure", errno: EIO)) {
        failure.withLock { $0 = error }
        control.withLock { $0.failures = count }
    }
    private let failure = Locked(ProviderError(.io, "injected upload failure", errno: EIO))
    var uploadCount: Int { control.withLock { $0.uploads } }
    /// Upload calls begun (held ones included).
    var startedCount: Int { control.withLock { $0.started } }
    func hold() { control.withLock { $0.held = true } }
    func release() {
        let waiting = control.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.held = false
            defer { state.waiting = [] }
            return state.waiting
        }
        for waiter in waiting { waiter.resume() }
    }

    /// Whether a replace takes the old file away before it puts the new one, as `rclone serve
    /// webdav`'s MOVE (delete the destination, then rename onto it, D-465): while the call is
    /// held, listings and lookups find no file under the name.
    let replacesInTwoSteps = Locked(false)

    func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        targets.withLock { $0.append(target) }
        var stored = target
        if case .replace(let identifier, let baseVersion) = target, replacesInTwoSteps.withLock({ $0 }) {
            let path = identifier.rawValue
            guard let (_, current) = base.content(of: path) else { throw ProviderError(.noSuchItem, "\(path) is gone") }
            if let baseVersion, baseVersion != current {
                throw ProviderError(.versionChanged, "\(path) is at \(current), not \(baseVersion)")
            }
            base.remove(path)
            // The new file is created where the old one was (identifiers are paths).
            let components = path.split(separator: "/")
            stored = .create(
                name: String(components.last ?? ""),
                in: components.count > 1 ? ItemIdentifier(components.dropLast().joined(separator: "/")) : .root)
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = control.withLock { state -> Bool in
                state.started += 1
                guard state.held else { return false }
                state.waiting.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        let fail = control.withLock { state -> Bool in
            state.uploads += 1
            guard state.failures > 0 else { return false }
            state.failures -= 1
            return true
        }
        if fail { throw failure.withLock { $0 } }
        let item = try await base.upload(
            from: localFile, to: stored, permissions: permissions, modificationTime: modificationTime)
        carried.withLock { $0 = (permissions, modificationTime) }
        return item
    }
}

/// A cache over an `UploadingProvider`, with a manual clock; `reopen()` is a restart on the same
/// directory and store.
final class WriteFixture: @unchecked Sendable {
    let provider = UploadingProvider()
    let clock = ManualClock()
    let directory: TemporaryDirectory
    let store: any MetadataStore
    var options = CacheFixture.defaultOptions()

    init(store: (any MetadataStore)? = nil) throws {
        directory = try TemporaryDirectory(prefix: "providerfs-writes")
        self.store = store ?? InMemoryMetadataStore()
        options.uploadRetryDelay = .seconds(1)
        options.maximumUploadRetryDelay = .seconds(8)
    }

    func makeCache() throws -> ProviderCache {
        try ProviderCache(provider: provider, directory: directory.path, store: store, clock: clock, options: options)
    }

    deinit { directory.remove() }
}

func readAll(_ cache: ProviderCache, _ item: ProviderItem) async throws -> [UInt8] {
    let entry = try await cache.pinContent(of: item)
    defer { cache.content.unpin(entry) }
    return try await bytes(of: entry.read(offset: 0, count: Int(item.size)))
}

func bytes(of data: ReadData) -> [UInt8] {
    switch data.source {
    case .memory(let buffer):
        return buffer.withUnsafeBytes { Array($0.prefix(data.count)) }
    case .file(let descriptor, let offset, _):
        var result = [UInt8](repeating: 0, count: data.count)
        let got = result.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, data.count, off_t(offset)) }
        return Array(result.prefix(max(0, got)))
    }
}

/// Polls `condition` (real time, bounded): the write-back runs in tasks of its own.
func eventually(_ timeout: Duration = .seconds(10), _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if await condition() { return true }
        await Task.yield()
        try? await Task.sleep(for: .milliseconds(2))
    }
    return await condition()
}

@Suite struct StagingMachineTests {
    @Test func lastWriterPublishesOnlyWhenChanged() {
        var machine = StagingMachine(startsModified: false)
        machine.openWriter()
        machine.openWriter()
        #expect(machine.closeWriter() == nil)
        #expect(machine.closeWriter() == .discard)

        var changed = StagingMachine(startsModified: false)
        changed.openWriter()
        changed.changed()
        #expect(changed.sync() == .publish)
        #expect(changed.sync() == nil)
        changed.changed()
        #expect(changed.closeWriter() == .publish)
    }

    @Test func aFailedPublishIsPublishedAgain() {
        var machine = StagingMachine(startsModified: true)
        machine.openWriter()
        #expect(machine.sync() == .publish)
        machine.publishFailed()
        #expect(machine.closeWriter() == .publish)
    }
}

@Suite struct UploadMachineTests {
    let id = ItemIdentifier("f")

    @Test func dirtyUploadingMaterialized() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, phase: .materialized))
        let actions = machine.published(ContentVersion("l1"), base: ContentVersion("v1"))
        #expect(actions.contains(.upload(version: ContentVersion("l1"), base: ContentVersion("v1"))))
        #expect(machine.record.phase == .uploading)
        #expect(machine.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v2")).count == 1)
        #expect(machine.record.phase == .materialized)
        #expect(machine.record.providerVersion == ContentVersion("v2"))
        // The next edit starts from what the upload made.
        // The next edit starts from what the upload made, even when its staging began before.
        let next = machine.published(ContentVersion("l2"), base: ContentVersion("v1"))
        #expect(next.contains(.upload(version: ContentVersion("l2"), base: ContentVersion("v2"))))
    }

    /// D-522: a publish whose upload starts at once saves the record once, as uploading (what a
    /// restart resumes as dirty); one that settles first saves it as dirty.
    @Test func aPublishThatStartsItsUploadSavesTheRecordOnce() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("unborn:1"), baseVersion: nil, creates: true))
        let actions = machine.published(ContentVersion("l1"), base: nil)
        let saves: [UploadRecord] = actions.compactMap { if case .save(let record) = $0 { record } else { nil } }
        #expect(saves.map(\.phase) == [.uploading])
        #expect(saves.first?.localVersion == ContentVersion("l1") && saves.first?.creates == true)
        #expect(actions.contains(.upload(version: ContentVersion("l1"), base: nil)))
        var settling = UploadMachine(
            record: UploadRecord(identifier: id, localVersion: ContentVersion("l0"), baseVersion: nil))
        let waits = settling.published(ContentVersion("l1"), base: nil, settle: .milliseconds(500))
        let phases: [UploadPhase] = waits.compactMap { if case .save(let record) = $0 { record.phase } else { nil } }
        #expect(phases == [.dirty])
    }

    /// D-451: after an upload the item changed elsewhere (another machine) and a writer opened
    /// from that version: its edit starts there, not from the upload's result (a false conflict).
    @Test func anEditFromAVersionChangedElsewhereSinceTheUploadStartsThere() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, phase: .materialized))
        _ = machine.published(ContentVersion("l1"), base: ContentVersion("v1"))
        _ = machine.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v2"))
        let next = machine.published(ContentVersion("l2"), base: ContentVersion("v3"), baseIsNewer: true)
        #expect(next.contains(.upload(version: ContentVersion("l2"), base: ContentVersion("v3"))))
        // From the local version (the upload's bytes): the upload's result, as before.
        _ = machine.uploaded(ContentVersion("l2"), providerVersion: ContentVersion("v4"))
        let local = machine.published(
            ContentVersion("l3"), base: ContentVersion("local:2.7"), baseIsNewer: true)
        #expect(local.contains(.upload(version: ContentVersion("l3"), base: ContentVersion("v4"))))
        // A copy made before that upload (a writer that fsyncs and writes on): its base is
        // history, the upload's result is the base (the fsx seed 15234226912746720864 read an old
        // version after a false conflict when this took the copy's base).
        _ = machine.uploaded(ContentVersion("l3"), providerVersion: ContentVersion("v5"))
        let old = machine.published(ContentVersion("l4"), base: ContentVersion("v1"), baseIsNewer: false)
        #expect(old.contains(.upload(version: ContentVersion("l4"), base: ContentVersion("v5"))))
    }

    @Test func aPublishDuringAnUploadIsUploadedNextFromItsResult() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, phase: .materialized))
        _ = machine.published(ContentVersion("l1"), base: ContentVersion("v1"))
        let during = machine.published(ContentVersion("l2"), base: nil)
        #expect(!during.contains { if case .upload = $0 { true } else { false } })
        let after = machine.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v2"))
        #expect(after.contains(.upload(version: ContentVersion("l2"), base: ContentVersion("v2"))))
        #expect(machine.record.phase == .uploading)
    }

    /// D-460: a chmod or utimens held while the create runs is carried by the call when it came
    /// before the call read its terms, else made after it (phase `.attributes`, pending); one held
    /// during that call is made next; a failure retries the attributes (not the bytes); a
    /// restart makes them again; a publish meanwhile is uploaded from what the upload made.
    @Test func attributesHeldDuringAnUploadAreCarriedOrMadeAfterIt() {
        let time = ItemTime(seconds: 1_000, nanoseconds: 7)
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, creates: true))
        _ = machine.start()
        // Held before the call read its terms: carried, nothing after.
        _ = machine.hold(HeldAttributes(permissions: 0o600, modificationTime: nil))
        #expect(machine.sendingAttributes() == HeldAttributes(permissions: 0o600, modificationTime: nil))
        #expect(machine.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v1")).count == 1)
        #expect(machine.record.phase == .materialized && machine.record.permissions == nil)

        var after = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, creates: true))
        _ = after.start()
        #expect(after.sendingAttributes() == HeldAttributes())
        // Held after it: saved at once, made after the upload.
        #expect(after.hold(HeldAttributes(permissions: 0o640, modificationTime: time)).count == 1)
        #expect(after.record.modificationTime == time)
        let uploaded = after.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v1"))
        #expect(uploaded.contains(.setAttributes(version: ContentVersion("l1"))))
        #expect(after.record.phase == .attributes && after.record.isPending && !after.record.creates)
        #expect(after.record.providerVersion == ContentVersion("v1"))
        // Another held while that call runs: made next.
        #expect(after.sendingAttributes() == HeldAttributes(permissions: 0o640, modificationTime: time))
        _ = after.hold(HeldAttributes(permissions: 0o644, modificationTime: nil))
        #expect(after.attributesMade(ContentVersion("l1")).contains(.setAttributes(version: ContentVersion("l1"))))
        // A failure retries the attributes after the backoff, not the upload.
        _ = after.sendingAttributes()
        let failed = after.failed(ContentVersion("l1"), message: "EIO")
        #expect(failed.contains { if case .retry = $0 { true } else { false } })
        #expect(after.record.phase == .attributes)
        // A restart (the record as saved) makes them again.
        var restarted = UploadMachine(record: after.record)
        #expect(restarted.start().contains(.setAttributes(version: ContentVersion("l1"))))
        #expect(after.retryDue().contains(.setAttributes(version: ContentVersion("l1"))))
        _ = after.sendingAttributes()
        #expect(after.attributesMade(ContentVersion("l1")).count == 1)
        #expect(after.record.phase == .materialized && after.record.heldAttributes == HeldAttributes())

        // A publish while the attributes wait: uploaded next from what the upload made, carrying
        // them; its own mtime replaces the one held.
        var edited = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: nil, creates: true))
        _ = edited.start()
        _ = edited.sendingAttributes()
        _ = edited.hold(HeldAttributes(permissions: 0o600, modificationTime: time))
        _ = edited.uploaded(ContentVersion("l1"), providerVersion: ContentVersion("v1"))
        _ = edited.published(ContentVersion("l2"), base: nil)
        #expect(edited.record.phase == .uploading && edited.record.modificationTime == nil)
        #expect(
            edited.attributesMade(ContentVersion("l1")).contains(
                .upload(version: ContentVersion("l2"), base: ContentVersion("v1"))))
        #expect(edited.sendingAttributes() == HeldAttributes(permissions: 0o600, modificationTime: nil))
    }

    @Test func failuresBackOffExponentiallyAndBounded() {
        var machine = UploadMachine(
            record: UploadRecord(identifier: id, localVersion: ContentVersion("l1"), baseVersion: ContentVersion("v1")),
            initialBackoff: .seconds(1), maximumBackoff: .seconds(5))
        #expect(machine.start().contains(.upload(version: ContentVersion("l1"), base: ContentVersion("v1"))))
        var delays: [Duration] = []
        for _ in 0..<5 {
            let actions = machine.failed(ContentVersion("l1"), message: "EIO")
            for case .retry(let delay, _) in actions { delays.append(delay) }
            #expect(machine.record.phase == .error)
            #expect(machine.record.lastError == "EIO")
            #expect(machine.retryDue().contains(.upload(version: ContentVersion("l1"), base: ContentVersion("v1"))))
        }
        #expect(delays == [.seconds(1), .seconds(2), .seconds(4), .seconds(5), .seconds(5)])
    }

    @Test func theSettleWaitsForTheLastPublishBoundedByTheFirst() {
        // D-405: each publish moves the start to `settle` after it, never past `maximumSettle`
        // after the first one still waiting; a timer of an older version does nothing.
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l0"), baseVersion: nil, phase: .materialized))
        func publish(_ n: Int, at now: Duration) -> [UploadMachine.Action] {
            machine.published(
                ContentVersion("l\(n)"), base: ContentVersion("v1"), now: now, settle: .seconds(1),
                maximumSettle: .seconds(3))
        }
        #expect(publish(1, at: .zero).contains(.settle(after: .seconds(1), version: ContentVersion("l1"))))
        #expect(machine.record.phase == .dirty && machine.inFlight == nil)
        #expect(publish(2, at: .milliseconds(900)).contains(.settle(after: .seconds(1), version: ContentVersion("l2"))))
        #expect(machine.settleDue(ContentVersion("l1"), now: .seconds(1)).isEmpty, "an older version's timer")
        #expect(
            publish(3, at: .milliseconds(2500)).contains(
                .settle(after: .milliseconds(500), version: ContentVersion("l3"))),
            "bounded by the first publish + 3 s")
        #expect(machine.settleDue(ContentVersion("l2"), now: .milliseconds(1900)).isEmpty)
        #expect(machine.settleDue(ContentVersion("l3"), now: .milliseconds(2999)).isEmpty, "not yet")
        #expect(
            machine.settleDue(ContentVersion("l3"), now: .seconds(3)).contains(
                .upload(version: ContentVersion("l3"), base: ContentVersion("v1"))))
        // A publish while it uploads waits for its own settle; the upload's end does not start it.
        #expect(
            publish(4, at: .milliseconds(3100)).contains(.settle(after: .seconds(1), version: ContentVersion("l4"))))
        let ended = machine.uploaded(
            ContentVersion("l3"), providerVersion: ContentVersion("v2"), now: .milliseconds(3200))
        #expect(!ended.contains { if case .upload = $0 { true } else { false } })
        #expect(machine.record.phase == .dirty)
        #expect(
            machine.settleDue(ContentVersion("l4"), now: .milliseconds(4100)).contains(
                .upload(version: ContentVersion("l4"), base: ContentVersion("v2"))))
        // Without a settle a publish uploads at once (unit tests, restarts).
        _ = machine.uploaded(ContentVersion("l4"), providerVersion: ContentVersion("v3"))
        #expect(
            machine.published(ContentVersion("l5"), base: nil).contains(
                .upload(version: ContentVersion("l5"), base: ContentVersion("v3"))))
    }

    @Test func anUnmountsFlushStartsWhatWaitsOutItsSettle() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l0"), baseVersion: nil, phase: .materialized))
        _ = machine.published(
            ContentVersion("l1"), base: ContentVersion("v1"), now: .zero, settle: .seconds(1),
            maximumSettle: .seconds(5))
        #expect(machine.expedite().contains(.upload(version: ContentVersion("l1"), base: ContentVersion("v1"))))
        #expect(machine.expedite().isEmpty, "one upload")
        #expect(machine.settleDue(ContentVersion("l1"), now: .seconds(1)).isEmpty, "its timer finds it started")
    }

    @Test func aRestartResumesAnUploadThatWasRunning() {
        var machine = UploadMachine(
            record: UploadRecord(
                identifier: id, localVersion: ContentVersion("l1"), baseVersion: ContentVersion("v1"), phase: .uploading
            ))
        #expect(machine.record.phase == .dirty)
        #expect(machine.start().contains(.upload(version: ContentVersion("l1"), base: ContentVersion("v1"))))
    }

    @Test func conflictNames() {
        #expect(LocalWrites.conflictName("a.txt", stamp: "2026-12-02 153000") == "a (conflict 2026-12-02 153000).txt")
        #expect(LocalWrites.conflictName("Makefile", stamp: "S") == "Makefile (conflict S)")
        #expect(LocalWrites.conflictName(".profile", stamp: "S") == ".profile (conflict S)")
        #expect(LocalWrites.conflictName("a.tar.gz", stamp: "S", attempt: 2) == "a.tar (conflict S 2).gz")
        #expect(LocalWrites.conflictStamp(ItemTime(seconds: 1_764_689_400)) == "2025-12-02 153000")
    }

    @Test func rekeyMovesAPrefix() {
        let old = ItemIdentifier("d")
        let new = ItemIdentifier("e/d")
        #expect(LocalWrites.rekeyed(ItemIdentifier("d"), from: old, to: new) == new)
        #expect(LocalWrites.rekeyed(ItemIdentifier("d/x"), from: old, to: new) == ItemIdentifier("e/d/x"))
        #expect(LocalWrites.rekeyed(ItemIdentifier("dx"), from: old, to: new) == nil)
    }
}

@Suite struct WriteBackTests {
    /// D-371, D-372: a rename through the mount right after a publish (an editor's
    /// save-via-rename) while the write-back uploads the new version, and a reader holds it open
    /// (a live content entry).
    @Test func aMoveDuringAnUploadWaitsForItAndKeepsTheLocalBytesUnderTheNewName() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("hello".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array(" world".utf8), at: 5)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        let reader = try await cache.pinContent(of: published.item)
        let deadline = ContinuousClock.now + .seconds(10)
        while fixture.provider.startedCount < 1, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fixture.provider.startedCount == 1, "the upload call is at the provider, held")
        // The move waits for the upload call (which addresses the old name) to end.
        let moving = Task {
            try await cache.move(published.item, to: .root, named: "g", mode: .replacing, replaced: nil)
        }
        fixture.provider.release()
        let (moved, moves) = try await moving.value
        #expect(moved.identifier == ItemIdentifier("g") && moves[ItemIdentifier("f")] == ItemIdentifier("g"))
        #expect(fixture.provider.base.content(of: "g")?.0 == .bytes(Array("hello world".utf8)))
        #expect(fixture.provider.base.content(of: "f") == nil, "nothing written under the old name")
        // The moved item keeps its bytes (the reader's live entry left a record under "g").
        let current = try await cache.catalog.item(ItemIdentifier("g"), maximumAge: .zero)
        #expect(try await readAll(cache, current) == Array("hello world".utf8))
        #expect(bytes(of: try await reader.read(offset: 0, count: 100)) == Array("hello world".utf8))
        cache.content.unpin(reader)
        #expect(try await readAll(cache, current) == Array("hello world".utf8), "its file outlived the reader")
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("g")))
        #expect(cache.status(of: ItemIdentifier("g"))?.state == .materialized)
    }

    /// D-477: a writer that fsyncs (each publish uploaded) and is then renamed onto a name whose
    /// earlier file was uploaded before the writer's copy was made publishes from its own last
    /// upload. The time of that upload was kept by identifier: it outlived the name's file, made
    /// the writer's old base look like news from the provider, and the upload kept a false
    /// conflict copy (differential seeds 4975878240140784189 and 6146882525447483587).
    @Test func aWriterRenamedOntoANameUploadedBeforeItsCopyIsNoConflict() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("f0".utf8)))
        fixture.provider.base.putFile("g", .bytes(Array("g0".utf8)))
        let cache = try fixture.makeCache()
        let g = try await cache.catalog.item(ItemIdentifier("g"), maximumAge: .zero)
        let other = try await cache.writes.openWriter(g, truncating: false)
        try await cache.writes.write(other, Array("g1".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(g.identifier))
        #expect(await cache.writes.waitUntilUploaded(g.identifier))
        try await cache.delete(try #require(cache.catalog.knownItem(g.identifier)))
        fixture.clock.advance(by: .seconds(1))
        // Made after g's upload; two of its publishes uploaded before the rename.
        let f = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let writer = try await cache.writes.openWriter(f, truncating: false)
        for round in 1...2 {
            try await cache.writes.write(writer, Array("f\(round)".utf8), at: 0)
            _ = try #require(try await cache.writes.sync(writer, durable: true))
            #expect(await cache.writes.waitUntilUploaded(f.identifier))
            fixture.clock.advance(by: .seconds(1))
        }
        let current = try #require(cache.catalog.knownItem(f.identifier))
        _ = try await cache.move(current, to: .root, named: "g", mode: .replacing, replaced: nil)
        try await cache.writes.write(writer, Array("f3".utf8), at: 0)
        _ = try #require(try await cache.writes.sync(writer, durable: true))
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("g")))
        #expect(fixture.provider.base.content(of: "g")?.0 == .bytes(Array("f3".utf8)))
        let names = fixture.provider.base.allItems.map(\.name).sorted()
        #expect(!names.contains { $0.contains("conflict") }, "\(names)")
        #expect(try await cache.writes.closeWriter(ItemIdentifier("g")) == nil)
    }

    /// D-494: a reader that pinned the provider's version and has only its first bytes reads
    /// the rest after a rewrite through the mount is published (not yet uploaded: the provider
    /// still has the old version). Retired at the publish, the missing bytes failed with
    /// `.stale`, so a reader that opened before the rewrite met ESTALE.
    @Test func aReaderOfTheReplacedVersionReadsItToItsEndAfterAPublish() async throws {
        let fixture = try WriteFixture()
        fixture.options.backgroundCompletion = false  // the reader's ranges only
        let old = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        fixture.provider.base.putFile("f", .bytes(old))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let reader = try await cache.pinContent(of: item)
        defer { cache.content.unpin(reader) }
        #expect(bytes(of: try await reader.read(offset: 0, count: 4096)) == Array(old[0..<4096]))
        #expect(!reader.isMaterialized, "the rest is not here yet")
        fixture.provider.hold()  // the upload waits: the provider keeps the old version
        let writer = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(writer, Array("new".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(item.identifier))
        let rest = try await reader.read(offset: 1 << 20, count: 1 << 20)
        #expect(bytes(of: rest) == Array(old[(1 << 20)...]), "the old version's end, fetched after the publish")
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
    }

    /// D-494: the upload of a rewrite waits until the version a reader has open is here in full
    /// (its download fetches the rest at the publish), so the reader reads its version to its
    /// end whatever the timing. Without the wait, the upload replaced the provider's version
    /// while the reader lacked most of it.
    @Test func theUploadWaitsUntilTheVersionAReaderHasOpenIsHereInFull() async throws {
        let fixture = try WriteFixture()
        fixture.options.backgroundCompletion = false  // the reader's ranges only
        let old = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        fixture.provider.base.putFile("f", .bytes(old))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let reader = try await cache.pinContent(of: item)
        defer { cache.content.unpin(reader) }
        #expect(bytes(of: try await reader.read(offset: 0, count: 4096)) == Array(old[0..<4096]))
        fixture.provider.holdFetches()
        let writer = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(writer, Array("new".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(item.identifier))
        // The upload attempt waits for the old version (its one waiter) and has not called the
        // provider: the fetch of the old version's rest is held (the 256 KiB read-ahead begun
        // before the hold may still be streaming).
        #expect(await eventually { reader.waiterCount == 1 }, "the upload does not wait for the reader's version")
        #expect(await eventually { fixture.provider.heldFetches >= 1 })
        #expect(!reader.isMaterialized)
        #expect(fixture.provider.startedCount == 0)
        fixture.provider.releaseFetches()
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        #expect(reader.isMaterialized, "uploaded before the reader's version was here in full")
        let rest = try await reader.read(offset: 4096, count: old.count - 4096)
        #expect(bytes(of: rest) == Array(old[4096...]) ? true : false, "the reader's version, to its end")
    }

    /// D-494: a reader that closes ends the wait: the upload goes on though the old version's
    /// fetch is still held (nothing to secure any more).
    @Test func aReaderThatClosesLetsTheWaitingUploadGoOn() async throws {
        let fixture = try WriteFixture()
        fixture.options.backgroundCompletion = false
        fixture.provider.base.putFile("f", .bytes(Array(repeating: 7, count: 1 << 20)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let reader = try await cache.pinContent(of: item)
        _ = try await reader.read(offset: 0, count: 4096)
        fixture.provider.holdFetches()
        let writer = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(writer, Array("new".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(await eventually { reader.waiterCount == 1 })
        #expect(fixture.provider.startedCount == 0)
        cache.content.unpin(reader)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        fixture.provider.releaseFetches()
    }

    /// D-494: only a change made elsewhere cuts a reader short: the provider's version changed
    /// while the upload waited, so the old version's fetch is refused, the reader's missing bytes
    /// fail with `.stale` (ESTALE), and the upload goes on (a conflict: the edit is kept as a copy).
    @Test func aChangeElsewhereWhileTheUploadWaitsCutsTheReaderShort() async throws {
        let fixture = try WriteFixture()
        fixture.options.backgroundCompletion = false
        fixture.provider.base.putFile("f", .bytes(Array(repeating: 7, count: 1 << 20)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let reader = try await cache.pinContent(of: item)
        defer { cache.content.unpin(reader) }
        _ = try await reader.read(offset: 0, count: 4096)
        fixture.provider.holdFetches()
        let writer = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(writer, Array("new".utf8), at: 0)
        _ = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(await eventually { reader.waiterCount == 1 })
        fixture.provider.base.putFile("f", .bytes(Array("elsewhere".utf8)))
        fixture.provider.releaseFetches()
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("elsewhere".utf8)))
        do {
            _ = try await reader.read(offset: 512 << 10, count: 4096)
            Issue.record("read bytes of a version changed elsewhere")
        } catch {
            #expect(error.code == .stale)
        }
    }

    /// D-405: an upload starts only once its settle has passed, and a file made and deleted
    /// within it (a database's journal) never reaches the provider.
    @Test func theWriteBackSettles() async throws {
        let fixture = try WriteFixture()
        fixture.options.uploadSettle = .seconds(1)
        fixture.options.maximumUploadSettle = .seconds(5)
        fixture.provider.base.defersCreates = true  // as the local provider (D-386)
        fixture.provider.base.putFile("db", .bytes(Array("v0".utf8)))
        let cache = try fixture.makeCache()
        let db = try await cache.catalog.item(ItemIdentifier("db"), maximumAge: .zero)
        let journal = try await cache.createFile(named: "db-journal", in: .root, permissions: 0o644)
        let journalWriter = try await cache.writes.openWriter(journal, truncating: true)
        try await cache.writes.write(journalWriter, Array("undo".utf8), at: 0)
        _ = try #require(try await cache.writes.sync(journalWriter, durable: true))
        let writer = try await cache.writes.openWriter(db, truncating: false)
        try await cache.writes.write(writer, Array("v1".utf8), at: 0)
        _ = try #require(try await cache.writes.sync(writer, durable: true))
        #expect(try await cache.writes.closeWriter(journal.identifier) == nil)
        try await cache.delete(try #require(cache.catalog.knownItem(journal.identifier)))
        // The settle timers sleep on the test's clock from whenever their tasks run: nothing
        // starts in the first 900 ms of it, and the upload comes once it has passed 1 s.
        for _ in 0..<9 {
            fixture.clock.advance(by: .milliseconds(100))
            await Task.yield()
        }
        #expect(fixture.provider.startedCount == 0, "nothing uploads before the settle")
        var uploaded = false
        for _ in 0..<60 where !uploaded {
            fixture.clock.advance(by: .milliseconds(100))
            uploaded = await eventually(.milliseconds(200)) {
                cache.writes.uploadRecord(of: db.identifier)?.isPending == false
            }
        }
        #expect(uploaded)
        #expect(fixture.provider.base.content(of: "db")?.0 == .bytes(Array("v1".utf8)))
        #expect(fixture.provider.uploadCount == 1, "the journal never reached the provider")
        #expect(fixture.provider.base.content(of: "db-journal") == nil)
        #expect(try await cache.writes.closeWriter(db.identifier) == nil)
    }

    /// D-400: a move waiting for an upload call of its item is interrupted (its task cancelled,
    /// what FUSE_INTERRUPT does): it ends at once with `.cancelled`, nothing moved, and it holds
    /// nothing up: the upload finishes under the old name and a later move goes through.
    @Test func aMoveWaitingForAnUploadEndsAtOnceWhenCancelled() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("hello".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array(" world".utf8), at: 5)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        let deadline = ContinuousClock.now + .seconds(10)
        while fixture.provider.startedCount < 1, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fixture.provider.startedCount == 1, "the upload call is at the provider, held")
        let moving = Task {
            try await cache.move(published.item, to: .root, named: "g", mode: .replacing, replaced: nil)
        }
        try await Task.sleep(for: .milliseconds(20))
        moving.cancel()
        let error = await #expect(throws: CacheError.self) {
            _ = try await withDeadline(.seconds(10), "the cancelled move") { try await moving.value }
        }
        #expect(error?.code == .cancelled)
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(ItemIdentifier("f")))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("hello world".utf8)))
        #expect(fixture.provider.base.content(of: "g") == nil, "the interrupted move moved nothing")
        let current = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let (moved, _) = try await withDeadline(.seconds(10), "a later move") {
            try await cache.move(current, to: .root, named: "g", mode: .replacing, replaced: nil)
        }
        #expect(moved.identifier == ItemIdentifier("g"))
    }

    @Test func aPublishIsANewLocalVersionUploadedAndKeptAcrossListings() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("hello".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let oldVersion = item.contentVersion
        // A reader pins the old version first.
        let reader = try await cache.pinContent(of: item)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array(" world".utf8), at: 5)
        #expect(cache.writes.stagedSize(of: item.identifier) == 11)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(published.item.contentVersion.rawValue.hasPrefix("local:"))
        #expect(published.item.size == 11)
        // The reader still reads the old bytes; a new pin reads the new ones.
        #expect(bytes(of: try await reader.read(offset: 0, count: 100)) == Array("hello".utf8))
        cache.content.unpin(reader)
        #expect(try await readAll(cache, published.item) == Array("hello world".utf8))
        // Uploaded, replacing the version the edit started from.
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        let (content, providerVersion) = try #require(fixture.provider.base.content(of: "f"))
        #expect(content == .bytes(Array("hello world".utf8)))
        #expect(providerVersion != oldVersion)
        #expect(cache.status(of: item.identifier)?.state == .materialized)
        // The provider's listing of the uploaded version is the local version, not a remote change.
        let listed = try await cache.catalog.children(of: .root, maximumAge: .zero)
        #expect(listed.first { $0.name == "f" }?.contentVersion == published.item.contentVersion)
        let again = try await cache.catalog.item(item.identifier, maximumAge: .zero)
        #expect(again.contentVersion == published.item.contentVersion)
        // A later change on the provider is a remote change again.
        fixture.provider.base.putFile("f", .bytes(Array("remote".utf8)))
        let remote = try await cache.catalog.item(item.identifier, maximumAge: .zero)
        #expect(remote.contentVersion != published.item.contentVersion)
        #expect(try await readAll(cache, remote) == Array("remote".utf8))
        await cache.shutdown()
    }

    @Test func twoWritersShareOneStagingFileAndTheLastClosePublishes() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("abcdef".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let first = try await cache.writes.openWriter(item, truncating: false)
        let second = try await cache.writes.openWriter(item, truncating: false)
        #expect(first === second)
        try await cache.writes.write(first, Array("X".utf8), at: 0)
        try await cache.writes.write(second, Array("Y".utf8), at: 5)
        #expect(try await cache.writes.closeWriter(item.identifier) == nil)
        #expect(cache.catalog.knownItem(item.identifier)?.contentVersion == item.contentVersion)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(try await readAll(cache, published.item) == Array("XbcdeY".utf8))
        await cache.shutdown()
    }

    @Test func truncatingStartsEmptyAndTruncateResizes() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("abcdef".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        #expect(staging.size == 0)
        try await cache.writes.write(staging, Array("xy".utf8), at: 0)
        try await cache.writes.truncate(staging, to: 4)
        let synced = try #require(try await cache.writes.sync(item.identifier))
        #expect(try await readAll(cache, synced.item) == [UInt8(ascii: "x"), UInt8(ascii: "y"), 0, 0])
        // fsync published the staging file (moved); the writers' next change works on a copy
        // of it, which the last close publishes.
        try await cache.writes.truncate(staging, to: 1)
        let closed = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(try await readAll(cache, closed.item) == Array("x".utf8))
        await cache.shutdown()
    }

    /// A publish renames the staging file into the content store (no copy); a handle that writes
    /// again afterwards copies it back first, so the published version never changes (D-379).
    @Test func aSyncPublishesByMovingAndTheNextChangeCopiesFirst() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("abcdef".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array("X".utf8), at: 0)
        let stagedPath = staging.path
        var before = stat()
        #expect(stat(stagedPath, &before) == 0)
        let first = try #require(try await cache.writes.sync(item.identifier))
        // Moved, not copied: the content file is the staging file's inode, and it left staging/.
        let firstPath = try #require(cache.content.contentFilePath(item.identifier, first.item.contentVersion))
        var published = stat()
        #expect(stat(firstPath, &published) == 0)
        #expect(published.st_ino == before.st_ino)
        #expect(access(stagedPath, F_OK) != 0)
        let reader = try await cache.pinContent(of: first.item)
        // The next write copies first: the published version keeps its bytes.
        try await cache.writes.write(staging, Array("Y".utf8), at: 1)
        #expect(staging.path != firstPath)
        #expect(bytes(of: try await reader.read(offset: 0, count: 100)) == Array("Xbcdef".utf8))
        #expect(try await staging.read(offset: 0, count: 100).count == 6)
        let second = try #require(try await cache.writes.sync(item.identifier))
        #expect(try await readAll(cache, second.item) == Array("XYcdef".utf8))
        #expect(bytes(of: try await reader.read(offset: 0, count: 100)) == Array("Xbcdef".utf8))
        cache.content.unpin(reader)
        // Nothing changed since: the last close publishes nothing and deletes no content file.
        #expect(try await cache.writes.closeWriter(item.identifier) == nil)
        let secondPath = try #require(cache.content.contentFilePath(item.identifier, second.item.contentVersion))
        #expect(access(secondPath, F_OK) == 0)
        #expect(try await readAll(cache, second.item) == Array("XYcdef".utf8))
        await cache.shutdown()
    }

    /// D-381: a new file's publish at close does not force its bytes to disk (as close(2) on a
    /// local file system); fsync does — through the same handle with nothing changed since, or
    /// through another handle opened after the close; the next publish of the same edit, and an
    /// edit of a file that had bytes, are forced at close too.
    @Test func aNewFilesCloseIsNotForcedToDiskButFsyncIs() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("new", .bytes([]))
        fixture.provider.base.putFile("old", .bytes(Array("abc".utf8)))
        let cache = try fixture.makeCache()
        let new = try await cache.catalog.item(ItemIdentifier("new"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(new, truncating: true)
        try await cache.writes.write(staging, Array("hello".utf8), at: 0)
        let closed = try #require(try await cache.writes.sync(staging, durable: false))
        #expect(try await readAll(cache, closed.item) == Array("hello".utf8))
        #expect(cache.content.isUnsynced(new.identifier, closed.item.contentVersion))
        #expect(try await cache.writes.sync(staging, durable: true) == nil, "nothing changed")
        #expect(!cache.content.isUnsynced(new.identifier, closed.item.contentVersion))
        // The same edit publishes again at close: the provider has its first version by now
        // (or will), so these bytes are forced.
        try await cache.writes.write(staging, Array("!".utf8), at: 5)
        let again = try #require(try await cache.writes.sync(staging, durable: false))
        #expect(!cache.content.isUnsynced(new.identifier, again.item.contentVersion))
        #expect(try await cache.writes.closeWriter(new.identifier) == nil)

        // A second new file, closed unsynced; then an fsync through a handle that is not its
        // writer (`makeDurable`, what fsync of any descriptor does) syncs it.
        fixture.provider.base.putFile("other", .bytes([]))
        let other = try await cache.catalog.item(ItemIdentifier("other"), maximumAge: .zero)
        let writer = try await cache.writes.openWriter(other, truncating: true)
        try await cache.writes.write(writer, Array("x".utf8), at: 0)
        let otherClosed = try #require(try await cache.writes.closeWriter(other.identifier))
        #expect(cache.content.isUnsynced(other.identifier, otherClosed.item.contentVersion))
        try await cache.writes.makeDurable(other.identifier)
        #expect(!cache.content.isUnsynced(other.identifier, otherClosed.item.contentVersion))

        let old = try await cache.catalog.item(ItemIdentifier("old"), maximumAge: .zero)
        let edit = try await cache.writes.openWriter(old, truncating: false)
        try await cache.writes.write(edit, Array("X".utf8), at: 0)
        let published = try #require(try await cache.writes.sync(edit, durable: false))
        #expect(try await readAll(cache, published.item) == Array("Xbc".utf8))
        #expect(
            !cache.content.isUnsynced(old.identifier, published.item.contentVersion),
            "an edit of bytes the provider has is forced at close too")
        #expect(try await cache.writes.closeWriter(old.identifier) == nil)
        await cache.shutdown()
    }

    @Test func aFailedUploadIsAnErrorRetriedWithBackoff() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        fixture.provider.failNext(2)
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { cache.status(of: item.identifier)?.state == .error })
        let status = try #require(cache.status(of: item.identifier))
        #expect(status.lastError?.message.contains("injected upload failure") == true)
        #expect(status.upload?.attempts == 1)
        // The local data is served meanwhile.
        #expect(try await readAll(cache, cache.catalog.knownItem(item.identifier)!) == Array("new".utf8))
        // First retry after 1 s (fails again), the next after 2 s.
        #expect(await eventually { fixture.clock.sleeperCount > 0 })
        fixture.clock.advance(by: .seconds(1))
        #expect(await eventually { fixture.provider.uploadCount == 2 && fixture.clock.sleeperCount > 0 })
        #expect(cache.status(of: item.identifier)?.upload?.attempts == 2)
        fixture.clock.advance(by: .seconds(1))
        #expect(fixture.provider.uploadCount == 2)
        fixture.clock.advance(by: .seconds(1))
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        await cache.shutdown()
    }

    @Test func aConflictKeepsBoth() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("notes.txt", .bytes(Array("base".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("notes.txt"), maximumAge: .zero)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("local".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        // The provider's version changes before the upload gets through.
        fixture.provider.base.putFile("notes.txt", .bytes(Array("remote".utf8)))
        fixture.provider.release()
        // Waits for the upload's outcome, whichever it is (an upload sent without its base
        // version gets through at once and fails the checks below, not a 10 s wait).
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(
            fixture.provider.targets.value.first == .replace(item.identifier, baseVersion: item.contentVersion),
            "the upload carries the version the edit started from: \(fixture.provider.targets.value)")
        let conflictName = try #require(cache.writes.uploadRecord(of: item.identifier)?.conflictName)
        #expect(conflictName.hasPrefix("notes (conflict "))
        #expect(conflictName.hasSuffix(").txt"))
        #expect(fixture.provider.base.content(of: "notes.txt")?.0 == .bytes(Array("remote".utf8)))
        #expect(fixture.provider.base.content(of: conflictName)?.0 == .bytes(Array("local".utf8)))
        let original = try #require(cache.catalog.knownItem(item.identifier))
        #expect(try await readAll(cache, original) == Array("remote".utf8))
        #expect(cache.status(of: item.identifier)?.upload?.conflictName == conflictName)
        await cache.shutdown()
    }

    @Test func aRestartResumesTheQueueAndServesTheLocalVersionMeanwhile() async throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-writes-sqlite")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let fixture = try WriteFixture(store: store)
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        fixture.provider.hold()
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("edited".utf8), at: 0)
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(await eventually { fixture.provider.startedCount == 1 })
        // "Crash": the upload never got through; the cache goes away without finishing it.
        await cache.shutdown()
        // The dead cache's upload call never gets through (a killed daemon's would not return).
        fixture.provider.failNext(1)
        fixture.provider.release()
        #expect(await eventually { fixture.provider.uploadCount == 1 })
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("old".utf8)))
        fixture.provider.hold()
        let restarted = try fixture.makeCache()
        let record = try #require(restarted.writes.uploadRecord(of: item.identifier))
        #expect(record.localVersion == published.item.contentVersion)
        // A listing does not replace the local version while it is pending.
        let listed = try await restarted.catalog.children(of: .root, maximumAge: .zero)
        let served = try #require(listed.first { $0.name == "f" })
        #expect(served.contentVersion == published.item.contentVersion)
        #expect(try await readAll(restarted, served) == Array("edited".utf8))
        fixture.provider.release()
        #expect(await restarted.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("edited".utf8)))
        await restarted.shutdown()
    }

    /// D-385: a chmod and a utimens while the edit has a publish to come are the edit's: shown at
    /// once, published with it, carried by its upload (also after a restart), never a provider
    /// call of their own. Without a publish to come they are not held.
    @Test func aChmodAndUtimensDuringAnEditRideItsPublishAndUploadAcrossARestart() async throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-writes-held")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let fixture = try WriteFixture(store: store)
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let change = ItemAttributeChanges(permissions: 0o640, modificationTime: time)
        #expect(!cache.writes.holdAttributes(change, of: item.identifier), "no edit open")
        let staging = try await cache.writes.openWriter(item, truncating: false)
        #expect(!cache.writes.holdAttributes(change, of: item.identifier), "an edit with nothing to publish")
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        #expect(cache.writes.holdAttributes(change, of: item.identifier))
        let shown = try #require(cache.writes.staged(item.identifier))
        #expect(shown.permissions == 0o640 && shown.modified == time)
        fixture.provider.hold()
        let published = try #require(try await cache.writes.closeWriter(item.identifier))
        #expect(published.item.permissions == 0o640 && published.item.modificationTime == time)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        // "Crash" before the upload got through.
        await cache.shutdown()
        fixture.provider.failNext(1)
        fixture.provider.release()
        #expect(await eventually { fixture.provider.uploadCount == 1 })
        fixture.provider.hold()
        let restarted = try fixture.makeCache()
        #expect(restarted.writes.uploadRecord(of: item.identifier)?.permissions == 0o640)
        // A listing while it is pending shows the edit's permissions and time, not the provider's.
        let listed = try await restarted.catalog.children(of: .root, maximumAge: .zero)
        let served = try #require(listed.first { $0.name == "f" })
        #expect(served.permissions == 0o640 && served.modificationTime == time)
        fixture.provider.release()
        #expect(await restarted.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        let carried = fixture.provider.carried.withLock { $0 }
        #expect(carried.permissions == 0o640 && carried.modificationTime == time)
        #expect(restarted.writes.uploadRecord(of: item.identifier)?.permissions == nil)
        // The next edit, without a chmod, carries none.
        let next = try await restarted.catalog.item(item.identifier, maximumAge: .zero)
        let again = try await restarted.writes.openWriter(next, truncating: false)
        try await restarted.writes.write(again, Array("N".utf8), at: 0)
        _ = try await restarted.writes.closeWriter(item.identifier)
        #expect(await restarted.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.carried.withLock { $0.permissions } == nil)
        await restarted.shutdown()
    }

    // MARK: Creates the provider gets later (D-386)

    /// A deferred create makes nothing at the provider until the first publish's upload, which
    /// is a `.create` with the bytes, mode and mtime; meanwhile listings and lookups keep the file.
    @Test func aDeferredCreateReachesTheProviderWithItsFirstUpload() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let item = try await cache.createFile(named: "n", in: .root, permissions: 0o640)
        #expect(item.identifier == ItemIdentifier("n"))
        #expect(fixture.provider.base.content(of: "n") == nil)
        #expect(fixture.provider.uploadCount == 0)
        // A new listing and a lookup do not lose it.
        let listed = try await cache.catalog.children(of: .root, maximumAge: .zero)
        #expect(listed.map(\.name) == ["n"])
        #expect(try await cache.catalog.item(item.identifier, maximumAge: .zero).contentVersion == item.contentVersion)
        // Taken: the name is refused as create(2) with O_EXCL would.
        await #expect(throws: CacheError.self) {
            _ = try await cache.createFile(named: "n", in: .root, permissions: 0o600)
        }
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("bytes".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        #expect(fixture.provider.base.content(of: "n")?.0 == .bytes(Array("bytes".utf8)))
        #expect(fixture.provider.carried.withLock { $0.permissions } == 0o640)
        #expect(fixture.provider.uploadCount == 1, "one upload: no empty create before it")
        #expect(!cache.catalog.isUnborn(item.identifier))
        #expect(cache.writes.uploadRecord(of: item.identifier)?.creates == false)
        await cache.shutdown()
    }

    /// A listing the provider took before files were created, born or deleted through the mount,
    /// and answered after, does not undo those changes (D-388): it dropped a file created and
    /// uploaded meanwhile from the directory until it was listed again, and brought back one
    /// deleted meanwhile.
    @Test(arguments: [false, true]) func aListingTakenBeforeChangesThroughTheMountDoesNotUndoThem(
        deferring: Bool
    ) async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = deferring
        fixture.provider.base.putFile("old", .bytes([1]))
        fixture.provider.base.putFile("was", .bytes([2]))
        fixture.provider.base.addDirectory("d")
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        // A file written and closed, its upload held (its birth, when deferred).
        let unborn = try await cache.createFile(named: "late", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(unborn, truncating: true)
        try await cache.writes.write(staging, Array("late".utf8), at: 0)
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(unborn.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        fixture.provider.holdNextListing()
        let listing = Task { try await cache.catalog.children(of: .root, maximumAge: .zero).map(\.name) }
        #expect(await eventually { fixture.provider.isHoldingListing })
        // While the listing waits: the upload gets through (a birth, when deferred), a file is
        // created, one is deleted and one renamed.
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(unborn.identifier))
        #expect(fixture.provider.base.content(of: "late") != nil)
        let created = try await cache.createFile(named: "new", in: .root, permissions: 0o644)
        try await cache.delete(try await cache.catalog.item(ItemIdentifier("old"), maximumAge: .zero))
        #expect(fixture.provider.base.content(of: "old") == nil)
        let was = try await cache.catalog.item(ItemIdentifier("was"), maximumAge: .zero)
        _ = try await cache.move(was, to: .root, named: "is", mode: .replacing, replaced: nil)
        fixture.provider.releaseListing()
        let answered = Set(try await listing.value)
        #expect(answered == ["d", "is", "late", "new"])
        // What the catalog keeps until the listing is taken again.
        let kept = try await cache.catalog.children(of: .root, maximumAge: .seconds(3600)).map(\.name)
        #expect(Set(kept) == ["d", "is", "late", "new"])
        #expect(try await cache.catalog.child(named: "new", of: .root)?.identifier == created.identifier)
        #expect(try await cache.catalog.child(named: "old", of: .root) == nil)
        // A listing taken after all of it agrees.
        let fresh = try await cache.catalog.children(of: .root, maximumAge: .zero).map(\.name)
        #expect(Set(fresh) == ["d", "is", "late", "new"])
        await cache.shutdown()
    }

    /// D-392: a name asked of the provider before a deferred file's birth and answered after it
    /// ("absent") does not remove the file (an editor's rename of its just-saved temporary file
    /// failed with ENOENT, and the catalog forgot a file the source had).
    @Test func aNameAskedBeforeABirthDoesNotUndoIt() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        fixture.provider.looksUpNames.withLock { $0 = true }
        let cache = try fixture.makeCache()
        _ = try await cache.catalog.children(of: .root, maximumAge: .zero)
        let unborn = try await cache.createFile(named: "doc.tmp", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(unborn, truncating: true)
        try await cache.writes.write(staging, Array("saved".utf8), at: 0)
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(unborn.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        // The listing is past its age: a lookup asks the provider for the name alone.
        fixture.clock.advance(by: fixture.options.directoryTTL + .seconds(1))
        fixture.provider.holdNextListing()
        let lookup = Task { try await cache.catalog.child(named: "doc.tmp", of: .root) }
        #expect(await eventually { fixture.provider.isHoldingListing }, "the provider was asked for the name")
        // While the answer ("absent") is on its way, the file is born at the provider.
        fixture.provider.release()
        #expect(await cache.writes.waitUntilUploaded(unborn.identifier))
        #expect(fixture.provider.base.content(of: "doc.tmp")?.0 == .bytes(Array("saved".utf8)))
        fixture.provider.releaseListing()
        #expect(try await lookup.value?.identifier == unborn.identifier)
        #expect(cache.catalog.knownItem(unborn.identifier) != nil, "the catalog still has the file")
        await cache.shutdown()
    }

    /// `touch`: created and closed unwritten, the empty file is made at the provider.
    @Test func aDeferredCreateClosedUnwrittenIsMadeEmpty() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let item = try await cache.createFile(named: "e", in: .root, permissions: 0o644)
        _ = try await cache.writes.openWriter(item, truncating: true)
        #expect(try await cache.writes.closeWriter(item.identifier) == nil)
        #expect(await eventually { fixture.provider.base.content(of: "e")?.0 == .bytes([]) })
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        let after = try await cache.catalog.item(item.identifier, maximumAge: .zero)
        #expect(!after.contentVersion.isUnborn && after.size == 0)
        await cache.shutdown()
    }

    /// A restart resumes both kinds: a file published and not uploaded, and one created and never
    /// closed (made empty). Meanwhile the catalog keeps serving them.
    @Test func deferredCreatesSurviveARestart() async throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-writes-unborn")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let fixture = try WriteFixture(store: store)
        fixture.provider.base.defersCreates = true
        fixture.provider.hold()
        let cache = try fixture.makeCache()
        let written = try await cache.createFile(named: "w", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(written, truncating: true)
        try await cache.writes.write(staging, Array("kept".utf8), at: 0)
        _ = try await cache.writes.closeWriter(written.identifier)
        let open = try await cache.createFile(named: "o", in: .root, permissions: 0o644)
        _ = try await cache.writes.openWriter(open, truncating: true)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        await cache.shutdown()  // "crash": o's writer never closed, w's upload never got through
        fixture.provider.failNext(1)
        fixture.provider.release()
        #expect(await eventually { fixture.provider.uploadCount == 1 })
        fixture.provider.hold()
        let restarted = try fixture.makeCache()
        #expect(restarted.catalog.isUnborn(written.identifier) && restarted.catalog.isUnborn(open.identifier))
        let listed = try await restarted.catalog.children(of: .root, maximumAge: .zero)
        #expect(Set(listed.map(\.name)) == ["w", "o"])
        let served = try #require(listed.first { $0.name == "w" })
        #expect(try await readAll(restarted, served) == Array("kept".utf8))
        fixture.provider.release()
        #expect(await restarted.writes.waitUntilUploaded(written.identifier))
        #expect(await restarted.writes.waitUntilUploaded(open.identifier))
        #expect(fixture.provider.base.content(of: "w")?.0 == .bytes(Array("kept".utf8)))
        #expect(fixture.provider.base.content(of: "o")?.0 == .bytes([]))
        await restarted.shutdown()
    }

    /// Namespace changes that need the file at the provider make it there first (empty, its
    /// upload replacing that next); an unlink of it touches nothing at the provider.
    @Test func renamesAndRmdirBearTheFileFirstAndUnlinkDropsIt() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        fixture.provider.base.addDirectory("d")
        let cache = try fixture.makeCache()
        let directory = try await cache.catalog.item(ItemIdentifier("d"), maximumAge: .zero)
        let item = try await cache.createFile(named: "n", in: directory.identifier, permissions: 0o644)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("moved".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        fixture.provider.release()
        // rmdir: the file is there (or is made there first), so the directory is not empty.
        await #expect(throws: CacheError.self) { try await cache.delete(directory) }
        #expect(fixture.provider.base.content(of: "d/n") != nil)
        let current = try await cache.catalog.item(item.identifier, maximumAge: .zero)
        let (moved, _) = try await cache.move(
            current, to: .root, named: "m", mode: .replacing, replaced: nil)
        #expect(await cache.writes.waitUntilUploaded(moved.identifier))
        #expect(fixture.provider.base.content(of: "m")?.0 == .bytes(Array("moved".utf8)))
        #expect(fixture.provider.base.content(of: "d/n") == nil)
        // unlink of a file the provider never had.
        let gone = try await cache.createFile(named: "g", in: .root, permissions: 0o644)
        try await cache.delete(gone)
        #expect(fixture.provider.base.content(of: "g") == nil)
        #expect(cache.writes.uploadRecord(of: gone.identifier) == nil)
        let names = try await cache.catalog.children(of: .root, maximumAge: .zero).map(\.name)
        #expect(!names.contains("g"))
        await cache.shutdown()
    }

    /// Someone else makes a file of the same name at the provider before the upload: both are
    /// kept, the provider's under the name, the mount's as a conflict copy.
    @Test func aNameTakenAtTheProviderMeanwhileIsAConflictCopy() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let item = try await cache.createFile(named: "c.txt", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        fixture.provider.base.putFile("c.txt", .bytes(Array("theirs".utf8)))
        // Meanwhile the mount keeps showing its own file.
        let listed = try await cache.catalog.children(of: .root, maximumAge: .zero)
        #expect(listed.first { $0.name == "c.txt" }?.contentVersion == item.contentVersion)
        try await cache.writes.write(staging, Array("ours".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { cache.writes.uploadRecord(of: item.identifier)?.conflictName != nil })
        let conflict = try #require(cache.writes.uploadRecord(of: item.identifier)?.conflictName)
        #expect(conflict.hasPrefix("c (conflict ") && conflict.hasSuffix(").txt"))
        #expect(fixture.provider.base.content(of: "c.txt")?.0 == .bytes(Array("theirs".utf8)))
        #expect(fixture.provider.base.content(of: conflict)?.0 == .bytes(Array("ours".utf8)))
        await cache.shutdown()
    }

    /// D-426: a chmod or utimens the provider makes at once is made on the calling thread, unless
    /// an upload call of the item runs (the async path waits for it, D-372), the item is not at
    /// the provider yet (unborn), or the provider does not answer at once.
    @Test func aChmodOrUtimensIsMadeAtOnceUnlessAnUploadCallRuns() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        fixture.provider.base.answersImmediately = true
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let time = ItemTime(seconds: 1_000, nanoseconds: 0)
        let made = try #require(
            cache.setAttributesNow(
                of: item.identifier, ItemAttributeChanges(permissions: 0o600, modificationTime: time)))
        #expect(try made.get().permissions == 0o600)
        #expect(cache.catalog.knownItem(item.identifier)?.modificationTime == time)
        #expect(cache.catalog.knownItem(item.identifier)?.permissions == 0o600)
        #expect(try await fixture.provider.base.item(for: item.identifier).permissions == 0o600)
        // A missing item: the provider's error, as the async path gives it.
        fixture.provider.base.remove("f")
        let missing = cache.setAttributesNow(of: item.identifier, ItemAttributeChanges(permissions: 0o644))
        #expect(missing == nil || (try? missing?.get()) == nil)
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        let current = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        // An upload call of the item running: declined.
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(current, truncating: false)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        _ = try await cache.writes.closeWriter(current.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        #expect(cache.setAttributesNow(of: current.identifier, ItemAttributeChanges(permissions: 0o644)) == nil)
        fixture.provider.release()
        #expect(await eventually { cache.writes.uploadRecord(of: current.identifier)?.isPending != true })
        #expect(cache.setAttributesNow(of: current.identifier, ItemAttributeChanges(permissions: 0o644)) != nil)
        // Not at the provider yet (D-386): held by its create upload (D-460), nothing made there.
        fixture.provider.base.defersCreates = true
        let created = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        #expect(
            try cache.setAttributesNow(of: created.identifier, ItemAttributeChanges(permissions: 0o600))?.get() != nil)
        #expect(cache.writes.uploadRecord(of: created.identifier)?.permissions == 0o600)
        #expect(fixture.provider.base.content(of: "n") == nil)
        // A provider that does not answer at once: declined.
        fixture.provider.base.answersImmediately = false
        #expect(cache.setAttributesNow(of: current.identifier, ItemAttributeChanges(permissions: 0o600)) == nil)
        await cache.shutdown()
    }

    /// D-521: a chmod or utimens of a directory does not wait for the uploads of the files in it
    /// (`tar x` sets each directory's times after writing its files, whose uploads still run):
    /// made at once, on the calling thread and the async way alike, and shown while the upload
    /// runs (the metadata the catalog holds for a directory written into is the one set), and
    /// after it. A chmod or utimens made between an upload's question for the directory and its
    /// recording of the answer is the one held.
    @Test func aDirectorysChmodOrUtimensDoesNotWaitForTheUploadsIntoIt() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.addDirectory("d")
        fixture.provider.base.putFile("d/f", .bytes(Array("old".utf8)))
        fixture.provider.base.answersImmediately = true
        let cache = try fixture.makeCache()
        let directory = ItemIdentifier("d")
        _ = try await cache.catalog.item(directory, maximumAge: .zero)
        let item = try await cache.catalog.item(ItemIdentifier("d/f"), maximumAge: .zero)
        fixture.provider.hold()
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        let time = ItemTime(seconds: 1_000, nanoseconds: 0)
        let made = try #require(
            cache.setAttributesNow(of: directory, ItemAttributeChanges(permissions: 0o700, modificationTime: time)),
            "declined: it would wait for the upload into the directory")
        #expect(try made.get().modificationTime == time)
        #expect(cache.catalog.itemNow(directory, maximumAge: .seconds(1))?.modificationTime == time)
        let later = ItemTime(seconds: 2_000, nanoseconds: 0)
        let answered = Locked(false)
        let utimens = Task {
            _ = try await cache.setAttributes(of: directory, ItemAttributeChanges(modificationTime: later))
            answered.withLock { $0 = true }
        }
        #expect(await eventually { answered.withLock { $0 } }, "the async path waited for the upload")
        try await utimens.value
        #expect(fixture.provider.uploadCount == 0, "the upload is still held")
        var shown = try #require(cache.catalog.itemNow(directory, maximumAge: .seconds(1)))
        #expect(shown.modificationTime == later && shown.permissions == 0o700)
        fixture.provider.release()
        #expect(await eventually { cache.writes.uploadRecord(of: item.identifier)?.isPending != true })
        shown = try await cache.catalog.item(directory, maximumAge: .zero)
        #expect(shown.modificationTime == later && shown.permissions == 0o700)
        // An upload asks for the directory, and a utimens through the mount comes before its
        // answer is recorded: the utimens's is the newer, and held.
        let latest = ItemTime(seconds: 3_000, nanoseconds: 0)
        let holding = cache.catalog.beginWriting(into: directory) {
            let asked = try? fixture.provider.base.itemNow(for: directory)
            _ = cache.setAttributesNow(of: directory, ItemAttributeChanges(modificationTime: latest))
            return asked
        }
        #expect(holding)
        #expect(cache.catalog.itemNow(directory, maximumAge: .seconds(1))?.modificationTime == latest)
        cache.catalog.endWriting(into: directory)
        await cache.shutdown()
    }

    /// D-460: a chmod or utimens of a file whose create upload runs (`cp -p`, git's local clone)
    /// is answered at once, on the calling thread and the async way alike, without waiting for
    /// that upload: the record holds it, the catalog shows it, and the provider gets it right
    /// after the upload (the call had read its terms already).
    @Test func aChmodOrUtimensOfAFileWhoseCreateRunsDoesNotWaitForIt() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let later = ItemTime(seconds: 1_100_000_000, nanoseconds: 0)
        let item = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(item, truncating: true)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        let made = try #require(
            cache.setAttributesNow(
                of: item.identifier, ItemAttributeChanges(permissions: 0o600, modificationTime: time)),
            "declined: it would wait for the create upload")
        #expect(try made.get().permissions == 0o600)
        #expect(fixture.provider.uploadCount == 0, "the create upload is still held")
        var shown = try #require(cache.catalog.itemNow(item.identifier, maximumAge: .seconds(1)))
        #expect(shown.permissions == 0o600 && shown.modificationTime == time)
        #expect(
            cache.writes.uploadRecord(of: item.identifier)?.heldAttributes
                == HeldAttributes(permissions: 0o600, modificationTime: time))
        // The async twin holds it the same way: it answers while the upload is still held.
        let answered = Locked(false)
        let utimens = Task {
            _ = try await cache.setAttributes(of: item.identifier, ItemAttributeChanges(modificationTime: later))
            answered.withLock { $0 = true }
        }
        #expect(await eventually { answered.withLock { $0 } }, "the async path waited for the upload")
        #expect(fixture.provider.uploadCount == 0)
        fixture.provider.release()
        try await utimens.value
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        let atProvider = try await fixture.provider.base.item(for: item.identifier)
        #expect(atProvider.permissions == 0o600 && atProvider.modificationTime == later)
        #expect(fixture.provider.base.content(of: "n")?.0 == .bytes(Array("new".utf8)))
        #expect(fixture.provider.attributeCalls >= 1)
        let record = try #require(cache.writes.uploadRecord(of: item.identifier))
        #expect(record.phase == .materialized && record.heldAttributes == HeldAttributes())
        shown = try await cache.catalog.item(item.identifier, maximumAge: .zero)
        #expect(shown.permissions == 0o600 && shown.modificationTime == later && shown.size == 3)
        await cache.shutdown()
    }

    /// D-460: held before the create sent anything (a parked create: the file not closed yet),
    /// the chmod and utimens ride the create upload itself; no call of their own.
    @Test func aChmodOrUtimensHeldBeforeTheCreateSendsRidesIt() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let item = try await cache.createFile(named: "t", in: .root, permissions: 0o644)
        _ = try await cache.writes.openWriter(item, truncating: true)
        _ = try #require(
            cache.setAttributesNow(
                of: item.identifier, ItemAttributeChanges(permissions: 0o600, modificationTime: time)))
        #expect(fixture.provider.base.content(of: "t") == nil)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await cache.writes.waitUntilUploaded(item.identifier))
        let carried = fixture.provider.carried.withLock { $0 }
        #expect(carried.permissions == 0o600 && carried.modificationTime == time)
        #expect(fixture.provider.attributeCalls == 0)
        #expect(fixture.provider.base.content(of: "t")?.0 == .bytes([]))
        await cache.shutdown()
    }

    /// D-460: the hold of a chmod or utimens and the catalog's showing it are two steps; the
    /// write-back can upload the file and make what was held between them (a loaded machine:
    /// `WriteMountTests.utimensAndChmodDuringAnEditAreNoConflict` saw the time of the publish
    /// after its utime). The local version then is no longer pending, and still shows the time
    /// held, also when the provider's item is applied again.
    @Test func aTimeHeldAfterItsUploadEndedStillShows() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("f0".utf8)))
        let cache = try fixture.makeCache()
        let identifier = ItemIdentifier("f")
        _ = try await cache.catalog.item(identifier, maximumAge: .zero)
        let published = ItemTime(seconds: 1_700_000_000, nanoseconds: 0)
        let local = ContentVersion("local:held-test")
        _ = cache.catalog.publishLocal(identifier, version: local, size: 2, modificationTime: published)
        // Uploaded: the provider's version holds the local bytes.
        var uploaded = try await fixture.provider.base.item(for: identifier)
        uploaded.contentVersion = ContentVersion("uploaded")
        cache.catalog.localUploaded(identifier, version: local, providerVersion: uploaded.contentVersion, base: nil)
        let held = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let shown = try #require(cache.catalog.attributesHeld(identifier, HeldAttributes(modificationTime: held)))
        #expect(shown.modificationTime == held)
        // The provider's item again (its version is the upload's): the local version's time.
        let applied = cache.catalog.apply(uploaded, origin: .provider)
        #expect(applied.contentVersion == local)
        #expect(applied.modificationTime == held, "the time of the publish came back")
        await cache.shutdown()
    }

    /// D-460: a chmod and utimens held while an empty file's create uploads stay shown once the
    /// create is at the provider, until the write-back has made them there: neither the create's
    /// answer nor the provider's item (a watcher's news) brings the create's mode back
    /// (pjdfstest chmod/07 saw the mode of the create in a stat right after its chmod). The
    /// atime too, which the upload cannot carry: made after it (pjdfstest utimensat/00 and 04
    /// lost it). Once made, the provider's item is shown again as it comes.
    @Test func attributesHeldPastACreateStayShownUntilMade() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let accessed = ItemTime(seconds: 900_000_000, nanoseconds: 7)
        fixture.provider.hold()
        fixture.provider.holdAttributes()
        // As open(O_CREAT) and close: created, closed unwritten.
        let created = try await cache.createFile(named: "n", in: .root, permissions: 0o644)
        let identifier = created.identifier
        _ = try await cache.writes.openWriter(created, truncating: true)
        _ = try await cache.writes.closeWriter(identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 }, "the create's upload runs")
        let held = try #require(
            cache.setAttributesNow(
                of: identifier, ItemAttributeChanges(permissions: 0o600, modificationTime: time, accessTime: accessed)))
        #expect(try held.get().accessTime == accessed)
        fixture.provider.release()
        #expect(await eventually { fixture.provider.attributeCalls == 1 }, "made after the create")
        let shown = try await cache.catalog.item(identifier, maximumAge: nil)
        #expect(shown.permissions == 0o600, "the create's mode came back")
        #expect(shown.modificationTime == time)
        #expect(shown.accessTime == accessed)
        let atProvider = try await fixture.provider.base.item(for: identifier)
        #expect(atProvider.permissions == 0o644, "not made at the provider yet")
        let applied = cache.catalog.apply(atProvider, origin: .provider)
        #expect(
            applied.permissions == 0o600 && applied.modificationTime == time && applied.accessTime == accessed,
            "\(applied)")
        fixture.provider.releaseAttributes()
        #expect(await eventually { cache.writes.uploadRecord(of: identifier)?.phase == .materialized })
        let made = try await fixture.provider.base.item(for: identifier)
        #expect(made.permissions == 0o600 && made.modificationTime == time && made.accessTime == accessed, "\(made)")
        // Made: a change at the provider shows as it comes.
        let changed = try await fixture.provider.base.setAttributes(
            identifier, ItemAttributeChanges(permissions: 0o640))
        #expect(cache.catalog.apply(changed, origin: .provider).permissions == 0o640)
        await cache.shutdown()
    }

    /// D-460, what meets a held chmod and utimens: a rename of the file before its create makes
    /// it at the provider with them; an unlink while its create runs leaves nothing and makes no
    /// call for them; a name taken at the provider meanwhile keeps them with the mount's file,
    /// the conflict copy, and never makes them on the other file.
    @Test func heldAttributesFollowTheFileThroughARenameAnUnlinkAndAConflict() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.defersCreates = true
        let cache = try fixture.makeCache()
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let changes = ItemAttributeChanges(permissions: 0o600, modificationTime: time)
        // A rename before the create: the file is made at the provider with them.
        let renamed = try await cache.createFile(named: "r", in: .root, permissions: 0o644)
        _ = try #require(cache.setAttributesNow(of: renamed.identifier, changes))
        let current = try await cache.catalog.item(renamed.identifier, maximumAge: .zero)
        let (moved, _) = try await cache.move(current, to: .root, named: "r2", mode: .replacing, replaced: nil)
        var carried = fixture.provider.carried.withLock { $0 }
        #expect(carried.permissions == 0o600 && carried.modificationTime == time)
        #expect(fixture.provider.base.content(of: "r2")?.0 == .bytes([]))
        #expect(cache.writes.uploadRecord(of: moved.identifier) == nil, "nothing left to upload")
        // An unlink while the create runs: it waits for that call, then nothing is left.
        let gone = try await cache.createFile(named: "g", in: .root, permissions: 0o644)
        let staging = try await cache.writes.openWriter(gone, truncating: true)
        try await cache.writes.write(staging, Array("g".utf8), at: 0)
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(gone.identifier)
        #expect(await eventually { fixture.provider.startedCount == 2 })
        _ = try #require(cache.setAttributesNow(of: gone.identifier, changes))
        let unlink = Task { try await cache.delete(try await cache.catalog.item(gone.identifier, maximumAge: nil)) }
        fixture.provider.release()
        try await unlink.value
        #expect(await eventually { cache.writes.uploadRecord(of: gone.identifier) == nil })
        #expect(fixture.provider.base.content(of: "g") == nil)
        #expect(fixture.provider.attributeCalls == 0)
        // A name taken at the provider meanwhile: the conflict copy is the mount's file, with them.
        let taken = try await cache.createFile(named: "c.txt", in: .root, permissions: 0o644)
        let takenStaging = try await cache.writes.openWriter(taken, truncating: true)
        try await cache.writes.write(takenStaging, Array("ours".utf8), at: 0)
        fixture.provider.base.putFile("c.txt", .bytes(Array("theirs".utf8)))
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(taken.identifier)
        #expect(await eventually { fixture.provider.startedCount == 3 })
        _ = try #require(cache.setAttributesNow(of: taken.identifier, changes))
        let theirs = try await fixture.provider.base.item(for: taken.identifier)
        fixture.provider.release()
        #expect(await eventually { cache.writes.uploadRecord(of: taken.identifier)?.conflictName != nil })
        let record = try #require(cache.writes.uploadRecord(of: taken.identifier))
        #expect(record.phase == .materialized && record.heldAttributes == HeldAttributes())
        carried = fixture.provider.carried.withLock { $0 }
        #expect(carried.permissions == 0o600 && carried.modificationTime == time)
        let after = try await fixture.provider.base.item(for: taken.identifier)
        #expect(after.permissions == theirs.permissions && after.modificationTime == theirs.modificationTime)
        #expect(fixture.provider.attributeCalls == 0)
        await cache.shutdown()
    }

    /// D-460, crash safety: the record holds the chmod and utimens before the answer. A daemon
    /// killed while the create upload runs, or after it and before their own call, still gets
    /// them to the provider after the restart; meanwhile the catalog shows them.
    @Test func aHeldChmodOrUtimensSurvivesARestart() async throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-writes-held-create")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let fixture = try WriteFixture(store: store)
        fixture.provider.base.defersCreates = true
        let time = ItemTime(seconds: 1_000_000_000, nanoseconds: 5)
        let changes = ItemAttributeChanges(permissions: 0o600, modificationTime: time)
        let cache = try fixture.makeCache()
        // "u": killed while its create upload runs; "a": after its upload, before the attributes.
        var items: [String: ProviderItem] = [:]
        for name in ["u", "a"] {
            let item = try await cache.createFile(named: name, in: .root, permissions: 0o644)
            let staging = try await cache.writes.openWriter(item, truncating: true)
            try await cache.writes.write(staging, Array(name.utf8), at: 0)
            items[name] = item
        }
        fixture.provider.holdAttributes()
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(items["a"]!.identifier)
        #expect(await eventually { fixture.provider.startedCount == 1 })
        _ = try #require(cache.setAttributesNow(of: items["a"]!.identifier, changes))
        fixture.provider.release()
        // "a"'s upload had read its terms: its chmod and utimens wait for their own call.
        #expect(
            await eventually {
                cache.writes.uploadRecord(of: items["a"]!.identifier)?.phase == .attributes
                    && fixture.provider.attributeCalls == 1
            })
        fixture.provider.hold()
        _ = try await cache.writes.closeWriter(items["u"]!.identifier)
        #expect(await eventually { fixture.provider.startedCount == 2 })
        _ = try #require(cache.setAttributesNow(of: items["u"]!.identifier, changes))
        await cache.shutdown()
        // The dead cache's calls never get through (a killed daemon's would not return).
        fixture.provider.failNext(1)
        fixture.provider.release()
        fixture.provider.releaseAttributes(failing: 1)
        #expect(
            await eventually {
                items.values.allSatisfy { cache.writes.uploadRecord(of: $0.identifier)?.lastError != nil }
            })
        #expect(try await fixture.provider.base.item(for: items["a"]!.identifier).permissions == 0o644)
        fixture.provider.hold()
        let restarted = try fixture.makeCache()
        for item in items.values {
            #expect(
                restarted.writes.uploadRecord(of: item.identifier)?.heldAttributes
                    == HeldAttributes(permissions: 0o600, modificationTime: time))
        }
        let listed = try await restarted.catalog.children(of: .root, maximumAge: .zero)
        for name in ["u", "a"] {
            let served = try #require(listed.first { $0.name == name })
            #expect(served.permissions == 0o600 && served.modificationTime == time, "\(name)")
        }
        fixture.provider.release()
        for item in items.values { #expect(await restarted.writes.waitUntilUploaded(item.identifier)) }
        // "u": its resumed create carried them; "a": its attributes were made.
        let carried = fixture.provider.carried.withLock { $0 }
        #expect(carried.permissions == 0o600 && carried.modificationTime == time)
        #expect(fixture.provider.base.content(of: "u")?.0 == .bytes(Array("u".utf8)))
        let made = try await fixture.provider.base.item(for: items["a"]!.identifier)
        #expect(made.permissions == 0o600 && made.modificationTime == time)
        #expect(fixture.provider.base.content(of: "a")?.0 == .bytes(Array("a".utf8)))
        await restarted.shutdown()
    }

    /// Review of D-385/D-386: a chmod that reaches the provider while an upload carrying an
    /// earlier held chmod waits is not undone by it; a create whose item the catalog lost is
    /// dropped, not retried forever.
    @Test func aLaterChmodWinsAndAnOrphanedCreateIsDropped() async throws {
        let fixture = try WriteFixture()
        fixture.provider.base.putFile("f", .bytes(Array("old".utf8)))
        let cache = try fixture.makeCache()
        let item = try await cache.catalog.item(ItemIdentifier("f"), maximumAge: .zero)
        let staging = try await cache.writes.openWriter(item, truncating: false)
        try await cache.writes.write(staging, Array("new".utf8), at: 0)
        #expect(cache.writes.holdAttributes(ItemAttributeChanges(permissions: 0o640), of: item.identifier))
        // The upload fails once and waits for its retry (a running one would make the chmod wait).
        fixture.provider.failNext(1)
        _ = try await cache.writes.closeWriter(item.identifier)
        #expect(await eventually { cache.writes.uploadRecord(of: item.identifier)?.phase == .error })
        _ = try await cache.setAttributes(of: item.identifier, ItemAttributeChanges(permissions: 0o600))
        #expect(cache.writes.uploadRecord(of: item.identifier)?.permissions == 0o600)
        #expect(cache.catalog.knownItem(item.identifier)?.permissions == 0o600)
        // The retry's backoff may begin after any one advance (and other sleepers count too):
        // the clock moves on until the upload got through.
        #expect(
            await eventually {
                fixture.clock.advance(by: .seconds(2))
                return cache.writes.uploadRecord(of: item.identifier)?.isPending == false
            })
        #expect(fixture.provider.carried.withLock { $0.permissions } == 0o600)

        fixture.provider.base.defersCreates = true
        let new = try await cache.createFile(named: "o", in: .root, permissions: 0o644)
        let newStaging = try await cache.writes.openWriter(new, truncating: true)
        try await cache.writes.write(newStaging, Array("x".utf8), at: 0)
        fixture.provider.failNext(1)
        _ = try await cache.writes.closeWriter(new.identifier)
        #expect(await eventually { cache.writes.uploadRecord(of: new.identifier)?.phase == .error })
        cache.catalog.removeItem(new.identifier)  // as when its directory goes outside the mount
        #expect(
            await eventually {
                fixture.clock.advance(by: .seconds(2))
                return cache.writes.uploadRecord(of: new.identifier) == nil
            })
        #expect(fixture.provider.base.content(of: "o") == nil)
        await cache.shutdown()
    }

    @Test func theSQLiteStoreKeepsUploadRecords() throws {
        let directory = try TemporaryDirectory(prefix: "providerfs-uploads-sqlite")
        defer { directory.remove() }
        let store = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        let record = UploadRecord(
            identifier: ItemIdentifier("a/b"), localVersion: ContentVersion("local:3.9"),
            baseVersion: ContentVersion("v1"), phase: .error, attempts: 2, lastError: "EIO: no", providerVersion: nil,
            conflictName: "b (conflict S)", permissions: 0o640, creates: true)
        try store.saveUpload(record)
        let reopened = try SQLiteMetadataStore(path: directory.path + "/metadata.sqlite")
        #expect(try reopened.loadUploads() == [record])
        try reopened.deleteUpload(record.identifier)
        #expect(try reopened.loadUploads().isEmpty)
    }
}
