// A wrapper keeps every capability of its base (ProviderCapabilities): for each capability, a base
// that has it, wrapped, still has it and the call reaches the base; a base without it, wrapped,
// still lacks it (and the call answers like the protocol's default).

import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Every capability that has calls of its own here, with a name for messages (the write
/// capabilities are tested together below).
private let everyCapability: [(name: String, capability: ProviderCapabilities)] = [
    ("namedChildLookup", .namedChildLookup), ("immediateMetadata", .immediateMetadata),
    ("listingChangeTracking", .listingChangeTracking), ("changeNotifying", .changeNotifying),
]

private func makeItem(_ name: String) -> ProviderItem {
    ProviderItem(
        identifier: ItemIdentifier(name), parent: .root, name: name, kind: .file, size: 1,
        modificationTime: ItemTime(seconds: 1), contentVersion: ContentVersion("v1"))
}

/// The token the recording provider hands out (the default gives none).
private let baseToken = ListingChangeToken(watch: 7, serial: 7, generation: 7)

/// Implements every optional call with answers of its own (unlike the defaults), records each
/// call, and reports the capabilities it is given.
private final class RecordingProvider: Provider {
    let capabilities: ProviderCapabilities
    let calls = Locked<[String]>([])
    init(_ capabilities: ProviderCapabilities) { self.capabilities = capabilities }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem { makeItem(identifier.rawValue) }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] { [makeItem("listed")] }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        DirectStream(calls: calls)
    }

    func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        calls.withLock { $0.append("child") }
        return makeItem("looked-up")
    }
    func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? {
        calls.withLock { $0.append("itemNow") }
        return makeItem("now")
    }
    func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild {
        calls.withLock { $0.append("childNow") }
        return .found(makeItem("child-now"))
    }
    func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        calls.withLock { $0.append("trackedChildren") }
        return ([makeItem("tracked")], baseToken)
    }
    func hasChanges(since token: ListingChangeToken) -> Bool {
        calls.withLock { $0.append("hasChanges") }
        return false
    }
    func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        calls.withLock { $0.append("observeChanges") }
        observer?([.entries(directory: ItemIdentifier("pushed"))])
    }

    func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        calls.withLock { $0.append("createDirectory") }
        return makeItem("made-\(name)")
    }
    func createSymbolicLink(named name: String, in parent: ItemIdentifier, target: String) async throws -> ProviderItem
    {
        calls.withLock { $0.append("createSymbolicLink") }
        return makeItem("linked-\(name)")
    }
    func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        calls.withLock { $0.append("upload") }
        return makeItem("uploaded")
    }
    func link(_ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String) async throws -> ProviderItem
    {
        calls.withLock { $0.append("link") }
        return makeItem("hard-\(name)")
    }
    func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        calls.withLock { $0.append("delete") }
    }
    func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        calls.withLock { $0.append("move") }
        return makeItem("moved-\(name)")
    }
    func setAttributes(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) async throws -> ProviderItem {
        calls.withLock { $0.append("setAttributes") }
        return makeItem("attributed")
    }
}

/// Every write call, made on `provider`: what each answered (the item's name, "done", or the
/// error's code), in order.
private func exerciseWrites(on provider: any Provider) async -> [String] {
    func answer(_ body: () async throws -> String) async -> String {
        do { return try await body() } catch { return ProviderError.from(error).code.rawValue }
    }
    let file = ItemIdentifier("f")
    return [
        await answer { try await provider.createDirectory(named: "d", in: .root, permissions: 0o755).name },
        await answer { try await provider.createSymbolicLink(named: "l", in: .root, target: "f").name },
        await answer {
            try await provider.upload(
                from: "/dev/null", to: .replace(file, baseVersion: nil), permissions: nil, modificationTime: nil
            ).name
        },
        await answer { try await provider.move(file, to: .root, named: "g", mode: .exchange).name },
        await answer { try await provider.setAttributes(file, ItemAttributeChanges(permissions: 0o600)).name },
        await answer { try await provider.link(file, to: .root, named: "h").name },
        await answer {
            try await provider.delete(file, kind: .file)
            return "done"
        },
    ]
}

private let writeCalls = [
    "createDirectory", "createSymbolicLink", "upload", "move", "setAttributes", "link", "delete",
]
private let writeCapabilities: ProviderCapabilities = [
    .writing, .symbolicLinks, .exchangingMoves, .storesAttributes, .hardLinks,
]

/// Only the three required calls: every optional one is the protocol's default.
private struct PlainProvider: Provider {
    let capabilities: ProviderCapabilities = []
    func item(for identifier: ItemIdentifier) async throws -> ProviderItem { makeItem(identifier.rawValue) }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] { [makeItem("listed")] }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        throw ProviderError(.io, "no content")
    }
}

/// A stream with a transfer of its own, recorded.
private final class DirectStream: ContentStream {
    let calls: Locked<[String]>
    init(calls: Locked<[String]>) { self.calls = calls }
    var capabilities: ContentStreamCapabilities { .directTransfer }
    func next(maximumLength: Int) async throws -> [UInt8]? { [1] }
    func close() {}
    func transfer(
        to descriptor: Int32, at offset: Int64, firstStep: Int, step: Int, maximumLength: Int,
        delivered: @escaping @Sendable (Int) -> Bool
    ) async throws -> Int? {
        calls.withLock { $0.append("transfer") }
        return 42
    }
}

/// Calls what `capability` offers on `provider`; says what came back (the recording provider's
/// answers and the defaults' differ, so the answer tells who answered).
private func exercise(_ capability: ProviderCapabilities, on provider: any Provider) async throws -> String {
    switch capability {
    case .namedChildLookup:
        return try await provider.child(named: "listed", of: .root)?.name ?? "nil"
    case .immediateMetadata:
        let item = try provider.itemNow(for: ItemIdentifier("f"))?.name ?? "nil"
        let child: String
        switch try provider.childNow(named: "f", of: .root) {
        case .found(let found): child = found.name
        case .absent: child = "absent"
        case .declined: child = "declined"
        }
        return "\(item) \(child)"
    case .listingChangeTracking:
        let (children, token) = try await provider.trackedChildren(of: .root)
        return
            "\(children.map(\.name)) \(token == baseToken ? "base token" : token == nil ? "no token" : "other token")"
            + " changed: \(provider.hasChanges(since: baseToken))"
    case .changeNotifying:
        let seen = Locked<[[ProviderChange]?]>([])
        provider.observeChanges { changes in seen.withLock { $0.append(changes) } }
        return seen.withLock { $0 }.isEmpty ? "nothing pushed" : "pushed"
    default:
        Issue.record("unknown capability \(capability)")
        return ""
    }
}

/// What the recording provider answers for each capability, and what the defaults answer.
private let baseAnswers: [ProviderCapabilities: String] = [
    .namedChildLookup: "looked-up", .immediateMetadata: "now child-now",
    .listingChangeTracking: "[\"tracked\"] base token changed: false", .changeNotifying: "pushed",
]
private let defaultAnswers: [ProviderCapabilities: String] = [
    .namedChildLookup: "listed", .immediateMetadata: "nil declined",
    .listingChangeTracking: "[\"listed\"] no token changed: true", .changeNotifying: "nothing pushed",
]
private let expectedCalls: [ProviderCapabilities: [String]] = [
    .namedChildLookup: ["child"], .immediateMetadata: ["itemNow", "childNow"],
    .listingChangeTracking: ["trackedChildren", "hasChanges"], .changeNotifying: ["observeChanges"],
]

@Suite("A wrapper keeps each capability of its base")
struct WrapperCapabilityTests {
    @Test("a base with the capability: the wrapper has it and the call reaches the base")
    func keepsWhatTheBaseHas() async throws {
        for (name, capability) in everyCapability {
            let base = RecordingProvider(capability)
            let wrapped = FaultInjectingProvider(wrapping: base, plan: FaultPlan())
            #expect(wrapped.capabilities == capability, "\(name)")
            #expect(try await exercise(capability, on: wrapped) == baseAnswers[capability], "\(name)")
            #expect(base.calls.withLock { $0 } == expectedCalls[capability], "\(name)")
        }
        let all = RecordingProvider(everyCapability.reduce([]) { $0.union($1.capability) })
        #expect(FaultInjectingProvider(wrapping: all, plan: FaultPlan()).capabilities == all.capabilities)
    }

    @Test("a base without the capability: the wrapper lacks it too")
    func lacksWhatTheBaseLacks() async throws {
        let every = everyCapability.reduce(ProviderCapabilities()) { $0.union($1.capability) }
        for (name, capability) in everyCapability {
            let others = RecordingProvider(every.subtracting(capability))
            #expect(!FaultInjectingProvider(wrapping: others, plan: FaultPlan()).capabilities.contains(capability))

            let wrapped = FaultInjectingProvider(wrapping: PlainProvider(), plan: FaultPlan())
            #expect(wrapped.capabilities.isEmpty, "\(name)")
            // The call still answers, the way the protocol's default does (declines, or the slow way).
            #expect(try await exercise(capability, on: wrapped) == defaultAnswers[capability], "\(name)")
        }
    }

    @Test("every write call reaches the base through the fault wrapper, and its capabilities stay")
    func writesReachTheBase() async throws {
        let base = RecordingProvider(writeCapabilities)
        let wrapped = FaultInjectingProvider(wrapping: base, plan: FaultPlan())
        #expect(wrapped.capabilities == writeCapabilities)
        #expect(
            await exerciseWrites(on: wrapped) == [
                "made-d", "linked-l", "uploaded", "moved-g", "attributed", "hard-h", "done",
            ])
        #expect(base.calls.withLock { $0 } == writeCalls)

        // With rules in the plan (none about these items) the calls still reach the base.
        let other = RecordingProvider(writeCapabilities)
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("elsewhere"), fault: .truncate(offset: 1))])
        _ = await exerciseWrites(on: FaultInjectingProvider(wrapping: other, plan: plan))
        #expect(other.calls.withLock { $0 } == writeCalls)

        // A base without writing: the wrapper declines like the protocol's defaults.
        let plain = FaultInjectingProvider(wrapping: PlainProvider(), plan: FaultPlan())
        #expect(!plain.capabilities.contains(.writing))
        #expect(await exerciseWrites(on: plain) == Array(repeating: "notSupported", count: 7))
    }

    @Test(
        "every write call reaches the in-memory base through ChangeNotifyingProvider, which keeps its write capabilities"
    )
    func changeNotifyingForwardsWrites() async throws {
        let base = InMemoryProvider()
        base.putFile("f", .bytes([1, 2, 3]))
        let wrapped = ChangeNotifyingProvider(base: base)
        // The in-memory provider has no hard links (an item has one parent and one name).
        #expect(wrapped.capabilities.isSuperset(of: writeCapabilities.subtracting(.hardLinks)))
        #expect(!wrapped.capabilities.contains(.hardLinks))
        let answers = await exerciseWrites(on: wrapped)
        // The exchange of "f" with a missing "g" is refused by the base itself (ENOENT).
        #expect(answers == ["d", "l", "f", "noSuchItem", "f", "notSupported", "done"])
        for call in InMemoryWriteCall.allCases { #expect(base.writeCount(call) == 1, "\(call)") }

        let readOnly = ChangeNotifyingProvider(base: InMemoryProvider(capabilities: .immediateMetadata))
        #expect(readOnly.capabilities.isDisjoint(with: writeCapabilities))
        #expect(await exerciseWrites(on: readOnly) == Array(repeating: "notSupported", count: 7))
    }

    @Test("a content stream keeps its direct transfer through the wrapper; a faulty one deliberately has none")
    func streamsKeepDirectTransfer() async throws {
        let base = RecordingProvider([])
        let plan = FaultPlan()
        let wrapped = FaultInjectingProvider(wrapping: base, plan: plan)
        let stream = try await wrapped.fetchContents(
            of: ItemIdentifier("f"), version: ContentVersion("v1"), range: 0..<10)
        #expect(stream.capabilities.contains(.directTransfer))
        let placed = try await stream.transfer(
            to: -1, at: 0, firstStep: 1, step: 1, maximumLength: 1, delivered: { _ in true })
        #expect(placed == 42)
        #expect(base.calls.withLock { $0 } == ["transfer"])

        // A fault applies to the bytes of `next`: the faulty stream offers no transfer of its own.
        plan.add(FaultRule(identifier: ItemIdentifier("f"), fault: .truncate(offset: 5)))
        let faulty = try await wrapped.fetchContents(
            of: ItemIdentifier("f"), version: ContentVersion("v1"), range: 0..<10)
        #expect(!faulty.capabilities.contains(.directTransfer))
    }
}

/// Hands out `bytes` through `next` only (no transfer of its own).
private final class BytesStream: ContentStream {
    let bytes: [UInt8]
    let position = Locked(0)
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    func next(maximumLength: Int) async throws -> [UInt8]? {
        position.withLock { position in
            guard position < bytes.count else { return nil }
            let end = min(bytes.count, position + maximumLength)
            defer { position = end }
            return Array(bytes[position..<end])
        }
    }
    func close() {}
}

private struct BytesProvider: Provider {
    let capabilities: ProviderCapabilities = []
    func item(for identifier: ItemIdentifier) async throws -> ProviderItem { makeItem(identifier.rawValue) }
    func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] { [] }
    func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        BytesStream(Array(1...10))
    }
}

@Suite("ContentStream's default transfer")
struct DefaultTransferTests {
    /// A temporary file's descriptor (unlinked at once) and its bytes after `body`.
    private func withFile(_ body: (Int32) async throws -> Void) async throws -> [UInt8] {
        var template = Array("/tmp/providerfs-transfer-XXXXXX".utf8CString)
        let fd = mkstemp(&template)
        try #require(fd >= 0)
        unlink(template)
        defer { close(fd) }
        try await body(fd)
        var contents = [UInt8](repeating: 0, count: 64)
        let count = pread(fd, &contents, contents.count, 0)
        return Array(contents[0..<max(0, count)])
    }

    @Test("a stream without a transfer of its own places its chunks through next, at the offset asked")
    func throughNext() async throws {
        let delivered = Locked<[Int]>([])
        let placed = Locked<[Int?]>([])
        let contents = try await withFile { fd in
            let stream = BytesStream(Array(1...10))
            #expect(stream.capabilities.isEmpty)
            for at in [2, 6, 10, 12] as [Int64] {
                let count = try await stream.transfer(
                    to: fd, at: at, firstStep: 4, step: 4, maximumLength: 100,
                    delivered: { count in
                        delivered.withLock { $0.append(count) }
                        return true
                    })
                placed.withLock { $0.append(count) }
            }
        }
        #expect(placed.withLock { $0 } == [4, 4, 2, nil])
        #expect(delivered.withLock { $0 } == [4, 4, 2])
        #expect(contents == [0, 0] + Array(1...10))
    }

    @Test("through a faulty stream (no transfer of its own) the fault still applies")
    func faultApplies() async throws {
        let plan = FaultPlan([FaultRule(identifier: ItemIdentifier("f"), fault: .truncate(offset: 3))])
        let wrapped = FaultInjectingProvider(wrapping: BytesProvider(), plan: plan)
        let contents = try await withFile { fd in
            let stream = try await wrapped.fetchContents(
                of: ItemIdentifier("f"), version: ContentVersion("v1"), range: 0..<10)
            #expect(!stream.capabilities.contains(.directTransfer))
            let first = try await stream.transfer(
                to: fd, at: 0, firstStep: 8, step: 8, maximumLength: 8, delivered: { _ in true })
            #expect(first == 3)
            let second = try await stream.transfer(
                to: fd, at: 3, firstStep: 8, step: 8, maximumLength: 8, delivered: { _ in true })
            #expect(second == nil)
        }
        #expect(contents == [1, 2, 3])
    }
}
