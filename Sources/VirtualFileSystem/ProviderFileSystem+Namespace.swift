// Namespace changes through the mount (issue 14): mkdir, symlink, unlink, rmdir, rename, and the
// attribute changes that are not a size (chmod, utimens). Each goes to the provider at once and
// is coordinated (forDeleting / forMoving claims, presenters told first). Read-only until then.

extension ProviderFileSystem {
    public func makeDirectory(
        parent: InodeNumber, name: String, permissions: UInt16, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        try checkPlainNode(parent, "mkdir", context: context)
        throw readOnly("mkdir")
    }

    public func makeSymbolicLink(
        parent: InodeNumber, name: String, target: String, context: RequestContext
    ) async throws(FileSystemError) -> Entry {
        try checkPlainNode(parent, "symlink", context: context)
        throw readOnly("symlink")
    }

    public func unlink(parent: InodeNumber, name: String, context: RequestContext) async throws(FileSystemError) {
        try checkPlainNode(parent, "unlink", context: context)
        throw readOnly("unlink")
    }

    public func removeDirectory(
        parent: InodeNumber, name: String, context: RequestContext
    ) async throws(FileSystemError) {
        try checkPlainNode(parent, "rmdir", context: context)
        throw readOnly("rmdir")
    }

    public func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: UInt32,
        context: RequestContext
    ) async throws(FileSystemError) {
        try checkPlainNode(parent, "rename", context: context)
        try checkPlainNode(newParent, "rename", context: context)
        throw readOnly("rename")
    }

    /// setattr's permissions, owner and times (never its size: `truncate`). Called with at least
    /// one change.
    func changeAttributes(
        _ inode: InodeNumber, _ changes: AttributeChanges, context: RequestContext
    ) async throws(FileSystemError) -> NodeAttributes {
        throw readOnly("setattr")
    }
}
