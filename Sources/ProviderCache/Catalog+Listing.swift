// Listings as they arrive (D-470) and listings others may keep (D-472): the batch form of
// `children(of:maximumAge:)`, the serial numbers of entries shown before their listing is
// applied, and whether a listing stays current.

public import ProviderModel
import SystemSupport

extension Catalog {
    /// `children(of:maximumAge:)` that, when it lists the directory at the provider now, hands
    /// the children to `batch` as the provider's batches arrive (D-470), each sorted by name, so
    /// a reader can answer with them before the whole directory is read. Not handed over: what
    /// the mount created there and the provider does not have yet (D-386) and what it changed
    /// there since the listing began (D-388) — the listing's answer, as `children(of:)`'s,
    /// has those as the mount made them. Nothing is handed over when the listing kept is fresh
    /// enough or the provider does not list in batches.
    /// `answer`: the listing's answer (what `children(of:maximumAge:)` returns, in no order: it
    /// is not sorted under the catalog's lock), given once, as soon as the catalog holds it: a
    /// listing taken now is saved to the store after it, soon (`saveSoon`, D-486).
    public func children(
        of identifier: ItemIdentifier, maximumAge: Duration?, batch: @escaping @Sendable ([ProviderItem]) -> Void,
        answer: @escaping ([ProviderItem]) -> Void
    ) async throws(CacheError) {
        let answered = Locked(false)
        try await listChildren(of: identifier, maximumAge: maximumAge, batch: batch) { [self] in
            answered.withLock { $0 = true }
            answer(state.withLock { Self.unsortedChildItems(of: identifier, in: $0) })
        }
        if !answered.withLock({ $0 }) { answer(state.withLock { Self.unsortedChildItems(of: identifier, in: $0) }) }
    }

    /// A batch of a listing of `directory` begun at `changeCount`, as `children(of:maximumAge:batch:)`
    /// hands it over.
    func listedBatch(
        _ items: [ProviderItem], of directory: ItemIdentifier, changeCount: UInt64
    ) -> [ProviderItem] {
        let kept = state.withLock { catalog -> [ProviderItem] in
            let changed = catalog.changedWhileListed[directory]?.filter { $0.value.count > changeCount }
            guard !catalog.unborn.isEmpty || changed?.isEmpty == false else { return items }
            return items.filter { !catalog.unborn.contains($0.identifier) && changed?[$0.identifier] == nil }
        }
        return kept.sorted { $0.name < $1.name }
    }

    /// The numbers of listed `items`, in order, as applying their listing gives them (a file with
    /// other names shares theirs, D-396): for entries shown before the listing is applied (D-470).
    public func serialNumbers(ofListed items: [ProviderItem]) -> [UInt64] {
        state.withLock { catalog in
            items.map { catalog.serials.number(for: $0.identifier, link: $0.hardLinkIdentity) }
        }
    }

    /// Whether whoever shows `directory`'s listing may keep showing it until told of a change
    /// (D-472): the provider tells of every change of it (a tracked listing, its token unchanged
    /// or the listing younger than `directoryTTL`), and it is younger than `fullListingInterval`
    /// (what the provider's tracking misses is seen then).
    public func listingStaysCurrent(_ directory: ItemIdentifier) -> Bool {
        guard pushesChanges else { return false }
        let now = environment.timeline.now
        let options = environment.options
        let fresh = state.withLock { catalog -> Bool? in
            guard let tracked = catalog.listingTokens[directory], let at = catalog.listedAt[directory],
                now - tracked.listedAt < options.fullListingInterval
            else { return nil }
            return now - at < options.directoryTTL
        }
        guard let fresh else { return false }
        return fresh || revalidateListing(of: directory, with: environment.provider, at: now)
    }
}
