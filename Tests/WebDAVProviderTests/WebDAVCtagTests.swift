// The getctag shortcut of remote-change polling (issue 26; D-518). rclone sends no getctag, so
// the tampering proxy adds an honest one (the hash of rclone's own Depth 1 answer for the
// collection) and logs every PROPFIND with its Depth. Through a ProviderCache's poll: a folder
// whose ctag is unchanged costs one Depth 0 PROPFIND and is not listed again, a folder whose
// file was rewritten in place (which leaves the directory's own date as it was) is listed again,
// and the new bytes are read; without getctag every poll lists every folder, as before.

import ProviderCache
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite(.enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVCtagTests {
    static let old = pattern(count: 5000, seed: 81)
    static let new = pattern(count: 7000, seed: 82)

    /// rclone serving `top.txt`, `docs/file.txt` and `other/file.txt` behind the tampering proxy
    /// in `mode`, a cache over a provider over the proxy, every folder listed once. Stopped by
    /// PID and removed at the end.
    func withListedServer(
        _ mode: WebDAVTestServer.Tampering, deep: Bool = false, ctagCoversSubtree: Bool = false,
        _ body: (String, WebDAVTestServer, ProviderCache) async throws -> Void
    ) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-ctag")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        try writeFile(served + "/top.txt", Self.old)
        try writeFile(served + "/docs/file.txt", Self.old)
        try writeFile(served + "/other/file.txt", Self.old)
        if deep { try writeFile(served + "/docs/deep/file.txt", Self.old) }
        let upstream = try WebDAVTestServer(root: served, kind: .rclone(user: nil, password: nil))
        defer { upstream.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: upstream.url))
        defer { proxy.stop() }
        try proxy.tamper(mode)
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(proxy.url))
        configuration.stallTimeout = .seconds(60)
        configuration.ctagCoversSubtree = ctagCoversSubtree
        // A loaded machine may take seconds between a parent's listing and its child's.
        configuration.childCtagLifetime = .seconds(60)
        var options = CacheOptions()
        options.listingRefreshAhead = nil
        options.retryDelay = .zero
        options.stallTimeout = .seconds(60)
        let cache = try ProviderCache(
            provider: WebDAVProvider(configuration: configuration), directory: scratch + "/cache",
            store: InMemoryMetadataStore(), options: options)
        do {
            let folders = ["", "docs"] + (deep ? ["docs/deep"] : []) + ["other"]
            for folder in folders.map({ ItemIdentifier($0) }) {
                _ = try await cache.catalog.children(of: folder, maximumAge: .zero)
            }
            try await body(served, proxy, cache)
        } catch {
            await cache.shutdown()
            throw error
        }
        await cache.shutdown()
    }

    /// The PROPFINDs the proxy passed on after the first `seen` lines of its log, sorted.
    func propfinds(_ proxy: WebDAVTestServer, after seen: Int) -> [String] {
        proxy.requestLog().dropFirst(seen).filter { $0.hasPrefix("PROPFIND ") }.sorted()
    }

    /// The bytes of `path` (`docs/file.txt`) as the catalog has it now, read through the cache.
    func readDocsFile(_ cache: ProviderCache, _ path: String = "docs/file.txt") async throws -> [UInt8] {
        let item = try await cache.catalog.item(ItemIdentifier(path), maximumAge: nil)
        let entry = try await cache.pinContent(of: item)
        defer { cache.content.unpin(entry) }
        return bytes(of: try await entry.read(offset: 0, count: Int(item.size)))
    }

    @Test func aPollListsAgainOnlyTheFoldersWhoseCtagChanged() async throws {
        try await withListedServer(.getctag) { served, proxy, cache in
            let first = proxy.requestLog().filter { $0.hasPrefix("PROPFIND ") }
            #expect(first.filter { $0.hasSuffix("depth=1") }.count == 3, "\(first)")
            #expect(try await readDocsFile(cache) == Self.old)

            // Nothing changed: one Depth 0 each, no listing.
            var seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 3)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND /docs/ depth=0", "PROPFIND /other/ depth=0",
                ])

            // A file rewritten in place: its folder's ctag changed, not its parent's or sibling's.
            try writeFile(served + "/docs/file.txt", Self.new)
            seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 3)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND /docs/ depth=0", "PROPFIND /docs/ depth=1",
                    "PROPFIND /other/ depth=0",
                ])
            #expect(try await readDocsFile(cache) == Self.new)

            // A new name in a folder changes its ctag too.
            try writeFile(served + "/other/added.txt", Self.old)
            seen = proxy.requestLog().count
            _ = await cache.catalog.pollListedDirectories(olderThan: .zero)
            #expect(propfinds(proxy, after: seen).contains("PROPFIND /other/ depth=1"))
            let names = try await cache.catalog.children(of: ItemIdentifier("other"), maximumAge: nil).map(\.name)
            #expect(names.sorted() == ["added.txt", "file.txt"])
        }
    }

    /// D-525: a collection whose parent's listing was just taken (Depth 1) is not asked again
    /// when that listing gave it the ctag of its kept listing, and is listed at once when it gave
    /// another. Its own Depth 0 is asked otherwise: this ctag (the proxy's) covers direct children
    /// only, so a change deeper down is found by the folder's own ctag.
    @Test func aParentsFreshListingStandsForItsChildFolders() async throws {
        try await withListedServer(.getctag, deep: true) { served, proxy, cache in
            // Nothing changed: each folder's own Depth 0 (nothing vouches for a subtree).
            var seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 4)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND /docs/ depth=0", "PROPFIND /docs/deep/ depth=0",
                    "PROPFIND /other/ depth=0",
                ])

            // A name added at the top: the root is listed again, and its listing stands for
            // `docs` and `other` (their ctags unchanged); `docs/deep` asks for itself.
            try writeFile(served + "/added.txt", Self.old)
            seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 4)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND / depth=1", "PROPFIND /docs/deep/ depth=0",
                ])

            // A name added in `docs` and a file rewritten in place in `docs/deep`: `docs`'s new
            // listing says `docs/deep`'s ctag changed, which is then listed without asking first.
            try writeFile(served + "/docs/added.txt", Self.old)
            try writeFile(served + "/docs/deep/file.txt", Self.new)
            seen = proxy.requestLog().count
            _ = await cache.catalog.pollListedDirectories(olderThan: .zero)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND /docs/ depth=0", "PROPFIND /docs/ depth=1",
                    "PROPFIND /docs/deep/ depth=1", "PROPFIND /other/ depth=0",
                ])
            let names = try await cache.catalog.children(of: ItemIdentifier("docs"), maximumAge: nil).map(\.name)
            #expect(names.sorted() == ["added.txt", "deep", "file.txt"])
            #expect(try await readDocsFile(cache, "docs/deep/file.txt") == Self.new)

            // A file rewritten in place deep down changes only its folder's ctag: found by that
            // folder's own Depth 0, by the poll and by `refresh`.
            try writeFile(served + "/docs/deep/file.txt", Self.old)
            seen = proxy.requestLog().count
            _ = await cache.catalog.pollListedDirectories(olderThan: .zero)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND /docs/ depth=0", "PROPFIND /docs/deep/ depth=0",
                    "PROPFIND /docs/deep/ depth=1", "PROPFIND /other/ depth=0",
                ])
            #expect(try await readDocsFile(cache, "docs/deep/file.txt") == Self.old)
            try writeFile(served + "/docs/deep/file.txt", Self.new)
            seen = proxy.requestLog().count
            _ = try await cache.catalog.refresh(path: "docs/deep/file.txt")
            #expect(propfinds(proxy, after: seen).contains("PROPFIND /docs/deep/ depth=1"))
            #expect(try await readDocsFile(cache, "docs/deep/file.txt") == Self.new)
        }
    }

    /// D-525 at a server whose ctag covers its whole subtree (`ctagCoversSubtree`; the proxy's
    /// `getctag-tree`): a poll of an unchanged tree is one Depth 0 of the root, and a file
    /// rewritten in place three levels down lists that path again, nothing beside it.
    @Test func aCtagCoveringItsSubtreeAnswersAnUnchangedTreeWithOneRequest() async throws {
        try await withListedServer(.getctagTree, deep: true, ctagCoversSubtree: true) { served, proxy, cache in
            var seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 4)
            #expect(propfinds(proxy, after: seen) == ["PROPFIND / depth=0"])
            seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 4)
            #expect(propfinds(proxy, after: seen) == ["PROPFIND / depth=0"])

            try writeFile(served + "/docs/deep/file.txt", Self.new)
            seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 4)
            #expect(
                propfinds(proxy, after: seen) == [
                    "PROPFIND / depth=0", "PROPFIND / depth=1", "PROPFIND /docs/ depth=1",
                    "PROPFIND /docs/deep/ depth=1",
                ])
            #expect(try await readDocsFile(cache, "docs/deep/file.txt") == Self.new)

            // `refresh` of the file lists its folder again: no fresh listing of its parent
            // vouches for it now, so its own Depth 0 finds its ctag changed.
            try writeFile(served + "/docs/deep/file.txt", Self.old)
            seen = proxy.requestLog().count
            _ = try await cache.catalog.refresh(path: "docs/deep/file.txt")
            #expect(propfinds(proxy, after: seen).contains("PROPFIND /docs/deep/ depth=1"))
            #expect(try await readDocsFile(cache, "docs/deep/file.txt") == Self.old)
        }
    }

    /// A server without getctag (rclone as it is): every poll lists every folder (Depth 1) and
    /// asks nothing else, as before D-518.
    @Test func withoutGetctagEveryPollListsEveryFolder() async throws {
        try await withListedServer(.none) { served, proxy, cache in
            var seen = proxy.requestLog().count
            #expect(await cache.catalog.pollListedDirectories(olderThan: .zero) == 3)
            let all = ["PROPFIND / depth=1", "PROPFIND /docs/ depth=1", "PROPFIND /other/ depth=1"]
            #expect(propfinds(proxy, after: seen) == all)

            try writeFile(served + "/docs/file.txt", Self.new)
            seen = proxy.requestLog().count
            _ = await cache.catalog.pollListedDirectories(olderThan: .zero)
            #expect(propfinds(proxy, after: seen) == all)
            #expect(try await readDocsFile(cache) == Self.new)
        }
    }
}
