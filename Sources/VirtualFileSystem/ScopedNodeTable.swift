// The nodes of access paths (`.scoped/<token>/…`, D-305), in a table of their own beside the
// `InodeTable` (D-506): a plain node and an access-path node of the same item are different
// numbers, and every operation on the latter knows its token. `resolve` says once per operation
// what a number is: plain, `.scoped` itself, or an access-path node (whose token the operation
// then checks, ProviderFileSystem+Scoped.swift).

import ProviderModel

/// What a node number is to an operation, resolved once (`ProviderFileSystem.resolve`).
enum ResolvedNode {
    /// A plain node (the item's, in the `InodeTable`), or a number the file system does not know.
    case plain
    /// `.scoped` itself: search permission only; its entries are the tokens.
    case scopedRoot(InodeNumber)
    /// A node under `.scoped/<token>`: each operation on it checks its token and scope (`enforce`).
    case scoped(ScopedNode)
}

/// A node reached through an access path (`.scoped/<token>/…`), separate from the item's plain
/// node so that every operation on it knows its token (D-305). Never in the `InodeTable`.
struct ScopedNode: Sendable {
    enum Role: Hashable, Sendable {
        /// `.scoped/<token>` of a file grant: a directory holding just the granted file.
        case token
        /// The granted item or an item inside it.
        case item(ItemIdentifier)
    }
    var token: String
    /// The token's public id (the provider's): its ends are announced by id (D-346).
    var tokenID: String
    /// The granted item (the check's when the node was made; a token's scope never changes).
    var scope: ItemIdentifier
    var role: Role
    var kind: ItemKind
    var lookupCount: UInt64
}

/// The access-path nodes by number, by token and role, and by token id (kept in
/// `ProviderFileSystem.State`, under its lock; numbers from `InodeTable.reserve`).
struct ScopedNodeTable {
    /// The `.scoped` directory's number (nil without a `ScopedAccessProvider`).
    var directory: InodeNumber?
    private var nodes: [InodeNumber: ScopedNode] = [:]
    private var byKey: [Key: InodeNumber] = [:]
    /// Token id → its nodes, to invalidate when it ends (D-346).
    private var byTokenID: [String: Set<InodeNumber>] = [:]

    /// A node's token and role: one node each.
    private struct Key: Hashable {
        var token: String
        var role: ScopedNode.Role
    }

    func resolve(_ inode: InodeNumber) -> ResolvedNode {
        if inode == directory { return .scopedRoot(inode) }
        return nodes[inode].map { .scoped($0) } ?? .plain
    }

    /// The node of `token` in `role`, made (numbered by `inodes.reserve`) if needed, with
    /// `references` more kernel references; a new node keeps the token's id and scope.
    mutating func bind(
        token: String, role: ScopedNode.Role, kind: ItemKind, references: UInt64, tokenID: String,
        scope: ItemIdentifier, numberedBy inodes: inout InodeTable
    ) -> InodeNumber {
        let key = Key(token: token, role: role)
        if let inode = byKey[key], var node = nodes[inode], node.kind == kind {
            node.lookupCount += references
            nodes[inode] = node
            return inode
        }
        let inode = inodes.reserve()
        nodes[inode] = ScopedNode(
            token: token, tokenID: tokenID, scope: scope, role: role, kind: kind, lookupCount: references)
        byKey[key] = inode
        byTokenID[tokenID, default: []].insert(inode)
        return inode
    }

    /// The kernel forgets `count` references of `inode`; false when it is no access-path node.
    mutating func forget(_ inode: InodeNumber, count: UInt64) -> Bool {
        guard var node = nodes[inode] else { return false }
        node.lookupCount -= min(count, node.lookupCount)
        if node.lookupCount > 0 {
            nodes[inode] = node
            return true
        }
        nodes[inode] = nil
        let key = Key(token: node.token, role: node.role)
        if byKey[key] == inode { byKey[key] = nil }
        byTokenID[node.tokenID]?.remove(inode)
        if byTokenID[node.tokenID]?.isEmpty == true { byTokenID[node.tokenID] = nil }
        return true
    }

    /// Access-path nodes name their item too: each follows its item to its new identifier.
    mutating func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        for (inode, node) in nodes {
            guard case .item(let identifier) = node.role, let moved = moves[identifier] else { continue }
            let oldKey = Key(token: node.token, role: node.role)
            nodes[inode]!.role = .item(moved)
            if byKey[oldKey] == inode { byKey[oldKey] = nil }
            byKey[Key(token: node.token, role: .item(moved))] = inode
        }
    }

    /// The invalidations that make the kernel forget the paths of the token `id`: the entry
    /// `.scoped/<token>` and the attributes of each of its nodes; empty when it has none (D-346).
    func invalidations(forEnded id: String) -> [KernelInvalidation] {
        guard let directory, let inodes = byTokenID[id] else { return [] }
        let sorted = inodes.sorted { $0.rawValue < $1.rawValue }
        var tokens: [String] = []
        for inode in sorted {
            if let token = nodes[inode]?.token, !tokens.contains(token) { tokens.append(token) }
        }
        return tokens.map { KernelInvalidation.entry(parent: directory, name: $0) }
            + sorted.map { KernelInvalidation.attributes($0) }
    }
}
