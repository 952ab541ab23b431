// What a token allows: reading, or reading and writing.

/// The access a token grants to its scope.
public enum TokenMode: String, Codable, Sendable, Hashable, CaseIterable {
    case read
    case readWrite

    /// Whether a token of this mode may be used for access that needs `needed`.
    public func allows(_ needed: TokenMode) -> Bool {
        self == .readWrite || needed == .read
    }
}
