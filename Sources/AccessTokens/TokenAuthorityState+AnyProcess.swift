// The check that needs no caller pid (D-344): a live, unexpired token bound to no process, from a
// user who is not being throttled, is allowed by `admit` without consuming, logging or changing
// anything, so its caller's process never has to be looked up (a /proc read per check).

extension TokenAuthorityState {
    /// The grant `admit(consume: false)` would answer for the token whose hash is `hash`, when that
    /// answer depends on nothing but the record: live, its deadline not reached, bound to no
    /// process, its parent (a derived token's) live with its deadline not reached too, and `uid`
    /// not throttled. Nil for everything else (the full check then runs, with the caller's pid).
    func allowedForAnyProcess(hash: [UInt8], uid: UInt32, now: Duration) -> TokenGrant? {
        guard limiter[uid]?.throttledUntil == nil, let id = find(hash: hash), let record = records[id],
            Self.liveAt(record, now), record.boundProcess == nil
        else { return nil }
        if let parent = record.parentID {
            guard let parentRecord = records[parent], Self.liveAt(parentRecord, now) else { return nil }
        }
        return record.grant(now: now)
    }

    private static func liveAt(_ record: TokenRecord, _ now: Duration) -> Bool {
        record.state == .live && (record.deadline.map { now < $0 } ?? true)
    }
}
