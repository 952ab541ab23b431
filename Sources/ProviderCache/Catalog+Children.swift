// A lookup of one name in the catalog: `child(named:of:)` and its immediate twin `childNow`
// share one core, `childStep` (the listing's answer, the miss refresh), and record a name the
// provider was asked for alone one way, `recordNamed` (D-512).

public import ProviderModel
import SystemSupport

extension Catalog {
    /// What the core of `child(named:of:)` and `childNow` decides (D-512).
    enum ChildStep {
        /// The cached listing answers: the child, or none (a miss younger than
        /// `missRefreshInterval`).
        case cached(ProviderItem?, tracked: Bool)
        /// The name asked of the provider alone (`recheckMissingChild`; `askedNow` when the
        /// provider answers at once).
        case askName
        /// The listing taken again (`child(named:of:maximumAge:)`); `childNow` declines.
        case list
    }

    /// The core of `child(named:of:)` and `childNow`: the name asked alone where a stale listing
    /// would be listed again for it (`answersByName`), else the listing when younger than
    /// `directoryTTL`, a miss asked again once the listing is `missRefreshInterval` old, so an
    /// item created on the provider is found without waiting for the listing TTL.
    func childStep(named name: String, of directory: ItemIdentifier) -> ChildStep {
        if answersByName(directory, name) { return .askName }
        switch cachedChild(named: name, of: directory, maximumAge: environment.options.directoryTTL) {
        case .found(let item, let tracked): return .cached(item, tracked: tracked)
        case .absent(let listingAge):
            return listingAge < environment.options.missRefreshInterval ? .cached(nil, tracked: false) : .askName
        case .unknown: return .list
        }
    }

    /// The child named `name` (compared byte for byte) of `directory` per the lookup policy
    /// (`childStep`), or nil when there is none; a name the listing lacks is asked again as that
    /// one name when the provider can look names up, else by a new listing.
    public func child(named name: String, of directory: ItemIdentifier) async throws(CacheError) -> ProviderItem? {
        switch childStep(named: name, of: directory) {
        case .cached(let item, _): return item
        case .askName: return try await recheckMissingChild(named: name, of: directory)
        case .list:
            if let found = try await child(named: name, of: directory, maximumAge: environment.options.directoryTTL) {
                return found
            }
            // Listed, and missing: the miss rule on what the listing left.
            guard case .askName = childStep(named: name, of: directory) else { return nil }
            return try await recheckMissingChild(named: name, of: directory)
        }
    }

    /// Whether a lookup of `name` in `directory` asks the provider for that name alone (D-378): a
    /// listing this session took went stale (a change reported since, as every change made
    /// through the mount is, or past its age) and the provider looks names up. Listing again for
    /// one name made `tar x` into a directory list it whole for every file's LOOKUP: quadratic.
    private func answersByName(_ directory: ItemIdentifier, _ name: String) -> Bool {
        guard environment.provider.capabilities.contains(.namedChildLookup),
            state.withLock({ $0.listedAt[directory] != nil || $0.listingsInFlight[directory] != nil }),
            case .unknown = cachedChild(named: name, of: directory, maximumAge: environment.options.directoryTTL)
        else { return false }
        guard environment.provider.capabilities.contains(.listingChangeTracking) else { return true }
        return !revalidateListing(of: directory, with: environment.provider, at: environment.timeline.now)
    }

    /// The immediate twin of `child(named:of:)`: the same answer, from `childStep`, when the
    /// catalog has it or the provider answers the one name at once (a watched local directory);
    /// else `.unknown`. Never waits.
    public func childNow(named name: String, of directory: ItemIdentifier) -> ChildAnswer {
        switch childStep(named: name, of: directory) {
        case .cached(let item?, let tracked): return .found(item, tracked: tracked)
        case .cached(nil, _): return .absent
        case .askName: return askedNow(named: name, of: directory)
        case .list: return .unknown
        }
    }

    /// `recheckMissingChild` when the provider answers at once: recorded the same way
    /// (`recordNamed`), with no task and no thread hop. `.unknown` when the provider declines
    /// or fails (the async path says why) or cannot look one name up (the async path lists).
    private func askedNow(named name: String, of directory: ItemIdentifier) -> ChildAnswer {
        guard let provider = immediateMetadata, provider.capabilities.contains(.namedChildLookup) else {
            return .unknown
        }
        let answer: ImmediateChild
        let (asked, question) = state.withLock { ($0.lastChange[directory] ?? 0, Self.beginQuestion(in: &$0)) }
        defer { endQuestion(question) }
        do { answer = try provider.childNow(named: name, of: directory) } catch { return .unknown }
        let found: ProviderItem?
        switch answer {
        case .declined: return .unknown
        case .absent: found = nil
        case .found(let item): found = item
        }
        guard let recorded = recordNamed(found, named: name, of: directory, asked: asked, question: question) else {
            return .absent
        }
        return .found(recorded.item, tracked: recorded.tracked)
    }

    /// A name the cached listing lacks, asked of the provider again: with a provider that looks
    /// up one name (`.namedChildLookup`), that name alone; otherwise by listing the directory.
    /// A child found is recorded like a listed one. Nil: there is no such child.
    private func recheckMissingChild(
        named name: String, of directory: ItemIdentifier
    ) async throws(CacheError)
        -> ProviderItem?
    {
        let provider = environment.provider
        guard let lookup = provider.capabilities.contains(.namedChildLookup) ? provider : nil else {
            return try await child(named: name, of: directory, maximumAge: .zero)
        }
        let found: ProviderItem?
        let (asked, question) = state.withLock { ($0.lastChange[directory] ?? 0, Self.beginQuestion(in: &$0)) }
        defer { endQuestion(question) }
        do {
            found = try await withDeadline(environment.options.stallTimeout, on: environment.timeline) {
                try await lookup.child(named: name, of: directory)
            }
        } catch {
            let failure = CacheError.from(error)
            switch failure.code {
            // No answer from the provider: the listing we have stands, for a name it has as for
            // one it lacks (D-492: offline, a listed file stays found past the listing's TTL).
            case .unreachable, .timedOut:
                return state.withLock { catalog in
                    catalog.names[directory]?[NameKey(name)].flatMap { catalog.items[$0] }
                }
            case .notFound:
                // The directory kept (D-465): the listing we have stands.
                if providerMissed(directory, askedAt: question) != nil {
                    return state.withLock { catalog in
                        catalog.names[directory]?[NameKey(name)].flatMap { catalog.items[$0] }
                    }
                }
                throw failure
            default: throw failure
            }
        }
        return recordNamed(found, named: name, of: directory, asked: asked, question: question)?.item
    }

    /// The provider's answer for the name alone (`found`, nil: it has none), asked when the
    /// directory's change mark was `asked` (`question`: the question's mark), recorded like a
    /// listed child. Nil: there is no such child. `tracked` as `isTracked(_:)`; false for an
    /// item not at the provider yet.
    private func recordNamed(
        _ found: ProviderItem?, named name: String, of directory: ItemIdentifier, asked: UInt64, question: UInt64
    ) -> (item: ProviderItem, tracked: Bool)? {
        let previous = state.withLock { $0.names[directory]?[NameKey(name)] }
        guard let found else {
            guard let previous else { return nil }
            // Not at the provider yet (D-386).
            if let unborn = unbornItem(previous) { return (unborn, false) }
            // The mount changed the directory while the provider was asked (a birth, a create, a
            // rename): the answer may predate the change and does not undo it (D-392). Else gone
            // from the provider while the listing still has it (unless the mount's own call on
            // its way changes it, D-465).
            let kept =
                changeMark(of: directory) != asked ? knownItem(previous) : providerMissed(previous, askedAt: question)
            return kept.map { ($0, isTracked($0)) }
        }
        // Another identifier under that name in the index is the old holder of the name.
        if let previous, previous != found.identifier { removeItem(previous, origin: .provider) }
        let applied = apply(found, origin: .provider)
        return (applied, isTracked(applied))
    }
}
