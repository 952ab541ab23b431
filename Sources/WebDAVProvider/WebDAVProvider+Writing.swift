// The WebDAV provider's write calls (ProviderModel/ProviderWriting.swift's rules).
//
// Uploads (D-417): PUT to a staging name in the destination collection
// (`.providerfs-upload-<random>`, hidden from listings), then MOVE onto the name: `Overwrite: F`
// for a new file (the server refuses, 412, when the name is taken), `Overwrite: T` for a new
// version. A reader of the server sees the old bytes or the new, never a part. A replace with a
// base version first checks the item's current version (PROPFIND Depth 0) and throws
// `.versionChanged` — the conflict path the local provider takes — when it moved on; between that
// check and the MOVE another writer can still slip in, unless the provider holds the item's WebDAV
// lock (D-451): then every write to it carries the lock token and nobody else's can. A server that refuses MOVE (405, 501) gets PUT in place with `If-Match` (replace) or
// `If-None-Match: *` (create), for the rest of the provider's life.
//
// MKCOL and a MOVE of a directory over another are checked first (existence, emptiness, kinds):
// WebDAV's own answers differ between servers (rclone answers MKCOL of an existing collection
// 201), and DELETE or MOVE of a collection is recursive where rmdir(2) and rename(2) are not.

import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

extension WebDAVProvider {
    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        try Task.checkCancellation()
        try checkNewName(name)
        let identifier = WebDAVLocation.identifier(of: name, in: parent)
        if try await existing(identifier) != nil {
            throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST)
        }
        let response = try await transport.send(
            HTTPRequest(method: "MKCOL", url: location.url(of: identifier, collection: true)))
        switch response.status {
        case 200, 201, 204: break
        case 405: throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST)
        default: throw Self.statusError(response.status, "MKCOL \(identifier)", conflict: .noSuchItem)
        }
        return try await item(for: identifier)
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        try Task.checkCancellation()
        let identifier: ItemIdentifier
        let parent: ItemIdentifier
        var baseVersion: ContentVersion?
        let creating: Bool
        switch target {
        case .create(let name, let directory):
            try checkNewName(name)
            identifier = WebDAVLocation.identifier(of: name, in: directory)
            parent = directory
            creating = true
        case .replace(let replaced, let base):
            try checkIdentifier(replaced)
            identifier = replaced
            parent = self.parent(of: replaced)
            baseVersion = base
            creating = false
            // The conflict check: the version the local edit began from must still be there.
            let current = try await item(for: replaced)
            guard current.kind == .file else {
                throw ProviderError(.wrongKind, "\(replaced) is not a file", errno: EISDIR)
            }
            if let base, !Self.sameVersion(current.contentVersion, base) {
                throw ProviderError(.versionChanged, "\(replaced) changed: \(base) is now \(current.contentVersion)")
            }
        }
        let target = location.url(of: identifier)
        if putsInPlace.withLock({ $0 }) {
            try await putInPlace(localFile, identifier: identifier, creating: creating, baseVersion: baseVersion)
            return try await item(for: identifier)
        }
        let staging = location.url(
            of: Self.temporaryNamePrefix + String(UInt64.random(in: .min ... .max), radix: 16), in: parent)
        let put = try await transport.send(
            HTTPRequest(method: "PUT", url: staging, uploadFile: localFile, totalDeadline: false))
        guard [200, 201, 204].contains(put.status) else {
            throw Self.statusError(put.status, "PUT \(identifier)", conflict: .noSuchItem)
        }
        do {
            try Task.checkCancellation()
            let move = try await transport.send(
                HTTPRequest(
                    method: "MOVE", url: staging,
                    headers: ["Destination: \(target)", "Overwrite: \(creating ? "F" : "T")"]
                        + lockHeaders(for: identifier, url: target)))
            switch move.status {
            case 200, 201, 204:
                break
            case 412 where creating:
                throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST)
            case 405, 501:
                // The server does not move files: PUT in place from now on.
                putsInPlace.withLock { $0 = true }
                await removeStaging(staging)
                try await putInPlace(localFile, identifier: identifier, creating: creating, baseVersion: baseVersion)
            default:
                throw Self.statusError(move.status, "MOVE onto \(identifier)", conflict: .noSuchItem)
            }
        } catch {
            // The staging file never outlives a failed upload: removed before the failure is
            // told (before, a DELETE sent off the caller's task could still be on its way when
            // the caller looked; a cancelled caller's removal still runs to its end).
            await removeStaging(staging)
            throw error
        }
        return try await item(for: identifier)
    }

    /// DELETE of an upload's staging file, best effort, on a task of its own so that a cancelled
    /// caller's removal still runs; waited for.
    private func removeStaging(_ staging: String) async {
        let transport = self.transport
        await Task.detached { _ = try? await transport.send(HTTPRequest(method: "DELETE", url: staging)) }.value
    }

    /// PUT straight onto the name, with the server checking the precondition where it honours it.
    private func putInPlace(
        _ localFile: String, identifier: ItemIdentifier, creating: Bool, baseVersion: ContentVersion?
    ) async throws {
        if creating, try await existing(identifier) != nil {
            throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST)
        }
        var headers: [String] = []
        if creating {
            headers.append("If-None-Match: *")
        } else if let baseVersion, Self.isETag(baseVersion.rawValue), !baseVersion.rawValue.hasPrefix("W/") {
            headers.append("If-Match: \(baseVersion.rawValue)")
        }
        let url = location.url(of: identifier)
        let put = try await transport.send(
            HTTPRequest(
                method: "PUT", url: url, headers: headers + lockHeaders(for: identifier, url: url),
                uploadFile: localFile, totalDeadline: false))
        switch put.status {
        case 200, 201, 204: return
        case 412 where creating: throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST)
        default: throw Self.statusError(put.status, "PUT \(identifier)", conflict: .noSuchItem)
        }
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        try Task.checkCancellation()
        try checkIdentifier(identifier)
        guard identifier != .root else {
            throw ProviderError(.accessDenied, "the root cannot be deleted", errno: EBUSY)
        }
        let item = try await item(for: identifier)
        if item.kind != kind {
            throw ProviderError(
                .wrongKind, "\(identifier) is a \(item.kind), not a \(kind)",
                errno: item.kind == .directory ? EISDIR : ENOTDIR)
        }
        // DELETE of a collection takes everything in it; rmdir(2) only an empty directory.
        if kind == .directory, try await !children(of: identifier).isEmpty {
            throw ProviderError(.notEmpty, "\(identifier) is not empty", errno: ENOTEMPTY)
        }
        let url = location.url(of: identifier, collection: kind == .directory)
        let response = try await transport.send(
            HTTPRequest(method: "DELETE", url: url, headers: lockHeaders(for: identifier, url: url)))
        guard [200, 202, 204].contains(response.status) else {
            throw Self.statusError(response.status, "DELETE \(identifier)", conflict: .io)
        }
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        try Task.checkCancellation()
        try checkIdentifier(identifier)
        try checkNewName(name)
        if mode == .exchange { throw ProviderError.notSupported("exchanging moves") }
        let destination = WebDAVLocation.identifier(of: name, in: parent)
        let source = try await item(for: identifier)
        if destination == identifier { return source }
        let what = "move \(identifier) to \(destination)"
        if source.kind == .directory,
            parent == identifier || parent.rawValue.hasPrefix(identifier.rawValue + "/")
        {
            throw ProviderError(.invalidName, "\(what): a directory cannot move into itself", errno: EINVAL)
        }
        if let existing = try await existing(destination) {
            if mode == .noReplace {
                throw ProviderError(.alreadyExists, "\(what): the destination exists", errno: EEXIST)
            }
            switch (source.kind == .directory, existing.kind == .directory) {
            case (true, false):
                throw ProviderError(.wrongKind, "\(what): the destination is not a directory", errno: ENOTDIR)
            case (false, true):
                throw ProviderError(.wrongKind, "\(what): the destination is a directory", errno: EISDIR)
            case (true, true):
                if try await !children(of: destination).isEmpty {
                    throw ProviderError(.notEmpty, "\(what): the destination is not empty", errno: ENOTEMPTY)
                }
            case (false, false): break
            }
        }
        let collection = source.kind == .directory
        let sourceURL = location.url(of: identifier, collection: collection)
        let destinationURL = location.url(of: destination, collection: collection)
        func moveRequest() -> HTTPRequest {
            HTTPRequest(
                method: "MOVE", url: sourceURL,
                headers: [
                    "Destination: \(destinationURL)",
                    "Overwrite: \(mode == .noReplace ? "F" : "T")",
                ] + lockHeaders(for: [(identifier, sourceURL), (destination, destinationURL)]))
        }
        var response = try await transport.send(moveRequest())
        if [412, 423].contains(response.status), holdsLock(on: identifier) {
            // A lock does not move with its item (RFC 4918 §7.7), and rclone refuses the
            // holder's MOVE of a locked source even with its token (412): the lock ends first.
            await unlock(identifier)
            response = try await transport.send(moveRequest())
        }
        switch response.status {
        case 200, 201, 204: break
        case 412: throw ProviderError(.alreadyExists, "\(what): the destination exists", errno: EEXIST)
        default: throw Self.statusError(response.status, what, conflict: .noSuchItem)
        }
        return try await item(for: destination)
    }

    /// The item, or nil when the server has none under that identifier.
    func existing(_ identifier: ItemIdentifier) async throws -> ProviderItem? {
        do {
            return try await item(for: identifier)
        } catch let error as ProviderError where error.code == .noSuchItem {
            return nil
        }
    }

    /// A name a new item may have: one component, and not a staging name.
    /// A file created through the mount is made at the server by its first upload, not by an
    /// empty PUT now (D-491): the name is checked as the upload would check it, but not looked
    /// up (that would be the round trip this saves); the cache checks its own listing, and the
    /// `.create` upload's `Overwrite: F` (or `If-None-Match: *`) refuses a name taken since,
    /// which the write-back keeps as a conflict copy. Nothing waits on the network, so a create
    /// works while the server is unreachable and is uploaded once it is back.
    public func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? {
        try checkNewName(name)
        return DeferredCreate(
            identifier: WebDAVLocation.identifier(of: name, in: parent), directory: nil, nameChecked: false)
    }

    func checkNewName(_ name: String) throws {
        guard WebDAVLocation.isName(name) else {
            throw ProviderError(.invalidName, "'\(name)' is not a file name", errno: EINVAL)
        }
        guard name.utf8.count <= 255 else {
            throw ProviderError(.invalidName, "'\(name)' is too long", errno: ENAMETOOLONG)
        }
        guard !Self.isTemporaryName(name) else {
            throw ProviderError(.invalidName, "'\(name)' is reserved for upload staging files", errno: EINVAL)
        }
    }
}
