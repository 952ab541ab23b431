// Turning a URL into what the arbiter keys claims by: canonical path, device+inode, package root.
// Bad input is rejected here, before anything reaches a server: non-file or relative URLs, NUL
// bytes, names over NAME_MAX, paths over PATH_MAX.

package import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How ProviderFS marks a directory as a file package on Linux (Linux has no bundle bit): the
/// directory contains an entry with this name. A package and everything inside it is coordinated
/// as one item (rules 8–9, 19). Decision D-104.
package let filePackageMarkerName = ".providerfs-package"

/// An item as the arbiter sees it.
package struct ResolvedItem: Sendable, Hashable {
    /// Canonical absolute path.
    package var path: String
    /// Device and inode when the item exists.
    package var identity: ItemIdentity?
    /// Whether the item is a directory.
    package var isDirectory: Bool
    /// The outermost package containing (or being) the item.
    package var packageRoot: String?
}

/// URL validation and canonicalisation.
package enum ItemResolver {
    /// Longest name component accepted (Linux NAME_MAX).
    package static let nameMax = 255
    /// Longest path accepted (Linux PATH_MAX, including the terminating NUL).
    package static let pathMax = 4096

    /// Checks that `url` names a local file by absolute path, and returns the path.
    package static func validatedPath(_ url: URL) throws(CoordinationError) -> String {
        guard url.isFileURL else {
            throw CoordinationError(
                .invalidURL, "'\(url.absoluteString)' is not a file URL; only file URLs can be coordinated.")
        }
        // The encoded path is the path itself unless something in it is percent-encoded; decoding
        // (url.path) costs more than the rest of the check, so it is done only when needed.
        let encoded = url.path(percentEncoded: true)
        let scan = PathScan(encoded)
        if scan.hasPercent { return try validatedPath(url.path) }
        return try validated(encoded, scan)
    }

    /// Checks an absolute path: no NUL, no component over NAME_MAX, not over PATH_MAX.
    package static func validatedPath(_ path: String) throws(CoordinationError) -> String {
        try validated(path, PathScan(path))
    }

    /// What one pass over a path's bytes found (no allocation: this runs on every coordination).
    private struct PathScan {
        var isAbsolute = false
        var length = 0
        var longestComponent = 0
        var hasNUL = false
        var hasPercent = false

        init(_ path: String) {
            // Over the contiguous bytes when the string has them (a native string does): a loop
            // over a buffer is several times faster than one over the UTF-8 view.
            if let scan = path.utf8.withContiguousStorageIfAvailable({ PathScan($0) }) {
                self = scan
            } else {
                self.init(path.utf8)
            }
        }

        @inline(__always)
        private init<Bytes: Sequence<UInt8>>(_ bytes: Bytes) {
            var componentLength = 0
            for byte in bytes {
                if length == 0 { isAbsolute = byte == UInt8(ascii: "/") }
                length += 1
                if byte == UInt8(ascii: "/") {
                    componentLength = 0
                    continue
                }
                if byte == 0 { hasNUL = true }
                if byte == UInt8(ascii: "%") { hasPercent = true }
                componentLength += 1
                if componentLength > longestComponent { longestComponent = componentLength }
            }
        }
    }

    private static func validated(_ path: String, _ scan: PathScan) throws(CoordinationError) -> String {
        guard scan.isAbsolute else {
            throw CoordinationError(.invalidURL, "'\(path)' is a relative path; coordination needs an absolute path.")
        }
        guard !scan.hasNUL else {
            throw CoordinationError(.invalidURL, "The path contains a NUL byte.")
        }
        guard scan.length < pathMax else {
            throw CoordinationError(.invalidURL, "The path is longer than PATH_MAX (\(pathMax) bytes).")
        }
        guard scan.longestComponent <= nameMax else {
            throw CoordinationError(
                .invalidURL, "A name in '\(path)' is longer than NAME_MAX (\(nameMax) bytes).")
        }
        return path
    }

    /// Resolves `path` (already validated): symlinks in parent directories are resolved, the last
    /// component is kept as is unless `followLastSymlink`. Without `followLastSymlink`, the result
    /// comes from `ResolutionCache.shared` when nothing it depends on changed (D-111).
    package static func resolve(
        _ path: String, followLastSymlink: Bool = false
    ) throws(CoordinationError)
        -> ResolvedItem
    {
        try resolve(path, followLastSymlink: followLastSymlink, cache: .shared)
    }

    /// `resolve` with an explicit cache (nil: none), for tests.
    package static func resolve(
        _ path: String, followLastSymlink: Bool, cache: ResolutionCache?
    ) throws(CoordinationError) -> ResolvedItem {
        let normalized = lexicallyNormalized(path)
        if !followLastSymlink, let cache { return cache.resolve(normalized) { resolveUncached($0) } }
        return resolveUncached(normalized, followLastSymlink: followLastSymlink)
    }

    /// The resolution by system calls: realpath of the parent, lstat, package-marker look-ups.
    package static func resolveUncached(_ normalized: String, followLastSymlink: Bool = false) -> ResolvedItem {
        var canonical = canonicalPath(normalized)
        if followLastSymlink, let target = SystemSupport.canonicalPath(canonical) { canonical = target }
        var info = stat()
        var identity: ItemIdentity?
        var isDirectory = false
        if lstat(canonical, &info) == 0 {
            identity = ItemIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
            isDirectory = (info.st_mode & S_IFMT) == S_IFDIR
        }
        return ResolvedItem(
            path: canonical, identity: identity, isDirectory: isDirectory,
            packageRoot: packageRoot(of: canonical, isDirectory: isDirectory))
    }

    /// Removes `.`, `..` and repeated slashes without touching the file system.
    static func lexicallyNormalized(_ path: String) -> String {
        if isNormalized(path) { return path }
        var parts: [Substring] = []
        for component in path.split(separator: "/", omittingEmptySubsequences: true) {
            if component == "." { continue }
            if component == ".." {
                if !parts.isEmpty { parts.removeLast() }
                continue
            }
            parts.append(component)
        }
        return "/" + parts.joined(separator: "/")
    }

    /// True for "/a/b": no empty, "." or ".." component and no trailing slash (the common case,
    /// checked without allocating).
    static func isNormalized(_ path: String) -> Bool {
        path.utf8.withContiguousStorageIfAvailable { isNormalized($0) } ?? isNormalized(path.utf8)
    }

    @inline(__always)
    private static func isNormalized<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> Bool {
        var previous: UInt8 = 0
        var dots = 0
        var componentLength = 0
        for byte in bytes {
            if byte == UInt8(ascii: "/") {
                if previous == UInt8(ascii: "/") || (componentLength > 0 && dots == componentLength && dots <= 2) {
                    return false
                }
                dots = 0
                componentLength = 0
            } else {
                componentLength += 1
                if byte == UInt8(ascii: ".") { dots += 1 }
            }
            previous = byte
        }
        if componentLength > 0 && dots == componentLength && dots <= 2 { return false }
        // "/" itself is normalized; any other trailing slash is not.
        return previous != UInt8(ascii: "/") || bytes.count == 1
    }

    /// The parent resolved with realpath (walking up while parents do not exist) plus the last name.
    static func canonicalPath(_ path: String) -> String {
        if path == "/" { return path }
        let slash = path.utf8.lastIndex(of: UInt8(ascii: "/"))!
        let parent = slash == path.utf8.startIndex ? "/" : String(path[..<slash])
        let name = String(path[path.index(after: slash)...])
        let resolvedParent = SystemSupport.canonicalPath(parent) ?? canonicalPath(parent)
        return resolvedParent == "/" ? "/" + name : resolvedParent + "/" + name
    }

    /// The outermost directory among the item and its ancestors that holds the package marker.
    static func packageRoot(of path: String, isDirectory: Bool) -> String? {
        var prefix = ""
        let components = path.split(separator: "/")
        for (index, component) in components.enumerated() {
            prefix += "/" + component
            if index == components.count - 1 && !isDirectory { break }
            if access(prefix + "/" + filePackageMarkerName, F_OK) == 0 { return prefix }
        }
        return nil
    }
}
