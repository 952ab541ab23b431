// The resolution cache (D-111): a cached resolution is used while nothing it depends on changed,
// and every change that alters the resolution is seen by the next look-up.
import FileCoordination
import Foundation
import Testing

@Suite struct ResolutionCacheTests {
    /// A fresh directory under /tmp (a local file system, so the cache applies), canonical.
    func scratch() throws -> String {
        let path = FileManager.default.temporaryDirectory.resolvingSymlinksInPath()
            .appendingPathComponent("rc-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    func resolve(_ path: String, _ cache: ResolutionCache) throws -> ResolvedItem {
        try ItemResolver.resolve(path, followLastSymlink: false, cache: cache)
    }

    /// Resolves until the result is cached. Any event in a watched ancestor while resolving
    /// rightly skips storing it, and tests running in parallel keep creating entries in /tmp, so one
    /// attempt may not be cached; a cache that never stores fails all 100.
    func resolveUntilCached(_ path: String, _ cache: ResolutionCache) throws -> ResolvedItem? {
        for _ in 0..<100 {
            let item = try resolve(path, cache)
            if cache.lookup(path) != nil { return item }
        }
        return nil
    }

    @Test func unchangedPathIsServedFromTheCacheAndCreationIsSeen() throws {
        let dir = try scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = ResolutionCache()
        let file = dir + "/f"
        let missing = try resolveUntilCached(file, cache)
        #expect(missing != nil, "a canonical path on a local file system is cached")
        #expect(missing?.identity == nil)
        try Data("x".utf8).write(to: URL(fileURLWithPath: file))
        #expect(cache.lookup(file) == nil, "creating the item drops its entry")
        let created = try resolve(file, cache)
        #expect(created.identity != nil)
        #expect(created == ItemResolver.resolveUncached(file))
    }

    @Test func replacingTheItemChangesItsIdentity() throws {
        let dir = try scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = ResolutionCache()
        let file = dir + "/f"
        try Data("1".utf8).write(to: URL(fileURLWithPath: file))
        let before = try resolve(file, cache)
        try Data("2".utf8).write(to: URL(fileURLWithPath: dir + "/g"))
        #expect(rename(dir + "/g", file) == 0)
        let after = try resolve(file, cache)
        #expect(after.identity != before.identity)
        #expect(after == ItemResolver.resolveUncached(file))
    }

    @Test func packageMarkerInAnAncestorOrInTheDirectoryItselfIsSeen() throws {
        let dir = try scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = ResolutionCache()
        let package = dir + "/Doc.pkg"
        try FileManager.default.createDirectory(atPath: package + "/sub", withIntermediateDirectories: true)
        let inner = package + "/sub/a"
        #expect(try resolve(inner, cache).packageRoot == nil)
        #expect(try resolve(package, cache).packageRoot == nil)
        try Data().write(to: URL(fileURLWithPath: package + "/" + filePackageMarkerName))
        #expect(try resolve(inner, cache).packageRoot == package)
        #expect(try resolve(package, cache).packageRoot == package, "the directory item's own marker")
        try FileManager.default.removeItem(atPath: package + "/" + filePackageMarkerName)
        #expect(try resolve(inner, cache).packageRoot == nil)
    }

    @Test func anAncestorReplacedBySymlinkIsResolvedAgain() throws {
        let dir = try scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = ResolutionCache()
        try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: dir + "/other/b", withIntermediateDirectories: true)
        let path = dir + "/a/b/f"
        #expect(try resolveUntilCached(path, cache)?.path == path)
        // Two levels up: a renamed directory and a symlink in its place.
        #expect(rename(dir + "/a", dir + "/moved") == 0)
        try FileManager.default.createSymbolicLink(atPath: dir + "/a", withDestinationPath: dir + "/other")
        #expect(try resolve(path, cache).path == dir + "/other/b/f")
        #expect(cache.lookup(path) == nil, "a path through a symlink is not cached")
        // The moved directory's old watches must not keep answering for the new location.
        #expect(try resolve(dir + "/moved/b/f", cache) == ItemResolver.resolveUncached(dir + "/moved/b/f"))
        try FileManager.default.removeItem(atPath: dir + "/a")
        try FileManager.default.createDirectory(atPath: dir + "/a/b", withIntermediateDirectories: true)
        let fresh = try resolve(path, cache)
        #expect(fresh.path == path)
        #expect(fresh == ItemResolver.resolveUncached(path))
    }

    @Test func aDirectoryReplacingAFileIsSeen() throws {
        let dir = try scratch()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cache = ResolutionCache()
        let item = dir + "/x"
        try Data().write(to: URL(fileURLWithPath: item))
        #expect(try resolve(item, cache).isDirectory == false)
        try FileManager.default.removeItem(atPath: item)
        try FileManager.default.createDirectory(atPath: item, withIntermediateDirectories: false)
        #expect(try resolve(item, cache).isDirectory == true)
        try Data().write(to: URL(fileURLWithPath: item + "/" + filePackageMarkerName))
        #expect(try resolve(item, cache).packageRoot == item)
    }
}
