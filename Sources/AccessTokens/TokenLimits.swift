// The authority's bounds, as one value (tests shrink them).

/// Limits of a `TokenAuthority`.
public struct TokenLimits: Sendable {
    /// The longest TTL a grant may ask for.
    public var maximumTTL: Duration = .seconds(365 * 24 * 3600)
    /// Denials per user within `denialWindow` before further checks are refused unread.
    public var deniedPerWindow: Int = 20
    public var denialWindow: Duration = .seconds(1)
    /// Audit entries kept (memory and file).
    public var auditEntries: Int = 10_000
    /// Ended tokens remembered, so a check can say "expired" or "revoked" rather than "unknown".
    public var endedTokens: Int = 1_000

    public init() {}
}
