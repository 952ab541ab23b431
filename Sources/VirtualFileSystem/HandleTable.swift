// The open file handles of a `ProviderFileSystem`, in one table (D-505): a handle is a reader of a
// pinned version or a writer of a staging file, as mountpoint-s3's `FileHandleState` is a read or
// a write. Every operation through a handle (read, write, flush, fsync, fallocate, ftruncate,
// release) finds it here; a rename or a removal moves every handle of the item in one place.
// Directory handles are not here (`State.directories`): they share only the numbers.

import ProviderCache
import ProviderModel

/// An open file handle.
enum FileHandle: Sendable {
    case read(ReadHandle)
    case write(WriteHandle)

    var inode: InodeNumber {
        switch self {
        case .read(let reader): reader.inode
        case .write(let writer): writer.inode
        }
    }

    /// The item the handle is of (it follows the item's renames and, for a file with other
    /// names, the name it goes on under, D-396).
    var identifier: ItemIdentifier {
        get {
            switch self {
            case .read(let reader): reader.identifier
            case .write(let writer): writer.identifier
            }
        }
        set {
            switch self {
            case .read(var reader):
                reader.identifier = newValue
                self = .read(reader)
            case .write(var writer):
                writer.identifier = newValue
                self = .write(writer)
            }
        }
    }
}

/// A handle open for reading: its pinned content version and read claim.
struct ReadHandle: Sendable {
    var inode: InodeNumber
    var identifier: ItemIdentifier
    var entry: ContentEntry
    var claim: ReadClaimToken
    /// Opened through an access path: every read re-checks this token and scope (D-307).
    var scoped: ScopedNode?
    /// The token id whose use this handle holds, ended when it is released (D-315).
    var scopedUse: String?
    /// The download failure a read of this handle met (D-288): later reads of bytes that are
    /// still missing fail with it at once, without a new download, until the handle is closed.
    /// Present bytes are still served. Not an interrupt (that was the reader's, not the file's).
    var failure: CacheError?
    /// Counted in its node's `cachingHandles` (D-435).
    var caching = false
}

/// A handle open for writing (ProviderFileSystem+Writes.swift): the item's shared staging file,
/// or through an access path its token's own (D-369).
struct WriteHandle: Sendable {
    var inode: InodeNumber
    var identifier: ItemIdentifier
    var staging: StagingFile
    /// The process (thread group) that opened it, when known: only its flushes publish.
    var opener: Int32?
    /// Opened through an access path: its node (every write, flush and fsync checks the token)
    /// and the use its open took, ended at release.
    var scoped: ScopedNode? = nil
    var scopedUse: String? = nil
    /// The write claim taken at the open, ended at the release (D-399); nil when the mount's
    /// claim provider takes no write claims.
    var claim: WriteClaimToken? = nil
    /// Counted in its plain node's writers (`admitChange`), given back at its release.
    var admitted = false
}

/// The open file handles by number (kept in `ProviderFileSystem.State`, under its lock).
struct HandleTable {
    private var handles: [FileHandleID: FileHandle] = [:]

    subscript(handle: FileHandleID) -> FileHandle? {
        get { handles[handle] }
        set { handles[handle] = newValue }
    }

    func reader(_ handle: FileHandleID) -> ReadHandle? {
        guard case .read(let reader)? = handles[handle] else { return nil }
        return reader
    }

    func writer(_ handle: FileHandleID) -> WriteHandle? {
        guard case .write(let writer)? = handles[handle] else { return nil }
        return writer
    }

    /// Removes the reader `handle` (nil: it is not a reader, and stays).
    mutating func removeReader(_ handle: FileHandleID) -> ReadHandle? {
        guard let reader = reader(handle) else { return nil }
        handles[handle] = nil
        return reader
    }

    /// Removes the writer `handle` (nil: it is not a writer, and stays).
    mutating func removeWriter(_ handle: FileHandleID) -> WriteHandle? {
        guard let writer = writer(handle) else { return nil }
        handles[handle] = nil
        return writer
    }

    /// Records the download failure a read of `handle` met, unless it has one already (D-288).
    mutating func recordFailure(_ error: CacheError, of handle: FileHandleID) {
        guard case .read(var reader)? = handles[handle], reader.failure == nil else { return }
        reader.failure = error
        handles[handle] = .read(reader)
    }

    var readers: [ReadHandle] {
        handles.values.compactMap { if case .read(let reader) = $0 { reader } else { nil } }
    }

    var writers: [(handle: FileHandleID, writer: WriteHandle)] {
        handles.compactMap { handle, open in if case .write(let writer) = open { (handle, writer) } else { nil } }
    }

    /// The items of every handle.
    var identifiers: [ItemIdentifier] { handles.values.map(\.identifier) }

    /// A writer of `inode`, if one is open.
    func writer(of inode: InodeNumber) -> WriteHandle? {
        for case .write(let writer) in handles.values where writer.inode == inode { return writer }
        return nil
    }

    /// Every handle of an item in `moves` follows it to its new identifier.
    mutating func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        guard !moves.isEmpty else { return }
        for (handle, open) in handles {
            if let moved = moves[open.identifier] { handles[handle]!.identifier = moved }
        }
    }

    /// Every handle of `old`, a name that went, goes on under `heir` (D-396).
    mutating func handOver(from old: ItemIdentifier, to heir: ItemIdentifier) {
        rekey([old: heir])
    }

    /// Removes every reader (shutdown).
    mutating func removeReaders() -> [ReadHandle] {
        let readers = readers
        handles = handles.filter { if case .read = $0.value { false } else { true } }
        return readers
    }
}
