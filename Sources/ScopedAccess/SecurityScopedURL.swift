// A security-scoped URL for Linux apps over a ProviderFS mount (docs/SCOPED-ACCESS.md): the
// access path a grant hands over (`MOUNTPOINT/.scoped/<token>/…`, from `providerfs token grant`
// or a picker), started and stopped like Apple's, and kept as bookmarks.

import ControlWire
public import Foundation

/// A URL that may carry a security scope: an access path of a grant, or a plain path.
///
/// Value type; the started state lives in the process (`startAccessingSecurityScopedResource`
/// is reference-counted per process and per grant, as on Apple platforms), so two values of the
/// same grant share it.
public struct SecurityScopedURL: Sendable, Hashable, CustomStringConvertible {
    /// The mount point of the ProviderFS mount the path is in; nil for a path outside any mount.
    public let mountpoint: String?
    /// The grant's token (the secret of the access path); nil for a URL without scope.
    let token: String?
    /// With a token: the path inside the token's directory ("" for a granted folder itself).
    /// Without: the path relative to the mount root, or the absolute path outside a mount.
    let inside: String
    let registry: ScopedAccessRegistry

    /// The URL of `path`: an access path (`MOUNTPOINT/.scoped/<token>/…`) carries the grant's
    /// scope; any other path carries none (start returns false for it).
    public init(path: String) {
        self.init(path: path, registry: .shared)
    }

    /// `init(path:)` of a file URL's path.
    public init(url: URL) {
        self.init(path: url.path)
    }

    package init(path: String, registry: ScopedAccessRegistry) {
        self.registry = registry
        // Resolved up to `.scoped` only: resolving the token's directory would be a lookup
        // through the mount (a check of the token, and an audit entry when it has ended).
        var located = path
        var rest = ""
        if let range = path.range(of: "/.scoped/") {
            located = String(path[..<range.lowerBound]) + "/.scoped"
            rest = String(path[range.upperBound...])
        }
        guard let mount = ControlConnection.mount(containing: located) else {
            (mountpoint, token, inside) = (nil, nil, path)
            return
        }
        let relative = rest.isEmpty ? mount.relativePath : mount.relativePath + "/" + rest
        let components = relative.split(separator: "/", omittingEmptySubsequences: true)
        if components.count >= 2, components[0] == ".scoped" {
            (mountpoint, token) = (mount.mountpoint, String(components[1]))
            inside = components.dropFirst(2).joined(separator: "/")
        } else {
            (mountpoint, token, inside) = (mount.mountpoint, nil, components.joined(separator: "/"))
        }
    }

    package init(mountpoint: String?, token: String?, inside: String, registry: ScopedAccessRegistry) {
        self.mountpoint = mountpoint
        self.token = token
        self.inside = inside
        self.registry = registry
    }

    /// Whether the URL carries a scope (an access path of a grant).
    public var hasSecurityScope: Bool { mountpoint != nil && token != nil }

    var key: ScopedAccessRegistry.Key? {
        guard let mountpoint, let token else { return nil }
        return ScopedAccessRegistry.Key(mountpoint: mountpoint, token: token)
    }

    // MARK: Paths

    /// The path to read and write through. While this process has started the grant: the
    /// access path of the token derived for this process. After the last stop: that same path,
    /// whose token has ended (reads fail with EACCES, as Apple's URL stops working). Before the
    /// first start, and for a URL without scope: the path as handed over.
    public var path: String {
        guard let mountpoint else { return inside }
        guard let key else { return Self.join(mountpoint, inside) }
        let token = registry.derivedToken(key)?.token ?? key.token
        return Self.join(mountpoint, ".scoped/" + token + (inside.isEmpty ? "" : "/" + inside))
    }

    /// `path` as a file URL.
    public var url: URL { URL(fileURLWithPath: path) }

    /// The path as handed over (the grant's own access path, never a derived one).
    public var grantPath: String {
        guard let mountpoint else { return inside }
        guard let token else { return Self.join(mountpoint, inside) }
        return Self.join(mountpoint, ".scoped/" + token + (inside.isEmpty ? "" : "/" + inside))
    }

    /// The URL of `name` inside this one (a folder's child): scoped by the same grant, sharing
    /// its started state (Apple: URLs enumerated from a scoped folder are scoped too).
    public func appending(component name: String) -> SecurityScopedURL {
        SecurityScopedURL(
            mountpoint: mountpoint, token: token, inside: inside.isEmpty ? name : inside + "/" + name,
            registry: registry)
    }

    static func join(_ mountpoint: String, _ relative: String) -> String {
        guard !relative.isEmpty else { return mountpoint }
        return (mountpoint.hasSuffix("/") ? mountpoint : mountpoint + "/") + relative
    }

    /// The path with the token shortened to its first characters (the token is a secret).
    public var description: String {
        guard let mountpoint, let token else { return grantPath }
        let shown = String(token.prefix(12)) + "…"
        return Self.join(mountpoint, ".scoped/" + shown + (inside.isEmpty ? "" : "/" + inside))
    }

    public static func == (lhs: SecurityScopedURL, rhs: SecurityScopedURL) -> Bool {
        (lhs.mountpoint, lhs.token, lhs.inside) == (rhs.mountpoint, rhs.token, rhs.inside)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(mountpoint)
        hasher.combine(token)
        hasher.combine(inside)
    }

    // MARK: Start and stop

    /// Apple: `URL.startAccessingSecurityScopedResource()`. True when this process now has access
    /// (balance it with one `stopAccessingSecurityScopedResource()`); false for a URL without
    /// scope and for a grant that is no longer valid (`lastError` says why). The first start of
    /// a grant in this process asks the mount for a token bound to this process; later ones
    /// count.
    public func startAccessingSecurityScopedResource() -> Bool {
        do {
            try startAccessing()
            return true
        } catch {
            return false
        }
    }

    /// `startAccessingSecurityScopedResource()` that says why it failed.
    public func startAccessing() throws(ScopedAccessError) {
        guard let key else { throw .noScope(path: grantPath) }
        try registry.start(key)
    }

    /// Apple: `URL.stopAccessingSecurityScopedResource()`. Balances one start; the last one ends
    /// this process's access before it returns (reads through `path`, also on descriptors opened
    /// while started, then fail with EACCES). Without a start to balance it does nothing.
    public func stopAccessingSecurityScopedResource() {
        guard let key else { return }
        registry.stop(key)
    }

    /// Whether this process has started the grant (more starts than stops).
    public var isAccessing: Bool { key.map { registry.count($0) > 0 } ?? false }

    /// Why the last start (or the last stop's release) of this grant failed; `.noScope` for a URL
    /// without scope; nil otherwise.
    public var lastError: ScopedAccessError? {
        guard let key else { return .noScope(path: grantPath) }
        return registry.lastError(key)
    }

    /// Runs `body` between a start and a stop; the stop runs on every exit path.
    public func withAccess<T, E: Error>(_ body: () throws(E) -> T) throws -> T {
        try startAccessing()
        defer { stopAccessingSecurityScopedResource() }
        return try body()
    }
}
