// One kernel node per version on a writable mount (D-435). The kernel keeps one page cache, one
// i_size and one passthrough backing file per node, so a node whose read handles use them must
// only ever show one version: readers that opened it keep its pages, and a newer version (or a
// writer) gets a new node with the same st_ino. Every rule of it is here:
// - a read open caches only on a node whose page cache is empty or of the version it opens, with
//   no writer and one name; a node that caches another version is retired and the open fails
//   with ESTALE, which makes the kernel look the name up again (LOOKUP_REVAL) and open the new
//   node (open(2) retries once; so do truncate(2) and link(2));
// - a write open, a truncate(2) and a link(2) of a node with caching handles do the same;
// - a lookup or getattr that would give a caching node another version's size or version retires
//   it instead (a lookup binds a new node, a getattr answers what the caching handles read).
// A retired node answers getattr with the item its handles read, link count 0 (an old version
// has no name), until the kernel forgets it.

import ProviderCache
import ProviderModel
import SystemSupport

extension ProviderFileSystem {
    /// How a read handle of a plain node uses the kernel's caches.
    enum ReadCaching: Equatable {
        /// The page cache (keep_cache), and passthrough when the content is complete.
        case cached
        /// Every read reaches the daemon (direct I/O).
        case direct
        /// The node caches another version: it is retired and the open fails with ESTALE.
        case stale
    }

    /// Whether plain read handles of this mount may use the page cache through version nodes: a
    /// writable mount (a read-only one keeps D-366's rules) without the token requirement (D-331),
    /// served to a kernel (`setKernelInvalidation`): the kernel is what retries an ESTALE on the
    /// name's new node, and a caller of the API without one keeps the node it has.
    var versionNodes: Bool { options.versionNodes && kernelCanBeTold && isWritable && !requiresToken }

    /// The rule for a read open of `version` on `node`. `editOpen`: the item has a staged edit
    /// (its size shows the edit's, not the version's); `complete`: the version is all in the
    /// cache at the open.
    static func readCaching(
        of node: InodeTable.Node, version: ContentVersion, editOpen: Bool, complete: Bool
    ) -> ReadCaching {
        let alone = node.writers == 0 && !editOpen && node.otherNames.isEmpty
        if alone && node.pageCache.keeps(version) {
            // Not all here yet: direct I/O, whose large reads follow the download 2-3× faster
            // than the page cache's readahead (1,264 against 473 MiB/s cold), unless caching
            // handles of this version are open (the node is theirs). Later opens cache.
            return complete || node.cachingHandles > 0 ? .cached : .direct
        }
        // An uncached handle cannot join caching ones: their pages are another version's, and
        // the kernel refuses any open but a passthrough one of a node in passthrough.
        if node.cachingHandles > 0 { return .stale }
        if !alone { return .direct }
        // Pages of another version (or of a writer): a new node, unless this is an old node no
        // name leads to (reached by a /proc/<pid>/fd link): uncached then.
        return node.retired ? .direct : .stale
    }

    /// Retires `inode` (state locked): no name leads to it any more, and it answers getattr with
    /// what its caching handles read (else `current`). Returns the names it had, for
    /// `forgetNames`.
    static func retire(_ inode: InodeNumber, current: ProviderItem?, in state: inout State) -> [ItemIdentifier] {
        guard let node = state.inodes[inode], !node.retired else { return [] }
        let shown = node.cachingHandles > 0 ? node.cachedItem ?? current : current
        if let shown { state.removed[inode] = (shown, node.serial) }
        return state.inodes.retire(inode)
    }

    /// The kernel forgets the dentries of `names`, so that the next path walk looks them up and
    /// finds their new node. Never with the state locked.
    func forgetNames(_ names: [ItemIdentifier]) {
        guard !names.isEmpty, let invalidate = kernelInvalidation.withLock({ $0 })?.call else { return }
        var invalidations: [KernelInvalidation] = []
        for name in names {
            guard let item = cache.catalog.knownItem(name) else { continue }
            if let parent = state.withLock({ $0.inodes.inode(of: item.parent) }) {
                invalidations.append(.entry(parent: parent, name: item.name))
            }
        }
        if !invalidations.isEmpty { invalidate(invalidations) }
    }

    /// A write open, truncate(2) or link(2) of plain node `inode` on a mount with version nodes:
    /// ESTALE (after retiring it) when read handles of it use the kernel's page cache, so that
    /// the kernel retries on a new node; else the node counts one writer more when `writing`.
    /// Every admitted writer is given back with `dismissWriter`.
    func admitChange(_ inode: InodeNumber, writing: Bool, current: ProviderItem? = nil) throws(FileSystemError) {
        guard versionNodes else { return }
        let names = state.withLock { state -> [ItemIdentifier]? in
            guard let node = state.inodes[inode] else { return [] }
            if node.cachingHandles > 0 || (node.retired && !writing) {
                return Self.retire(inode, current: current, in: &state)
            }
            if writing { state.inodes[inode]?.writers += 1 }
            return nil
        }
        guard let names else { return }
        forgetNames(names)
        throw FileSystemError(.stale, "the file is open for reading on this node: a new node for the change")
    }

    /// A writer `admitChange` counted is gone.
    func dismissWriter(_ inode: InodeNumber) {
        guard versionNodes else { return }
        state.withLock { state in
            if let writers = state.inodes[inode]?.writers, writers > 0 { state.inodes[inode]?.writers = writers - 1 }
        }
    }

    /// A lookup or getattr is about to show `item` at size `shownSize` for `inode`: when caching
    /// handles of the node read another version (or another size), the node is retired and true
    /// returned (a lookup then binds a new node, a getattr answers the retired node's item).
    func retireIfShowingAnother(_ inode: InodeNumber, item: ProviderItem, shownSize: Int64) -> Bool {
        let names = state.withLock { state -> [ItemIdentifier]? in
            guard let node = state.inodes[inode], node.cachingHandles > 0, !node.retired,
                let cached = node.cachedItem,
                cached.contentVersion != item.contentVersion || cached.size != shownSize
            else { return nil }
            return Self.retire(inode, current: item, in: &state)
        }
        guard let names else { return false }
        forgetNames(names)
        return true
    }
}
