import SystemSupport

// The calls that change a provider: namespace changes and content uploads (issue 14). Every
// provider has them as requirements of `Provider` (so a wrapper forwards them and keeps them);
// the defaults decline with `.notSupported`, and `ProviderCapabilities.writing` says whether a
// provider really offers them. Callers check the capability, never the provider's type.
//
// Rules every implementation keeps:
// - Each call is atomic at the provider: it happens whole or not at all, and a reader of the
//   provider never sees a half-written file (a local directory: a temporary file in the same
//   directory, then rename(2); a WebDAV server: PUT to a temporary name, then MOVE).
// - Names are one path component, as `ProviderItem.name`: not empty, not "." or "..", no "/" or
//   NUL. A name the provider cannot store throws `.invalidName` (with ENAMETOOLONG as its errno
//   when it is too long).
// - Each call returns the item as it is after the change (its new content version included), so
//   the caller's catalog needs no second round trip.
// - Failures throw `ProviderError` with the code below that says what happened, and its errno
//   when the system gave one (EACCES, ENOSPC, EDQUOT, EFBIG, …): the mount maps them to errno in
//   its one table.

/// Where `upload(from:to:…)` puts the bytes.
public enum UploadTarget: Sendable, Hashable {
    /// A new file `name` in `parent`. Throws `.alreadyExists` when the name is taken (O_EXCL):
    /// the caller never replaces an item it did not know about.
    case create(name: String, in: ItemIdentifier)
    /// New content for the existing file `identifier`. When `baseVersion` is given and the item's
    /// current content version is another one, nothing is written and the call throws
    /// `.versionChanged`: the provider's version changed since the local edit began (a conflict,
    /// which the caller resolves by keeping both). Nil: replace whatever is there.
    case replace(ItemIdentifier, baseVersion: ContentVersion?)
}

/// How `move(_:to:named:mode:)` treats an item already at the destination (rename(2)'s flags).
public enum MoveMode: Sendable, Hashable {
    /// rename(2) with no flags: the destination, if any, is replaced (a file by a file; a
    /// directory only by a directory, and only an empty one: `.notEmpty` otherwise).
    case replacing
    /// RENAME_NOREPLACE: throws `.alreadyExists` when the destination exists.
    case noReplace
    /// RENAME_EXCHANGE: both must exist; they swap names atomically. Offered only with
    /// `ProviderCapabilities.exchangingMoves`; `.notSupported` otherwise.
    case exchange
}

/// Metadata a mount stores for an item (chmod, utimens, chown). Nil fields are left as they are.
public struct ItemAttributeChanges: Sendable, Hashable {
    /// Permission bits (mode & 0o7777).
    public var permissions: UInt16?
    public var modificationTime: ItemTime?
    /// The owner and group (`.storesOwnership`, D-397), changed before the permissions, so that
    /// a chown's clearing of setuid/setgid at the source cannot undo the permissions asked.
    public var uid: UInt32?
    public var gid: UInt32?
    /// The access time, where the provider keeps one (`ProviderItem.accessTime`).
    public var accessTime: ItemTime?
    public init(
        permissions: UInt16? = nil, modificationTime: ItemTime? = nil, uid: UInt32? = nil, gid: UInt32? = nil,
        accessTime: ItemTime? = nil
    ) {
        self.permissions = permissions
        self.modificationTime = modificationTime
        self.uid = uid
        self.gid = gid
        self.accessTime = accessTime
    }
}

extension ProviderCapabilities {
    /// `createDirectory`, `upload`, `delete`, `move` and `setAttributes` really change the
    /// provider. Without it the mount is read-only (EROFS).
    public static let writing = ProviderCapabilities(rawValue: 1 << 4)
    /// `createSymbolicLink` works (needs `.writing` too).
    public static let symbolicLinks = ProviderCapabilities(rawValue: 1 << 5)
    /// `move(…, mode: .exchange)` works (needs `.writing` too).
    public static let exchangingMoves = ProviderCapabilities(rawValue: 1 << 6)
    /// `setAttributes` stores permissions and modification times at the provider. Without it the
    /// mount keeps them in its own metadata only (docs/SEMANTICS.md).
    public static let storesAttributes = ProviderCapabilities(rawValue: 1 << 7)
    /// `link` works (needs `.writing` too): a file may have several names, each its own item
    /// (identifier) with the same `hardLinkIdentity`, and a new version of it written through
    /// any name is the content of all of them (D-396). Without it link(2) is EPERM.
    public static let hardLinks = ProviderCapabilities(rawValue: 1 << 8)
    /// Items carry their `owner`, and `setAttributes` changes it (chown; needs `.storesAttributes`
    /// too). Without it every node shows the mounting user and chown to another is EPERM (D-397).
    /// A local directory offers it when the daemon may chown (root or CAP_CHOWN).
    public static let storesOwnership = ProviderCapabilities(rawValue: 1 << 9)
}

/// The write calls' defaults: they decline, as a provider without `.writing` does.
extension Provider {
    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("creating directories")
    }

    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("symbolic links")
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("uploads")
    }

    public func link(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("hard links")
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        throw ProviderError.notSupported("deleting")
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("moving")
    }

    public func setAttributes(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws -> ProviderItem {
        throw ProviderError.notSupported("changing attributes")
    }
}

extension ProviderError {
    /// What a provider without the capability throws.
    public static func notSupported(_ what: String) -> ProviderError {
        ProviderError(.notSupported, "the provider does not support \(what)", errno: Errno.notSupported.rawValue)
    }
}
