// The serial number of every item the catalog holds: what stat(2) shows as st_ino. An item keeps
// its number for its whole life in a mount (rename, upload, new versions at the provider) and
// across remounts with the same cache (it is saved with the item); a number another item still
// has is never handed out. The FUSE node id is something else (VirtualFileSystem's InodeTable):
// it may change with the kernel's references, the serial number may not (D-389).

import ProviderModel

/// A pure table (guarded by the catalog's lock) of serial numbers by identifier.
struct ItemSerials {
    /// The root's number: 1, as on most FUSE file systems.
    static let root: UInt64 = 1

    private(set) var numbers: [ItemIdentifier: UInt64] = [.root: ItemSerials.root]
    /// The next number to hand out: above every number in `numbers` and every one handed out
    /// in this session, so a number is never handed out twice while its item exists.
    private(set) var next: UInt64 = ItemSerials.root + 1
    /// Numbers more than one identifier holds: the names of one file with hard links (D-396),
    /// with those names. A number with one name is not here.
    private(set) var groups: [UInt64: Set<ItemIdentifier>] = [:]
    /// A provider's `hardLinkIdentity` → the number its names share and one name holding it
    /// (checked before use: it may have moved or gone).
    private var byLink: [String: (number: UInt64, holder: ItemIdentifier)] = [:]

    subscript(_ identifier: ItemIdentifier) -> UInt64? { numbers[identifier] }

    /// How many names the catalog knows for the item's file: st_nlink (1 without hard links).
    func linkCount(of identifier: ItemIdentifier) -> Int {
        guard !groups.isEmpty, let number = numbers[identifier] else { return 1 }
        return groups[number]?.count ?? 1
    }

    /// The other names of the item's file, in no order.
    func otherNames(of identifier: ItemIdentifier) -> [ItemIdentifier] {
        guard !groups.isEmpty, let number = numbers[identifier], let names = groups[number] else { return [] }
        return names.filter { $0 != identifier }
    }

    /// The number of `identifier`, whose provider item has the hard-link identity `link`: the
    /// number its other names have, when the catalog knows one (D-396). Two groups found to be
    /// one file (names numbered before the catalog saw them linked) take the lower number.
    @discardableResult
    mutating func number(for identifier: ItemIdentifier, link: String?) -> UInt64 {
        guard let link, identifier != .root else { return number(for: identifier) }
        let own = numbers[identifier]
        guard let known = byLink[link], let holder = liveHolder(of: known.number, known.holder) else {
            let number = own ?? number(for: identifier)
            byLink[link] = (number, identifier)
            return number
        }
        if own == known.number { return known.number }
        if let own, own < known.number {
            let moving = groups.removeValue(forKey: known.number) ?? [holder]
            for name in moving { numbers[name] = own }
            groups[own, default: [identifier]].formUnion(moving)
            byLink[link] = (own, identifier)
            return own
        }
        join(identifier, known.number, holder: holder)
        return known.number
    }

    /// A new name `identifier` of the file `existing` has (link(2) through the mount): its number.
    @discardableResult
    mutating func share(_ identifier: ItemIdentifier, with existing: ItemIdentifier, link: String?) -> UInt64 {
        let number = number(for: existing)
        join(identifier, number, holder: existing)
        if let link { byLink[link] = (number, existing) }
        return number
    }

    /// A name holding `number`: `holder` if it still does, else any name of its group.
    private func liveHolder(of number: UInt64, _ holder: ItemIdentifier) -> ItemIdentifier? {
        if numbers[holder] == number { return holder }
        return groups[number]?.first
    }

    /// `identifier` takes `number`, which `holder` has.
    private mutating func join(_ identifier: ItemIdentifier, _ number: UInt64, holder: ItemIdentifier) {
        guard identifier != .root, numbers[identifier] != number else { return }
        leave(identifier)
        numbers[identifier] = number
        if groups[number] != nil {
            groups[number]!.insert(identifier)
        } else if holder != identifier, numbers[holder] == number {
            groups[number] = [holder, identifier]
        }
    }

    /// `identifier` is no longer one of its group's names.
    private mutating func leave(_ identifier: ItemIdentifier) {
        guard !groups.isEmpty, let number = numbers[identifier], groups[number] != nil else { return }
        groups[number]!.remove(identifier)
        if groups[number]!.count < 2 { groups[number] = nil }
    }

    /// The number of `identifier`, handed out now if it has none.
    @discardableResult
    mutating func number(for identifier: ItemIdentifier) -> UInt64 {
        if let number = numbers[identifier] { return number }
        let number = next
        next += 1
        numbers[identifier] = number
        return number
    }

    /// A number kept from an earlier session (0: none was kept; one is handed out then).
    /// Returns whether `identifier` got a new number (its stored row should be saved again).
    mutating func restore(_ identifier: ItemIdentifier, _ stored: UInt64) -> Bool {
        guard identifier != .root else { return false }
        guard stored > ItemSerials.root else {
            numbers[identifier] = nil
            return true
        }
        numbers[identifier] = stored
        next = max(next, stored + 1)
        return false
    }

    /// Hands out numbers to the identifiers `restore` left without one (after every stored
    /// number is known, so that none of them is handed out again).
    mutating func numberRestored(_ identifiers: [ItemIdentifier]) {
        for identifier in identifiers { number(for: identifier) }
        // Names that kept one number are the names of one file (D-396).
        var first: [UInt64: ItemIdentifier] = [:]
        for (identifier, number) in numbers where identifier != .root {
            if let holder = first.updateValue(identifier, forKey: number) {
                groups[number, default: [holder]].insert(identifier)
            }
        }
    }

    /// The item is gone: its number goes with it.
    mutating func remove(_ identifier: ItemIdentifier) {
        guard identifier != .root else { return }
        leave(identifier)
        numbers[identifier] = nil
    }

    /// A new item under an identifier an earlier one had: a new number.
    mutating func renew(_ identifier: ItemIdentifier) {
        guard identifier != .root else { return }
        leave(identifier)
        numbers[identifier] = nil
        number(for: identifier)
    }

    /// Numbers taken out before their items were forgotten (an exchange), put back: the items,
    /// listed again, get them.
    mutating func restoreKept(_ kept: [ItemIdentifier: UInt64]) {
        for (identifier, number) in kept where identifier != .root { numbers[identifier] = number }
        // Names of one file among them (or with names elsewhere) are one group again (D-396).
        let restored = Set(kept.values)
        var holders: [UInt64: Set<ItemIdentifier>] = [:]
        for (identifier, number) in numbers where identifier != .root && restored.contains(number) {
            holders[number, default: []].insert(identifier)
        }
        for (number, names) in holders where names.count > 1 { groups[number] = names }
    }

    /// Identifiers re-keyed (a move at a provider whose identifiers are paths): each number
    /// follows its item. `moves` may swap identifiers (an exchange).
    mutating func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        guard !moves.isEmpty else { return }
        var moved: [(ItemIdentifier, UInt64)] = []
        for (old, new) in moves where old != .root {
            if let number = numbers.removeValue(forKey: old) {
                moved.append((new, number))
                if !groups.isEmpty, groups[number] != nil { groups[number]!.remove(old) }
            }
        }
        for (new, number) in moved {
            numbers[new] = number
            if !groups.isEmpty, groups[number] != nil { groups[number]!.insert(new) }
        }
    }

    /// Every identifier with a number for which `transform` gives a new one (an exchange swaps
    /// two subtrees), re-keyed.
    mutating func rekey(_ transform: (ItemIdentifier) -> ItemIdentifier?) {
        var moves: [ItemIdentifier: ItemIdentifier] = [:]
        for identifier in numbers.keys { if let new = transform(identifier) { moves[identifier] = new } }
        rekey(moves)
    }
}
