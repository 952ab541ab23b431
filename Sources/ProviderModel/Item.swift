// The vocabulary every provider speaks: identifiers, versions, item metadata.

/// Names an item of a provider for as long as the item exists. Opaque to everything above
/// ProviderModel: only the provider that minted it interprets it (LocalDirectoryProvider uses the
/// path relative to its root, "" for the root).
public struct ItemIdentifier: RawRepresentable, Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    /// The root container of every provider.
    public static let root = ItemIdentifier("")
    public static func < (lhs: ItemIdentifier, rhs: ItemIdentifier) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { rawValue.isEmpty ? "<root>" : rawValue }
}

/// Identifies one exact content of an item. Two fetches with the same version return the same
/// bytes; a provider refuses (`ProviderError.Code.versionChanged`) to serve a version it no longer has.
public struct ContentVersion: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }
}

/// What kind of node an item is. The kind of an identifier never changes; a provider that replaces
/// a file by a directory of the same name must mint a new identifier or report the old one gone.
public enum ItemKind: String, Sendable, Equatable, Codable {
    case file, directory, symbolicLink
}

/// Seconds and nanoseconds since the epoch.
public struct ItemTime: Sendable, Hashable, Comparable {
    public var seconds: Int64
    public var nanoseconds: Int32
    public init(seconds: Int64, nanoseconds: Int32 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
    public static func < (lhs: ItemTime, rhs: ItemTime) -> Bool {
        (lhs.seconds, lhs.nanoseconds) < (rhs.seconds, rhs.nanoseconds)
    }
}

/// The metadata of one provider item: everything listing and stat need, no content.
/// Equality leaves out `accessTime`: reading a file is no change of it (ctime does not move
/// either), and a source whose atime moved when the mount downloaded it has not changed.
public struct ProviderItem: Sendable, Hashable {
    public var identifier: ItemIdentifier
    /// The containing directory; the root's parent is the root itself.
    public var parent: ItemIdentifier
    /// One path component (never empty, never contains "/" or NUL, never "." or "..").
    public var name: String
    public var kind: ItemKind
    /// Content length in bytes (for a symbolic link: the length of its target).
    public var size: Int64
    public var modificationTime: ItemTime
    /// The content version; fetches name it so that a changed item is detected, never mixed.
    public var contentVersion: ContentVersion
    /// Permission bits the provider suggests (mode & 0o7777: setuid, setgid and sticky too, D-391);
    /// write bits are dropped by read-only mounts.
    public var permissions: UInt16
    /// The target of a symbolic link, nil for other kinds.
    public var symbolicLinkTarget: String?
    /// A file (or symbolic link) with more than one name at a provider with `.hardLinks`: the
    /// same text for every name of it (a local directory: its device and inode), nil for one with
    /// one name and for directories. The catalog gives all its names one st_ino (D-396).
    public var hardLinkIdentity: String?
    /// The owner the provider stores (`.storesOwnership`, D-397); nil: it has none, and the mount
    /// shows the mounting user.
    public var owner: ItemOwner?
    /// A FIFO, socket or device made through the mount and kept by it alone, never at the
    /// provider (kind `.file`, size 0, D-398); nil for every provider item.
    public var special: SpecialNode?
    /// The last access and the last change of the item's metadata, where the provider keeps them
    /// (a local source's st_atime and st_ctime); nil: they read as `modificationTime`.
    public var accessTime: ItemTime?
    public var changeTime: ItemTime?
    /// Checksums of a file's whole content that the provider lists with it (ownCloud's
    /// `oc:checksums`, D-519), with the version they are of; nil: none. The catalog stores them
    /// with the item, so they outlive a restart (D-526); presenters hear of no change of them
    /// alone.
    public var statedChecksums: StatedChecksums?

    public init(
        identifier: ItemIdentifier, parent: ItemIdentifier, name: String, kind: ItemKind, size: Int64,
        modificationTime: ItemTime, contentVersion: ContentVersion, permissions: UInt16 = 0o644,
        symbolicLinkTarget: String? = nil, hardLinkIdentity: String? = nil, owner: ItemOwner? = nil,
        special: SpecialNode? = nil
    ) {
        self.identifier = identifier
        self.parent = parent
        self.name = name
        self.kind = kind
        self.size = size
        self.modificationTime = modificationTime
        self.contentVersion = contentVersion
        self.permissions = permissions
        self.symbolicLinkTarget = symbolicLinkTarget
        self.hardLinkIdentity = hardLinkIdentity
        self.owner = owner
        self.special = special
    }

    public static func == (lhs: ProviderItem, rhs: ProviderItem) -> Bool {
        lhs.identifier == rhs.identifier && lhs.parent == rhs.parent && lhs.name == rhs.name && lhs.kind == rhs.kind
            && lhs.size == rhs.size && lhs.modificationTime == rhs.modificationTime
            && lhs.contentVersion == rhs.contentVersion && lhs.permissions == rhs.permissions
            && lhs.symbolicLinkTarget == rhs.symbolicLinkTarget && lhs.owner == rhs.owner
            && lhs.special == rhs.special && lhs.changeTime == rhs.changeTime
            && lhs.hardLinkIdentity == rhs.hardLinkIdentity && lhs.statedChecksums == rhs.statedChecksums
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(identifier)
        hasher.combine(contentVersion)
    }
}

/// Checksums of the whole content of a file at `version` (D-526): kept with the version they
/// are of, so a copy of the item that now names another version never lends them to it.
public struct StatedChecksums: Sendable, Hashable {
    public var version: ContentVersion
    public var checksums: [ContentChecksum]
    public init(version: ContentVersion, checksums: [ContentChecksum]) {
        self.version = version
        self.checksums = checksums
    }
}

/// What a local-only node is (D-398): its type and, for a device, its number (st_rdev).
public struct SpecialNode: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        case fifo, socket
        case characterDevice = "char"
        case blockDevice = "block"
    }
    public var kind: Kind
    public var device: UInt64
    public init(_ kind: Kind, device: UInt64 = 0) {
        self.kind = kind
        self.device = device
    }
}

/// A user and group id, as stat shows them (D-397).
public struct ItemOwner: Sendable, Hashable, CustomStringConvertible {
    public var uid: UInt32
    public var gid: UInt32
    public init(uid: UInt32, gid: UInt32) {
        self.uid = uid
        self.gid = gid
    }
    public var description: String { "\(uid):\(gid)" }
}
