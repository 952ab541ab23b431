// A wrapper keeps every capability of its base (ProviderCapabilities): for each capability, a base
// that has it, wrapped, still has it and the call reaches the base; a base without it, wrapped,
// still lacks it (and the call answers like the protocol's default).

import ProviderFaults
import ProviderModel
import SystemSupport
import Testing

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
