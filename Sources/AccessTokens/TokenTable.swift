// The authority's records by id, remembering which ids changed since the store last took them:
// the store writes those rows only (D-335), so a change costs the same with 10 or 10,000 tokens.

/// A dictionary of records that notes every id set or removed. Reads are a dictionary's.
struct TokenTable {
    private(set) var byID: [String: TokenRecord] = [:]
    /// Ids set or removed since `takeChanged`.
    private(set) var changed: Set<String> = []

    subscript(id: String) -> TokenRecord? {
        get { byID[id] }
        set {
            byID[id] = newValue
            changed.insert(id)
        }
    }

    var values: Dictionary<String, TokenRecord>.Values { byID.values }
    var keys: Dictionary<String, TokenRecord>.Keys { byID.keys }
    var count: Int { byID.count }
    var isEmpty: Bool { byID.isEmpty }

    @discardableResult
    mutating func removeValue(forKey id: String) -> TokenRecord? {
        changed.insert(id)
        return byID.removeValue(forKey: id)
    }

    /// The ids changed since the last call, each with its record now (nil: removed).
    mutating func takeChanged() -> [(id: String, record: TokenRecord?)] {
        defer { changed = [] }
        return changed.map { ($0, byID[$0]) }
    }

    /// Marks ids changed again (a write that failed; the next save retries them).
    mutating func markChanged<S: Sequence<String>>(_ ids: S) {
        changed.formUnion(ids)
    }

    /// Forgets the changes (records just loaded from the store are not changes).
    mutating func forgetChanges() { changed = [] }
}

extension TokenTable: Sequence {
    /// `(key: id, value: record)` pairs, as a dictionary's.
    func makeIterator() -> Dictionary<String, TokenRecord>.Iterator { byID.makeIterator() }
}
