// WebDAV locks (RFC 4918 §6-7, issue 26 item 4, D-451): an exclusive write lock on one item with a
// timeout (`Timeout: Second-N`), refreshed by its holder, lapsing on its own when the holder is
// gone. The provider keeps the token of every lock it holds, and its writes to a locked item carry
// it (`If: <url> (<token>)`): a server refuses (423 Locked) a write to a locked item without it.
// Whether the server locks at all is its DAV class (`OPTIONS`: `DAV: 1, 2`; class 1 has no LOCK).

import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// What a LOCK request got.
public enum WebDAVLockResult: Sendable, Equatable {
    /// The lock is this provider's now (or still: a refresh).
    case acquired
    /// Another client holds a lock on the item (423 Locked); try again later.
    case lockedByOther
    /// The lock to refresh is gone (lapsed or removed: 412); nothing is held.
    case lost
}

extension WebDAVProvider {
    /// The server's DAV compliance classes (`OPTIONS` of the collection: `DAV: 1, 2, …`).
    public func complianceClasses() async throws -> Set<String> {
        let response = try await transport.send(
            HTTPRequest(method: "OPTIONS", url: location.url(of: .root, collection: true), followRedirects: true))
        guard (200..<300).contains(response.status) else {
            throw Self.statusError(response.status, "OPTIONS", conflict: .io)
        }
        return Self.complianceClasses(response.header("DAV"))
    }

    /// The classes a `DAV` header names (`1, 2, <http://…>` → 1, 2 and the URI).
    public static func complianceClasses(_ header: String?) -> Set<String> {
        Set((header ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
    }

    static func lockBody(owner: String) -> [UInt8] {
        let escaped = owner.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
        return Array(
            """
            <?xml version="1.0" encoding="utf-8"?>
            <D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope>\
            <D:locktype><D:write/></D:locktype><D:owner>\(escaped)</D:owner></D:lockinfo>
            """.utf8)
    }

    /// Takes an exclusive write lock on the item for `timeout` (whole seconds, at least 1), or
    /// refreshes the one this provider holds on it. `owner` is shown to other clients (lock
    /// discovery). Depth 0: a file's lock, never a collection's subtree.
    public func lock(_ identifier: ItemIdentifier, timeout: Duration, owner: String) async throws -> WebDAVLockResult {
        try checkIdentifier(identifier)
        let url = location.url(of: identifier)
        let seconds = max(1, timeout.components.seconds)
        if let token = heldLocks.withLock({ $0[identifier] }) {
            let response = try await transport.send(
                HTTPRequest(method: "LOCK", url: url, headers: ["Timeout: Second-\(seconds)", "If: (<\(token)>)"]))
            switch response.status {
            case 200: return .acquired
            case 412, 409, 404:
                heldLocks.withLock { _ = $0.removeValue(forKey: identifier) }
                return .lost
            case 423: return .lockedByOther
            default: throw Self.statusError(response.status, "LOCK refresh \(identifier)", conflict: .io)
            }
        }
        let response = try await transport.send(
            HTTPRequest(
                method: "LOCK", url: url,
                headers: [
                    "Timeout: Second-\(seconds)", "Depth: 0", "Content-Type: application/xml; charset=utf-8",
                ], body: Self.lockBody(owner: owner)))
        switch response.status {
        case 200, 201:
            guard let token = Self.lockToken(response.header("Lock-Token")) else {
                throw ProviderError(.io, "LOCK \(identifier): the answer carries no Lock-Token", errno: EIO)
            }
            heldLocks.withLock { $0[identifier] = token }
            return .acquired
        case 423: return .lockedByOther
        default: throw Self.statusError(response.status, "LOCK \(identifier)", conflict: .noSuchItem)
        }
    }

    /// Ends the lock this provider holds on the item (UNLOCK), best effort: a lock the server
    /// no longer has is simply forgotten.
    public func unlock(_ identifier: ItemIdentifier) async {
        guard let token = heldLocks.withLock({ $0.removeValue(forKey: identifier) }) else { return }
        _ = try? await transport.send(
            HTTPRequest(method: "UNLOCK", url: location.url(of: identifier), headers: ["Lock-Token: <\(token)>"]))
    }

    /// Whether this provider holds a lock on the item.
    public func holdsLock(on identifier: ItemIdentifier) -> Bool {
        heldLocks.withLock { $0[identifier] != nil }
    }

    /// The `If` header a write to `identifier` (at `url`) carries while this provider holds its
    /// lock; none otherwise.
    func lockHeaders(for identifier: ItemIdentifier, url: String) -> [String] {
        lockHeaders(for: [(identifier, url)])
    }

    /// One `If` header with a tagged list for each of `items` whose lock this provider holds (a
    /// MOVE names its source and its destination); none when it holds neither.
    func lockHeaders(for items: [(identifier: ItemIdentifier, url: String)]) -> [String] {
        let held = heldLocks.withLock { locks in
            items.compactMap { item in locks[item.identifier].map { (item.url, $0) } }
        }
        guard !held.isEmpty else { return [] }
        return ["If: " + held.map { "<\($0.0)> (<\($0.1)>)" }.joined(separator: " ")]
    }

    /// The token of a `Lock-Token: <token>` header.
    static func lockToken(_ header: String?) -> String? {
        guard var text = header?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
        if text.hasPrefix("<") && text.hasSuffix(">") { text = String(text.dropFirst().dropLast()) }
        guard !text.isEmpty, !text.contains(where: { $0 == ">" || $0 == "<" || $0.isNewline }) else { return nil }
        return text
    }
}
