// Derived tokens: one process's start of a grant (the ScopedAccess module's
// `startAccessingSecurityScopedResource`, docs/SCOPED-ACCESS.md). A process presents a granted
// token and gets a child token bound to itself: same scope and mode, a deadline no later than
// the parent's, ended with the parent, and ended at once when the process releases it (the last
// stop). Deriving takes one use of the parent, which stays open until the child ends.

import CryptoSupport
import Foundation
import SystemSupport

/// Why a derive or a release was refused. Nothing is granted (or ended) when one is thrown.
public enum TokenDerivationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The presented token gives the caller no access (expired, revoked, unknown…).
    case denied(TokenDenialReason)
    /// The presented token is itself derived: a process starts the grant it was handed.
    case derivedParent
    /// A release presented a granted (not derived) token: it ends with `revoke`, not a stop.
    case notDerived
    /// A release from a process other than the one the derived token is bound to.
    case wrongProcess
    /// The caller's start time cannot be read (it ended).
    case noSuchProcess(Int32)
    /// The derived token could not be stored: it was withdrawn.
    case storeFailed(String)

    public var description: String {
        switch self {
        case .denied(let reason): reason.explanation
        case .derivedParent: "the token is itself derived from a grant: start the grant, not a derived token"
        case .notDerived: "the token was granted, not derived: end it with token revoke"
        case .wrongProcess: "the derived token is bound to another process"
        case .noSuchProcess(let pid): "no process \(pid) is running"
        case .storeFailed(let why): "the derived token could not be stored, so none was made: \(why)"
        }
    }
}

extension TokenAuthority {
    /// Derives a token from `token` for `caller`'s process (bound to its pid and start time),
    /// with the parent's scope and mode and a deadline no later than the parent's. Takes one use
    /// of the parent (logged as a use); the use stays open until the child ends.
    public func derive(from token: String, by caller: TokenCaller) throws(TokenDerivationError) -> IssuedToken {
        guard let startTime = processStartTime(caller.pid) else { throw .noSuchProcess(caller.pid) }
        endOrphanedDerivedTokens()
        let parentGrant: TokenGrant
        switch recordUse(token, caller: caller) {
        case .denied(let reason): throw .denied(reason)
        case .allowed(let grant): parentGrant = grant
        }
        let childToken = format.newToken()
        let childHash = hash(Array(childToken.utf8))
        let now = time.elapsed()
        let wallNow = wallClock()
        let made = state.withLock { state -> Result<TokenRecord, TokenDerivationError> in
            state.noticeExpiry(of: parentGrant.id, now: now, wallNow: wallNow)
            guard let parent = state.records[parentGrant.id] else { return .failure(.denied(.unknown)) }
            guard parent.parentID == nil else { return .failure(.derivedParent) }
            switch parent.state {
            case .live: break
            case .expired: return .failure(.denied(.expired))
            case .revoked: return .failure(.denied(.revoked))
            // Not while the use just taken is open (D-315).
            case .usedUp: return .failure(.denied(.usedUp))
            }
            var id = hexString(randomBytes(6))
            while state.records[id] != nil { id = hexString(randomBytes(6)) }
            let record = TokenRecord(
                id: id, hash: childHash, scope: parent.scope, mode: parent.mode, grantedAt: wallNow,
                deadline: parent.deadline,
                boundProcess: TokenRecord.BoundProcess(pid: caller.pid, startTime: startTime), usesLeft: nil,
                parentID: parent.id)
            state.insert(record)
            state.generation += 1
            state.log(
                .grant, time: wallNow, tokenID: id, caller: caller,
                detail:
                    "derived from \(parent.id) for pid \(caller.pid) (\(parent.scope.path), \(parent.mode.rawValue))")
            return .success(record)
        }
        let record: TokenRecord
        switch made {
        case .failure(let error):
            returnUse(id: parentGrant.id)
            throw error
        case .success(let made): record = made
        }
        if let failure = persist() {
            state.withLock { state in
                state.remove(record.id)
                state.generation += 1
                state.log(
                    .storeProblem, time: wallNow, tokenID: record.id, detail: "derived token withdrawn: \(failure)")
            }
            returnUse(id: parentGrant.id)
            throw .storeFailed(failure)
        }
        return IssuedToken(token: childToken, info: record.info(now: now, wallNow: wallNow))
    }

    /// Ends the derived token `token` now (revoked; checks then answer `revoked`), presented by
    /// the process it is bound to: the last stop of a start. Returns its id. Ends the parent's
    /// use the derive took.
    @discardableResult
    public func release(_ token: String, by caller: TokenCaller) throws(TokenDerivationError) -> String {
        let presented: [UInt8]
        switch format.parse(token) {
        case .token(let bytes): presented = hash(bytes)
        case .denied(let reason): throw .denied(reason)
        }
        let now = time.elapsed()
        let wallNow = wallClock()
        let ended = state.withLock { state -> Result<(id: String, parent: String?), TokenDerivationError> in
            guard let id = state.find(hash: presented), let record = state.records[id] else {
                return .failure(.denied(.unknown))
            }
            guard let parent = record.parentID else { return .failure(.notDerived) }
            guard record.boundProcess?.pid == caller.pid else { return .failure(.wrongProcess) }
            state.noticeExpiry(of: id, now: now, wallNow: wallNow)
            guard state.records[id]?.state == .live else {
                // Ended already (with its parent, or expired): the release has nothing to end,
                // and the parent's use was ended with it (or the parent has ended).
                return .success((id, nil))
            }
            state.end(id, as: .revoked, wallNow: wallNow)
            state.log(.revocation, time: wallNow, tokenID: id, caller: caller, detail: "released by its process (stop)")
            return .success((id, parent))
        }
        switch ended {
        case .failure(let error):
            saveIfChanged()
            throw error
        case .success(let ids):
            if let parent = ids.parent { endParentUse(parent) }
            saveIfChanged()
            return ids.id
        }
    }
}

extension TokenAuthority {
    /// Ends the use of `parentID` that a derive took (its child has ended): D-315's `endUse`, so
    /// a `uses` parent whose last use was a derive ends used up when the child ends.
    func endParentUse(_ parentID: String) {
        endUse(id: parentID)
    }

    /// Ends the live derived tokens whose process has ended (its start time is gone or another):
    /// nobody can use them, and they hold a use of their parent. Reads /proc once per live
    /// derived token; called before each derive.
    func endOrphanedDerivedTokens() {
        let bound = state.withLock { state in
            state.children.values.flatMap { $0 }.compactMap { id -> (String, TokenRecord.BoundProcess)? in
                guard let record = state.records[id], record.state == .live, let process = record.boundProcess
                else { return nil }
                return (id, process)
            }
        }
        let orphans = bound.filter { processStartTime($0.1.pid) != $0.1.startTime }.map(\.0)
        guard !orphans.isEmpty else { return }
        let wallNow = wallClock()
        let parents = state.withLock { state -> [String] in
            orphans.compactMap { id -> String? in
                guard let record = state.records[id], record.state == .live else { return nil }
                state.end(id, as: .revoked, wallNow: wallNow)
                state.log(.revocation, time: wallNow, tokenID: id, detail: "its process ended without a stop")
                return record.parentID
            }
        }
        for parent in parents { endUse(id: parent) }
        saveIfChanged()
    }
}
