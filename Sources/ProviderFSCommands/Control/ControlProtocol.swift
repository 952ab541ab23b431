// The requests of the control protocol between the CLI and a running mount's daemon
// (docs/CONTROL.md). The wire layer (framing, envelope, errors) is ControlWire's, shared with
// ScopedAccess; the typed requests and their arguments are here.
//
//   request:  {"version": 1, "id": 7, "request": "download", "arguments": {"path": "a/b.bin"}}
// Parsing never traps: bad input becomes a `ControlError`.

import ControlWire
import Foundation
import ProviderFaults

extension ControlProtocol {
    /// A request frame (what `ControlClient` sends).
    static func requestFrame(id: Int64, _ request: ControlRequest) -> [UInt8] {
        requestFrame(id: id, kind: request.kind, arguments: request.arguments)
    }

    /// Reads one request payload. The id is returned whenever it could be read, so that an error
    /// reply names the request it answers.
    static func parseRequest(_ payload: [UInt8]) -> (id: Int64?, request: Result<ControlRequest, ControlError>) {
        let (id, envelope) = parseEnvelope(payload)
        return (id, envelope.flatMap { ControlRequest.make(kind: $0.kind, arguments: $0.arguments) })
    }
}

/// The requests of protocol version 1.
enum ControlRequest: Sendable, Equatable {
    /// The mount as a whole: uptime, provider reachability, cache space, transfers, errors.
    case status
    /// One item's state (`path` relative to the mount root).
    case item(path: String)
    /// Start downloading every byte of a file; answers at once with its state (poll `item`).
    case download(path: String)
    /// Evict a file's local content (issue 27): its presenters are asked first (a forEvicting
    /// claim); answers what happened, or why not.
    case evict(path: String)
    /// Set an item's pin state (D-445: pinned, unpinned or inherited); unpinned evicts its files
    /// where eviction allows. Answers the state, the policy and the evictions.
    case pin(path: String, state: String)
    /// Ask the provider again about a path (D-450): its directory's listing and, for a
    /// directory, its own; changes are applied as any provider answer (kernel told, ESTALE for
    /// open readers of a changed version, presenters told).
    case refresh(path: String)
    /// Add a fault on an item (or a folder and everything inside it).
    case faultAdd(FaultRequest)
    /// The mount's faults.
    case faultList
    /// Remove the faults on `path` (nil: every fault).
    case faultClear(path: String?)
    /// Grant a scoped access token on an item; the reply carries the token, once.
    case tokenGrant(TokenGrantRequest)
    /// The mount's tokens (ids, never tokens); ended ones too when `includeEnded`.
    case tokenList(includeEnded: Bool)
    /// End a live token now, as revoked.
    case tokenRevoke(id: String)
    /// End a live token now, as expired.
    case tokenExpire(id: String)
    /// The token audit log after a sequence number (0: all of it).
    case tokenLog(after: UInt64)
    /// Derive a token bound to the asking process from a granted one (a start, ScopedAccess).
    case tokenDerive(token: String)
    /// End a derived token now, presented by its process (the last stop).
    case tokenRelease(token: String)
    /// An item's identity (identifier, fingerprint) from its path, for a bookmark.
    case identifyItem(ItemLocator)
    /// An item's path now from its identity (a bookmark resolved), found again after a move.
    case resolveItem(ItemIdentity)

    static let kinds = [
        "status", "item", "download", "evict", "pin", "refresh", "faultAdd", "faultList", "faultClear",
        "tokenGrant", "tokenList",
        "tokenRevoke", "tokenExpire", "tokenLog", "tokenDerive", "tokenRelease", "identifyItem", "resolveItem",
    ]

    var kind: String {
        switch self {
        case .status: "status"
        case .item: "item"
        case .download: "download"
        case .evict: "evict"
        case .pin: "pin"
        case .refresh: "refresh"
        case .faultAdd: "faultAdd"
        case .faultList: "faultList"
        case .faultClear: "faultClear"
        case .tokenGrant: "tokenGrant"
        case .tokenList: "tokenList"
        case .tokenRevoke: "tokenRevoke"
        case .tokenExpire: "tokenExpire"
        case .tokenLog: "tokenLog"
        case .tokenDerive: "tokenDerive"
        case .tokenRelease: "tokenRelease"
        case .identifyItem: "identifyItem"
        case .resolveItem: "resolveItem"
        }
    }

    var arguments: [String: Any] {
        switch self {
        case .status, .faultList: [:]
        case .item(let path), .download(let path), .evict(let path), .refresh(let path): ["path": path]
        case .pin(let path, let state): ["path": path, "state": state]
        case .faultAdd(let request): request.arguments
        case .faultClear(let path): path.map { ["path": $0] } ?? ["all": true]
        case .tokenGrant(let request): request.arguments
        case .tokenList(let includeEnded): includeEnded ? ["includeEnded": true] : [:]
        case .tokenRevoke(let id), .tokenExpire(let id): ["id": id]
        case .tokenLog(let after): after == 0 ? [:] : ["after": Int64(clamping: after)]
        case .tokenDerive(let token), .tokenRelease(let token): ["token": token]
        case .identifyItem(let locator): locator.arguments
        case .resolveItem(let identity): identity.arguments
        }
    }

    static func make(kind: String, arguments: [String: Any]) -> Result<ControlRequest, ControlError> {
        switch kind {
        case "status":
            return .success(.status)
        case "item", "download", "evict", "pin", "refresh":
            guard let path = arguments["path"] as? String else {
                return .failure(ControlError(.invalidArguments, "\"\(kind)\" needs a string argument \"path\""))
            }
            guard let normalized = normalizedRelativePath(path) else {
                return .failure(
                    ControlError(.invalidArguments, "\"path\" must be relative to the mount root, without '..'"))
            }
            switch kind {
            case "item": return .success(.item(path: normalized))
            case "download": return .success(.download(path: normalized))
            case "pin":
                guard let state = arguments["state"] as? String, ["pinned", "unpinned", "inherited"].contains(state)
                else {
                    return .failure(
                        ControlError(.invalidArguments, "\"pin\" needs \"state\": pinned, unpinned or inherited"))
                }
                return .success(.pin(path: normalized, state: state))
            case "refresh": return .success(.refresh(path: normalized))
            default: return .success(.evict(path: normalized))
            }
        case "faultAdd":
            return FaultRequest.parse(arguments).map { .faultAdd($0) }
        case "faultList":
            if let unknown = arguments.keys.sorted().first {
                return .failure(ControlError(.invalidArguments, "\"faultList\" takes no argument (got \"\(unknown)\")"))
            }
            return .success(.faultList)
        case "faultClear":
            return FaultRequest.parseClear(arguments).map { .faultClear(path: $0) }
        case "tokenGrant":
            return TokenGrantRequest.parse(arguments).map { .tokenGrant($0) }
        case "tokenList":
            return TokenGrantRequest.parseList(arguments).map { .tokenList(includeEnded: $0) }
        case "tokenRevoke":
            return TokenGrantRequest.parseID(kind, arguments).map { .tokenRevoke(id: $0) }
        case "tokenExpire":
            return TokenGrantRequest.parseID(kind, arguments).map { .tokenExpire(id: $0) }
        case "tokenLog":
            return TokenGrantRequest.parseLog(arguments).map { .tokenLog(after: $0) }
        case "tokenDerive", "tokenRelease":
            return ItemLocator.parseToken(kind, arguments).map {
                kind == "tokenDerive" ? .tokenDerive(token: $0) : .tokenRelease(token: $0)
            }
        case "identifyItem":
            return ItemLocator.parse(arguments).map { .identifyItem($0) }
        case "resolveItem":
            return ItemIdentity.parse(arguments).map { .resolveItem($0) }
        default:
            return .failure(
                ControlError(
                    .unknownRequest, "unknown request '\(kind)'; known: \(kinds.joined(separator: ", "))"))
        }
    }

    /// `path` without empty and "." components; nil when it is absolute or climbs with "..".
    static func normalizedRelativePath(_ path: String) -> String? {
        guard !path.hasPrefix("/"), !path.utf8.contains(0) else { return nil }
        var components: [Substring] = []
        for component in path.split(separator: "/") where component != "." {
            if component == ".." { return nil }
            components.append(component)
        }
        return components.joined(separator: "/")
    }
}
