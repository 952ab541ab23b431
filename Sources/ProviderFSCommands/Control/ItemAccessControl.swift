// The control requests of the ScopedAccess module (docs/SCOPED-ACCESS.md, docs/CONTROL.md):
// `tokenDerive` and `tokenRelease` (a process's start and last stop of a grant) and
// `identifyItem` and `resolveItem` (a bookmark made, and resolved after a move). Tokens arrive
// as arguments: they are checked, never logged or echoed.

import AccessTokens
import ControlWire
import Foundation
import ProviderCache
import ProviderModel
import SystemSupport
import VirtualFileSystem

/// Where an item is: a path relative to the mount root, or with `token`, relative to the token's
/// access-path directory (`.scoped/<token>/`: the granted folder's contents, or the granted
/// file's name). `identifyItem`'s arguments.
struct ItemLocator: Sendable, Equatable {
    var token: String?
    var path: String

    var arguments: [String: Any] {
        var arguments: [String: Any] = ["path": path]
        if let token { arguments["token"] = token }
        return arguments
    }

    /// The longest token argument read (tokens are 45 characters; a longer one is refused by the
    /// authority as malformed, this only bounds the work).
    static let maximumTokenLength = 256

    static func token(_ raw: Any?, _ kind: String) -> Result<String?, ControlError> {
        guard let raw else { return .success(nil) }
        guard let token = raw as? String, !token.isEmpty, token.utf8.count <= maximumTokenLength else {
            return .failure(ControlError(.invalidArguments, "\"token\" of \(kind) must be a token (a short string)"))
        }
        return .success(token)
    }

    static func unknown(_ arguments: [String: Any], _ kind: String, allowed: Set<String>) -> ControlError? {
        guard let name = arguments.keys.sorted().first(where: { !allowed.contains($0) }) else { return nil }
        return ControlError(.invalidArguments, "\"\(name)\" is not an argument of \(kind)")
    }

    /// `tokenDerive` and `tokenRelease`: `{"token": TOKEN}`.
    static func parseToken(_ kind: String, _ arguments: [String: Any]) -> Result<String, ControlError> {
        if let error = unknown(arguments, kind, allowed: ["token"]) { return .failure(error) }
        return token(arguments["token"], kind).flatMap { token in
            token.map { .success($0) }
                ?? .failure(ControlError(.invalidArguments, "\"\(kind)\" needs a string argument \"token\""))
        }
    }

    static func parse(_ arguments: [String: Any]) -> Result<ItemLocator, ControlError> {
        if let error = unknown(arguments, "identifyItem", allowed: ["token", "path"]) { return .failure(error) }
        guard let raw = arguments["path"] as? String, let path = ControlRequest.normalizedRelativePath(raw) else {
            return .failure(
                ControlError(.invalidArguments, "\"identifyItem\" needs \"path\", relative, without '..'"))
        }
        return token(arguments["token"], "identifyItem").flatMap { token in
            if token == nil, path == ".scoped" || path.hasPrefix(".scoped/") {
                return .failure(
                    ControlError(.invalidArguments, "\"path\" is an access path: pass its token and the path inside"))
            }
            return .success(ItemLocator(token: token, path: path))
        }
    }
}

/// Who an item is: its identifier and fingerprint, and the path it had (a hint); with `token`,
/// searched within that token's scope only. `resolveItem`'s arguments.
struct ItemIdentity: Sendable, Equatable {
    var token: String?
    var identifier: String
    var fingerprint: String?
    /// The path relative to the mount root when the bookmark was made.
    var path: String?

    var arguments: [String: Any] {
        var arguments: [String: Any] = ["identifier": identifier]
        if let token { arguments["token"] = token }
        if let fingerprint { arguments["fingerprint"] = fingerprint }
        if let path { arguments["path"] = path }
        return arguments
    }

    static func parse(_ arguments: [String: Any]) -> Result<ItemIdentity, ControlError> {
        let kind = "resolveItem"
        if let error = ItemLocator.unknown(arguments, kind, allowed: ["token", "identifier", "fingerprint", "path"]) {
            return .failure(error)
        }
        guard let identifier = arguments["identifier"] as? String, identifier.utf8.count <= 4096 else {
            return .failure(ControlError(.invalidArguments, "\"resolveItem\" needs a string argument \"identifier\""))
        }
        var identity = ItemIdentity(identifier: identifier)
        if let raw = arguments["fingerprint"] {
            guard let fingerprint = raw as? String, !fingerprint.isEmpty, fingerprint.utf8.count <= 256 else {
                return .failure(ControlError(.invalidArguments, "\"fingerprint\" must be a short string"))
            }
            identity.fingerprint = fingerprint
        }
        if let raw = arguments["path"] {
            guard let text = raw as? String, let path = ControlRequest.normalizedRelativePath(text) else {
                return .failure(ControlError(.invalidArguments, "\"path\" must be relative, without '..'"))
            }
            identity.path = path
        }
        return ItemLocator.token(arguments["token"], kind).map { token in
            identity.token = token
            return identity
        }
    }
}

/// The reply to `identifyItem` and `resolveItem`.
struct ControlItemIdentity: Codable, Sendable, Equatable {
    var identifier: String
    /// The provider's fingerprint (`Provider.fingerprint(of:)`), nil when it has none.
    var fingerprint: String?
    /// file, directory or symbolicLink.
    var kind: String
    var name: String
    /// Relative to the mount root ("" for the root).
    var path: String
    /// With a token: relative to the token's access-path directory ("" for a granted folder).
    var scopedPath: String?
    /// `resolveItem`: "identifier" (the identifier still names it) or "fingerprint" (it was found
    /// again by its fingerprint: it moved, and its identifier changed).
    var foundBy: String?
}

/// The reply to `tokenDerive`: the derived token (its only copy) and its row.
struct ControlDerivedToken: Codable, Sendable, Equatable {
    var token: String
    var info: ControlToken
}

/// The daemon's side of the four requests.
struct MountItemAccess: Sendable {
    let authority: TokenAuthority?
    let fileSystem: ProviderFileSystem
    /// The most items `resolveItem` looks at when it searches by fingerprint.
    var searchLimit = 10_000

    var catalog: Catalog { fileSystem.cache.catalog }

    func handle(_ request: ControlRequest, peer: UnixSocket.PeerCredentials) async -> Result<[UInt8], ControlError> {
        do {
            return try await answer(request, caller: TokenCaller(pid: peer.pid, uid: peer.uid))
        } catch {
            return .failure(error)
        }
    }

    func answer(
        _ request: ControlRequest, caller: TokenCaller
    ) async throws(ControlError) -> Result<[UInt8], ControlError> {
        switch request {
        case .tokenDerive(let token):
            let authority = try self.authority(for: token)
            let issued: IssuedToken
            do { issued = try authority.derive(from: token, by: caller) } catch { throw Self.controlError(error) }
            return ControlProtocol.encode(ControlDerivedToken(token: issued.token, info: ControlToken(issued.info)))
        case .tokenRelease(let token):
            let authority = try self.authority(for: token)
            let id: String
            do { id = try authority.release(token, by: caller) } catch { throw Self.controlError(error) }
            guard let info = authority.info(id: id) else {
                throw ControlError(.failed, "token \(id) ended and was forgotten at once")
            }
            return ControlProtocol.encode(ControlToken(info))
        case .identifyItem(let locator):
            return ControlProtocol.encode(try await identify(locator, caller: caller))
        case .resolveItem(let identity):
            return ControlProtocol.encode(try await resolve(identity, caller: caller))
        default:
            return .failure(ControlError(.failed, "not an item access request"))
        }
    }

    func authority(for token: String?) throws(ControlError) -> TokenAuthority {
        guard let authority else { throw ControlError(.failed, "this mount hands out no tokens") }
        return authority
    }

    static func controlError(_ error: TokenDerivationError) -> ControlError {
        switch error {
        case .denied: ControlError(.accessDenied, error.description)
        case .storeFailed: ControlError(.failed, error.description)
        case .derivedParent, .notDerived, .wrongProcess, .noSuchProcess:
            ControlError(.invalidArguments, error.description)
        }
    }

    // MARK: Identify

    /// The scope item of `token` for `caller` (checked, no use taken).
    func scope(of token: String, caller: TokenCaller) async throws(ControlError) -> ProviderItem {
        let authority = try self.authority(for: token)
        switch authority.check(token, caller: caller) {
        case .denied(let reason):
            throw ControlError(.accessDenied, "the token gives no access: \(reason.explanation)")
        case .allowed(let grant):
            do {
                return try await catalog.item(ItemIdentifier(grant.scope.identifier), maximumAge: .zero)
            } catch {
                throw ControlError(
                    .notFound,
                    "the granted item (\(grant.scope.path)) is gone from the provider: "
                        + "the token no longer reaches anything (\(error.message))")
            }
        }
    }

    func identify(_ locator: ItemLocator, caller: TokenCaller) async throws(ControlError) -> ControlItemIdentity {
        var components = locator.path.split(separator: "/").map(String.init)
        var current: ProviderItem
        var scopeItem: ProviderItem?
        if let token = locator.token {
            let scope = try await self.scope(of: token, caller: caller)
            scopeItem = scope
            current = scope
            if scope.kind != .directory {
                // `.scoped/<token>/` holds the granted file under its current name only.
                guard components.first == scope.name else {
                    throw ControlError(
                        .notFound, "\(locator.path) is not in the token's access path (it holds \(scope.name))")
                }
                components.removeFirst()
            }
        } else {
            do { current = try await catalog.item(.root, maximumAge: nil) } catch {
                throw ControlError(.failed, "the mount's root cannot be read: \(error.message)")
            }
        }
        for component in components {
            let child: ProviderItem?
            do { child = try await catalog.child(named: component, of: current.identifier) } catch {
                throw ControlError(.notFound, "\(locator.path) is not in the mount (\(error.message))")
            }
            guard let child else { throw ControlError(.notFound, "\(locator.path) is not in the mount") }
            current = child
        }
        return try await reply(current, scope: scopeItem, foundBy: nil)
    }

    // MARK: Resolve

    func resolve(_ identity: ItemIdentity, caller: TokenCaller) async throws(ControlError) -> ControlItemIdentity {
        var scopeItem: ProviderItem?
        if let token = identity.token { scopeItem = try await scope(of: token, caller: caller) }
        // By identifier: it must still be the same item (same fingerprint) and inside the scope.
        if let item = try? await catalog.item(ItemIdentifier(identity.identifier), maximumAge: .zero),
            identity.fingerprint == nil || fileSystem.cache.fingerprint(of: item) == identity.fingerprint,
            let found = try? await reply(item, scope: scopeItem, foundBy: "identifier")
        {
            return found
        }
        guard let fingerprint = identity.fingerprint else {
            throw ControlError(.notFound, "the item is gone: nothing has the identifier \(identity.identifier)")
        }
        if let item = try await search(fingerprint: fingerprint, below: scopeItem?.identifier ?? .root) {
            return try await reply(item, scope: scopeItem, foundBy: "fingerprint")
        }
        throw ControlError(
            .notFound,
            "the item is gone: nothing has its identifier, and nothing within "
                + (scopeItem == nil ? "the mount" : "the token's scope")
                + " (the first \(searchLimit) items) has its fingerprint")
    }

    /// Breadth first below `top` (its own fingerprint first), listing fresh, at most `searchLimit`
    /// items; nil when none has `fingerprint`.
    func search(fingerprint: String, below top: ItemIdentifier) async throws(ControlError) -> ProviderItem? {
        let cache = fileSystem.cache
        var queue: [ItemIdentifier] = [top]
        var seen = 0
        var index = 0
        while index < queue.count, seen < searchLimit {
            let directory = queue[index]
            index += 1
            guard let children = try? await catalog.children(of: directory, maximumAge: .zero) else { continue }
            for child in children.sorted(by: { $0.name < $1.name }) {
                seen += 1
                if cache.fingerprint(of: child) == fingerprint { return child }
                if child.kind == .directory { queue.append(child.identifier) }
                if seen >= searchLimit { break }
            }
        }
        return nil
    }

    /// The reply for `item`: its path from the root and, within `scope`, from the token's
    /// directory (thrown notFound when it is not inside the scope).
    func reply(
        _ item: ProviderItem, scope: ProviderItem?, foundBy: String?
    ) async throws(ControlError)
        -> ControlItemIdentity
    {
        // Ancestors, nearest first, asked of the provider when the catalog does not know them.
        var names: [String] = []
        var scopedPath: String?
        var current = item
        var depth = 0
        while current.identifier != .root {
            if let scope, current.identifier == scope.identifier {
                let below = names.reversed().joined(separator: "/")
                scopedPath = scope.kind == .directory ? below : ([scope.name] + names.reversed()).joined(separator: "/")
            }
            names.append(current.name)
            depth += 1
            guard depth < 4096 else { throw ControlError(.failed, "\(item.name) is nested too deep") }
            if let known = catalog.knownItem(current.parent) {
                current = known
                continue
            }
            do { current = try await catalog.item(current.parent, maximumAge: nil) } catch {
                throw ControlError(.notFound, "the item's folder is gone (\(error.message))")
            }
        }
        if let scope, scopedPath == nil {
            guard scope.identifier == .root else {
                throw ControlError(.notFound, "the item is no longer inside the token's scope (\(scope.name))")
            }
            scopedPath = names.reversed().joined(separator: "/")
        }
        return ControlItemIdentity(
            identifier: item.identifier.rawValue, fingerprint: fileSystem.cache.fingerprint(of: item),
            kind: item.kind.rawValue, name: item.identifier == .root ? "" : item.name,
            path: names.reversed().joined(separator: "/"), scopedPath: scopedPath, foundBy: foundBy)
    }
}
