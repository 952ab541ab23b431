// Scoped access tokens through the control socket (docs/CONTROL.md, docs/TOKENS.md): the
// `tokenGrant`, `tokenList`, `tokenRevoke`, `tokenExpire` and `tokenLog` requests — their
// arguments, checked strictly, and the daemon's answers over the mount's TokenAuthority. The CLI
// on top is TokenCommand.swift.

import AccessTokens
import ControlWire
import Foundation
import ProviderCache
import ProviderModel
import SystemSupport
import VirtualFileSystem

/// The arguments of `tokenGrant`: `{"path", "write", "ttlMilliseconds", "pid", "uses"}`.
struct TokenGrantRequest: Sendable, Equatable {
    /// Relative to the mount root ("" for the root).
    var path: String
    var write: Bool
    var ttlMilliseconds: Int64?
    var pid: Int32?
    var uses: Int?

    static let argumentNames: Set<String> = ["path", "write", "ttlMilliseconds", "pid", "uses"]
    /// The most uses a request may ask for (a larger value is a mistake, not a test).
    static let maximumUses: Int64 = 1_000_000_000

    var mode: TokenMode { write ? .readWrite : .read }
    var ttl: Duration? { ttlMilliseconds.map { .milliseconds($0) } }

    var arguments: [String: Any] {
        var arguments: [String: Any] = ["path": path]
        if write { arguments["write"] = true }
        if let ttlMilliseconds { arguments["ttlMilliseconds"] = ttlMilliseconds }
        if let pid { arguments["pid"] = pid }
        if let uses { arguments["uses"] = uses }
        return arguments
    }

    /// The library's own message for a TTL it would refuse (zero, negative, over the maximum), or
    /// nil for one it accepts. Checked here so that nothing reaches the authority that it would
    /// refuse, with the same words.
    static func ttlProblem(_ ttl: Duration, limits: TokenLimits = TokenLimits()) -> String? {
        if ttl <= .zero { return TokenGrantError.nonPositiveTTL(ttl).description }
        if ttl > limits.maximumTTL { return TokenGrantError.ttlTooLong(ttl, maximum: limits.maximumTTL).description }
        return nil
    }

    /// Checks every argument: unknown fields, types, ranges; the path relative and without "..".
    static func parse(_ arguments: [String: Any]) -> Result<TokenGrantRequest, ControlError> {
        func invalid(_ message: String) -> Result<TokenGrantRequest, ControlError> {
            .failure(ControlError(.invalidArguments, message))
        }
        if let unknown = arguments.keys.sorted().first(where: { !argumentNames.contains($0) }) {
            return invalid("\"\(unknown)\" is not an argument of tokenGrant")
        }
        guard let rawPath = arguments["path"] as? String else {
            return invalid("\"tokenGrant\" needs a string argument \"path\"")
        }
        guard let path = ControlRequest.normalizedRelativePath(rawPath) else {
            return invalid("\"path\" must be relative to the mount root, without '..'")
        }
        if path == ".scoped" || path.hasPrefix(".scoped/") {
            return invalid("\"path\" names an access path: grant access to the item itself")
        }
        var request = TokenGrantRequest(path: path, write: false)
        if let raw = arguments["write"] {
            guard let flag = FaultRequest.boolean(raw) else { return invalid("\"write\" must be true or false") }
            request.write = flag
        }
        if let raw = arguments["ttlMilliseconds"] {
            guard let value = ControlProtocol.integer(raw) else {
                return invalid("\"ttlMilliseconds\" must be an integer number of milliseconds")
            }
            if let problem = ttlProblem(.milliseconds(value)) { return invalid(problem) }
            request.ttlMilliseconds = value
        }
        if let raw = arguments["pid"] {
            guard let value = ControlProtocol.integer(raw) else { return invalid("\"pid\" must be an integer") }
            guard value > 0, value <= Int64(Int32.max) else {
                return invalid(TokenGrantError.invalidPID(Int32(clamping: value)).description)
            }
            request.pid = Int32(value)
        }
        if let raw = arguments["uses"] {
            guard let value = ControlProtocol.integer(raw) else { return invalid("\"uses\" must be an integer") }
            guard value >= 1 else { return invalid(TokenGrantError.nonPositiveUses(Int(value)).description) }
            guard value <= maximumUses else { return invalid("\"uses\" must be at most \(maximumUses) (got \(value))") }
            request.uses = Int(value)
        }
        return .success(request)
    }

    /// A token id as `token list` shows it: lowercase hex digits (12 of them today), or nil.
    static func tokenID(_ text: String) -> String? {
        let id = text.lowercased()
        guard (1...64).contains(id.utf8.count),
            id.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) })
        else { return nil }
        return id
    }

    /// `tokenRevoke` and `tokenExpire`: `{"id": ID}`.
    static func parseID(_ kind: String, _ arguments: [String: Any]) -> Result<String, ControlError> {
        if let unknown = arguments.keys.sorted().first(where: { $0 != "id" }) {
            return .failure(ControlError(.invalidArguments, "\"\(unknown)\" is not an argument of \(kind)"))
        }
        guard let raw = arguments["id"] as? String else {
            return .failure(ControlError(.invalidArguments, "\"\(kind)\" needs a string argument \"id\""))
        }
        guard let id = tokenID(raw) else {
            return .failure(
                ControlError(
                    .invalidArguments, "'\(raw.prefix(80))' is not a token id (hex digits, as token list shows)"))
        }
        return .success(id)
    }

    /// `tokenList`: `{"includeEnded": Bool}` (optional).
    static func parseList(_ arguments: [String: Any]) -> Result<Bool, ControlError> {
        if let unknown = arguments.keys.sorted().first(where: { $0 != "includeEnded" }) {
            return .failure(ControlError(.invalidArguments, "\"\(unknown)\" is not an argument of tokenList"))
        }
        guard let raw = arguments["includeEnded"] else { return .success(false) }
        guard let flag = FaultRequest.boolean(raw) else {
            return .failure(ControlError(.invalidArguments, "\"includeEnded\" must be true or false"))
        }
        return .success(flag)
    }

    /// `tokenLog`: `{"after": SEQUENCE}` (optional, at least 0).
    static func parseLog(_ arguments: [String: Any]) -> Result<UInt64, ControlError> {
        if let unknown = arguments.keys.sorted().first(where: { $0 != "after" }) {
            return .failure(ControlError(.invalidArguments, "\"\(unknown)\" is not an argument of tokenLog"))
        }
        guard let raw = arguments["after"] else { return .success(0) }
        guard let value = ControlProtocol.integer(raw), value >= 0 else {
            return .failure(ControlError(.invalidArguments, "\"after\" must be a sequence number, 0 or more"))
        }
        return .success(UInt64(value))
    }
}

/// One token as `tokenList` (and the other token requests) answer it: everything but the token.
struct ControlToken: Codable, Sendable, Equatable {
    var id: String
    /// The scope's path relative to the mount root when it was granted ("" for the root).
    var path: String
    var identifier: String
    /// read or readWrite.
    var mode: String
    /// live, expired, revoked or usedUp.
    var state: String
    var grantedAt: Date
    /// Wall-clock expiry as of the reply (now + timeLeft); nil without a TTL.
    var expiresAt: Date?
    /// Monotonic time left (authoritative); nil without a TTL, 0 once ended.
    var timeLeftMilliseconds: Int64?
    var usesLeft: Int?
    /// Handles opened through a `uses` token and not yet closed (each holds one use, D-315).
    var openUses: Int?
    var lastUse: Date?
    var boundPID: Int32?
    var endedAt: Date?
    /// A derived token's parent (a process's start of that grant, docs/SCOPED-ACCESS.md).
    var parentID: String?

    init(_ info: TokenInfo) {
        id = info.id
        path = info.scope.path
        identifier = info.scope.identifier
        mode = info.mode.rawValue
        state = info.state.rawValue
        grantedAt = info.grantedAt
        expiresAt = info.expiresAt
        timeLeftMilliseconds = info.timeLeft.map(Self.milliseconds)
        usesLeft = info.usesLeft
        openUses = info.usesLeft == nil ? nil : info.openUses
        lastUse = info.lastUse
        boundPID = info.boundPID
        endedAt = info.endedAt
        parentID = info.parentID
    }

    /// Rounded up, so that a token with any time left never shows 0.
    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
    }
}

/// The reply to `tokenGrant`: the token (its only copy) and its row.
struct ControlTokenGrant: Codable, Sendable, Equatable {
    var token: String
    /// The granted item is a directory (the access path is the token's directory itself).
    var isDirectory: Bool
    /// The item's name (last path component; "" for the mount root).
    var name: String
    var info: ControlToken
}

struct ControlTokenList: Codable, Sendable, Equatable {
    var tokens: [ControlToken]
}

struct ControlTokenLog: Codable, Sendable, Equatable {
    var entries: [TokenAuditEntry]
}

/// The daemon's side: a mount's token authority and its file system (to resolve paths).
struct MountTokens: Sendable {
    let authority: TokenAuthority
    let fileSystem: ProviderFileSystem

    func handle(_ request: ControlRequest, peer: UnixSocket.PeerCredentials) async -> Result<[UInt8], ControlError>? {
        let caller = TokenCaller(pid: peer.pid, uid: peer.uid)
        switch request {
        case .tokenGrant(let request):
            do { return ControlProtocol.encode(try await grant(request, by: caller)) } catch { return .failure(error) }
        case .tokenList(let includeEnded):
            return ControlProtocol.encode(
                ControlTokenList(tokens: authority.list(includeEnded: includeEnded).map(ControlToken.init)))
        case .tokenRevoke(let id), .tokenExpire(let id):
            do {
                if case .tokenRevoke = request {
                    try authority.revoke(id: id, by: caller)
                } else {
                    try authority.expire(id: id, by: caller)
                }
            } catch {
                switch error {
                case .unknownID: return .failure(ControlError(.invalidArguments, error.description))
                case .alreadyEnded: return .failure(ControlError(.failed, error.description))
                }
            }
            guard let info = authority.info(id: id) else {
                return .failure(ControlError(.failed, "token \(id) ended and was forgotten at once"))
            }
            return ControlProtocol.encode(ControlToken(info))
        case .tokenLog(let after):
            return ControlProtocol.encode(ControlTokenLog(entries: authority.auditLog(after: after)))
        default:
            return nil
        }
    }

    /// Resolves the path to the provider's identifier (through the file system, as a lookup
    /// would), then grants. Every refusal of the authority is invalidArguments with its message.
    func grant(_ request: TokenGrantRequest, by caller: TokenCaller) async throws(ControlError) -> ControlTokenGrant {
        let status: ItemStatus
        do { status = try await fileSystem.status(ofPath: request.path) } catch {
            throw MountControl.controlError(error, path: request.path)
        }
        let issued: IssuedToken
        do {
            issued = try authority.grant(
                scope: TokenScope(identifier: status.identifier.rawValue, path: request.path), mode: request.mode,
                ttl: request.ttl, pid: request.pid, uses: request.uses, by: caller)
        } catch {
            if case .storeFailed = error { throw ControlError(.failed, error.description) }
            throw ControlError(.invalidArguments, error.description)
        }
        return ControlTokenGrant(
            token: issued.token, isDirectory: status.kind == .directory,
            name: request.path.split(separator: "/").last.map(String.init) ?? "", info: ControlToken(issued.info))
    }
}
