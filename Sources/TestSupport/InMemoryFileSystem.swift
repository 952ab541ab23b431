// A read-only `FileSystem` held in memory: the test double the FUSE adapter is tested with, with
// no provider or cache underneath. It behaves like a small, strict kernel file system: lookup
// counts, handles that must be open, ERANGE-free xattrs (sizing is the adapter's job), EROFS for
// every change.

public import SystemSupport
public import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A node to put in an `InMemoryFileSystem`.
public enum InMemoryNode: Sendable {
    case file([UInt8], extendedAttributes: [String: [UInt8]] = [:])
    case directory([String: InMemoryNode])
    case symbolicLink(String)
}

/// A read-only, in-memory `FileSystem` for adapter and mount tests.
public final class InMemoryFileSystem: FileSystem {
    private struct Node {
        var attributes: NodeAttributes
        var content: [UInt8] = []
        var children: [String: InodeNumber] = [:]
        var parent: InodeNumber
        var target: String = ""
        var extendedAttributes: [String: [UInt8]] = [:]
        var lookups: UInt64 = 0
    }

    private struct State {
        var nodes: [InodeNumber: Node] = [:]
        var nextHandle: UInt64 = 1
        var openFiles: [FileHandleID: InodeNumber] = [:]
        var openDirectories: [FileHandleID: InodeNumber] = [:]
        var readCount = 0
    }

    private let state: Locked<State>
    /// Where each file's bytes are also kept as `<inode>` (nil: nowhere), so opens can name them.
    public let backingDirectory: String?
    /// Each read of a file whose name starts with "slow" waits this long first (cancellable).
    public let slowReadDelay: Duration
    /// Timeouts handed to the kernel with every entry.
    public let timeout: Duration

    /// With `backingDirectory`, every regular file is also written there (as its inode number) and
    /// `open` names that file as `OpenedFile.servedFrom` (FUSE passthrough), except "slow" files,
    /// whose reads must reach the file system.
    public init(
        root: [String: InMemoryNode], slowReadDelay: Duration = .milliseconds(300), timeout: Duration = .seconds(1),
        backingDirectory: String? = nil
    ) {
        self.slowReadDelay = slowReadDelay
        self.timeout = timeout
        self.backingDirectory = backingDirectory
        var nodes: [InodeNumber: Node] = [:]
        var next: UInt64 = 2
        let now = Timestamp(seconds: 1_700_000_000)
        func attributes(_ inode: InodeNumber, _ type: NodeType, size: Int) -> NodeAttributes {
            NodeAttributes(
                inode: inode, type: type,
                permissions: type == .directory ? 0o755 : (type == .symbolicLink ? 0o777 : 0o644),
                linkCount: type == .directory ? 2 : 1, uid: getuid(), gid: getgid(), size: Int64(size),
                blocks: Int64((size + 511) / 512), accessTime: now, modificationTime: now, changeTime: now)
        }
        func add(_ tree: [String: InMemoryNode], under parent: InodeNumber) {
            for (name, node) in tree.sorted(by: { $0.key < $1.key }) {
                let inode = InodeNumber(next)
                next += 1
                nodes[parent]!.children[name] = inode
                switch node {
                case .file(let bytes, let xattrs):
                    nodes[inode] = Node(
                        attributes: attributes(inode, .regular, size: bytes.count), content: bytes, parent: parent,
                        extendedAttributes: xattrs)
                case .symbolicLink(let target):
                    nodes[inode] = Node(
                        attributes: attributes(inode, .symbolicLink, size: target.utf8.count), parent: parent,
                        target: target)
                case .directory(let children):
                    nodes[inode] = Node(attributes: attributes(inode, .directory, size: 4096), parent: parent)
                    add(children, under: inode)
                }
            }
        }
        nodes[.root] = Node(attributes: attributes(.root, .directory, size: 4096), parent: .root)
        add(root, under: .root)
        if let backingDirectory {
            for (inode, node) in nodes where node.attributes.type == .regular {
                try? writeFile(backingDirectory + "/\(inode.rawValue)", node.content)
            }
        }
        state = Locked(State(nodes: nodes))
    }

    /// Reads served so far (every `read` call, including failed ones).
    public var readCount: Int { state.withLock { $0.readCount } }
    /// Handles open right now (files and directories).
    public var openHandleCount: Int { state.withLock { $0.openFiles.count + $0.openDirectories.count } }

    private func node(_ inode: InodeNumber) throws(FileSystemError) -> Node {
        guard let node = state.withLock({ $0.nodes[inode] }) else {
            throw FileSystemError(.notFound, "no inode \(inode)")
        }
        return node
    }

    public func lookup(
        parent: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        guard name.utf8.count <= 255 else { throw FileSystemError(.nameTooLong, "name too long") }
        let attributes = try state.withLock { state throws(FileSystemError) -> NodeAttributes in
            guard let directory = state.nodes[parent] else { throw FileSystemError(.notFound, "no inode \(parent)") }
            guard directory.attributes.type == .directory else {
                throw FileSystemError(.notADirectory, "not a directory")
            }
            guard let inode = directory.children[name] else { throw FileSystemError(.notFound, "\(name) not found") }
            state.nodes[inode]!.lookups += 1
            return state.nodes[inode]!.attributes
        }
        return Entry(attributes: attributes, generation: 1, attributeTimeout: timeout, entryTimeout: timeout)
    }

    public func forget(_ inode: InodeNumber, count: UInt64) {
        state.withLock { state in
            guard state.nodes[inode] != nil else { return }
            state.nodes[inode]!.lookups -= min(count, state.nodes[inode]!.lookups)
        }
    }

    public func getAttributes(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        try node(inode).attributes
    }

    public func setAttributes(
        _ inode: InodeNumber, changes: AttributeChanges, handle: FileHandleID?, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        _ = try node(inode)
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func readLink(_ inode: InodeNumber, context: RequestContext) async throws(FileSystemError) -> String {
        let node = try node(inode)
        guard node.attributes.type == .symbolicLink else { throw FileSystemError(.invalidArgument, "not a link") }
        return node.target
    }

    public func openDirectory(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> FileHandleID {
        try state.withLock { state throws(FileSystemError) -> FileHandleID in
            guard let node = state.nodes[inode] else { throw FileSystemError(.notFound, "no inode") }
            guard node.attributes.type == .directory else { throw FileSystemError(.notADirectory, "not a directory") }
            let handle = FileHandleID(state.nextHandle)
            state.nextHandle += 1
            state.openDirectories[handle] = inode
            return handle
        }
    }

    public func readDirectory(
        _ inode: InodeNumber, handle: FileHandleID, after cookie: UInt64, limit: Int, context: RequestContext
    ) async throws(FileSystemError) -> [DirectoryEntry] {
        try state.withLock { state throws(FileSystemError) -> [DirectoryEntry] in
            guard state.openDirectories[handle] == inode, let node = state.nodes[inode] else {
                throw FileSystemError(.badHandle, "directory handle \(handle) is not open")
            }
            var all = [
                DirectoryEntry(name: ".", inode: inode, type: .directory, cookie: 1),
                DirectoryEntry(name: "..", inode: node.parent, type: .directory, cookie: 2),
            ]
            for (index, (name, child)) in node.children.sorted(by: { $0.key < $1.key }).enumerated() {
                all.append(
                    DirectoryEntry(
                        name: name, inode: child, type: state.nodes[child]!.attributes.type, cookie: UInt64(index + 3)))
            }
            return Array(all.filter { $0.cookie > cookie }.prefix(limit))
        }
    }

    public func releaseDirectory(_ inode: InodeNumber, handle: FileHandleID) {
        _ = state.withLock { $0.openDirectories.removeValue(forKey: handle) }
    }

    public func open(
        _ inode: InodeNumber, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> OpenedFile {
        try state.withLock { state throws(FileSystemError) -> OpenedFile in
            guard let node = state.nodes[inode] else { throw FileSystemError(.notFound, "no inode") }
            guard node.attributes.type != .directory else { throw FileSystemError(.isADirectory, "is a directory") }
            guard flags.isReadOnly, !flags.truncates else { throw FileSystemError(.readOnlyFileSystem, "read-only") }
            let handle = FileHandleID(state.nextHandle)
            state.nextHandle += 1
            state.openFiles[handle] = inode
            let name = state.nodes[node.parent]?.children.first { $0.value == inode }?.key ?? ""
            let backing = name.hasPrefix("slow") ? nil : backingDirectory.map { $0 + "/\(inode.rawValue)" }
            return OpenedFile(handle: handle, keepCache: true, servedFrom: backing)
        }
    }

    public func read(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, count: Int, context: RequestContext
    ) async throws(FileSystemError) -> ReadData {
        let (content, slow) = try state.withLock { state throws(FileSystemError) -> ([UInt8], Bool) in
            state.readCount += 1
            guard state.openFiles[handle] == inode, let node = state.nodes[inode] else {
                throw FileSystemError(.badHandle, "file handle \(handle) is not open")
            }
            let name = state.nodes[node.parent]?.children.first { $0.value == inode }?.key ?? ""
            return (node.content, name.hasPrefix("slow"))
        }
        if slow {
            do { try await Task.sleep(for: slowReadDelay) } catch {
                throw FileSystemError(.interrupted, "read interrupted")
            }
        }
        let start = min(Int(offset), content.count)
        let end = min(start + count, content.count)
        let buffer = AlignedBuffer(capacity: max(count, 1))
        buffer.withUnsafeMutableBytes { destination in
            content.withUnsafeBytes { source in
                destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[start..<end]))
            }
        }
        return ReadData(buffer: buffer, count: end - start)
    }

    public func write(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) async throws(FileSystemError) -> Int {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func flush(_ inode: InodeNumber, handle: FileHandleID, context: RequestContext) async throws(FileSystemError)
    {}

    public func fsync(
        _ inode: InodeNumber, handle: FileHandleID, dataOnly: Bool, context: RequestContext
    ) async throws(FileSystemError) {}

    public func release(_ inode: InodeNumber, handle: FileHandleID) async {
        _ = state.withLock { $0.openFiles.removeValue(forKey: handle) }
    }

    public func create(
        parent: InodeNumber, name: String, permissions: UInt16, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> (Entry, OpenedFile) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func makeDirectory(
        parent: InodeNumber, name: String, permissions: UInt16, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func makeSymbolicLink(
        parent: InodeNumber, name: String, target: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func removeDirectory(
        parent: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: UInt32,
        context: RequestContext
    ) async throws(FileSystemError) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func getExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) -> [UInt8] {
        if name == "user.test.caller" {
            return Array("tid=\(context.threadID) uid=\(context.uid) gid=\(context.gid)".utf8)
        }
        guard let value = try node(inode).extendedAttributes[name] else {
            throw FileSystemError(.noAttribute, "no attribute \(name)")
        }
        return value
    }

    public func listExtendedAttributes(
        _ inode: InodeNumber, context: RequestContext
    ) async throws(FileSystemError) -> [String] {
        try node(inode).extendedAttributes.keys.sorted()
    }

    public func setExtendedAttribute(
        _ inode: InodeNumber, name: String, value: [UInt8], flags: Int32, context: RequestContext
    ) async throws(FileSystemError) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func removeExtendedAttribute(
        _ inode: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) {
        throw FileSystemError(.readOnlyFileSystem, "read-only")
    }

    public func statistics(context: RequestContext) async throws(FileSystemError) -> FileSystemStatistics {
        FileSystemStatistics(
            blockSize: 4096, totalBlocks: 1 << 20, freeBlocks: 0, availableBlocks: 0, totalFiles: 1 << 20,
            freeFiles: 0, maximumNameLength: 255)
    }

    public func shutdown() async {}
}

extension InMemoryNode {
    /// Loads a directory tree from disk (regular files, directories, symbolic links).
    public static func load(directory path: String) -> [String: InMemoryNode] {
        var result: [String: InMemoryNode] = [:]
        guard let stream = opendir(path) else { return result }
        defer { closedir(stream) }
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name == "." || name == ".." { continue }
            let full = path + "/" + name
            var info = stat()
            guard lstat(full, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFDIR: result[name] = .directory(load(directory: full))
            case S_IFLNK:
                var buffer = [CChar](repeating: 0, count: 4097)
                let count = readlink(full, &buffer, 4096)
                result[name] = .symbolicLink(
                    String(decoding: buffer.prefix(max(0, count)).map { UInt8(bitPattern: $0) }, as: UTF8.self))
            case S_IFREG: result[name] = .file(Array(readTextFileBytes(full)))
            default: continue
            }
        }
        return result
    }
}

private func readTextFileBytes(_ path: String) -> [UInt8] {
    let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return [] }
    defer { close(fd) }
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 20)
    while true {
        let count = chunk.withUnsafeMutableBytes { buffer in Glibc.read(fd, buffer.baseAddress, buffer.count) }
        if count <= 0 { break }
        result += chunk[0..<count]
    }
    return result
}
