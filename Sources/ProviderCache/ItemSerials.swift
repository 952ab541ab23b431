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

    subscript(_ identifier: ItemIdentifier) -> UInt64? { numbers[identifier] }

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
    }

    /// The item is gone: its number goes with it.
    mutating func remove(_ identifier: ItemIdentifier) {
        guard identifier != .root else { return }
        numbers[identifier] = nil
    }

    /// A new item under an identifier an earlier one had: a new number.
    mutating func renew(_ identifier: ItemIdentifier) {
        guard identifier != .root else { return }
        numbers[identifier] = nil
        number(for: identifier)
    }

    /// Numbers taken out before their items were forgotten (an exchange), put back: the items,
    /// listed again, get them.
    mutating func restoreKept(_ kept: [ItemIdentifier: UInt64]) {
        for (identifier, number) in kept where identifier != .root { numbers[identifier] = number }
    }

    /// Identifiers re-keyed (a move at a provider whose identifiers are paths): each number
    /// follows its item. `moves` may swap identifiers (an exchange).
    mutating func rekey(_ moves: [ItemIdentifier: ItemIdentifier]) {
        guard !moves.isEmpty else { return }
        var moved: [(ItemIdentifier, UInt64)] = []
        for (old, new) in moves where old != .root {
            if let number = numbers.removeValue(forKey: old) { moved.append((new, number)) }
        }
        for (new, number) in moved { numbers[new] = number }
    }

    /// Every identifier with a number for which `transform` gives a new one (an exchange swaps
    /// two subtrees), re-keyed.
    mutating func rekey(_ transform: (ItemIdentifier) -> ItemIdentifier?) {
        var moves: [ItemIdentifier: ItemIdentifier] = [:]
        for identifier in numbers.keys { if let new = transform(identifier) { moves[identifier] = new } }
        rekey(moves)
    }
}
