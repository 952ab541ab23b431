// A deterministic provider held in memory, with call counters and a gate that holds fetches, for
// unit, fault and model tests.

public import ProviderModel
import SystemSupport

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
    }

    let state = Locked(State())

    public init() {
        state.withLock { state in
            state.nodes[.root] = Node(
                item: ProviderItem(
                    identifier: .root, parent: .root, name: "", kind: .directory, size: 0,
                    modificationTime: ItemTime(seconds: state.time), contentVersion: ContentVersion("v0"),
                    permissions: 0o755), content: nil)
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
                contentVersion: ContentVersion("v\(state.nextVersion)"), permissions: kind == .directory ? 0o755 : 0o644
            )
            state.nodes[ItemIdentifier(path)] = Node(item: item, content: content)
        }
    }

    /// Creates a directory (its parent must exist).
    public func addDirectory(_ path: String) { put(path, kind: .directory, content: nil) }

    /// Creates or replaces a file (new version).
    public func putFile(_ path: String, _ content: InMemoryContent) { put(path, kind: .file, content: content) }

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

    /// Immediate metadata: `itemNow(for:)` is offered, and answers only when `answersImmediately`.
    public let capabilities: ProviderCapabilities = .immediateMetadata

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
}
