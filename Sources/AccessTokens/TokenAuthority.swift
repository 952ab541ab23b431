// The mount's access tokens: grant, check, use, revoke, expire, list and the audit log, kept in
// the mount's cache directory. What it guarantees and how enforcement uses it: docs/TOKENS.md.

import CryptoSupport
public import Foundation
import SystemSupport

/// Owns a mount's tokens. Thread-safe; every call is synchronous and short (a check is a hash,
/// one dictionary lookup and, for a pid-bound token, one read of /proc). Calls that change a
/// token (grant, a counted use, revoke, expire) write that token's row of tokens.db (fsynced)
/// before they return; the cost does not grow with the number of tokens (D-335, D-339).
public final class TokenAuthority: Sendable {
    public let limits: TokenLimits
    /// The 8 characters after `pfs_` in this mount's tokens.
    public let mountTag: String

    let state: Locked<TokenAuthorityState>
    let format: TokenFormat
    /// Random, per mount, kept with the hashes: each hash is SHA-256(salt ‖ token).
    private let salt: [UInt8]
    let time: MonotonicTime
    let wallClock: @Sendable () -> Date
    let processStartTime: @Sendable (Int32) -> UInt64?
    private let store: TokenStore?
    /// The store clock (D-336) at this authority's monotonic zero: store time = origin + elapsed.
    private let clockOrigin: Duration
    /// Told the id of every token that ends, outside the lock (`observeEnds`, D-346).
    private let endObservers = Locked<[@Sendable (String) -> Void]>([])
    /// Appends the audit entries of uses that change nothing else within `auditFlushDelay`, on a
    /// thread of its own (D-347). Started when there is a store; stopped by deinit.
    let auditFlusher = AuditFlusher(delay: TokenAuthority.auditFlushDelay)
    /// Held while pending entries are taken and appended, so two flushes cannot reorder them.
    private let auditOrder = Lock()
    /// How long the entries of uses may wait before they are appended to the file (D-347).
    static let auditFlushDelay: Duration = .milliseconds(50)

    /// - Parameters:
    ///   - storeDirectory: the mount's cache directory, or nil to keep nothing on disk.
    ///   - clock: the monotonic clock expiry is measured on (ContinuousClock in the daemon).
    ///   - wallClock: for display and for carrying deadlines across a restart only.
    ///   - processStartTime: a process's start time; nil reads /proc/PID/stat field 22 (tests
    ///     substitute a fake).
    ///   - log: one line per problem with the files (never contains a token).
    public init(
        storeDirectory: String?,
        clock: any Clock<Duration>,
        wallClock: @escaping @Sendable () -> Date = { Date() },
        processStartTime: (@Sendable (Int32) -> UInt64?)? = nil,
        limits: TokenLimits = TokenLimits(),
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) {
        self.limits = limits
        self.time = MonotonicTime(clock)
        self.wallClock = wallClock
        self.processStartTime = processStartTime ?? { ProcessInfoFiles.startTime(of: $0) }
        let store = storeDirectory.map { TokenStore(directory: $0, log: log) }
        self.store = store
        var state = TokenAuthorityState(limits: limits)
        let now = time.elapsed()
        let wallNow = wallClock()
        var restored: (tag: [UInt8], salt: [UInt8])?
        var problem: String?
        // The store clock starts at zero now, or continues the stored one (D-336).
        var clockOrigin = Duration.zero - now
        var onDisk = false
        var migrating = false
        if let store {
            let audit = store.loadAudit(limit: limits.auditEntries)
            for entry in audit.entries { state.append(entry) }
            state.nextSequence = (audit.entries.last?.sequence ?? 0) + 1
            if audit.badLines > 0 {
                // Rewritten without them, so the next start does not report them again.
                store.rewriteAudit(audit.entries)
                state.log(.storeProblem, time: wallNow, detail: "\(audit.badLines) unreadable audit lines skipped")
            }
            switch store.load() {
            case .missing: break
            case .setAside(let why): problem = why
            case .legacy(let stored):
                if let records = Self.restore(stored, now: now, wallNow: wallNow) {
                    restored = (Array(stored.mountTag.utf8), Self.bytes(hex: stored.salt)!)
                    for record in records { state.insert(record) }
                    migrating = true
                } else {
                    problem = store.setAsideLegacy("a token in it is not valid")
                }
            case .loaded(let header, let tokens):
                let storeNow = Self.storeNow(header, wallNow: wallNow)
                if let restoredHeader = Self.restore(header),
                    let records = Self.restore(tokens, storeNow: storeNow, now: now, wallNow: wallNow)
                {
                    restored = restoredHeader
                    for record in records { state.insert(record) }
                    state.records.forgetChanges()
                    clockOrigin = .nanoseconds(storeNow) - now
                    onDisk = true
                } else {
                    problem = store.setAsideDatabase("a token or its tag and salt are not valid")
                }
            }
        }
        if let problem {
            state.log(.storeProblem, time: wallNow, detail: problem + "; starting with no tokens")
        }
        let tag = restored?.tag ?? TokenFormat.randomTag()
        format = TokenFormat(tag: tag)
        mountTag = String(decoding: tag, as: UTF8.self)
        salt = restored?.salt ?? randomBytes(32)
        self.clockOrigin = clockOrigin
        state.generation = 1
        // A new store (or a migrated one) is written at once: its tag and salt, and every token.
        state.savedGeneration = onDisk ? 1 : 0
        state.noticeExpiries(now: now, wallNow: wallNow)
        self.state = Locked(state)
        if migrating {
            if let failure = persist(force: true) {
                log("tokens.json not migrated (its tokens hold until the mount stops): \(failure)")
            } else {
                store?.retireLegacy(
                    reason: "its \(self.state.withLock { $0.records.count }) tokens are now in tokens.db")
            }
        } else if !onDisk {
            persist(force: true)
        } else {
            saveIfChanged()
        }
        if store != nil {
            // Weakly: the thread holds the flusher, never the authority, so deinit stops it.
            auditFlusher.start { [weak self] in self?.flushAudit() }
        }
    }

    deinit {
        auditFlusher.stop()
        flushAudit()
    }

    // MARK: Grant

    /// Grants access to `scope`. Returns the token (its only copy) and its row of the list.
    public func grant(
        scope: TokenScope, mode: TokenMode, ttl: Duration? = nil, pid: Int32? = nil, uses: Int? = nil,
        by caller: TokenCaller? = nil
    ) throws(TokenGrantError) -> IssuedToken {
        guard !scope.identifier.isEmpty else { throw .emptyIdentifier }
        if let ttl {
            guard ttl > .zero else { throw .nonPositiveTTL(ttl) }
            guard ttl <= limits.maximumTTL else { throw .ttlTooLong(ttl, maximum: limits.maximumTTL) }
        }
        if let uses, uses < 1 { throw .nonPositiveUses(uses) }
        var bound: TokenRecord.BoundProcess?
        if let pid {
            guard pid > 0 else { throw .invalidPID(pid) }
            guard let start = processStartTime(pid) else { throw .noSuchProcess(pid) }
            bound = TokenRecord.BoundProcess(pid: pid, startTime: start)
        }
        let token = format.newToken()
        let hash = hash(Array(token.utf8))
        let now = time.elapsed()
        let wallNow = wallClock()
        let record = state.withLock { state -> TokenRecord in
            var id = hexString(randomBytes(6))
            while state.records[id] != nil { id = hexString(randomBytes(6)) }
            let record = TokenRecord(
                id: id, hash: hash, scope: scope, mode: mode, grantedAt: wallNow, deadline: ttl.map { now + $0 },
                boundProcess: bound, usesLeft: uses)
            state.insert(record)
            state.generation += 1
            var terms = [mode.rawValue]
            if let ttl { terms.append("ttl \(ttl)") }
            if let pid { terms.append("pid \(pid)") }
            if let uses { terms.append("\(uses) uses") }
            state.log(
                .grant, time: wallNow, tokenID: id, caller: caller,
                detail: "\(scope.path) (\(scope.identifier)): " + terms.joined(separator: ", "))
            return record
        }
        if let failure = persist() {
            state.withLock { state in
                state.remove(record.id)
                state.generation += 1
                state.log(.storeProblem, time: wallNow, tokenID: record.id, detail: "grant withdrawn: \(failure)")
            }
            flushAudit()
            throw .storeFailed(failure)
        }
        return IssuedToken(token: token, info: record.info(now: now, wallNow: wallNow))
    }

    // MARK: Check and use

    /// Whether `token` gives `caller` access now (every lookup, open and read asks this). Logs
    /// denials, not allowed checks.
    public func check(_ token: String, caller: TokenCaller) -> TokenDecision {
        decide(token, caller: caller, consume: false)
    }

    /// `check` for a caller whose process id is worked out only when the answer needs it (a
    /// pid-bound token, a denial or anything else that is logged): enforcement maps a FUSE
    /// thread to its process with a /proc read, which a token bound to no process does not need
    /// (D-344). Same answers as `check(_:caller:)` with `TokenCaller(pid: pid(), uid: uid)`.
    public func check(_ token: String, uid: UInt32, pid: () -> Int32) -> TokenDecision {
        switch format.parse(token) {
        case .token(let bytes):
            let presented = hash(bytes)
            let now = time.elapsed()
            if let grant = state.withLock({ $0.allowedForAnyProcess(hash: presented, uid: uid, now: now) }) {
                return .allowed(grant)
            }
        case .denied(.notAToken): return .denied(.notAToken)  // no process needed: nothing is logged
        case .denied: break
        }
        return decide(token, caller: TokenCaller(pid: pid(), uid: uid), consume: false)
    }

    /// `check`, and if allowed, takes one use: an open through the token. A use lasts until
    /// `endUse` (the handle is closed). Once the last use of a `uses` token is taken, further
    /// uses are denied `usedUp` while checks still pass, so the handles holding uses read on;
    /// when the last of those ends the token ends `usedUp` (D-315). Expiry and revocation end
    /// it at once, whatever uses are open.
    public func recordUse(_ token: String, caller: TokenCaller) -> TokenDecision {
        decide(token, caller: caller, consume: true)
    }

    /// Ends a use that `recordUse` allowed for the token `id` (the grant's id): its handle was
    /// closed, or the open failed after the use was taken. Call once per allowed use.
    public func endUse(id: String) {
        let wallNow = wallClock()
        state.withLock { $0.endUse(id, wallNow: wallNow) }
        // Every release through an access path comes here: no file write unless a token changed.
        saveIfChanged(deferringAudit: true)
    }

    /// Gives back a use that `recordUse` allowed for the token `id` when the open it was taken
    /// for failed afterwards (it opened nothing). Instead of `endUse`, not as well.
    public func returnUse(id: String) {
        let wallNow = wallClock()
        state.withLock { $0.returnUse(id, wallNow: wallNow) }
        saveIfChanged(deferringAudit: true)
    }

    private func decide(_ token: String, caller: TokenCaller, consume: Bool) -> TokenDecision {
        let parsed = format.parse(token)
        // A name that cannot be a token (a probe such as `.providerfs-package`) is no guess: not
        // logged, not counted, answered even while the user is throttled (D-394).
        if parsed == .denied(.notAToken) { return .denied(.notAToken) }
        var presented: [UInt8]?
        if case .token(let bytes) = parsed { presented = hash(bytes) }
        let now = time.elapsed()
        let wallNow = wallClock()
        var admission = state.withLock { state -> TokenAuthorityState.Admission in
            if state.isThrottled(caller, now: now, wallNow: wallNow) { return .denied(.rateLimited) }
            guard let presented else {
                guard case .denied(let reason) = parsed else { return .denied(.malformed) }
                return state.deny(reason, caller: caller, now: now, wallNow: wallNow)
            }
            guard let id = state.find(hash: presented) else {
                return state.deny(.unknown, caller: caller, now: now, wallNow: wallNow)
            }
            return state.admit(id, caller: caller, now: now, wallNow: wallNow, consume: consume, processChecked: false)
        }
        if case .verifyProcess(let id, let startTime) = admission {
            // A pid's start time changes only when the pid is reused (or the process is gone).
            let current = processStartTime(caller.pid)
            admission = state.withLock { state in
                guard current == startTime else {
                    return state.deny(.processReused, tokenID: id, caller: caller, now: now, wallNow: wallNow)
                }
                return state.admit(
                    id, caller: caller, now: now, wallNow: wallNow, consume: consume, processChecked: true)
            }
        }
        // An allowed check or use that changed nothing but the log does not wait for the file
        // (D-347); a denial's entry is appended before it is answered, as a change's is.
        if case .allowed = admission { saveIfChanged(deferringAudit: true) } else { saveIfChanged() }
        switch admission {
        case .allowed(let grant): return .allowed(grant)
        case .denied(let reason): return .denied(reason)
        case .verifyProcess: return .denied(.processReused)
        }
    }

    // MARK: Revoke, expire

    /// Ends a live token now; checks then answer `revoked`.
    public func revoke(id: String, by caller: TokenCaller? = nil) throws(TokenCommandError) {
        try end(id: id, as: .revoked, by: caller)
    }

    /// Ends a live token now as if its TTL had run out; checks then answer `expired`.
    public func expire(id: String, by caller: TokenCaller? = nil) throws(TokenCommandError) {
        try end(id: id, as: .expired, by: caller)
    }

    private func end(id: String, as ending: TokenState, by caller: TokenCaller?) throws(TokenCommandError) {
        let now = time.elapsed()
        let wallNow = wallClock()
        try state.withLock { (state) throws(TokenCommandError) in
            state.noticeExpiry(of: id, now: now, wallNow: wallNow)
            guard let record = state.records[id] else { throw .unknownID(id) }
            guard record.state == .live else { throw .alreadyEnded(id: id, record.state) }
            state.end(id, as: ending, wallNow: wallNow)
            state.log(
                ending == .revoked ? .revocation : .expiry, time: wallNow, tokenID: id, caller: caller,
                detail: ending == .revoked ? "revoked by command" : "expired by command")
        }
        // The change holds in memory even if the file cannot be written (that is logged).
        saveIfChanged()
    }

    // MARK: Ends

    /// Calls `observer` with the id of each token that ends from now on: revoked, expired by
    /// command, used up at its last use's end, a derived token released, ended with its parent or
    /// ended because its process is gone, and a TTL's end when a check, list or log notices it.
    /// Called on the thread of the call that ended it, after the authority's lock is dropped and
    /// before the token file is written; once per end (D-346). Enforcement uses it to make the
    /// kernel forget what it cached for the token.
    public func observeEnds(_ observer: @escaping @Sendable (_ id: String) -> Void) {
        endObservers.withLock { $0.append(observer) }
    }

    /// Tells the observers of the tokens ended since the last call.
    private func announceEnds() {
        let ended = state.withLock { state -> [String] in
            defer { state.endedSinceAnnounced = [] }
            return state.endedSinceAnnounced
        }
        guard !ended.isEmpty else { return }
        let observers = endObservers.withLock { $0 }
        for id in ended {
            for observer in observers { observer(id) }
        }
    }

    // MARK: Inspection

    /// The tokens (live ones; with `includeEnded`, also the remembered ended ones), oldest first.
    public func list(includeEnded: Bool = false) -> [TokenInfo] {
        let now = time.elapsed()
        let wallNow = wallClock()
        let rows = state.withLock { state -> [TokenInfo] in
            state.noticeExpiries(now: now, wallNow: wallNow)
            state.endBursts(now: now, wallNow: wallNow)
            return state.records.values.filter { includeEnded || $0.state == .live }
                .map { $0.info(now: now, wallNow: wallNow) }
        }
        saveIfChanged()
        return rows.sorted { ($0.grantedAt, $0.id) < ($1.grantedAt, $1.id) }
    }

    /// Whether the token `id` has ended (expired, revoked, used up; a derived token also when
    /// its parent has), or is not known: no caller can use it any more (D-369).
    public func hasEnded(id: String) -> Bool {
        let now = time.elapsed()
        let wallNow = wallClock()
        let ended = state.withLock { state -> Bool in
            state.noticeExpiry(of: id, now: now, wallNow: wallNow)
            guard let record = state.records[id] else { return true }
            guard record.state == .live else { return true }
            guard let parent = record.parentID else { return false }
            state.noticeExpiry(of: parent, now: now, wallNow: wallNow)
            return state.records[parent]?.state != .live
        }
        saveIfChanged()
        return ended
    }

    /// One token's row, ended or not, while it is remembered.
    public func info(id: String) -> TokenInfo? {
        let now = time.elapsed()
        let wallNow = wallClock()
        let row = state.withLock { state -> TokenInfo? in
            state.noticeExpiry(of: id, now: now, wallNow: wallNow)
            return state.records[id]?.info(now: now, wallNow: wallNow)
        }
        saveIfChanged()
        return row
    }

    /// The audit log (the newest `limits.auditEntries`), oldest first; entries after `sequence`.
    public func auditLog(after sequence: UInt64 = 0) -> [TokenAuditEntry] {
        // The file has every entry the answer has (D-347).
        flushAuditLog()
        let now = time.elapsed()
        let wallNow = wallClock()
        let entries = state.withLock { state -> [TokenAuditEntry] in
            state.noticeExpiries(now: now, wallNow: wallNow)
            state.endBursts(now: now, wallNow: wallNow)
            return state.auditSnapshot.filter { $0.sequence > sequence }
        }
        saveIfChanged()
        return entries
    }

    /// How many stored hashes a check of `token` compares in full: the size of the index bucket
    /// its hash prefix selects (tests: 1 for a granted token, 0 for an unknown one, whatever the
    /// number of tokens). Nil for a string that is not a token of this mount.
    func lookupCandidates(_ token: String) -> Int? {
        guard case .token(let bytes) = format.parse(token) else { return nil }
        let key = TokenRecord.indexKey(hash(bytes))
        return state.withLock { $0.index[key]?.count ?? 0 }
    }

    /// Token rows the store has written or deleted since it opened (nil without a store).
    var storeRowsWritten: Int? { store?.rowsWritten }

    // MARK: Files

    func hash(_ token: [UInt8]) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(salt)
        hasher.update(token)
        return hasher.finalize()
    }

    /// Writes the changed records (and appends the pending audit entries). Returns why they could
    /// not be written, or nil (also without a store). When it returns nil, every change made
    /// before the call is on disk: written by this call, or by the one whose batch took it.
    @discardableResult
    func persist(force: Bool = false) -> String? {
        announceEnds()
        guard let store else {
            state.withLock { state in
                state.savedGeneration = state.generation
                _ = state.records.takeChanged()
                _ = state.takePendingAudit()
            }
            return nil
        }
        let failure = store.save(
            force: force,
            take: { () -> TokenStore.Batch in
                // Taken under the store's writer lock, so the store clock only moves forward.
                let now = time.elapsed()
                let wallNow = wallClock()
                let changed = state.withLock { state in
                    state.savedGeneration = state.generation
                    return state.records.takeChanged()
                }
                let rows = changed.map { change in
                    (
                        id: change.id,
                        token: change.record.map {
                            Self.stored($0, now: now, wallNow: wallNow, clockOrigin: clockOrigin)
                        }
                    )
                }
                let header = TokenStore.Header(
                    mountTag: mountTag, salt: hexString(salt),
                    clockNanoseconds: Self.nanoseconds(clockOrigin + now), wall: wallNow)
                return TokenStore.Batch(header: header, rows: rows)
            },
            failed: { ids in state.withLock { $0.records.markChanged(ids) } })
        if let failure {
            let wallNow = wallClock()
            state.withLock { $0.log(.storeProblem, time: wallNow, detail: "cannot write the tokens: \(failure)") }
        }
        flushAudit()
        return failure
    }

    /// Every call that changed a token (an expiry noticed included) saves before it returns;
    /// otherwise only the new audit entries are appended: at once, or with `deferringAudit` (a
    /// use that changed nothing else) by the flusher thread within `auditFlushDelay` (D-347).
    /// Ends are announced first.
    func saveIfChanged(deferringAudit: Bool = false) {
        announceEnds()
        if state.withLock({ $0.hasUnsavedChanges }) {
            persist()
        } else if deferringAudit {
            // Nothing to ask for when no entry waits (a check that allowed logs none).
            if state.withLock({ $0.pendingAudit.isEmpty }) { return }
            if !auditFlusher.request() { flushAudit() }
        } else {
            flushAudit()
        }
    }

    /// Appends every audit entry not yet in the file, now. The daemon calls it when the mount
    /// ends, so a clean unmount loses none of the deferred ones (D-347).
    public func flushAuditLog() {
        flushAudit()
    }

    /// Appends the audit entries not yet written. Serialized, so entries reach the file in order.
    func flushAudit() {
        auditOrder.withLock {
            let pending = state.withLock { $0.takePendingAudit() }
            guard let store, !pending.isEmpty else { return }
            if store.appendAudit(pending, compactAbove: 2 * limits.auditEntries) {
                // The rewrite has every entry logged so far: none of them is appended again.
                store.rewriteAudit(
                    state.withLock { state in
                        _ = state.takePendingAudit()
                        return state.auditSnapshot
                    })
            }
        }
    }

    /// A record as the store keeps it (a row of tokens.db). Deadlines are written on the store
    /// clock, with the time left and the wall-clock deadline as of now (D-302, D-336).
    static func stored(_ record: TokenRecord, now: Duration, wallNow: Date, clockOrigin: Duration) -> StoredTokens.Token
    {
        var remaining: Duration?
        if let deadline = record.deadline { remaining = max(.zero, deadline - now) }
        return StoredTokens.Token(
            id: record.id, hash: hexString(record.hash), identifier: record.scope.identifier,
            path: record.scope.path, mode: record.mode, grantedAt: record.grantedAt,
            remainingNanoseconds: remaining.map(nanoseconds),
            wallDeadline: remaining.map { wallNow.addingTimeInterval(TokenRecord.seconds($0)) },
            deadlineNanoseconds: record.deadline.map { nanoseconds(clockOrigin + $0) },
            boundPID: record.boundProcess?.pid, boundStartTime: record.boundProcess?.startTime,
            usesLeft: record.usesLeft, lastUse: record.lastUse, state: record.state, endedAt: record.endedAt,
            parentID: record.parentID)
    }

    /// The store clock now (D-336): where it stood at the last write, plus the wall-clock time
    /// since (never less than zero: a wall clock set back does not turn it back).
    static func storeNow(_ header: TokenStore.Header, wallNow: Date) -> Int64 {
        let down = max(0, min(wallNow.timeIntervalSince(header.wall), 1e9))
        return header.clockNanoseconds.addingReportingOverflow(Int64(down * 1e9)).partialValue
    }

    /// The tag and salt of a header, or nil if either is not valid.
    static func restore(_ header: TokenStore.Header) -> (tag: [UInt8], salt: [UInt8])? {
        let tag = Array(header.mountTag.utf8)
        guard tag.count == TokenFormat.tagLength, tag.allSatisfy(TokenFormat.isBase32),
            let salt = bytes(hex: header.salt), salt.count == 32
        else { return nil }
        return (tag, salt)
    }

    /// The records of tokens.db's rows, with deadlines on this run's monotonic clock: the time
    /// left is the stored deadline minus the store clock now, and never more than the saved
    /// wall-clock deadline allows (D-302, D-336). Nil if anything in them is not valid.
    static func restore(
        _ tokens: [StoredTokens.Token], storeNow: Int64, now: Duration, wallNow: Date
    ) -> [TokenRecord]? {
        var records: [TokenRecord] = []
        records.reserveCapacity(tokens.count)
        var ids: Set<String> = []
        for token in tokens {
            var left: Duration?
            if let deadline = token.deadlineNanoseconds {
                left = .nanoseconds(max(0, deadline.subtractingReportingOverflow(storeNow).partialValue))
                if let wallDeadline = token.wallDeadline { left = min(left!, wallLeft(wallDeadline, wallNow: wallNow)) }
            } else if token.remainingNanoseconds != nil {
                return nil  // a row written without the store clock
            }
            guard ids.insert(token.id).inserted, let record = record(token, left: left, now: now) else { return nil }
            records.append(record)
        }
        return records
    }

    /// The records of a legacy token file (tokens.json), with deadlines on this run's monotonic
    /// clock (D-302): the time left continues from the wall clock but never beyond what was left
    /// at the save. Nil if anything in it is not valid.
    static func restore(_ stored: StoredTokens, now: Duration, wallNow: Date) -> [TokenRecord]? {
        let tag = Array(stored.mountTag.utf8)
        guard tag.count == TokenFormat.tagLength, tag.allSatisfy(TokenFormat.isBase32),
            let salt = bytes(hex: stored.salt), salt.count == 32
        else { return nil }
        var records: [TokenRecord] = []
        var ids: Set<String> = []
        for token in stored.tokens {
            var left: Duration?
            if let remaining = token.remainingNanoseconds {
                guard remaining >= 0 else { return nil }
                left = .nanoseconds(remaining)
                if let wallDeadline = token.wallDeadline { left = min(left!, wallLeft(wallDeadline, wallNow: wallNow)) }
            }
            guard ids.insert(token.id).inserted, let record = record(token, left: left, now: now) else { return nil }
            records.append(record)
        }
        return records
    }

    private static func wallLeft(_ wallDeadline: Date, wallNow: Date) -> Duration {
        let wallLeft = wallDeadline.timeIntervalSince(wallNow)
        return wallLeft <= 0 ? .zero : .nanoseconds(Int64(min(wallLeft, 1e15) * 1e9))
    }

    /// One stored token as a record, its deadline `left` from now; nil if it is not valid.
    private static func record(_ token: StoredTokens.Token, left: Duration?, now: Duration) -> TokenRecord? {
        guard !token.id.isEmpty, !token.identifier.isEmpty,
            let hash = bytes(hex: token.hash), hash.count == 32,
            (token.boundPID == nil) == (token.boundStartTime == nil),
            token.usesLeft.map({ $0 >= 0 }) ?? true
        else { return nil }
        var state = token.state
        if state == .live, token.usesLeft == 0 { state = .usedUp }
        return TokenRecord(
            id: token.id, hash: hash, scope: TokenScope(identifier: token.identifier, path: token.path),
            mode: token.mode, grantedAt: token.grantedAt, deadline: left.map { now + $0 },
            boundProcess: token.boundPID.map {
                TokenRecord.BoundProcess(pid: $0, startTime: token.boundStartTime ?? 0)
            },
            usesLeft: token.usesLeft, lastUse: token.lastUse, state: state, endedAt: token.endedAt,
            parentID: token.parentID)
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000
    }

    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = nibble(digits[index]), let low = nibble(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private static func nibble(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        default: nil
        }
    }
}
