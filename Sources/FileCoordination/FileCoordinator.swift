// The public coordinator (Apple's NSFileCoordinator), over a `CoordinationDomain`.

public import Foundation
import SystemSupport

/// Coordinates reads and writes of files with other coordinators and presenters, in this process
/// and in others (Apple's `NSFileCoordinator`). Errors are thrown; an accessor never runs when the
/// coordination failed. Differences from Apple are listed in docs/SEMANTICS.md.
public final class FileCoordinator: ClaimLossListener, @unchecked Sendable {
    // Safe: the mutable fields live in `state` (a Locked); the others are immutable.
    struct State {
        var purpose: String
        var purposeWasSet = false
        var cancelled = false
        var inflight: [ObjectIdentifier: CoordinationDomain.Ticket] = [:]
        var deadlines: CoordinationDeadlines
        var claimLostHandler: (@Sendable (CoordinationError) -> Void)?
    }

    /// The presenter this coordinator acts for: it receives no messages caused by this coordinator
    /// (rule 26) and shares its purpose identifier (rule 6).
    public let filePresenter: (any FilePresenter)?
    /// Where claims go.
    package let domain: CoordinationDomain
    private let state: Locked<State>

    /// A coordinator in the cross-process shared domain. With `filePresenter`, every coordinator
    /// made with that presenter has the same purpose identifier.
    public convenience init(filePresenter: (any FilePresenter)? = nil) {
        self.init(filePresenter: filePresenter, domain: .shared)
    }

    /// A coordinator whose claims go to `domain` (tests and the mount use their own domains).
    package init(filePresenter: (any FilePresenter)? = nil, domain: CoordinationDomain) {
        self.filePresenter = filePresenter
        self.domain = domain
        let purpose = filePresenter.map { domain.purpose(for: $0) } ?? UUID().uuidString
        state = Locked(State(purpose: purpose, deadlines: .default))
    }

    // MARK: Presenters (process-wide, in the shared domain)

    /// Registers a presenter with the shared domain (rule 68: kept until removed).
    public static func addFilePresenter(_ presenter: any FilePresenter) {
        CoordinationDomain.shared.addFilePresenter(presenter)
    }

    /// Unregisters a presenter from the shared domain; unknown presenters are ignored (rule 66).
    public static func removeFilePresenter(_ presenter: any FilePresenter) {
        CoordinationDomain.shared.removeFilePresenter(presenter)
    }

    /// This process's presenters in the shared domain (rule 67).
    public static var filePresenters: [any FilePresenter] { CoordinationDomain.shared.filePresenters }

    /// Inside an accessor: the sockets of the server connections that hold the caller's claims
    /// (none for an in-process domain). The server releases a connection's claims when the last
    /// copy of its socket is closed, so a child process that inherits these descriptors keeps the
    /// claims alive after this process dies, as flock(1)'s command keeps its lock
    /// (`providerfs coordinate -- CMD`, D-136). Each descriptor is close-on-exec here.
    package static var heldClaimDescriptors: [Int32] {
        var descriptors: [Int32] = []
        for held in CoordinationContext.held {
            if let descriptor = held.descriptor, !descriptors.contains(descriptor) { descriptors.append(descriptor) }
        }
        return descriptors
    }

    /// Inside an accessor: the caller's claims are for process `pid` (started at `startTime`,
    /// /proc/PID/stat) from now on: the mount lets it and its descendants through them as it lets
    /// the caller (D-126), also once the caller is gone (`providerfs coordinate -- CMD`, D-406).
    /// Sent on each connection that holds them, and again to the server a claim is reclaimed from
    /// after a crash (D-402); no answer is awaited.
    package static func holdClaims(forProcess pid: Int32, startTime: UInt64) {
        var told: [ObjectIdentifier] = []
        for held in CoordinationContext.held {
            let endpoint = held.ticket.progress.withLock { progress in
                progress.heldFor = (pid, startTime)
                return progress.endpoint
            }
            guard !told.contains(ObjectIdentifier(endpoint)) else { continue }
            told.append(ObjectIdentifier(endpoint))
            endpoint.holdFor(pid: pid, startTime: startTime)
        }
    }

    /// Waits until each server holding the caller's claims has handled what was sent to it
    /// (`holdClaims` above all), at most `milliseconds` in all: `providerfs coordinate` lets CMD
    /// start only then (D-528). False when one did not confirm in time.
    package static func confirmHeldClaimsReceived(milliseconds: Int) -> Bool {
        let deadline = monotonicNanoseconds() + UInt64(max(0, milliseconds)) * 1_000_000
        var asked: [ObjectIdentifier] = []
        var confirmed = true
        for held in CoordinationContext.held {
            let endpoint = held.ticket.progress.withLock { $0.endpoint }
            guard !asked.contains(ObjectIdentifier(endpoint)) else { continue }
            asked.append(ObjectIdentifier(endpoint))
            let left = deadline > monotonicNanoseconds() ? Int((deadline - monotonicNanoseconds()) / 1_000_000) : 0
            if !endpoint.confirmReceived(milliseconds: left) { confirmed = false }
        }
        return confirmed
    }

    // MARK: Identity and deadlines

    /// Claims with the same purpose never wait for each other, even across processes (rule 5).
    public var purposeIdentifier: String { state.withLock { $0.purpose } }

    /// Sets the purpose identifier once, before use (rule 7): a second call, a call on a
    /// coordinator made with a presenter, or an empty identifier throws.
    public func setPurposeIdentifier(_ identifier: String) throws(CoordinationError) {
        guard filePresenter == nil else {
            throw CoordinationError(
                .invalidPurposeIdentifier,
                "A coordinator created with a file presenter uses the presenter's purpose identifier.")
        }
        guard !identifier.isEmpty else {
            throw CoordinationError(.invalidPurposeIdentifier, "The purpose identifier must not be empty.")
        }
        try state.withLock { (state) throws(CoordinationError) in
            guard !state.purposeWasSet else {
                throw CoordinationError(.invalidPurposeIdentifier, "The purpose identifier can be set only once.")
            }
            state.purpose = identifier
            state.purposeWasSet = true
        }
    }

    /// How long this coordinator's claims wait (default: `CoordinationDeadlines.default`).
    public var deadlines: CoordinationDeadlines {
        get { state.withLock { $0.deadlines } }
        set { state.withLock { $0.deadlines = newValue } }
    }

    /// Called when a claim of this coordinator, already granted, could not be re-established
    /// after its coordination server died (D-402): another claim took its place first, or no
    /// server came back in time. The error is `.claimLost` and names the item. It runs on an
    /// arbitrary thread, usually while the accessor is still running — from then on the accessor
    /// has no exclusion, and should stop or check its work. A claim re-established in time is not
    /// reported: its accessor never lost exclusion. Nil (the default): nobody is told.
    public var claimLostHandler: (@Sendable (CoordinationError) -> Void)? {
        get { state.withLock { $0.claimLostHandler } }
        set { state.withLock { $0.claimLostHandler = newValue } }
    }

    func claimLost(_ error: CoordinationError) {
        if let handler = claimLostHandler { handler(error) }
    }

    // MARK: Cancellation

    /// Stops every wait of this coordinator now; they throw `.cancelled` and their accessors do
    /// not run. An accessor already running finishes normally (rule 54). Sticky: every later call
    /// throws `.cancelled` without running its accessor (rule 55). Callable from any thread.
    public func cancel() {
        let tickets = state.withLock { state -> [CoordinationDomain.Ticket] in
            state.cancelled = true
            defer { state.inflight.removeAll() }
            return Array(state.inflight.values)
        }
        for ticket in tickets { domain.cancel(ticket) }
    }

    private func checkNotCancelled() throws(CoordinationError) {
        if state.withLock({ $0.cancelled }) {
            throw CoordinationError(.cancelled, "The coordinator was cancelled.")
        }
    }

    // MARK: Synchronous coordination

    /// Waits for a read claim on `url`, then runs `reader` with the URL to use (rules 17–18, 39).
    @discardableResult
    public func coordinate<T>(
        readingItemAt url: URL, options: ReadingOptions = [], byAccessor reader: (URL) throws -> T
    ) throws -> T {
        try coordinate(intents: [.readingIntent(with: url, options: options)]) { urls in try reader(urls[0]) }
    }

    /// Waits for a write claim on `url`, then runs `writer` with the URL to use.
    @discardableResult
    public func coordinate<T>(
        writingItemAt url: URL, options: WritingOptions = [], byAccessor writer: (URL) throws -> T
    ) throws -> T {
        try coordinate(intents: [.writingIntent(with: url, options: options)]) { urls in try writer(urls[0]) }
    }

    /// A read of one item and a write of another, claimed together (no lock-order deadlock).
    @discardableResult
    public func coordinate<T>(
        readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [], writingItemAt writingURL: URL,
        options writingOptions: WritingOptions = [], byAccessor body: (URL, URL) throws -> T
    ) throws -> T {
        try coordinate(intents: [
            .readingIntent(with: readingURL, options: readingOptions),
            .writingIntent(with: writingURL, options: writingOptions),
        ]) { urls in try body(urls[0], urls[1]) }
    }

    /// Two writes claimed together, e.g. a move: source `.forMoving`, destination `.forReplacing`.
    @discardableResult
    public func coordinate<T>(
        writingItemAt url1: URL, options options1: WritingOptions = [], writingItemAt url2: URL,
        options options2: WritingOptions = [], byAccessor body: (URL, URL) throws -> T
    ) throws -> T {
        try coordinate(intents: [
            .writingIntent(with: url1, options: options1), .writingIntent(with: url2, options: options2),
        ]) { urls in try body(urls[0], urls[1]) }
    }

    /// Takes the claim for `claimIntents` and blocks this thread until it is granted (or fails);
    /// returns the ticket and the granted paths. The endpoint may read the grant on this very
    /// thread (one thread wake-up less).
    private func acquireOnThisThread(_ claimIntents: [ClaimIntent]) throws -> (CoordinationDomain.Ticket, [String]) {
        let waiter = Waiter()
        let ticket = try domain.acquire(
            claimIntents, purpose: purposeIdentifier, deadlines: deadlines, waitsOnThread: true, onLost: self
        ) { waiter.fulfil($1) }
        // Granted (or failed) inside `acquire`, as an uncontended local claim is: nothing left
        // for `cancel()` to stop.
        if let ready = waiter.peek() { return (ticket, try ready.get()) }
        track(ticket)
        let result = ticket.endpoint.wait(for: waiter) ?? domain.awaitAfterLoss(ticket, waiter)
        untrack(ticket)
        return (ticket, try result.get())
    }

    /// Waits for every intent (all or nothing), then runs `body` with their URLs, on this thread.
    @discardableResult
    public func coordinate<T>(intents: [FileAccessIntent], byAccessor body: ([URL]) throws -> T) throws -> T {
        try checkNotCancelled()
        let (claimIntents, asRequested) = try Self.resolveNotingUnchanged(intents)
        let (ticket, paths) = try acquireOnThisThread(claimIntents)
        return try runAccessor(
            ticket: ticket, intents: intents, claimIntents: claimIntents, asRequested: asRequested, paths: paths,
            body: body)
    }

    // MARK: Asynchronous coordination

    /// Calls `accessor` once on `queue`: with nil when every intent is granted (access ends when it
    /// returns), or with the error (rule 61). Never blocks the caller. `intent.url` holds the URL to
    /// use inside (rule 39).
    public func coordinate(
        with intents: [FileAccessIntent], queue: OperationQueue,
        byAccessor accessor: @escaping @Sendable ((any Error)?) -> Void
    ) {
        do {
            try checkNotCancelled()
            let claimIntents = try Self.resolve(intents)
            let domain = self.domain
            let ticket = try domain.acquire(
                claimIntents, purpose: purposeIdentifier, deadlines: deadlines, blocksCaller: false,
                onLost: self
            ) { [weak self] ticket, result in
                let coordinator = self
                switch result {
                case .success(let paths):
                    Self.update(intents, claimIntents: claimIntents, paths: paths)
                    queue.addOperation {
                        defer {
                            coordinator?.untrack(ticket)
                            domain.release(ticket)
                        }
                        do {
                            try Self.makeContentAvailable(
                                claimIntents, paths: paths, endpoint: ticket.endpoint,
                                isCancelled: { coordinator?.isCancelled ?? false })
                        } catch {
                            accessor(error)
                            return
                        }
                        CoordinationContext.$held.withValue(Self.held(ticket: ticket)) { accessor(nil) }
                    }
                case .failure(let error):
                    coordinator?.untrack(ticket)
                    queue.addOperation { accessor(error) }
                }
            }
            track(ticket)
        } catch {
            queue.addOperation { accessor(error) }
        }
    }

    /// Waits without blocking a thread for every intent, then runs `body` with their URLs. Task
    /// cancellation cancels the wait.
    public func coordinate<T: Sendable>(
        with intents: [FileAccessIntent], performing body: @Sendable ([URL]) async throws -> T
    ) async throws -> T {
        try checkNotCancelled()
        let claimIntents = try Self.resolve(intents)
        let box = Locked<CoordinationDomain.Ticket?>(nil)
        let domain = self.domain
        let purpose = purposeIdentifier
        let deadlines = self.deadlines
        let paths = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[String], any Error>) in
                do {
                    let ticket = try domain.acquire(
                        claimIntents, purpose: purpose, deadlines: deadlines, onLost: self
                    ) {
                        continuation.resume(with: $1.mapError { $0 as any Error })
                    }
                    box.withLock { $0 = ticket }
                    track(ticket)
                    if Task.isCancelled { domain.cancel(ticket) }
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            if let ticket = box.withLock({ $0 }) { domain.cancel(ticket) }
        }
        let ticket = box.withLock { $0 }!
        untrack(ticket)
        Self.update(intents, claimIntents: claimIntents, paths: paths)
        defer {
            domain.release(ticket)
            if let filePresenter { domain.refreshPresenter(filePresenter) }
        }
        if ticket.endpoint.servesProviderMount {
            // Reads through the mount block: done off the caller's executor; task cancellation
            // and cancel() stop the wait.
            let endpoint = ticket.endpoint
            let taskCancelled = Locked(false)
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    DispatchQueue.global().async { [weak self] in
                        continuation.resume(
                            with: Result { () throws(CoordinationError) in
                                try Self.makeContentAvailable(
                                    claimIntents, paths: paths, endpoint: endpoint,
                                    isCancelled: { taskCancelled.withLock { $0 } || (self?.isCancelled ?? false) })
                            }.mapError { $0 as any Error })
                    }
                }
            } onCancel: {
                taskCancelled.withLock { $0 = true }
            }
        }
        let urls = zip(paths, claimIntents).map { URL(fileURLWithPath: $0, isDirectory: $1.isDirectory) }
        return try await CoordinationContext.$held.withValue(Self.held(ticket: ticket)) { try await body(urls) }
    }

    /// Async form of a coordinated read (the label differs from the blocking form's so a
    /// synchronous closure in async code cannot pick the blocking overload by accident).
    public func coordinate<T: Sendable>(
        readingItemAt url: URL, options: ReadingOptions = [], performing reader: @Sendable (URL) async throws -> T
    ) async throws -> T {
        try await coordinate(
            with: [.readingIntent(with: url, options: options)], performing: { urls in try await reader(urls[0]) })
    }

    /// Async form of a coordinated write.
    public func coordinate<T: Sendable>(
        writingItemAt url: URL, options: WritingOptions = [], performing writer: @Sendable (URL) async throws -> T
    ) async throws -> T {
        try await coordinate(
            with: [.writingIntent(with: url, options: options)], performing: { urls in try await writer(urls[0]) })
    }

    // MARK: Batch preparation (rule 33)

    /// Prepares a batch (Apple's `prepare(forReadingItemsAt:options:writingItemsAt:options:byAccessor:)`):
    /// presenters of the listed top-level items and of everything inside them are messaged once —
    /// `savePresentedItemChanges` for reads without `.withoutChanges` and `.forMerging` writes,
    /// `accommodatePresentedItemDeletion` for `.forDeleting` writes, never a relinquish (rule 33) —
    /// then `batchAccessor` runs on this thread. Its nested `coordinate…` calls still take claims
    /// (usually with `.withoutChanges`) and should use this coordinator: the batch claim is held,
    /// under this coordinator's purpose, until `completionHandler` is called (once, from any thread)
    /// when they are done. If `batchAccessor` throws, the batch ends at once. `.resolvesSymbolicLink`,
    /// `.forReplacing` and `.forEvicting` are invalid here.
    public func prepare(
        forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
        byAccessor batchAccessor: (_ completionHandler: @escaping @Sendable () -> Void) throws -> Void
    ) throws {
        let intents = try Self.batchIntents(readingURLs, readingOptions, writingURLs, writingOptions)
        try checkNotCancelled()
        let claimIntents = try Self.resolve(intents)
        let (ticket, _) = try acquireOnThisThread(claimIntents)
        let domain = self.domain
        let once = Locked(false)
        let complete: @Sendable () -> Void = {
            let first = once.withLock { done -> Bool in
                defer { done = true }
                return !done
            }
            if first { domain.release(ticket) }
        }
        do {
            try CoordinationContext.$held.withValue(Self.held(ticket: ticket)) { try batchAccessor(complete) }
        } catch {
            complete()
            throw error
        }
    }

    /// Async form of `prepare(…)`: the batch ends when `body` returns or throws.
    public func prepare<T: Sendable>(
        forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
        performing body: @Sendable () async throws -> T
    ) async throws -> T {
        let intents = try Self.batchIntents(readingURLs, readingOptions, writingURLs, writingOptions)
        return try await coordinate(with: intents, performing: { _ in try await body() })
    }

    private static func batchIntents(
        _ readingURLs: [URL], _ readingOptions: ReadingOptions, _ writingURLs: [URL], _ writingOptions: WritingOptions
    ) throws(CoordinationError) -> [FileAccessIntent] {
        if readingOptions.contains(.resolvesSymbolicLink) || readingOptions.contains(.forUploading)
            || !writingOptions.isDisjoint(with: [.forReplacing, .forEvicting])
        {
            throw CoordinationError(
                .invalidRequest,
                "prepare(…) does not accept .resolvesSymbolicLink, .forUploading, .forReplacing or .forEvicting.")
        }
        if readingURLs.isEmpty && writingURLs.isEmpty {
            throw CoordinationError(.invalidRequest, "prepare(…) needs at least one item.")
        }
        return readingURLs.map { .readingIntent(with: $0, options: readingOptions.union(.preparing)) }
            + writingURLs.map { .writingIntent(with: $0, options: writingOptions.union(.preparing)) }
    }

    // MARK: Eviction (rule 34)

    /// Coordinates the eviction of `url`'s local content: presenters of the item and of everything
    /// inside it get `accommodatePresentedItemEviction` and must remove themselves before answering.
    /// Throws `.presenterFailed` when one does not implement it, vetoes, or answers while still
    /// registered; `evictor` then does not run. Same as `coordinate(writingItemAt: url, options:
    /// .forEvicting, byAccessor:)`.
    @discardableResult
    public func coordinate<T>(evictingItemAt url: URL, byAccessor evictor: (URL) throws -> T) throws -> T {
        try coordinate(writingItemAt: url, options: .forEvicting, byAccessor: evictor)
    }

    // MARK: Moves

    /// Apple's announcement before a move. It sends no presenter message and changes nothing on
    /// Linux, as on iOS and unsandboxed macOS (rule 43); it exists so code written for Apple's API
    /// compiles and behaves the same. Call `item(at:didMoveTo:)` after the move.
    public func item(at oldURL: URL, willMoveTo newURL: URL) {}

    /// Announces, inside a coordinated write accessor, that the item at `from` now lives at `to`:
    /// presenters follow it and waiting claims are granted with the new URL (rules 35–40).
    public func item(at from: URL, didMoveTo to: URL) throws(CoordinationError) {
        guard !CoordinationContext.held.isEmpty else {
            throw CoordinationError(
                .invalidRequest, "item(at:didMoveTo:) must be called inside a coordinated write accessor.")
        }
        let fromPath = try ItemResolver.resolve(try ItemResolver.validatedPath(from)).path
        let toPath = try ItemResolver.resolve(try ItemResolver.validatedPath(to)).path
        try domain.itemMoved(from: fromPath, to: toPath, purpose: purposeIdentifier)
    }

    /// Announces, inside a coordinated write accessor, that a version of the item at `url` (stored
    /// at `version.url`) was gained, lost or resolved. Presenters of the item and of containing
    /// directories hear it, including this coordinator's own presenter (rule 27).
    public func item(
        at url: URL, didChangeVersion version: FileVersion, change: VersionChange
    )
        throws(CoordinationError)
    {
        guard !CoordinationContext.held.isEmpty else {
            throw CoordinationError(
                .invalidRequest, "Version changes must be announced inside a coordinated write accessor.")
        }
        let path = try ItemResolver.resolve(try ItemResolver.validatedPath(url)).path
        let versionPath = try ItemResolver.validatedPath(version.url)
        try domain.versionChanged(path: path, change: change, version: versionPath, versionName: version.name)
    }

    // MARK: Internals

    /// Rules 50–52: the granted reads of items in a ProviderFS mount get the items' content (a
    /// directory: its listing) before the accessor runs, except `.immediatelyAvailableMetadataOnly`
    /// reads. The claim is held meanwhile; a failure fails the coordination.
    /// `isCancelled` (asked between 1 MiB steps) ends the wait with `.cancelled` (rule 53).
    private static func makeContentAvailable(
        _ claimIntents: [ClaimIntent], paths: [String], endpoint: any CoordinationEndpoint,
        isCancelled: () -> Bool
    ) throws(CoordinationError) {
        guard endpoint.servesProviderMount else { return }
        for (index, intent) in claimIntents.enumerated()
        where intent.kind == .read && !intent.readingOptions.contains(.immediatelyAvailableMetadataOnly) {
            try ProviderContent.makeAvailable(paths[index], isCancelled: isCancelled)
        }
    }

    private var isCancelled: Bool { state.withLock { $0.cancelled } }

    private func track(_ ticket: CoordinationDomain.Ticket) {
        let cancelNow = state.withLock { state -> Bool in
            if state.cancelled { return true }
            state.inflight[ObjectIdentifier(ticket)] = ticket
            return false
        }
        if cancelNow { domain.cancel(ticket) }
    }

    private func untrack(_ ticket: CoordinationDomain.Ticket) {
        state.withLock { _ = $0.inflight.removeValue(forKey: ObjectIdentifier(ticket)) }
    }

    private static func held(ticket: CoordinationDomain.Ticket) -> [HeldClaim] {
        var held = CoordinationContext.held
        held.append(
            HeldClaim(
                endpoint: ObjectIdentifier(ticket.endpoint), local: ticket.local,
                descriptor: ticket.endpoint.claimDescriptor, ticket: ticket))
        return held
    }

    private static func update(_ intents: [FileAccessIntent], claimIntents: [ClaimIntent], paths: [String]) {
        for (index, intent) in intents.enumerated() where paths[index] != claimIntents[index].path {
            intent.url = URL(fileURLWithPath: paths[index], isDirectory: claimIntents[index].isDirectory)
        }
    }

    /// `asRequested`: bit i set when intent i's URL named its item's canonical path; the accessor
    /// then gets that very URL back unless the item moved (no new URL to build).
    private func runAccessor<T>(
        ticket: CoordinationDomain.Ticket, intents: [FileAccessIntent], claimIntents: [ClaimIntent],
        asRequested: UInt64, paths: [String], body: ([URL]) throws -> T
    ) throws -> T {
        Self.update(intents, claimIntents: claimIntents, paths: paths)
        var released = false
        defer {
            if !released { domain.release(ticket) }
            if let filePresenter { domain.refreshPresenter(filePresenter) }
        }
        try Self.makeContentAvailable(
            claimIntents, paths: paths, endpoint: ticket.endpoint, isCancelled: { self.isCancelled })
        var urls: [URL] = []
        urls.reserveCapacity(paths.count)
        for index in paths.indices {
            if index < 64, asRequested & (1 << index) != 0, paths[index] == claimIntents[index].path {
                urls.append(intents[index].url)
            } else {
                // isDirectory given: URL(fileURLWithPath:) alone would stat the path again.
                urls.append(URL(fileURLWithPath: paths[index], isDirectory: claimIntents[index].isDirectory))
            }
        }
        var snapshots: [Snapshot] = []
        defer { for snapshot in snapshots { snapshot.remove() } }
        for (index, intent) in claimIntents.enumerated()
        where intent.kind == .read && intent.readingOptions.contains(.forUploading) {
            let snapshot = try Snapshot.make(of: paths[index])
            snapshots.append(snapshot)
            urls[index] = snapshot.url
        }
        if !snapshots.isEmpty && snapshots.count == claimIntents.count {
            // Rule 48: once the snapshots exist, the originals are free for others.
            domain.release(ticket)
            released = true
            return try body(urls)
        }
        return try CoordinationContext.$held.withValue(Self.held(ticket: ticket)) { try body(urls) }
    }

    /// Validates and resolves intents: file URLs with absolute paths, at most one writing option,
    /// the same item not named twice with the same kind and different options.
    static func resolve(_ intents: [FileAccessIntent]) throws(CoordinationError) -> [ClaimIntent] {
        try resolveNotingUnchanged(intents).claims
    }

    /// `resolve`, also noting (bit i of `asRequested`, first 64 intents) which URLs already named
    /// their item's canonical path.
    static func resolveNotingUnchanged(
        _ intents: [FileAccessIntent]
    ) throws(CoordinationError) -> (claims: [ClaimIntent], asRequested: UInt64) {
        guard !intents.isEmpty else {
            throw CoordinationError(.invalidRequest, "A coordination needs at least one intent.")
        }
        var result: [ClaimIntent] = []
        result.reserveCapacity(intents.count)
        var asRequested: UInt64 = 0
        for intent in intents {
            let path = try ItemResolver.validatedPath(intent.url)
            if intent.writingOptions.subtracting(.preparing).rawValue.nonzeroBitCount > 1 {
                throw CoordinationError(.invalidRequest, "A write takes at most one writing option.")
            }
            let follow = intent.kind == .read && intent.readingOptions.contains(.resolvesSymbolicLink)
            let item = try ItemResolver.resolve(path, followLastSymlink: follow)
            let claim = ClaimIntent(
                kind: intent.kind, path: item.path, readingOptions: intent.readingOptions,
                writingOptions: intent.writingOptions, identity: item.identity, isDirectory: item.isDirectory,
                packageRoot: item.packageRoot)
            if let clash = result.first(where: {
                $0.path == claim.path && $0.kind == claim.kind
                    && ($0.readingOptions != claim.readingOptions || $0.writingOptions != claim.writingOptions)
            }) {
                throw CoordinationError(
                    .invalidRequest,
                    "\(clash.path) is named twice with different \(clash.kind) options (\(clash.kindDescription) and "
                        + "\(claim.kindDescription)).")
            }
            if item.path == path && result.count < 64 { asRequested |= 1 << UInt64(result.count) }
            result.append(claim)
        }
        return (result, asRequested)
    }
}
