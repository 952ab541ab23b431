// What start, bookmarkData and bookmark resolution fail with: one case per situation an app
// handles differently, each with a sentence (docs/SCOPED-ACCESS.md).

/// Why a scoped URL gives no access, or a bookmark cannot be made or resolved.
public enum ScopedAccessError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The URL carries no scope: a plain path in a mount, or a file outside any mount. Start
    /// returns false for it (Apple: a URL built from a path). The path may still be readable.
    case noScope(path: String)
    /// The path is not inside a ProviderFS mount (bookmarks of local files are refused).
    case notInMount(path: String)
    /// The grant has ended or never was: expired, revoked, used up, unknown. The daemon's reason.
    case accessEnded(reason: String)
    /// The bookmarked item is gone: its identifier names nothing and its fingerprint was not found
    /// within the grant's scope (or the mount), or the granted item itself is gone.
    case itemGone(reason: String)
    /// The mount is not running, or its daemon did not answer (its control socket).
    case mountUnavailable(reason: String)
    /// The bookmark data is not a bookmark of this format: truncated, damaged, another version.
    case invalidBookmark(reason: String)
    /// The daemon refused or failed for another reason (its sentence).
    case failed(reason: String)

    public var description: String {
        switch self {
        case .noScope(let path): "\(path) carries no security scope (it is not an access path of a grant)"
        case .notInMount(let path): "\(path) is not inside a ProviderFS mount"
        case .accessEnded(let reason): "access has ended: \(reason)"
        case .itemGone(let reason): "the item is gone: \(reason)"
        case .mountUnavailable(let reason): "the mount is not available: \(reason)"
        case .invalidBookmark(let reason): "not a valid bookmark: \(reason)"
        case .failed(let reason): reason
        }
    }
}
