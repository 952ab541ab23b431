// Content changes through the mount (issue 14): create, open for writing (O_TRUNC included),
// write, truncate, fsync, and the last close of a writer. Writes go to a staging copy shared by
// the item's write handles; it is published as a new version atomically, then uploaded by the
// write-back queue. Read-only until then.

extension ProviderFileSystem {
    public func create(
        parent: InodeNumber, name: String, permissions: UInt16, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> (Entry, OpenedFile) {
        try checkPlainNode(parent, "create", context: context)
        throw readOnly("create")
    }

    /// open(2) of a plain node with O_WRONLY, O_RDWR or O_TRUNC.
    func openForWriting(
        _ inode: InodeNumber, node: InodeTable.Node, flags: OpenFlags, context: RequestContext
    ) async throws(FileSystemError) -> OpenedFile {
        throw readOnly("open for writing")
    }

    public func write(
        _ inode: InodeNumber, handle: FileHandleID, offset: Int64, data: [UInt8], context: RequestContext
    ) async throws(FileSystemError) -> Int {
        throw readOnly("write")
    }

    /// setattr's size (truncate(2), ftruncate(2) when `handle` is set). Returns the attributes after.
    func truncate(
        _ inode: InodeNumber, to size: Int64, handle: FileHandleID?, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        throw readOnly("truncate")
    }
}
