// A wrapper keeps every capability of its base (ProviderCapabilities): for each capability, a base
// that has it, wrapped, still has it and the call reaches the base; a base without it, wrapped,
// still lacks it (and the call answers like the protocol's default).

import ProviderFaults
import ProviderModel
import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Every capability, with a name for messages.
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
}

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
        return try provider.itemNow(for: ItemIdentifier("f"))?.name ?? "nil"
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
    .namedChildLookup: "looked-up", .immediateMetadata: "now",
    .listingChangeTracking: "[\"tracked\"] base token changed: false", .changeNotifying: "pushed",
]
private let defaultAnswers: [ProviderCapabilities: String] = [
    .namedChildLookup: "listed", .immediateMetadata: "nil",
    .listingChangeTracking: "[\"listed\"] no token changed: true", .changeNotifying: "nothing pushed",
]
private let expectedCalls: [ProviderCapabilities: [String]] = [
    .namedChildLookup: ["child"], .immediateMetadata: ["itemNow"],
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
