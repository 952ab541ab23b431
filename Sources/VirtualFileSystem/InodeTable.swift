// Node numbers (FUSE node ids) for provider items: stable for the life of a mount while the kernel
// holds them, never reused within a mount for another item, with lookup counts the kernel's
// `forget` pays back. An item's node id is its serial number (its st_ino, D-389) whenever no other
// node holds that number, so traces name items by the number stat shows; otherwise, and for
// access-path nodes, a spare id from 2^62 up. st_ino is the serial number either way.

import ProviderModel

/// A pure table (guarded by ProviderFileSystem's lock) of the nodes the kernel knows.
struct InodeTable {
    struct Node {
        var identifier: ItemIdentifier
        var kind: ItemKind
        var lookupCount: UInt64
        var generation: UInt64
        /// What the kernel's page cache of this node may hold, which decides FOPEN_KEEP_CACHE.
        var pageCache: PageCache = .empty
        /// The file's other names (hard links) that resolved to this node (D-396): one of them
        /// becomes `identifier` when that name goes.
        var otherNames: [ItemIdentifier] = []
        /// Read handles open here that may use the kernel's page cache or passthrough on a
        /// writable mount (D-435): all of them read `cachedItem`'s version.
        var cachingHandles = 0
        /// The item as the caching handles' version has it (size, times): what the node shows
        /// once retired, so that the kernel never gets another version's size for these pages.
        var cachedItem: ProviderItem?
        /// Plain write handles open here (their bytes may be in no page cache readers share).
        var writers = 0
        /// No name leads here any more: a newer version (or a writer) has a node of its own, and
        /// this one lives on for the descriptors open on it until forgotten (D-435).
        var retired = false
        /// The item's serial number (st_ino) when the node was bound.
        var serial: UInt64 = 0
    }

    /// What a node's page cache in the kernel may hold.
    enum PageCache: Equatable {
        /// Never opened: a new node number is a new kernel inode, whose page cache is empty.
        case empty
        /// Opened on this version, and only on it since the cache was last dropped.
        case version(ContentVersion)
        /// Written around (a writer's handle): anything.
        case unknown

        /// Whether an open of `version` may keep the pages: they can only be of that version.
        func keeps(_ version: ContentVersion) -> Bool { self == .empty || self == .version(version) }
    }

    private(set) var nodes: [InodeNumber: Node] = [:]
    private var byIdentifier: [ItemIdentifier: InodeNumber] = [:]
    private var bindings: [ItemIdentifier: UInt64] = [:]
    /// The first node id that is not an item's serial number (those count up from 1).
    static let spareBase: UInt64 = 1 << 62
    private var nextSpare: UInt64 = InodeTable.spareBase

    init() {
        nodes[.root] = Node(identifier: .root, kind: .directory, lookupCount: 1, generation: 1)
        byIdentifier[.root] = .root
    }

    subscript(_ inode: InodeNumber) -> Node? {
        get { nodes[inode] }
        set { nodes[inode] = newValue }
    }

    /// The identifier and kind of a node, without copying the rest of it (a LOOKUP's parent).
    /// Mutating only to reach the node in place.
    mutating func identity(of inode: InodeNumber) -> (identifier: ItemIdentifier, kind: ItemKind)? {
        guard let index = nodes.index(forKey: inode) else { return nil }
        func read(_ node: inout Node) -> (ItemIdentifier, ItemKind) { (node.identifier, node.kind) }
        return read(&nodes.values[index])
    }

    /// How many read handles of the node use the page cache (D-435), without copying the node.
    mutating func cachingHandles(of inode: InodeNumber) -> Int {
        guard let index = nodes.index(forKey: inode) else { return 0 }
        func read(_ node: inout Node) -> Int { node.cachingHandles }
        return read(&nodes.values[index])
    }

    /// A fresh number that no item's serial number is (access-path nodes, kept by
    /// ProviderFileSystem; an item whose serial number another node holds).
    mutating func reserve() -> InodeNumber {
        defer { nextSpare += 1 }
        return InodeNumber(nextSpare)
    }

    /// The node of `identifier`, made if needed. A node whose kind no longer matches is detached
    /// and replaced, so the kernel never sees a file turn into a directory under one number.
    /// `generation` counts how often the identifier was bound in this mount. `serial`: the item's
    /// serial number, the new node's id unless another node holds it. `holder`: another name of
    /// the same file under which its edit not uploaded yet is kept (D-410): a new node goes by
    /// that name, with `identifier` as another name.
    mutating func bind(
        _ identifier: ItemIdentifier, kind: ItemKind, serial: UInt64, holder: ItemIdentifier? = nil
    ) -> (InodeNumber, UInt64) {
        if let inode = byIdentifier[identifier], let node = nodes[inode] {
            if node.kind == kind || identifier == .root { return (inode, node.generation) }
            byIdentifier[identifier] = nil
        }
        // Another name of a file whose node the kernel holds (a hard link: the same serial
        // number, which only the names of one file share): that node, so that every name is one
        // kernel inode with one page cache, and opens through any name reach one item (D-396).
        // A number's own node id is taken by the first of its names bound; the holder's node,
        // wherever it is, otherwise.
        if kind != .directory {
            var shared: InodeNumber?
            if serial > InodeNumber.root.rawValue, serial < Self.spareBase {
                let own = InodeNumber(serial)
                if let node = nodes[own], node.kind == kind, byIdentifier[node.identifier] == own { shared = own }
            }
            if shared == nil, let holder, let inode = byIdentifier[holder], nodes[inode]?.kind == kind {
                shared = inode
            }
            if let shared, let index = nodes.index(forKey: shared) {
                nodes.values[index].otherNames.append(identifier)
                byIdentifier[identifier] = shared
                return (shared, nodes.values[index].generation)
            }
        }
        let inode =
            serial > InodeNumber.root.rawValue && serial < Self.spareBase && nodes[InodeNumber(serial)] == nil
            ? InodeNumber(serial) : reserve()
        // The file's edit is kept under `holder`: the node's item is that name's, so that it reads
        // and writes on from the edit (not from the provider's version the other names show).
        var primary = identifier
        if kind != .directory, let holder, byIdentifier[holder] == nil { primary = holder }
        let generation = (bindings[primary] ?? 0) + 1
        bindings[primary] = generation
        nodes[inode] = Node(
            identifier: primary, kind: kind, lookupCount: 0, generation: generation,
            otherNames: primary == identifier ? [] : [identifier], serial: serial)
        byIdentifier[identifier] = inode
        byIdentifier[primary] = inode
        return (inode, generation)
    }

    /// `bind` plus one kernel reference, for a lookup reply: an existing node is found and
    /// counted with one hash of the identifier and one of the number (this runs on every LOOKUP).
    mutating func bindLookedUp(
        _ identifier: ItemIdentifier, kind: ItemKind, serial: UInt64, holder: ItemIdentifier? = nil
    ) -> (InodeNumber, UInt64) {
        if let inode = byIdentifier[identifier], let index = nodes.index(forKey: inode) {
            // The node is checked and counted in place: reading `nodes.values[index]` would copy
            // it (and retain its strings) for each field.
            func count(_ node: inout Node) -> UInt64? {
                guard node.kind == kind || identifier == .root else { return nil }
                node.lookupCount += 1
                return node.generation
            }
            if let generation = count(&nodes.values[index]) { return (inode, generation) }
        }
        let (inode, generation) = bind(identifier, kind: kind, serial: serial, holder: holder)
        nodes[inode]?.lookupCount += 1
        return (inode, generation)
    }

    /// The kernel dropped `count` references. A node with none left is forgotten (the root never).
    mutating func forget(_ inode: InodeNumber, count: UInt64) {
        guard inode != .root, var node = nodes[inode] else { return }
        node.lookupCount -= min(count, node.lookupCount)
        if node.lookupCount == 0 {
            nodes[inode] = nil
            if byIdentifier[node.identifier] == inode { byIdentifier[node.identifier] = nil }
            for name in node.otherNames where byIdentifier[name] == inode { byIdentifier[name] = nil }
        } else {
            nodes[inode] = node
        }
    }

    /// The item is gone: its number is no longer handed out for the identifier (the node lives
    /// until forgotten; its operations fail with ENOENT). A node of a file with other names
    /// goes on under one of them (D-396). Returns the node when it lost its last name.
    /// `heir`: another name of the file the catalog knows, which carries the node on when no other
    /// name is bound to it.
    @discardableResult
    mutating func detach(_ identifier: ItemIdentifier, heir: ItemIdentifier? = nil) -> InodeNumber? {
        guard identifier != .root, let inode = byIdentifier.removeValue(forKey: identifier),
            let index = nodes.index(forKey: inode)
        else { return nil }
        func drop(_ node: inout Node) -> Bool {
            node.otherNames.removeAll { $0 == identifier }
            guard node.identifier == identifier else { return false }
            // The first other name still bound here carries the node on.
            while let next = node.otherNames.first {
                node.otherNames.removeFirst()
                if byIdentifier[next] == inode {
                    node.identifier = next
                    return false
                }
            }
            if let heir, heir != identifier, byIdentifier[heir] == nil {
                node.identifier = heir
                byIdentifier[heir] = inode
                return false
            }
            return true
        }
        return drop(&nodes.values[index]) ? inode : nil
    }

    /// The name a node goes on under when `identifier`, its item's, goes: its first other name
    /// still bound to it (what `detach` picks). Nil when `identifier` is not a node's item or the
    /// node has no other name.
    func heir(of identifier: ItemIdentifier) -> ItemIdentifier? {
        guard let inode = byIdentifier[identifier], let node = nodes[inode], node.identifier == identifier else {
            return nil
        }
        return node.otherNames.first { byIdentifier[$0] == inode }
    }

    /// `identifier`, a new name of the file `inode` is (link(2), D-396), bound to that node with
    /// one kernel reference. Nil when the node is gone.
    mutating func addName(_ identifier: ItemIdentifier, to inode: InodeNumber) -> UInt64? {
        guard let index = nodes.index(forKey: inode) else { return nil }
        if byIdentifier[identifier] != inode {
            byIdentifier[identifier] = inode
            nodes.values[index].otherNames.append(identifier)
        }
        nodes.values[index].lookupCount += 1
        return nodes.values[index].generation
    }

    /// `inode` keeps serving the descriptors open on it, but no name leads to it any more: the next
    /// lookup of its item binds a new node (a new kernel inode, with a page cache of its own),
    /// with the same st_ino (D-435). Returns the names it had.
    mutating func retire(_ inode: InodeNumber) -> [ItemIdentifier] {
        guard inode != .root, let index = nodes.index(forKey: inode) else { return [] }
        nodes.values[index].retired = true
        let names = [nodes.values[index].identifier] + nodes.values[index].otherNames
        var unbound: [ItemIdentifier] = []
        for name in names where byIdentifier[name] == inode {
            byIdentifier[name] = nil
            unbound.append(name)
        }
        return unbound
    }

    /// The identifiers a node answers to: its item's and its other names' (D-396).
    func names(of inode: InodeNumber) -> [ItemIdentifier] {
        guard let node = nodes[inode] else { return [] }
        return [node.identifier] + node.otherNames
    }

    /// Items were re-keyed (a move at a provider whose identifiers are paths): their nodes keep
    /// their numbers under the new identifiers.
    mutating func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        guard !moves.isEmpty else { return }
        var moved: [(ItemIdentifier, InodeNumber)] = []
        for (old, new) in moves {
            guard let inode = byIdentifier.removeValue(forKey: old), let node = nodes[inode] else { continue }
            if node.identifier == old {
                nodes[inode]!.identifier = new
            } else if let index = node.otherNames.firstIndex(of: old) {
                nodes[inode]!.otherNames[index] = new
            }
            moved.append((new, inode))
        }
        for (new, inode) in moved { byIdentifier[new] = inode }
    }

    /// The identifiers that have a node handed out.
    var identifiers: Dictionary<ItemIdentifier, InodeNumber>.Keys { byIdentifier.keys }

    /// The node handed out for `identifier`, if the kernel may hold one.
    func inode(of identifier: ItemIdentifier) -> InodeNumber? { byIdentifier[identifier] }

    var count: Int { nodes.count }
}
