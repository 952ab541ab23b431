// Move exclusion (D-372): a move through the mount waits for the upload calls at the provider
// that address what it moves, and upload calls wait for the moves of their item to end, so that no
// upload writes by a name a move is changing.

import Diagnostics
import ProviderModel
import SystemSupport

extension LocalWrites {
    /// A move through the mount of `identifiers` begins: new upload calls for them (and what lies
    /// under them) wait, and this waits for the ones at the provider to end, so that no upload
    /// addresses an item by a name the move is changing (it would write the old name anew, or
    /// replace another item that took it). Call `endMove` after the move and its re-keying.
    /// Cancelling the task (an interrupted request) ends the wait: the move is given up (its names
    /// let go, as `endMove` does) and this throws `.cancelled` (D-400).
    func beginMove(_ identifiers: [ItemIdentifier]) async throws(CacheError) {
        state.withLock { $0.moving += identifiers }
        while true {
            if Task.isCancelled {
                endMove(identifiers)
                throw CacheError(.cancelled, "interrupted while waiting for an upload of the item to end")
            }
            var clear = false
            let ticket = state.withLock { state -> UInt64 in
                defer { state.nextMoveTicket += 1 }
                return state.nextMoveTicket
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let waits = state.withLock { state -> Bool in
                        let busy = state.callsInFlight.keys.contains { key in
                            identifiers.contains { Self.lies(key, atOrUnder: $0) }
                        }
                        if !busy { clear = true }
                        // Cancelled before the handler could find it: not registered at all.
                        guard busy, !Task.isCancelled else { return false }
                        state.blockedMoves[ticket] = continuation
                        return true
                    }
                    if !waits { continuation.resume() }
                }
            } onCancel: {
                state.withLock { $0.blockedMoves.removeValue(forKey: ticket) }?.resume()
            }
            if clear { return }
        }
    }

    /// `beginMove` on the calling thread, when no upload call of the items runs (D-426): true
    /// when begun (then `endMove`), false when one runs (nothing begun).
    func tryBeginMove(_ identifiers: [ItemIdentifier]) -> Bool {
        state.withLock { state -> Bool in
            let busy = state.callsInFlight.keys.contains { key in identifiers.contains { Self.lies(key, atOrUnder: $0) }
            }
            if !busy { state.moving += identifiers }
            return !busy
        }
    }

    func endMove(_ identifiers: [ItemIdentifier]) {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            for identifier in identifiers {
                if let index = state.moving.firstIndex(of: identifier) { state.moving.remove(at: index) }
            }
            defer { state.blockedCalls = [] }
            return state.blockedCalls
        }
        for waiter in waiting { waiter.resume() }
    }

    /// Registers an upload call of `version` at the provider, once no move is changing its item's
    /// name; returns the identifier to address (where renames have moved the entry).
    func beginUploadCall(_ identifier: ItemIdentifier, version: ContentVersion) async -> ItemIdentifier {
        while true {
            var key: ItemIdentifier?
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let proceed = state.withLock { state -> Bool in
                    let current = Self.uploadKey(identifier, version: version, in: state.uploads)
                    if state.moving.contains(where: { Self.lies(current, atOrUnder: $0) }) {
                        state.blockedCalls.append(continuation)
                        return false
                    }
                    state.callsInFlight[current, default: 0] += 1
                    key = current
                    return true
                }
                if proceed { continuation.resume() }
            }
            if let key { return key }
        }
    }

    func endUploadCall(_ key: ItemIdentifier) {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.callsInFlight[key, default: 1] -= 1
            if state.callsInFlight[key] == 0 { state.callsInFlight[key] = nil }
            defer { state.blockedMoves = [:] }
            return Array(state.blockedMoves.values)
        }
        for waiter in waiting { waiter.resume() }
    }
}
