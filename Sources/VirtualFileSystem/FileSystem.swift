// The file system in kernel vocabulary, with no FUSE types: each method maps 1:1 to a FUSE
// low-level operation. FUSEAdapter decodes a request, calls one of these from a Task, and replies
// with the result or with `FileSystemError.errno` (the one errno table, FileSystemError.swift).
//
// Every method may suspend (a download, a coordination claim); none blocks its caller's thread.

public import SystemSupport

/// A kernel-visible node number. `root` is 1 (FUSE_ROOT_ID).
public struct InodeNumber: RawRepresentable, Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public static let root = InodeNumber(1)
    public static func < (lhs: InodeNumber, rhs: InodeNumber) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { "#\(rawValue)" }
}

/// An open file or directory handle (the `fh` the kernel hands back on read/release).
public struct FileHandleID: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "fh\(rawValue)" }
}

public enum NodeType: Sendable, Equatable {
    case regular, directory, symbolicLink
    /// Kept by the mount alone (D-398): their I/O is the kernel's.
    case fifo, socket, characterDevice, blockDevice
}

/// The file type mknod(2) asks for (the kernel refuses directories and unknown types itself).
public enum MknodType: Sendable, Equatable {
    case regular, fifo, socket, characterDevice, blockDevice
}

/// Seconds and nanoseconds since the epoch, as `struct timespec` carries them.
public struct Timestamp: Sendable, Hashable, Comparable {
    public var seconds: Int64
    public var nanoseconds: Int32
    public init(seconds: Int64, nanoseconds: Int32 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
    public static func < (lhs: Timestamp, rhs: Timestamp) -> Bool {
        (lhs.seconds, lhs.nanoseconds) < (rhs.seconds, rhs.nanoseconds)
    }
}

/// What `stat(2)` shows for a node.
public struct NodeAttributes: Sendable, Equatable {
    /// The kernel's node (the FUSE node id): may change while the item lives (a forgotten node
    /// is looked up under a new number).
    public var inode: InodeNumber
    /// What stat shows as st_ino: the item's number for its whole life in the mount, across
    /// renames, uploads, new versions and remounts (D-389). Defaults to the node id for nodes
    /// that are not items.
    public var serialNumber: UInt64
    public var type: NodeType
    /// Permission bits only (mode & 0o7777).
    public var permissions: UInt16
    public var linkCount: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    /// 512-byte blocks actually stored locally (0 for a placeholder, like a dataless file).
    public var blocks: Int64
    public var blockSize: UInt32
    public var accessTime: Timestamp
    public var modificationTime: Timestamp
    public var changeTime: Timestamp
    /// A device node's number (st_rdev), 0 for every other node.
    public var device: UInt64 = 0
    /// How long the kernel may cache these attributes when they answer a getattr; nil: the
    /// mount's `attributeTimeout`. (A lookup's `Entry` carries its own timeouts.)
    public var validFor: Duration?

    public init(
        inode: InodeNumber, type: NodeType, permissions: UInt16, linkCount: UInt32, uid: UInt32, gid: UInt32,
        size: Int64, blocks: Int64, blockSize: UInt32 = 4096, accessTime: Timestamp, modificationTime: Timestamp,
        changeTime: Timestamp, serialNumber: UInt64? = nil
    ) {
        self.inode = inode
        self.serialNumber = serialNumber ?? inode.rawValue
        self.type = type
        self.permissions = permissions
        self.linkCount = linkCount
        self.uid = uid
        self.gid = gid
        self.size = size
        self.blocks = blocks
        self.blockSize = blockSize
        self.accessTime = accessTime
        self.modificationTime = modificationTime
        self.changeTime = changeTime
    }
}

/// The answer to `lookup`: the node, its attributes, and how long the kernel may cache them.
/// Each successful lookup adds one to the node's lookup count; `forget` takes it back.
public struct Entry: Sendable, Equatable {
    public var attributes: NodeAttributes
    public var generation: UInt64
    public var attributeTimeout: Duration
    public var entryTimeout: Duration
    public var inode: InodeNumber { attributes.inode }

    public init(attributes: NodeAttributes, generation: UInt64, attributeTimeout: Duration, entryTimeout: Duration) {
        self.attributes = attributes
        self.generation = generation
        self.attributeTimeout = attributeTimeout
        self.entryTimeout = entryTimeout
    }
}

/// Something the kernel may have cached from earlier answers and must forget (FUSE's
/// notify_inval_entry and notify_inval_inode): the next access asks the file system again.
public enum KernelInvalidation: Sendable, Hashable {
    /// The name `name` in directory `parent` (its dentry).
    case entry(parent: InodeNumber, name: String)
    /// The attributes of a node (size, times, mode).
    case attributes(InodeNumber)
    /// The cached pages of a node (and its attributes): a new version was published (issue 14).
    case content(InodeNumber)
}

/// A file system that tells the kernel when something it answered changed, so that its answers
/// may be cached for longer than a timer would allow (D-228).
public protocol KernelCacheCoherent: Sendable {
    /// The adapter hands in how to reach the kernel, once the mount is up; nil when it is going
    /// away. `invalidate` may be called from any thread, never blocks, and sends in order.
    func setKernelInvalidation(_ invalidate: (@Sendable ([KernelInvalidation]) -> Void)?)
}

/// Who is asking: from `fuse_req_ctx`. `threadID` is the calling thread (not the process);
/// map it to a process with `/proc/<tid>/status` (Tgid).
public struct RequestContext: Sendable, Equatable {
    public var threadID: Int32
    public var uid: UInt32
    public var gid: UInt32
    public init(threadID: Int32, uid: UInt32, gid: UInt32) {
        self.threadID = threadID
        self.uid = uid
        self.gid = gid
    }
    /// For tests and internal calls.
    public static let kernel = RequestContext(threadID: 0, uid: 0, gid: 0)
}

/// `open(2)` flags as the kernel passes them (O_RDONLY, O_WRONLY, O_RDWR, O_TRUNC, O_APPEND, …).
public struct OpenFlags: RawRepresentable, Sendable, Equatable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public var isReadOnly: Bool { rawValue & 0o3 == 0 }  // O_ACCMODE == 3, O_RDONLY == 0
    public var wantsWrite: Bool { rawValue & 0o3 != 0 }
    public var truncates: Bool { rawValue & 0o1000 != 0 }  // O_TRUNC
}

/// The answer to `open`: the handle and the page-cache policy for it.
public struct OpenedFile: Sendable, Equatable {
    public var handle: FileHandleID
    /// Keep the kernel page cache from earlier opens (content version unchanged).
    public var keepCache: Bool
    /// Bypass the page cache for this handle.
    public var directIO: Bool
    /// A local file that holds, at the same offsets, every byte this handle reads, and whose bytes
    /// do not change while the handle is open (it may be unlinked, never truncated or rewritten in
    /// place). When set, all reads of the handle may be served from that file by the kernel
    /// without reaching the file system (FUSE passthrough, docs/SEMANTICS.md); the adapter decides
    /// whether it does. Nil: every read goes through `read`.
    public var servedFrom: String?
    public init(handle: FileHandleID, keepCache: Bool, directIO: Bool = false, servedFrom: String? = nil) {
        self.handle = handle
        self.keepCache = keepCache
        self.directIO = directIO
        self.servedFrom = servedFrom
    }
}

/// One directory entry. `cookie` is the offset to pass to continue after this entry.
public struct DirectoryEntry: Sendable, Equatable {
    public var name: String
    /// The entry's node when it has one; a plain listing makes none (D-485): a child the kernel
    /// has no node of names its serial number here. Not sent to the kernel (readdir gives d_ino
    /// and d_type only).
    public var inode: InodeNumber
    /// What readdir shows as d_ino: the item's st_ino (`NodeAttributes.serialNumber`).
    public var serialNumber: UInt64
    public var type: NodeType
    public var cookie: UInt64
    public init(name: String, inode: InodeNumber, serialNumber: UInt64? = nil, type: NodeType, cookie: UInt64) {
        self.name = name
        self.inode = inode
        self.serialNumber = serialNumber ?? inode.rawValue
        self.type = type
        self.cookie = cookie
    }
}

/// How the kernel may cache what it was shown of an open directory's listing (D-472).
public enum ListingCaching: Sendable, Equatable {
    /// Not at all: every readdir reaches the file system.
    case none
    /// For this open (FOPEN_CACHE_DIR): the next open starts afresh.
    case thisOpen
    /// Across opens too (FOPEN_CACHE_DIR and FOPEN_KEEP_CACHE), until the file system invalidates
    /// the directory's content (`KernelInvalidation.content`).
    case kept
}

/// A readdirplus entry (D-471): the entry and, where the file system gives it, the lookup answer
/// the kernel keeps for it (the node's lookup count is taken, as by a LOOKUP; `forget` gives it
/// back). Nil for "." and ".." and for entries the file system has no attributes for yet: the
/// kernel looks those up when it needs them.
public struct DirectoryEntryPlus: Sendable, Equatable {
    public var entry: DirectoryEntry
    public var lookup: Entry?
    public init(entry: DirectoryEntry, lookup: Entry?) {
        self.entry = entry
        self.lookup = lookup
    }
}

/// What `statfs(2)` shows.
public struct FileSystemStatistics: Sendable, Equatable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var availableBlocks: UInt64
    public var totalFiles: UInt64
    public var freeFiles: UInt64
    public var maximumNameLength: UInt64
    public init(
        blockSize: UInt64, totalBlocks: UInt64, freeBlocks: UInt64, availableBlocks: UInt64, totalFiles: UInt64,
        freeFiles: UInt64, maximumNameLength: UInt64
    ) {
        self.blockSize = blockSize
        self.totalBlocks = totalBlocks
        self.freeBlocks = freeBlocks
        self.availableBlocks = availableBlocks
        self.totalFiles = totalFiles
        self.freeFiles = freeFiles
        self.maximumNameLength = maximumNameLength
    }
}

/// Attribute changes requested by `setattr` (truncate, chmod, utimens, …). Nil means unchanged.
public struct AttributeChanges: Sendable, Equatable {
    public var size: Int64?
    public var permissions: UInt16?
    public var uid: UInt32?
    public var gid: UInt32?
    public var accessTime: Timestamp?
    public var modificationTime: Timestamp?
    public init(
        size: Int64? = nil, permissions: UInt16? = nil, uid: UInt32? = nil, gid: UInt32? = nil,
        accessTime: Timestamp? = nil, modificationTime: Timestamp? = nil
    ) {
        self.size = size
        self.permissions = permissions
        self.uid = uid
        self.gid = gid
        self.accessTime = accessTime
        self.modificationTime = modificationTime
    }
}

/// The file system the kernel talks to. Implemented by `ProviderFileSystem`; test doubles too.
///
/// Method names follow the FUSE operations. Errors are `FileSystemError`, whose `errno` is what
/// the caller sees. Mutating operations exist so that writing slots in; a read-only file system
/// throws `.readOnlyFileSystem` from them.
public protocol FileSystem: Sendable {
    func lookup(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError) -> Entry
    /// The kernel dropped `count` references obtained through lookup/create/mkdir.
    func forget(_ inode: InodeNumber, count: UInt64)
    func getAttributes(_ inode: InodeNumber, context: RequestContext) async throws(FileSystemError) -> NodeAttributes
    func setAttributes(
        _ inode: InodeNumber, changes: AttributeChanges, handle: FileHandleID?, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes
    func readLink(_ inode: InodeNumber, context: RequestContext) async throws(FileSystemError) -> String

    func openDirectory(_ inode: InodeNumber, context: RequestContext) async throws(FileSystemError) -> FileHandleID
    /// Entries after `cookie` (0 = from the start, including "." and ".."), at most `limit`.
    func readDirectory(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntry]
    func releaseDirectory(_ inode: InodeNumber, handle: FileHandleID)
    /// readdirplus: `readDirectory`'s entries with their lookup answers. The default gives none
    /// (the kernel looks every entry up), and `givesDirectoryAttributes` says whether the file
    /// system gives any: the adapter asks the kernel for READDIRPLUS only then.
    func readDirectoryPlus(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntryPlus]
    var givesDirectoryAttributes: Bool { get }
    /// How the kernel may cache the listing of the directory just opened as `handle`. Default
    /// `.none`.
    func listingCaching(_ inode: InodeNumber, handle: FileHandleID) -> ListingCaching

    func open(
        _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError)
        -> OpenedFile
    /// Up to `count` bytes at `offset`; fewer only at end of file.
    func read(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, count: Int, context: RequestContext
    )
        async throws(FileSystemError) -> ReadData
    func write(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) async throws(FileSystemError) -> Int
    func flush(_ inode: InodeNumber, handle: FileHandleID, context: RequestContext) async throws(FileSystemError)
    func fsync(
        _ inode: InodeNumber, handle: FileHandleID, dataOnly: Bool, context: RequestContext)
        async throws(FileSystemError)
    /// The last close of a handle. Cannot fail (the kernel ignores release errors).
    func release(_ inode: InodeNumber, handle: FileHandleID) async
    /// fallocate(2) on a handle open for writing: `offset..<offset+length` allocated, the size
    /// extended to its end unless `keepSize` (FALLOC_FL_KEEP_SIZE). Other modes never reach the
    /// file system (the adapter answers EOPNOTSUPP). Default: EOPNOTSUPP.
    func allocate(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, length: Int64, keepSize: Bool,
        context: RequestContext
    ) async throws(FileSystemError)

    func create(
        parent: InodeNumber, name: String, permissions: UInt16, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> (Entry, OpenedFile)
    func makeDirectory(
        parent: InodeNumber, name: String, permissions: UInt16, context: RequestContext
    )
        async throws(FileSystemError) -> Entry
    func makeSymbolicLink(
        parent: InodeNumber, name: String, target: String, context: RequestContext
    )
        async throws(FileSystemError) -> Entry
    func unlink(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError)
    func removeDirectory(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError)
    func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: UInt32,
        context: RequestContext
    ) async throws(FileSystemError)
    /// mknod(2) (and bind(2) of a Unix socket, mkfifo(3)); `device`: a device's number (st_rdev).
    /// The default makes a regular file as `create` then `release` would (as `touch` does) and
    /// refuses every other type with EPERM, as a Linux file system that cannot store them (vfat)
    /// does (D-391).
    func makeNode(
        parent: InodeNumber, name: String, type: MknodType, permissions: UInt16, device: UInt64,
        context: RequestContext
    ) async throws(FileSystemError) -> Entry
    /// link(2): a second name for `inode`. The default refuses with EPERM, as a Linux file
    /// system without hard links (vfat) does.
    func makeHardLink(
        _ inode: InodeNumber, newParent: InodeNumber, newName: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry

    func getExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext
    )
        async throws(FileSystemError) -> [UInt8]
    func listExtendedAttributes(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError)
        -> [String]
    func setExtendedAttribute(
        _ inode: InodeNumber, name: String, value: [UInt8], flags: Int32, context: RequestContext
    ) async throws(FileSystemError)
    func removeExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext)
        async throws(FileSystemError)

    func statistics(context: RequestContext) async throws(FileSystemError) -> FileSystemStatistics

    /// The session is ending: fail waiting work, flush state. Called once, before unmount completes.
    func shutdown() async
}

/// Answers that need no waiting, given on the FUSE thread that received the request (no task, no
/// thread hop). Each returns nil when the answer needs the provider, a download or anything else
/// that may wait; the adapter then calls the async method. They may do local blocking I/O at most
/// of the page-cache kind (FUSE threads are libfuse's to block), and ask the provider only for
/// what it answers at once (`.immediateMetadata`: a local lstat or fstatat), never for anything
/// that may wait on a network or a lock.
public protocol FileSystemFastPath: Sendable {
    func lookupNow(parent: InodeNumber, name: String, context: RequestContext) -> Result<Entry, FileSystemError>?
    func getAttributesNow(_ inode: InodeNumber, context: RequestContext) -> Result<NodeAttributes, FileSystemError>?
    func readNow(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, count: Int, context: RequestContext
    ) -> Result<ReadData, FileSystemError>?
    /// May block on local file I/O of the cache (opening a cache file) and on the provider's
    /// immediate metadata (`.immediateMetadata`: a local lstat), never on a claim or the network.
    func openNow(
        _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) -> Result<OpenedFile, FileSystemError>?
    func releaseNow(_ inode: InodeNumber, handle: FileHandleID) -> Result<Void, FileSystemError>?
    func flushNow(_ inode: InodeNumber, handle: FileHandleID, context: RequestContext) -> Result<Void, FileSystemError>?
    /// A setattr that changes nothing the file system keeps (a chown to the owner every node
    /// already has, as `tar x` and `cp -a` run as that user send for every file): its answer is
    /// getattr's.
    func setAttributesNow(
        _ inode: InodeNumber, changes: AttributeChanges, context: RequestContext
    ) -> Result<NodeAttributes, FileSystemError>?
    /// A write that the file system takes at once (a small file's bytes into its staging copy).
    func writeNow(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) -> Result<Int, FileSystemError>?
    /// A getxattr of a name the file system never has: the kernel asks for
    /// `security.capability` before the first write through every new descriptor.
    func getExtendedAttributeNow(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) -> Result<[UInt8], FileSystemError>?
    /// A readdir (or readdirplus) whose entries the open listing already has (D-470).
    func readDirectoryNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntry], FileSystemError>?
    func readDirectoryPlusNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntryPlus], FileSystemError>?
}

extension FileSystemFastPath {
    public func readDirectoryNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntry], FileSystemError>? { nil }

    public func readDirectoryPlusNow(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) -> Result<[DirectoryEntryPlus], FileSystemError>? { nil }

    public func writeNow(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) -> Result<Int, FileSystemError>? { nil }

    public func getExtendedAttributeNow(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) -> Result<[UInt8], FileSystemError>? { nil }

    public func setAttributesNow(
        _ inode: InodeNumber, changes: AttributeChanges, context: RequestContext
    ) -> Result<NodeAttributes, FileSystemError>? { nil }
}

extension FileSystem {
    public func readDirectoryPlus(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntryPlus] {
        try await readDirectory(inode, handle: handle, after: cookie, limit: limit, context: context).map {
            DirectoryEntryPlus(entry: $0, lookup: nil)
        }
    }

    public var givesDirectoryAttributes: Bool { false }

    public func listingCaching(_ inode: InodeNumber, handle: FileHandleID) -> ListingCaching { .none }

    public func makeNode(
        parent: InodeNumber, name: String, type: MknodType, permissions: UInt16, device: UInt64,
        context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        guard type == .regular else {
            throw FileSystemError(.notPermitted, "mknod: a \(type) cannot be stored by the provider")
        }
        return try await makeEmptyFile(parent: parent, name: name, permissions: permissions, context: context)
    }

    /// mknod(2) of a regular file: `create` (O_WRONLY | O_CREAT | O_EXCL), then `release`.
    func makeEmptyFile(
        parent: InodeNumber, name: String, permissions: UInt16, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        let (entry, opened) = try await create(
            parent: parent, name: name, permissions: permissions, flags: OpenFlags(rawValue: 0o1 | 0o100 | 0o200),
            context: context)
        await release(entry.inode, handle: opened.handle)
        return entry
    }

    public func makeHardLink(
        _ inode: InodeNumber, newParent: InodeNumber, newName: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        throw FileSystemError(.notPermitted, "link: hard links are not supported")
    }

    public func allocate(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, length: Int64, keepSize: Bool,
        context: RequestContext
    ) async throws(FileSystemError) {
        throw FileSystemError(.unsupported, "fallocate is not supported")
    }
}
