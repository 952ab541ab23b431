// The authority's state machine: records, their index, the audit log and the denial limiter.
// Pure (no clocks, no system calls): the authority passes the time in and performs what comes out
// (audit lines to append, a store to save) after dropping its lock.

import CryptoSupport
import Foundation

struct TokenAuthorityState {
    /// By id; notes which ids changed, for the store (every write of a record goes through it).
    var records = TokenTable()
    /// First 8 bytes of a record's hash → ids (a collision of 64 random bits is possible, only
    /// unlikely: each candidate's full hash is compared in constant time).
    var index: [UInt64: [String]] = [:]
    /// Ended ids, oldest first, for forgetting beyond `limits.endedTokens`.
    var endedOrder: [String] = []
    var audit: [TokenAuditEntry] = []
    /// Entries not yet appended to the audit file.
    var pendingAudit: [TokenAuditEntry] = []
    var nextSequence: UInt64 = 1
    /// Counts changes to the records that must be saved before the call returns.
    var generation: UInt64 = 0
    /// The generation when the store last took the changed records.
    var savedGeneration: UInt64 = 0
    var hasUnsavedChanges: Bool { generation != savedGeneration }
    var limiter: [UInt32: DenialWindow] = [:]
    /// Parent id → the ids of the tokens derived from it (every remembered one).
    var children: [String: Set<String>] = [:]
    /// Ids of the tokens ended since the authority last announced ends (D-346), in order.
    var endedSinceAnnounced: [String] = []
    let limits: TokenLimits

    struct DenialWindow {
        var windowStart: Duration
        var count = 0
        /// While set and in the future, checks from this user are refused unread.
        var throttledUntil: Duration?
        var burstStart: Date?
        var refused = 0
    }

    init(limits: TokenLimits) { self.limits = limits }

    // MARK: Records

    mutating func insert(_ record: TokenRecord) {
        records[record.id] = record
        index[record.indexKey, default: []].append(record.id)
        if let parent = record.parentID { children[parent, default: []].insert(record.id) }
        if record.state != .live { endedOrder.append(record.id) }
    }

    mutating func remove(_ id: String) {
        guard let record = records.removeValue(forKey: id) else { return }
        let key = record.indexKey
        index[key]?.removeAll { $0 == id }
        if index[key]?.isEmpty == true { index[key] = nil }
        if let parent = record.parentID {
            children[parent]?.remove(id)
            if children[parent]?.isEmpty == true { children[parent] = nil }
        }
    }

    /// The id of the record whose hash is `hash`, compared in constant time.
    func find(hash: [UInt8]) -> String? {
        var found: String?
        for id in index[TokenRecord.indexKey(hash)] ?? [] {
            if let record = records[id], constantTimeEquals(record.hash, hash) { found = id }
        }
        return found
    }

    /// Marks `id` expired if its deadline has passed; logs the expiry once.
    mutating func noticeExpiry(of id: String, now: Duration, wallNow: Date) {
        guard var record = records[id], record.state == .live, let deadline = record.deadline, deadline <= now
        else { return }
        let late = TokenRecord.seconds(now - deadline)
        record.state = .expired
        record.endedAt = wallNow.addingTimeInterval(-late)
        records[id] = record
        noteEnded(id)
        log(.expiry, time: record.endedAt ?? wallNow, tokenID: id, detail: "its TTL ran out")
        endChildren(of: id, as: .expired, wallNow: record.endedAt ?? wallNow)
    }

    /// Notices every passed deadline (list, log and save do this; a check notices its own).
    mutating func noticeExpiries(now: Duration, wallNow: Date) {
        let due = records.values.filter { $0.state == .live && ($0.deadline.map { $0 <= now } ?? false) }
        for record in due.sorted(by: { $0.deadline! < $1.deadline! }) {
            noticeExpiry(of: record.id, now: now, wallNow: wallNow)
        }
    }

    mutating func end(_ id: String, as state: TokenState, wallNow: Date) {
        guard var record = records[id], record.state == .live else { return }
        record.state = state
        record.endedAt = wallNow
        records[id] = record
        noteEnded(id)
        endChildren(of: id, as: state, wallNow: wallNow)
    }

    /// Ends the live tokens derived from `id` with it (revoked with a revoked parent, expired
    /// with an expired one; a used-up parent's children count as revoked), each logged.
    mutating func endChildren(of id: String, as state: TokenState, wallNow: Date) {
        guard let derived = children[id] else { return }
        let ending: TokenState = state == .expired ? .expired : .revoked
        for child in derived.sorted() where records[child]?.state == .live {
            end(child, as: ending, wallNow: wallNow)
            log(
                ending == .expired ? .expiry : .revocation, time: wallNow, tokenID: child,
                detail: "its parent \(id) ended (\(state.rawValue))")
        }
    }

    private mutating func noteEnded(_ id: String) {
        generation += 1
        endedSinceAnnounced.append(id)
        endedOrder.append(id)
        let excess = endedOrder.count - limits.endedTokens
        if excess > limits.endedTokens / 4 || (excess > 0 && limits.endedTokens < 4) {
            for old in endedOrder.prefix(excess) { remove(old) }
            endedOrder.removeFirst(excess)
        }
    }

    // MARK: Audit

    mutating func log(
        _ event: TokenAuditEntry.Event, time: Date, tokenID: String? = nil, caller: TokenCaller? = nil,
        uid: UInt32? = nil, reason: TokenDenialReason? = nil, count: Int? = nil, detail: String? = nil
    ) {
        let entry = TokenAuditEntry(
            sequence: nextSequence, time: time, event: event, tokenID: tokenID, uid: caller?.uid ?? uid,
            pid: caller?.pid,
            reason: reason, count: count, detail: detail)
        nextSequence += 1
        append(entry)
        pendingAudit.append(entry)
    }

    /// Adds an entry to the bounded in-memory log (also used when loading the file).
    mutating func append(_ entry: TokenAuditEntry) {
        audit.append(entry)
        let excess = audit.count - limits.auditEntries
        if excess > limits.auditEntries / 4 || (excess > 0 && limits.auditEntries < 4) { audit.removeFirst(excess) }
    }

    mutating func takePendingAudit() -> [TokenAuditEntry] {
        defer { pendingAudit = [] }
        return pendingAudit
    }

    var auditSnapshot: [TokenAuditEntry] { Array(audit.suffix(limits.auditEntries)) }

    // MARK: Denial limiter

    /// True if checks from `caller`'s user are being refused unread. A burst lasts while refused
    /// checks keep coming less than a window apart; its one summary entry is written when it ends.
    mutating func isThrottled(_ caller: TokenCaller, now: Duration, wallNow: Date) -> Bool {
        guard var window = limiter[caller.uid], let until = window.throttledUntil else { return false }
        if now < until {
            window.refused += 1
            window.throttledUntil = now + limits.denialWindow
            limiter[caller.uid] = window
            return true
        }
        endBursts(now: now, wallNow: wallNow)
        return false
    }

    /// Counts a denial for `caller`'s user; past the limit, the user's checks are throttled.
    mutating func countDenial(_ caller: TokenCaller, now: Duration, wallNow: Date) {
        var window = limiter[caller.uid] ?? DenialWindow(windowStart: now)
        if now - window.windowStart >= limits.denialWindow {
            window.windowStart = now
            window.count = 0
        }
        window.count += 1
        if window.count > limits.deniedPerWindow && window.throttledUntil == nil {
            window.throttledUntil = now + limits.denialWindow
            window.burstStart = wallNow
            window.refused = 0
        }
        limiter[caller.uid] = window
    }

    /// Writes the summary of every burst that has ended, and forgets quiet users.
    mutating func endBursts(now: Duration, wallNow: Date) {
        for (uid, window) in limiter {
            if let until = window.throttledUntil {
                guard now >= until else { continue }
                log(
                    .rateLimited, time: wallNow, uid: uid, count: window.refused,
                    detail:
                        "more than \(limits.deniedPerWindow) denials within \(limits.denialWindow); "
                        + "\(window.refused) further checks refused unread from "
                        + "\(window.burstStart.map { "\($0)" } ?? "?") until the guesses stopped")
                limiter[uid] = nil
            } else if now - window.windowStart >= limits.denialWindow {
                limiter[uid] = nil
            }
        }
    }
}

// MARK: Checks

extension TokenAuthorityState {
    enum Admission {
        case allowed(TokenGrant)
        case denied(TokenDenialReason)
        /// The token is bound to the caller's pid: its start time must be read (outside the lock)
        /// and compared with this one before `admit` is asked again with `processChecked`.
        case verifyProcess(id: String, startTime: UInt64)
    }

    /// Guesses count towards the rate limit: names with the token prefix `pfs_` that are no
    /// token of this mount. A name without the prefix can never grant access (D-394); the other
    /// reasons show the token was real.
    static func countsAsGuess(_ reason: TokenDenialReason) -> Bool {
        switch reason {
        case .malformed, .truncated, .foreignMount, .unknown: true
        case .notAToken, .rateLimited, .expired, .revoked, .usedUp, .wrongProcess, .processReused: false
        }
    }

    mutating func deny(
        _ reason: TokenDenialReason, tokenID: String? = nil, caller: TokenCaller, now: Duration, wallNow: Date
    ) -> Admission {
        log(.denial, time: wallNow, tokenID: tokenID, caller: caller, reason: reason)
        if Self.countsAsGuess(reason) { countDenial(caller, now: now, wallNow: wallNow) }
        return .denied(reason)
    }

    /// Whether the token `id` gives `caller` access now; with `consume`, takes one use (an open)
    /// and logs it.
    mutating func admit(
        _ id: String, caller: TokenCaller, now: Duration, wallNow: Date, consume: Bool, processChecked: Bool
    ) -> Admission {
        noticeExpiry(of: id, now: now, wallNow: wallNow)
        guard var record = records[id] else { return deny(.unknown, caller: caller, now: now, wallNow: wallNow) }
        if record.state == .live, let parent = record.parentID {
            // Ended with its parent (already, unless the parent was forgotten or ended in a run
            // that did not end its children).
            noticeExpiry(of: parent, now: now, wallNow: wallNow)
            if records[parent]?.state != .live {
                let ending: TokenState = records[parent]?.state == .expired ? .expired : .revoked
                end(id, as: ending, wallNow: wallNow)
                log(
                    ending == .expired ? .expiry : .revocation, time: wallNow, tokenID: id,
                    detail: "its parent \(parent) has ended")
                record = records[id] ?? record
            }
        }
        switch record.state {
        case .live: break
        case .expired: return deny(.expired, tokenID: id, caller: caller, now: now, wallNow: wallNow)
        case .revoked: return deny(.revoked, tokenID: id, caller: caller, now: now, wallNow: wallNow)
        case .usedUp: return deny(.usedUp, tokenID: id, caller: caller, now: now, wallNow: wallNow)
        }
        if let bound = record.boundProcess {
            guard bound.pid == caller.pid else {
                return deny(.wrongProcess, tokenID: id, caller: caller, now: now, wallNow: wallNow)
            }
            if !processChecked { return .verifyProcess(id: id, startTime: bound.startTime) }
        }
        let grant = record.grant(now: now)
        guard consume else { return .allowed(grant) }
        // The last use taken: no more opens, while the handles holding uses read on (D-315).
        if record.usesLeft == 0 { return deny(.usedUp, tokenID: id, caller: caller, now: now, wallNow: wallNow) }
        record.lastUse = wallNow
        if let uses = record.usesLeft {
            // Saved before the open is answered; the last-use time alone is not (no write per open).
            record.usesLeft = uses - 1
            record.openUses += 1
            generation += 1
        }
        records[id] = record
        log(
            .use, time: wallNow, tokenID: id, caller: caller,
            detail: record.usesLeft.map { "\($0) uses left" })
        return .allowed(grant)
    }

    /// A use taken by `admit(consume:)` has ended (its handle closed). A `uses` token whose last
    /// use has been taken ends `usedUp` when its last open use ends (D-315).
    mutating func endUse(_ id: String, wallNow: Date) {
        guard var record = records[id], record.state == .live, let usesLeft = record.usesLeft else { return }
        record.openUses = max(0, record.openUses - 1)
        records[id] = record
        guard usesLeft == 0, record.openUses == 0 else { return }
        end(id, as: .usedUp, wallNow: wallNow)
        log(.usedUp, time: wallNow, tokenID: id, detail: "its last use ended")
    }

    /// A use taken by `admit(consume:)` is given back: the open failed after the token allowed
    /// it (a claim refused, a download that could not start), so it opened nothing.
    mutating func returnUse(_ id: String, wallNow: Date) {
        guard var record = records[id], record.state == .live, let usesLeft = record.usesLeft else { return }
        record.openUses = max(0, record.openUses - 1)
        record.usesLeft = usesLeft + 1
        records[id] = record
        generation += 1
        log(.useReturned, time: wallNow, tokenID: id, detail: "\(usesLeft + 1) uses left")
    }
}
