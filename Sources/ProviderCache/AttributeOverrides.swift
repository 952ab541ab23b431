// chmod and utimens at a provider that does not store them (no `.storesAttributes`): the mount
// keeps them in its own metadata (`attributes` table, migration v3) and shows them in getattr
// (docs/SEMANTICS.md, "Attributes the provider does not store").
//
// The permissions hold until the item is deleted through the mount; the modification time holds
// for the content version it was set on (a new version, written through the mount or at the
// provider, brings its own time).

import Diagnostics
public import ProviderModel
import SystemSupport

/// What the mount shows instead of the provider's metadata for one item.
public struct AttributeOverride: Sendable, Equatable {
    /// Permission bits (mode & 0o7777).
    public var permissions: UInt16?
    public var modificationTime: ItemTime?
    /// The content version `modificationTime` was set on.
    public var version: ContentVersion
    public init(permissions: UInt16?, modificationTime: ItemTime?, version: ContentVersion) {
        self.permissions = permissions
        self.modificationTime = modificationTime
        self.version = version
    }
}

/// Persistence of the overrides. The defaults keep nothing (a store that predates them).
extension MetadataStore {
    public func loadAttributeOverrides() throws -> [ItemIdentifier: AttributeOverride] { [:] }
    public func saveAttributeOverride(_ override: AttributeOverride?, for identifier: ItemIdentifier) throws {}
}

/// The overrides in memory, written through to the store.
final class AttributeOverrides: Sendable {
    private let table: Locked<[ItemIdentifier: AttributeOverride]>
    private let store: any MetadataStore
    private let environment: CacheEnvironment

    init(environment: CacheEnvironment) {
        self.environment = environment
        self.store = environment.store
        var loaded: [ItemIdentifier: AttributeOverride] = [:]
        do { loaded = try environment.store.loadAttributeOverrides() } catch {
            environment.logger.warning("cannot read stored attributes: \(error)")
        }
        table = Locked(loaded)
    }

    /// `item` as the mount shows it.
    func applied(to item: ProviderItem) -> ProviderItem {
        guard let override = table.withLock({ $0.isEmpty ? nil : $0[item.identifier] }) else { return item }
        var item = item
        if let permissions = override.permissions { item.permissions = permissions }
        if let time = override.modificationTime, override.version == item.contentVersion {
            item.modificationTime = time
        }
        return item
    }

    /// Records `changes` for `item` (merged with what is kept).
    func set(_ changes: ItemAttributeChanges, for item: ProviderItem) {
        let override = table.withLock { table -> AttributeOverride in
            var override =
                table[item.identifier]
                ?? AttributeOverride(permissions: nil, modificationTime: nil, version: item.contentVersion)
            if override.version != item.contentVersion {
                override.modificationTime = nil
                override.version = item.contentVersion
            }
            if let permissions = changes.permissions { override.permissions = permissions }
            if let time = changes.modificationTime { override.modificationTime = time }
            table[item.identifier] = override
            return override
        }
        save(override, for: item.identifier)
    }

    func remove(_ identifier: ItemIdentifier) {
        guard table.withLock({ $0.removeValue(forKey: identifier) }) != nil else { return }
        save(nil, for: identifier)
    }

    func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        let moved = table.withLock { table -> [(ItemIdentifier, ItemIdentifier, AttributeOverride)] in
            guard !table.isEmpty else { return [] }
            var moved: [(ItemIdentifier, ItemIdentifier, AttributeOverride)] = []
            for (old, new) in moves {
                if let value = table.removeValue(forKey: old) { moved.append((old, new, value)) }
            }
            for (_, new, value) in moved { table[new] = value }
            return moved
        }
        for (old, new, value) in moved {
            save(nil, for: old)
            save(value, for: new)
        }
    }

    private func save(_ override: AttributeOverride?, for identifier: ItemIdentifier) {
        do { try store.saveAttributeOverride(override, for: identifier) } catch {
            environment.logger.warning("cannot save the attributes of \(identifier): \(error)")
        }
    }
}
