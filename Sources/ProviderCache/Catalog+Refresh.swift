// Remote changes the provider does not push (issue 26, D-450): `providerfs refresh PATH` and the
// periodic poll of listed directories. Both end in the path every provider answer takes — a
// listing or item applied (Catalog+Updates.swift): the kernel's caches told, open readers of a
// version that changed get ESTALE, presenters told (D-403). `refresh` first reports the path
// changed, as a provider that pushes changes would (`providerChanged`), so a listing whose change
// token still says unchanged (a local directory) is listed again too.

public import ProviderModel
import SystemSupport

/// What `Catalog.refresh(path:)` found at the path.
public enum RefreshOutcome: Sendable, Equatable {
    /// The item as the provider has it now.
    case present(ProviderItem)
    /// The provider has no item at the path (any the catalog had is gone now).
    case absent
}

extension Catalog {
    /// Asks the provider again about `path` (relative to the provider root, "" the root): the
    /// listing of its directory (its entry: written, created, deleted) and, for a directory, its
    /// own listing. Whatever changed is applied as any provider answer is. Throws what the
    /// provider threw (`.unreachable` when it cannot be asked), `.notFound` for a missing
    /// directory above the path.
    public func refresh(path: String) async throws(CacheError) -> RefreshOutcome {
        let components = path.split(separator: "/").map(String.init)
        var directory = ItemIdentifier.root
        for component in components.dropLast() {
            guard let found = try await child(named: component, of: directory) else {
                throw CacheError(.notFound, "\(path): no such directory '\(component)'")
            }
            guard found.kind == .directory else { throw CacheError(.wrongKind, "\(path): '\(component)' is a file") }
            directory = found.identifier
        }
        guard let name = components.last else {
            try await relist(.root)
            return .present(try await item(.root, maximumAge: .zero))
        }
        try await relist(directory)
        let target = state.withLock { catalog in catalog.names[directory]?[NameKey(name)].flatMap { catalog.items[$0] }
        }
        guard let target else { return .absent }
        guard target.kind == .directory else { return .present(target) }
        try await relist(target.identifier)
        return .present(knownItem(target.identifier) ?? target)
    }

    /// Lists `directory` again now: first told as changed entries (the same report a pushing
    /// provider makes: listing expired, its token void, kernel told), then listed.
    private func relist(_ directory: ItemIdentifier) async throws(CacheError) {
        providerChanged([.entries(directory: directory)])
        _ = try await children(of: directory, maximumAge: .zero)
    }

    /// One pass of the poll (D-450): every directory listed this session whose listing is at
    /// least `olderThan` old is listed again (a provider that tracks listings answers from its
    /// token), oldest first, at most `limit` of them, and the pins told of each (D-445). Failures are left to the next pass and to
    /// lookups (an unreachable provider keeps the cached listing). Returns how many were asked.
    @discardableResult
    public func pollListedDirectories(olderThan: Duration, limit: Int = 4096) async -> Int {
        let now = environment.timeline.now
        let due = state.withLock { catalog in
            catalog.listedAt.filter { now - $0.value >= olderThan }.sorted { $0.value < $1.value }.prefix(limit)
                .map(\.key)
        }
        var asked = 0
        for directory in due {
            if Task.isCancelled { break }
            // Removed by an earlier listing of this pass (a directory deleted with its parent).
            guard state.withLock({ $0.listedAt[directory] != nil }) else { continue }
            asked += 1
            guard (try? await children(of: directory, maximumAge: olderThan)) != nil else { continue }
            // What a poll found is a provider change like a pushed one: pins hear it, so a file
            // that appeared in a pinned folder is downloaded now, not at the next pinned sweep.
            afterProviderChanges.withLock { $0 }?.call([.entries(directory: directory)])
        }
        return asked
    }
}
