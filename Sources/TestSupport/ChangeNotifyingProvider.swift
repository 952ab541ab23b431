// A provider that pushes changes (`.changeNotifying`) under the test's control: `report` voids the
// tokens of the directories it names (every token for nil) and hands the changes to the observer
// on the calling thread, as a real provider's watcher would soon after the change.

public import ProviderModel
import SystemSupport

public final class ChangeNotifyingProvider: InMemoryProviderWrapper {
    public let base: InMemoryProvider
    /// Change tracking and pushed changes, plus the base's write capabilities (its write calls are
    /// forwarded by `InMemoryProviderWrapper`).
    public let capabilities: ProviderCapabilities
    private struct State {
        var generations: [ItemIdentifier: UInt64] = [:]
        /// A number per directory listed, carried in its tokens.
        var directories: [UInt64: ItemIdentifier] = [:]
        var numbers: [ItemIdentifier: UInt64] = [:]
        var observer: (@Sendable ([ProviderChange]?) -> Void)?
        /// The next listing is taken at once and returned only when released.
        var holdNext = false
        var held: CheckedContinuation<Void, Never>?
        var released = false
    }
    private let state = Locked(State())

    public init(base: InMemoryProvider) {
        self.base = base
        capabilities = base.capabilities.intersection([.writing, .symbolicLinks, .exchangingMoves, .storesAttributes])
            .union([.listingChangeTracking, .changeNotifying])
    }

    public func trackedChildren(
        of directory: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        let token = state.withLock { state in
            let number =
                state.numbers[directory]
                ?? {
                    let number = UInt64(state.numbers.count + 1)
                    state.numbers[directory] = number
                    state.directories[number] = directory
                    return number
                }()
            return ListingChangeToken(watch: 1, serial: number, generation: state.generations[directory, default: 0])
        }
        let listed = try await base.children(of: directory)
        let hold = state.withLock { state -> Bool in
            defer { state.holdNext = false }
            return state.holdNext
        }
        if hold {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let go = state.withLock { state -> Bool in
                    if state.released { return true }
                    state.held = continuation
                    return false
                }
                if go { continuation.resume() }
            }
        }
        return (listed, token)
    }

    public func hasChanges(since token: ListingChangeToken) -> Bool {
        state.withLock { state in
            guard let directory = state.directories[token.serial] else { return true }
            return state.generations[directory, default: 0] != token.generation
        }
    }

    public func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        state.withLock { $0.observer = observer }
    }

    public func downloadEnded(of identifier: ItemIdentifier, version: ContentVersion, succeeded: Bool) {
        base.downloadEnded(of: identifier, version: version, succeeded: succeeded)
    }

    /// Reports `changes` (nil: events were lost) after voiding the tokens concerned.
    public func report(_ changes: [ProviderChange]?) {
        let observer = state.withLock { state -> (@Sendable ([ProviderChange]?) -> Void)? in
            if let changes {
                for change in changes {
                    switch change {
                    case .entry(let directory, _), .membership(let directory, _), .entries(let directory):
                        state.generations[directory, default: 0] += 1
                    }
                }
            } else {
                for directory in state.numbers.keys { state.generations[directory, default: 0] += 1 }
            }
            return state.observer
        }
        observer?(changes)
    }

    /// The next listing is taken at once but returned only after `releaseListing()`.
    public func holdNextListing() { state.withLock { $0.holdNext = true } }
    public var isHoldingListing: Bool { state.withLock { $0.held != nil } }
    public func releaseListing() {
        let held = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.released = true
            defer { state.held = nil }
            return state.held
        }
        held?.resume()
    }
}
