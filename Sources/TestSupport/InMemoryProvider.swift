// A deterministic provider held in memory, with call counters and a gate that holds fetches, for
// unit, fault and model tests.

public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// The content of an in-memory file: explicit bytes, or `size` ramp bytes (big files for free).
public enum InMemoryContent: Sendable, Equatable {
    case bytes([UInt8])
    case ramp(seed: UInt64, size: Int64)

    public var size: Int64 {
        switch self {
        case .bytes(let bytes): Int64(bytes.count)
        case .ramp(_, let size): size
        }
    }

    public func slice(_ range: Range<Int64>) -> [UInt8] {
        switch self {
        case .bytes(let bytes): Array(bytes[Int(range.lowerBound)..<Int(range.upperBound)])
        case .ramp(let seed, _): rampBytes(seed: seed, offset: range.lowerBound, count: Int(range.count))
        }
    }
}

/// A provider whose namespace lives in memory. Identifiers are paths ("" is the root), as for
/// LocalDirectoryProvider. Every change bumps the item's version ("v<n>").
public final class InMemoryProvider: Provider, @unchecked Sendable {
    // Safe: all mutable state lives in `state` (a Locked).
    struct Node {
        var item: ProviderItem
        var content: InMemoryContent?
    }

    /// Calls seen, for assertions like "listing did not fetch content".
    public struct Counters: Sendable, Equatable {
        public var itemCalls = 0
        public var childrenCalls = 0
        public var fetchCalls = 0
        public var fetchedRanges: [Range<Int64>] = []
        public var bytesServed: Int64 = 0
        /// `downloadEnded` calls, in order: the item and whether the download succeeded.
        public var downloadsEnded: [DownloadEnd] = []
        /// Write calls made (failed ones included), per call.
        public var writeCalls: [InMemoryWriteCall: Int] = [:]
    }

    public struct DownloadEnd: Sendable, Equatable {
        public var identifier: ItemIdentifier
        public var succeeded: Bool
        public init(_ identifier: ItemIdentifier, succeeded: Bool) {
            self.identifier = identifier
            self.succeeded = succeeded
        }
    }

    public func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {
        state.withLock { $0.counters.downloadsEnded.append(DownloadEnd(identifier, succeeded: succeeded)) }
    }

    struct State {
        var nodes: [ItemIdentifier: Node] = [:]
        var nextVersion = 1
        var counters = Counters()
        var holding = false
        var held: [CheckedContinuation<Void, Never>] = []
        var time: Int64 = 1_700_000_000
        var answersImmediately = false
        /// Failures to throw from the next calls of each write call (first in, first thrown).
        var failures: [InMemoryWriteCall: [ProviderError]] = [:]
        /// While holding uploads, each waits here (after reading its local file, before anything
        /// changes) until `releaseUploads()`.
        var holdingUploads = false
        var heldUploads: [CheckedContinuation<Void, Never>] = []
        /// With `.storesOwnership`: the owner of what is made (as a local source's daemon run by
        /// root makes it), nil otherwise (D-397).
        var ownerOfNew: ItemOwner?
        /// Whether `deferCreateNow` defers creates (D-386), as the local provider does.
        var defersCreates = false
    }

    let state = Locked(State())

    /// Immediate metadata (`itemNow(for:)`, answering only when `answersImmediately`) and, unless
    /// the test says otherwise, every write capability.
    public let capabilities: ProviderCapabilities

    /// What an InMemoryProvider offers unless a test says otherwise.
    public static let defaultCapabilities: ProviderCapabilities = [
        .immediateMetadata, .writing, .symbolicLinks, .exchangingMoves, .storesAttributes,
    ]

    /// A provider with `capabilities` (a test makes one without `.writing` or `.exchangingMoves`
    /// this way; the calls it lacks then decline with `.notSupported`).
    public init(capabilities: ProviderCapabilities = InMemoryProvider.defaultCapabilities) {
        self.capabilities = capabilities
        state.withLock { state in
            state.ownerOfNew = capabilities.contains(.storesOwnership) ? ItemOwner(uid: 0, gid: 0) : nil
            state.nodes[.root] = Node(
                item: ProviderItem(
                    identifier: .root, parent: .root, name: "", kind: .directory, size: 0,
                    modificationTime: ItemTime(seconds: state.time), contentVersion: ContentVersion("v0"),
                    permissions: 0o755, owner: state.ownerOfNew), content: nil)
        }
    }

    public var counters: Counters { state.withLock { $0.counters } }

    private static func split(_ path: String) -> (ItemIdentifier, String) {
        let components = path.split(separator: "/")
        let parent =
            components.count <= 1 ? ItemIdentifier.root : ItemIdentifier(components.dropLast().joined(separator: "/"))
        return (parent, String(components.last ?? ""))
    }

    private func put(_ path: String, kind: ItemKind, content: InMemoryContent?) {
        let (parent, name) = Self.split(path)
        state.withLock { state in
            precondition(state.nodes[parent]?.item.kind == .directory, "InMemoryProvider: no directory \(parent)")
            state.nextVersion += 1
            state.time += 1
            let item = ProviderItem(
                identifier: ItemIdentifier(path), parent: parent, name: name, kind: kind, size: content?.size ?? 0,
                modificationTime: ItemTime(seconds: state.time, nanoseconds: Int32(state.nextVersion)),
                contentVersion: ContentVersion("v\(state.nextVersion)"),
                permissions: kind == .directory ? 0o755 : 0o644,
                owner: state.ownerOfNew)
            state.nodes[ItemIdentifier(path)] = Node(item: item, content: content)
        }
    }

    /// Creates a directory (its parent must exist).
    public func addDirectory(_ path: String) { put(path, kind: .directory, content: nil) }

    /// Creates or replaces a file (new version).
    public func putFile(_ path: String, _ content: InMemoryContent) { put(path, kind: .file, content: content) }

    /// Creates or replaces a symbolic link to `target`.
    public func putSymbolicLink(_ path: String, target: String) {
        put(path, kind: .symbolicLink, content: nil)
        state.withLock { state in
            state.nodes[ItemIdentifier(path)]?.item.symbolicLinkTarget = target
            state.nodes[ItemIdentifier(path)]?.item.size = Int64(target.utf8.count)
            state.nodes[ItemIdentifier(path)]?.item.permissions = 0o777
        }
    }

    /// Removes an item and everything under it.
    public func remove(_ path: String) {
        state.withLock { state in
            let prefix = path + "/"
            state.nodes = state.nodes.filter { $0.key.rawValue != path && !$0.key.rawValue.hasPrefix(prefix) }
        }
    }

    /// The content and version of a file now.
    public func content(of path: String) -> (InMemoryContent, ContentVersion)? {
        state.withLock { state in
            guard let node = state.nodes[ItemIdentifier(path)], let content = node.content else { return nil }
            return (content, node.item.contentVersion)
        }
    }

    /// Every item now (for model comparisons).
    public var allItems: [ProviderItem] { state.withLock { $0.nodes.values.map(\.item) } }

    /// While holding, every fetch stream waits before its first chunk until `release()`.
    public func hold() { state.withLock { $0.holding = true } }

    /// Lets held and future fetches run.
    public func release() {
        let held = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.holding = false
            defer { state.held = [] }
            return state.held
        }
        for continuation in held { continuation.resume() }
    }

    /// Number of fetches waiting at the gate.
    public var heldCount: Int { state.withLock { $0.held.count } }

    func passGate() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = state.withLock { state -> Bool in
                guard state.holding else { return false }
                state.held.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
    }

    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try state.withLock { state in try Self.item(identifier, in: &state) }
    }

    /// An item call, counted.
    private static func item(_ identifier: ItemIdentifier, in state: inout State) throws -> ProviderItem {
        state.counters.itemCalls += 1
        guard let node = state.nodes[identifier] else { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
        return node.item
    }

    /// Whether creates wait for their first upload (`deferCreateNow`, D-386), as in a watched
    /// local directory; false (the default): made at once.
    public var defersCreates: Bool {
        get { state.withLock { $0.defersCreates } }
        set { state.withLock { $0.defersCreates = newValue } }
    }

    /// With `defersCreates`: the name checked free, the identifier the `.create` upload will give.
    public func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? {
        try state.withLock { state in
            guard state.defersCreates else { return nil }
            return DeferredCreate(identifier: try Self.newEntry(name, in: parent, state: state), directory: nil)
        }
    }

    /// Whether `itemNow(for:)` answers (like a local directory) or declines (like a network
    /// provider, the default).
    public var answersImmediately: Bool {
        get { state.withLock { $0.answersImmediately } }
        set { state.withLock { $0.answersImmediately = newValue } }
    }

    /// `item(for:)` at once when `answersImmediately`, counted as an item call.
    public func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? {
        try state.withLock { state in
            guard state.answersImmediately else { return nil }
            return try Self.item(identifier, in: &state)
        }
    }

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try state.withLock { state in
            state.counters.childrenCalls += 1
            guard let node = state.nodes[identifier] else { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
            guard node.item.kind == .directory else {
                throw ProviderError(.wrongKind, "\(identifier) is not a directory")
            }
            return state.nodes.values.filter { $0.item.parent == identifier && $0.item.identifier != .root }.map(\.item)
        }
    }

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try state.withLock { state in
            state.counters.fetchCalls += 1
            state.counters.fetchedRanges.append(range)
            guard let node = state.nodes[identifier], let content = node.content else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone")
            }
            guard node.item.contentVersion == version else {
                throw ProviderError(.versionChanged, "\(identifier) is now \(node.item.contentVersion)")
            }
            guard range.lowerBound >= 0, range.upperBound <= content.size else {
                throw ProviderError(.io, "range \(range) outside \(content.size) bytes")
            }
        }
        return InMemoryStream(provider: self, identifier: identifier, version: version, range: range)
    }

    func serve(_ identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>) throws -> [UInt8] {
        try state.withLock { state in
            guard let node = state.nodes[identifier], let content = node.content else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone")
            }
            guard node.item.contentVersion == version else {
                throw ProviderError(.versionChanged, "\(identifier) is now \(node.item.contentVersion)")
            }
            state.counters.bytesServed += Int64(range.count)
            return content.slice(range)
        }
    }
}

/// The write calls of `Provider`, for `InMemoryProvider.failNext` and its counters.
public enum InMemoryWriteCall: String, Sendable, Hashable, CaseIterable {
    case createDirectory, createSymbolicLink, upload, delete, move, setAttributes
}

// MARK: Writing

extension InMemoryProvider {
    /// The next call of `call` throws `error` (after counting it, before changing anything).
    /// Several failures queue up, thrown in order.
    public func failNext(_ call: InMemoryWriteCall, with error: ProviderError) {
        state.withLock { $0.failures[call, default: []].append(error) }
    }

    /// Write calls made, per call (failed ones included).
    public func writeCount(_ call: InMemoryWriteCall) -> Int { counters.writeCalls[call, default: 0] }

    /// From now on every upload waits, once it has read its local file and before it changes
    /// anything, until `releaseUploads()` (a test looks at the caller's "uploading" state).
    public func holdUploads() { state.withLock { $0.holdingUploads = true } }

    /// Lets held and future uploads go on.
    public func releaseUploads() {
        let held = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.holdingUploads = false
            defer { state.heldUploads = [] }
            return state.heldUploads
        }
        for continuation in held { continuation.resume() }
    }

    /// Uploads waiting at the gate.
    public var heldUploadCount: Int { state.withLock { $0.heldUploads.count } }

    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        try state.withLock { state in
            try Self.begin(.createDirectory, needs: .writing, capabilities, in: &state)
            let identifier = try Self.newEntry(name, in: parent, state: state)
            return Self.insert(
                identifier, parent: parent, name: name, kind: .directory, content: nil,
                permissions: permissions & 0o7777, in: &state)
        }
    }

    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String
    ) async throws -> ProviderItem {
        try state.withLock { state in
            try Self.begin(.createSymbolicLink, needs: [.writing, .symbolicLinks], capabilities, in: &state)
            let identifier = try Self.newEntry(name, in: parent, state: state)
            var item = Self.insert(
                identifier, parent: parent, name: name, kind: .symbolicLink, content: nil, permissions: 0o777,
                in: &state)
            item.symbolicLinkTarget = target
            item.size = Int64(target.utf8.count)
            state.nodes[identifier]?.item = item
            return item
        }
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        state.withLock { $0.counters.writeCalls[.upload, default: 0] += 1 }
        let bytes = try Self.readLocalFile(localFile)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = state.withLock { state -> Bool in
                guard state.holdingUploads else { return false }
                state.heldUploads.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        try Task.checkCancellation()
        return try state.withLock { state in
            try Self.begin(.upload, needs: .writing, capabilities, counting: false, in: &state)
            let identifier: ItemIdentifier
            let parent: ItemIdentifier
            let name: String
            var mode = permissions.map { $0 & 0o7777 } ?? 0o644
            switch target {
            case .create(let newName, let directory):
                identifier = try Self.newEntry(newName, in: directory, state: state)
                (parent, name) = (directory, newName)
            case .replace(let existing, let baseVersion):
                guard let node = state.nodes[existing] else {
                    throw ProviderError(.noSuchItem, "\(existing) is gone", errno: ENOENT)
                }
                guard node.item.kind == .file else {
                    throw ProviderError(
                        .wrongKind, "\(existing) is not a file", errno: node.item.kind == .directory ? EISDIR : EINVAL)
                }
                if let baseVersion, baseVersion != node.item.contentVersion {
                    throw ProviderError(
                        .versionChanged, "\(existing) changed: \(baseVersion) is now \(node.item.contentVersion)")
                }
                if permissions == nil { mode = node.item.permissions }
                (identifier, parent, name) = (existing, node.item.parent, node.item.name)
            }
            var item = Self.insert(
                identifier, parent: parent, name: name, kind: .file, content: .bytes(bytes), permissions: mode,
                in: &state)
            if let modificationTime {
                item.modificationTime = modificationTime
                state.nodes[identifier]?.item = item
            }
            return item
        }
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        try state.withLock { state in
            try Self.begin(.delete, needs: .writing, capabilities, in: &state)
            guard identifier != .root else {
                throw ProviderError(.invalidName, "the root cannot be deleted", errno: EBUSY)
            }
            guard let node = state.nodes[identifier] else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone", errno: ENOENT)
            }
            guard node.item.kind == kind else {
                let code: Int32? = node.item.kind == .directory ? EISDIR : kind == .directory ? ENOTDIR : nil
                throw ProviderError(.wrongKind, "\(identifier) is a \(node.item.kind), not a \(kind)", errno: code)
            }
            if kind == .directory,
                state.nodes.values.contains(where: { $0.item.parent == identifier && $0.item.identifier != .root })
            {
                throw ProviderError(.notEmpty, "\(identifier) is not empty", errno: ENOTEMPTY)
            }
            state.nodes[identifier] = nil
        }
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        try state.withLock { state in
            try Self.begin(
                .move, needs: mode == .exchange ? [.writing, .exchangingMoves] : .writing, capabilities, in: &state)
            try Self.checkName(name)
            guard identifier != .root else { throw ProviderError(.invalidName, "the root cannot move", errno: EBUSY) }
            guard let source = state.nodes[identifier] else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone", errno: ENOENT)
            }
            try Self.checkDirectory(parent, state: state)
            let destination = Self.child(name, of: parent)
            if destination == identifier { return source.item }
            if source.item.kind == .directory, Self.isInside(destination, identifier) {
                throw ProviderError(.invalidName, "\(identifier) cannot move into itself", errno: EINVAL)
            }
            let existing = state.nodes[destination]
            if let existing, existing.item.kind == .directory, Self.isInside(identifier, destination) {
                throw ProviderError(.notEmpty, "\(destination) is not empty", errno: ENOTEMPTY)
            }
            switch mode {
            case .noReplace:
                if existing != nil { throw ProviderError(.alreadyExists, "\(destination) exists", errno: EEXIST) }
            case .replacing:
                if let existing {
                    if source.item.kind == .directory && existing.item.kind != .directory {
                        throw ProviderError(.wrongKind, "\(destination) is not a directory", errno: ENOTDIR)
                    }
                    if source.item.kind != .directory && existing.item.kind == .directory {
                        throw ProviderError(.wrongKind, "\(destination) is a directory", errno: EISDIR)
                    }
                    if existing.item.kind == .directory,
                        state.nodes.values.contains(where: { $0.item.parent == destination })
                    {
                        throw ProviderError(.notEmpty, "\(destination) is not empty", errno: ENOTEMPTY)
                    }
                    state.nodes[destination] = nil
                }
            case .exchange:
                guard existing != nil else {
                    throw ProviderError(.noSuchItem, "\(destination) does not exist", errno: ENOENT)
                }
                if existing!.item.kind == .directory, Self.isInside(identifier, destination) {
                    throw ProviderError(.invalidName, "\(destination) cannot move into itself", errno: EINVAL)
                }
            }
            // Take both subtrees out, then put them back under their new identifiers.
            let moved = Self.takeSubtree(identifier, from: &state)
            let swapped = mode == .exchange ? Self.takeSubtree(destination, from: &state) : []
            Self.putSubtree(moved, from: identifier, to: destination, parent: parent, name: name, in: &state)
            if mode == .exchange {
                Self.putSubtree(
                    swapped, from: destination, to: identifier, parent: source.item.parent, name: source.item.name,
                    in: &state)
            }
            state.time += 1
            return state.nodes[destination]!.item
        }
    }

    public func setAttributes(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws -> ProviderItem {
        try setAttributesSync(identifier, changes)
    }

    /// `setAttributes` at once, when `answersImmediately` (as `itemNow`); else declined.
    public func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem?
    {
        guard answersImmediately else { return nil }
        return try setAttributesSync(identifier, changes)
    }

    private func setAttributesSync(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem
    {
        try state.withLock { state in
            try Self.begin(.setAttributes, needs: .writing, capabilities, in: &state)
            guard var node = state.nodes[identifier] else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone", errno: ENOENT)
            }
            // Without `.storesAttributes` the call succeeds and keeps nothing.
            guard capabilities.contains(.storesAttributes) else { return node.item }
            // The owner first, as Linux's chown: it clears setuid and setgid of a non-directory.
            if capabilities.contains(.storesOwnership), changes.uid != nil || changes.gid != nil,
                var owner = node.item.owner
            {
                owner.uid = changes.uid ?? owner.uid
                owner.gid = changes.gid ?? owner.gid
                node.item.owner = owner
                if node.item.kind != .directory { node.item.permissions &= ~0o6000 }
            }
            if let permissions = changes.permissions, node.item.kind != .symbolicLink {
                node.item.permissions = permissions & 0o7777
            }
            if let time = changes.modificationTime { node.item.modificationTime = time }
            if let time = changes.accessTime { node.item.accessTime = time }
            state.nodes[identifier] = node
            return node.item
        }
    }

    // MARK: Helpers of the write calls (with `state` locked)

    /// Counts the call, then throws what the test queued for it, or `.notSupported` when the
    /// provider lacks `needs`.
    private static func begin(
        _ call: InMemoryWriteCall, needs: ProviderCapabilities, _ capabilities: ProviderCapabilities,
        counting: Bool = true, in state: inout State
    ) throws {
        if counting { state.counters.writeCalls[call, default: 0] += 1 }
        if var queued = state.failures[call], !queued.isEmpty {
            let error = queued.removeFirst()
            state.failures[call] = queued
            throw error
        }
        guard capabilities.isSuperset(of: needs) else { throw ProviderError.notSupported("\(call.rawValue)") }
    }

    static func checkName(_ name: String) throws {
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(0), !name.utf8.contains(UInt8(ascii: "/"))
        else { throw ProviderError(.invalidName, "'\(name)' is not a file name", errno: EINVAL) }
        guard name.utf8.count <= 255 else {
            throw ProviderError(.invalidName, "a name of \(name.utf8.count) bytes is too long", errno: ENAMETOOLONG)
        }
    }

    private static func checkDirectory(_ identifier: ItemIdentifier, state: State) throws {
        guard let node = state.nodes[identifier] else {
            throw ProviderError(.noSuchItem, "\(identifier) is gone", errno: ENOENT)
        }
        guard node.item.kind == .directory else {
            throw ProviderError(.wrongKind, "\(identifier) is not a directory", errno: ENOTDIR)
        }
    }

    /// The identifier of a new item `name` in `parent`, once the name and the parent are good and
    /// the name is free.
    private static func newEntry(_ name: String, in parent: ItemIdentifier, state: State) throws -> ItemIdentifier {
        try checkName(name)
        try checkDirectory(parent, state: state)
        let identifier = child(name, of: parent)
        if state.nodes[identifier] != nil { throw ProviderError(.alreadyExists, "\(identifier) exists", errno: EEXIST) }
        return identifier
    }

    private static func child(_ name: String, of parent: ItemIdentifier) -> ItemIdentifier {
        ItemIdentifier(parent == .root ? name : parent.rawValue + "/" + name)
    }

    /// Whether `identifier` is `ancestor` or inside it.
    private static func isInside(_ identifier: ItemIdentifier, _ ancestor: ItemIdentifier) -> Bool {
        ancestor == .root || identifier == ancestor || identifier.rawValue.hasPrefix(ancestor.rawValue + "/")
    }

    /// Stores a new item (or new content of one) with a new version and time.
    private static func insert(
        _ identifier: ItemIdentifier, parent: ItemIdentifier, name: String, kind: ItemKind,
        content: InMemoryContent?, permissions: UInt16, in state: inout State
    ) -> ProviderItem {
        state.nextVersion += 1
        state.time += 1
        let item = ProviderItem(
            identifier: identifier, parent: parent, name: name, kind: kind, size: content?.size ?? 0,
            modificationTime: ItemTime(seconds: state.time, nanoseconds: Int32(state.nextVersion)),
            contentVersion: ContentVersion("v\(state.nextVersion)"), permissions: permissions, owner: state.ownerOfNew)
        state.nodes[identifier] = Node(item: item, content: content)
        return item
    }

    private static func takeSubtree(_ identifier: ItemIdentifier, from state: inout State) -> [Node] {
        let prefix = identifier.rawValue + "/"
        let taken = state.nodes.values.filter {
            $0.item.identifier == identifier || $0.item.identifier.rawValue.hasPrefix(prefix)
        }
        for node in taken { state.nodes[node.item.identifier] = nil }
        return taken
    }

    /// Puts a subtree taken from `old` back under `new` (its top item named `name` in `parent`);
    /// versions are kept (a move changes no content).
    private static func putSubtree(
        _ nodes: [Node], from old: ItemIdentifier, to new: ItemIdentifier, parent: ItemIdentifier, name: String,
        in state: inout State
    ) {
        func rekey(_ identifier: ItemIdentifier) -> ItemIdentifier {
            identifier == old ? new : ItemIdentifier(new.rawValue + identifier.rawValue.dropFirst(old.rawValue.count))
        }
        for var node in nodes {
            if node.item.identifier == old {
                node.item.parent = parent
                node.item.name = name
            } else {
                node.item.parent = rekey(node.item.parent)
            }
            node.item.identifier = rekey(node.item.identifier)
            state.nodes[node.item.identifier] = node
        }
    }

    private static func readLocalFile(_ path: String) throws -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            throw ProviderError(.io, "open \(path): \(String(cString: strerror(code)))", errno: code)
        }
        defer { close(fd) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                let code = errno
                throw ProviderError(.io, "read \(path): \(String(cString: strerror(code)))", errno: code)
            }
            if count == 0 { return result }
            result += chunk[0..<count]
        }
    }
}

final class InMemoryStream: ContentStream, @unchecked Sendable {
    // Safe: `position` and `gatePassed` are only touched while `lock` is held.
    private let lock = Lock()
    private let provider: InMemoryProvider
    private let identifier: ItemIdentifier
    private let version: ContentVersion
    private var position: Int64
    private let end: Int64
    private var gatePassed = false
    private var closed = false

    init(provider: InMemoryProvider, identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>) {
        self.provider = provider
        self.identifier = identifier
        self.version = version
        self.position = range.lowerBound
        self.end = range.upperBound
    }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        if !lock.withLock({ gatePassed }) {
            await provider.passGate()
            lock.withLock { gatePassed = true }
        }
        try Task.checkCancellation()
        let range = lock.withLock { () -> Range<Int64>? in
            guard !closed, position < end else { return nil }
            return position..<min(end, position + Int64(maximumLength))
        }
        guard let range else { return nil }
        let bytes = try provider.serve(identifier, version: version, range: range)
        lock.withLock { position = range.upperBound }
        return bytes
    }

    func close() { lock.withLock { closed = true } }
}

/// A test provider that changes one behaviour of an InMemoryProvider: every call it does not
/// implement itself goes to `base`.
public protocol InMemoryProviderWrapper: Provider {
    var base: InMemoryProvider { get }
}

extension InMemoryProviderWrapper {
    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try await base.item(for: identifier)
    }

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await base.children(of: identifier)
    }

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await base.fetchContents(of: identifier, version: version, range: range)
    }

    // The write calls, forwarded (a wrapper keeps what its base offers).

    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        try await base.createDirectory(named: name, in: parent, permissions: permissions)
    }

    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String
    ) async throws -> ProviderItem {
        try await base.createSymbolicLink(named: name, in: parent, target: target)
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        try await base.upload(from: localFile, to: target, permissions: permissions, modificationTime: modificationTime)
    }

    public func link(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String
    ) async throws -> ProviderItem {
        try await base.link(identifier, to: parent, named: name)
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        try await base.delete(identifier, kind: kind)
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        try await base.move(identifier, to: parent, named: name, mode: mode)
    }

    public func setAttributes(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws -> ProviderItem {
        try await base.setAttributes(identifier, changes)
    }
}
