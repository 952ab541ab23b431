// The ScopedAccess module on a real `--source` mount (docs/SCOPED-ACCESS.md): start/stop of a
// grant from `providerfs token grant` (reads in this process through the derived token's path,
// the last stop refusing them at once, a descriptor opened while started included), the derived
// token refused to another process and ended with its parent, start false without scope and for
// a revoked grant; bookmarks resolving after a rename in the source (stale), and refusing a gone
// item and a revoked grant.

import Foundation
import ScopedAccess
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct ScopedAccessAPIMountTests: MountLayoutSuite, TokenGranting {
    let layout: MountLayout
    let registry: ScopedAccessRegistry

    init() throws {
        layout = try MountLayout(prefix: "scoped-api")
        // This process's runtime directory is not the mount's: the backend is told where it is.
        registry = ScopedAccessRegistry(backend: ControlSocketBackend(mountsDirectory: layout.runtime + "/mounts"))
        mkdir(source + "/docs", 0o755)
        mkdir(source + "/docs/inner", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
        writeTestFile(source + "/docs/inner/notes.txt", Array("notes\n".utf8))
        writeTestFile(source + "/private.txt", Array("private\n".utf8))
    }

    func mount() throws -> MountedFileSystem {
        try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
    }

    /// The bytes of `path` read by this process, or the errno of the open or read.
    func readHere(_ path: String) -> Result<String, Errno> {
        let descriptor = open(path, O_RDONLY)
        guard descriptor >= 0 else { return .failure(Errno.current) }
        defer { close(descriptor) }
        return readAll(descriptor)
    }

    func readAll(_ descriptor: Int32) -> Result<String, Errno> {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0 { return .failure(Errno.current) }
            if count == 0 { return .success(String(decoding: bytes, as: UTF8.self)) }
            bytes += buffer[0..<count]
        }
    }

    @Test func startStartStopKeepsAccessTheLastStopEndsItAndTheDerivedTokenIsThisProcesssOnly() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }

        let folder = try grant(mounted.path("docs"))
        let url = SecurityScopedURL(path: folder.accessPath + "/report.txt", registry: registry)
        #expect(url.hasSecurityScope && url.path == folder.accessPath + "/report.txt")

        // Start twice: one derived token, bound to this process, listed with its parent.
        #expect(url.startAccessingSecurityScopedResource(), "\(String(describing: url.lastError))")
        #expect(url.startAccessingSecurityScopedResource())
        let started = url.path
        #expect(started != folder.accessPath + "/report.txt" && started.hasSuffix("/report.txt"))
        #expect(readHere(started) == .success("quarterly"))
        let list = try providerfs(["token", "list"], runtime: runtime)
        let childLine = try #require(list.output.split(separator: "\n").first { $0.contains("derived from") })
        #expect(childLine.contains("derived from \(folder.id)") && childLine.contains("pid \(getpid())"), "\(list)")

        // Another process cannot use the derived token's path.
        let other = try shell("cat \(quoted(started)) 2>&1")
        #expect(other.status != 0 && other.output.contains("Permission denied"), "\(other.output)")

        // A descriptor opened while started; one stop keeps access, the last ends it at once.
        let descriptor = open(started, O_RDONLY)
        #expect(descriptor >= 0)
        defer { close(descriptor) }
        var byte: UInt8 = 0
        #expect(pread(descriptor, &byte, 1, 0) == 1)
        url.stopAccessingSecurityScopedResource()
        #expect(url.isAccessing && readHere(started) == .success("quarterly"))
        #expect(pread(descriptor, &byte, 1, 1) == 1)
        url.stopAccessingSecurityScopedResource()
        #expect(!url.isAccessing && url.lastError == nil)
        errno = 0
        #expect(pread(descriptor, &byte, 1, 2) == -1 && errno == EACCES, "a read on the open descriptor")
        #expect(readHere(started) == .failure(Errno(EACCES)))
        #expect(readHere(url.path) == .failure(Errno(EACCES)), "the URL keeps naming the ended token")
        url.stopAccessingSecurityScopedResource()  // one too many: nothing happens
        #expect(try shell("cat \(quoted(folder.accessPath))/report.txt").output == "quarterly", "the grant remains")
        let log = try providerfs(["token", "log"], runtime: runtime)
        #expect(log.output.contains("released by its process"), "\(log.output)")
        // Neither the grant's token nor the derived one is in the list, the log or the daemon's output.
        let derivedToken = String(started.split(separator: "/").dropLast().last ?? "")
        let grantToken = String(folder.accessPath.split(separator: "/").last ?? "")
        #expect(derivedToken.hasPrefix("pfs_") && grantToken.hasPrefix("pfs_") && derivedToken != grantToken)
        let listed = try providerfs(["token", "list", "--all", "--json"], runtime: runtime).output
        for secret in [derivedToken, grantToken] {
            #expect(!log.output.contains(secret) && !listed.contains(secret))
            #expect(!mounted.child.standardError.contains(secret) && !mounted.child.standardOutput.contains(secret))
        }

        // A new start derives again; revoking the parent ends the started token at once.
        #expect(url.startAccessingSecurityScopedResource())
        let again = url.path
        #expect(again != started && readHere(again) == .success("quarterly"))
        #expect(try providerfs(["token", "revoke", folder.id], runtime: runtime).status == 0)
        #expect(readHere(again) == .failure(Errno(EACCES)))
        url.stopAccessingSecurityScopedResource()

        // Start is false without scope, and for a grant that has ended, with the reason.
        let plain = SecurityScopedURL(path: mounted.path("private.txt"), registry: registry)
        #expect(!plain.hasSecurityScope && !plain.startAccessingSecurityScopedResource())
        #expect(plain.lastError == .noScope(path: mounted.path("private.txt")))
        #expect(!url.startAccessingSecurityScopedResource())
        guard case .accessEnded(let reason) = url.lastError else {
            Issue.record("start on a revoked grant: \(String(describing: url.lastError))")
            return
        }
        #expect(reason.contains("revoked"), "\(reason)")
    }

    @Test func aStartIsOneUseOfAUsesGrantThatEndsUsedUpAtTheLastStop() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }

        let once = try grant(mounted.path("docs/report.txt"), ["--uses", "1"])
        let url = SecurityScopedURL(path: once.accessPath, registry: registry)
        #expect(url.startAccessingSecurityScopedResource(), "\(String(describing: url.lastError))")
        #expect(url.startAccessingSecurityScopedResource())
        #expect(readHere(url.path) == .success("quarterly"))
        #expect(readHere(url.path) == .success("quarterly"), "opens through the derived token take no use")
        let other = try shell("cat \(quoted(once.accessPath)) 2>&1")
        #expect(other.status != 0 && other.output.contains("Permission denied"), "the grant's one use is the start's")
        url.stopAccessingSecurityScopedResource()
        url.stopAccessingSecurityScopedResource()
        let list = try providerfs(["token", "list", "--all"], runtime: runtime)
        let row = try #require(list.output.split(separator: "\n").first { $0.hasPrefix(once.id) })
        #expect(row.contains("used up"), "\(list.output)")
        #expect(!url.startAccessingSecurityScopedResource())
        #expect(url.lastError.map { "\($0)" }?.contains("used up") == true, "\(String(describing: url.lastError))")
    }

    @Test func aStartedGrantExpiresWithItsGrantAndThenStartIsFalse() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }

        let granted = ContinuousClock.now
        let short = try grant(mounted.path("docs/inner"), ["--ttl", "1s"])
        let url = SecurityScopedURL(path: short.accessPath + "/notes.txt", registry: registry)
        #expect(url.startAccessingSecurityScopedResource(), "\(String(describing: url.lastError))")
        #expect(readHere(url.path) == .success("notes\n"))
        // The derived token's deadline is the grant's: the started path stops with it (polled, bounded).
        var refused = false
        while !refused, ContinuousClock.now - granted < .seconds(10) {
            refused = readHere(url.path) == .failure(Errno(EACCES))
            if !refused { usleep(20_000) }
        }
        #expect(refused && ContinuousClock.now - granted >= .seconds(1), "the started path outlived its grant")
        // A start while started only counts (no daemon round trip): true, though access has ended.
        let second = SecurityScopedURL(path: short.accessPath, registry: registry)
        #expect(second.startAccessingSecurityScopedResource() && readHere(url.path) == .failure(Errno(EACCES)))
        second.stopAccessingSecurityScopedResource()
        url.stopAccessingSecurityScopedResource()
        // The next first start asks the daemon, and is refused with the reason.
        #expect(!second.startAccessingSecurityScopedResource())
        #expect(
            second.lastError.map { "\($0)" }?.contains("expired") == true, "\(String(describing: second.lastError))")
    }

    @Test func bookmarksResolveAfterARenameInTheSourceAndRefuseGoneItemsAndEndedGrants() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }

        let folder = try grant(mounted.path("docs"))
        let scoped = SecurityScopedURL(path: folder.accessPath + "/inner/notes.txt", registry: registry)
        let scopedBookmark = try scoped.bookmarkData()
        let plain = SecurityScopedURL(path: mounted.path("private.txt"), registry: registry)
        let plainBookmark = try plain.bookmarkData()
        #expect(!String(decoding: plainBookmark, as: UTF8.self).contains("pfs_"), "no token in a plain bookmark")

        // Unchanged: not stale, the same URLs.
        var stale = true
        var resolved = try SecurityScopedURL(
            resolvingBookmarkData: scopedBookmark, bookmarkDataIsStale: &stale, registry: registry)
        #expect(!stale && resolved == scoped)
        resolved = try SecurityScopedURL(
            resolvingBookmarkData: plainBookmark, bookmarkDataIsStale: &stale, registry: registry)
        #expect(!stale && resolved.path == mounted.path("private.txt"))

        // Renamed and moved in the source: found again by fingerprint, stale, readable.
        #expect(rename(source + "/docs/inner/notes.txt", source + "/docs/renamed.txt") == 0)
        mkdir(source + "/moved", 0o755)
        #expect(rename(source + "/private.txt", source + "/moved/private-2.txt") == 0)
        resolved = try SecurityScopedURL(
            resolvingBookmarkData: scopedBookmark, bookmarkDataIsStale: &stale, registry: registry)
        #expect(stale && resolved.hasSecurityScope && resolved.grantPath == folder.accessPath + "/renamed.txt")
        #expect(resolved.startAccessingSecurityScopedResource())
        #expect(readHere(resolved.path) == .success("notes\n"))
        resolved.stopAccessingSecurityScopedResource()
        let fresh = try resolved.bookmarkData()
        #expect(
            try SecurityScopedURL(resolvingBookmarkData: fresh, bookmarkDataIsStale: &stale, registry: registry)
                == resolved)
        #expect(!stale, "a bookmark made again is not stale")
        resolved = try SecurityScopedURL(
            resolvingBookmarkData: plainBookmark, bookmarkDataIsStale: &stale, registry: registry)
        #expect(stale && resolved.path == mounted.path("moved/private-2.txt"))
        #expect(readHere(resolved.path) == .success("private\n"))

        // Gone: deleted in the source.
        let report = try SecurityScopedURL(path: folder.accessPath + "/report.txt", registry: registry).bookmarkData()
        #expect(unlink(source + "/docs/report.txt") == 0)
        #expect {
            try SecurityScopedURL(resolvingBookmarkData: report, bookmarkDataIsStale: &stale, registry: registry)
        } throws: { error in
            guard case .itemGone = error as? ScopedAccessError else { return false }
            return true
        }

        // The grant revoked: resolution says access has ended.
        #expect(try providerfs(["token", "revoke", folder.id], runtime: runtime).status == 0)
        #expect {
            try SecurityScopedURL(resolvingBookmarkData: fresh, bookmarkDataIsStale: &stale, registry: registry)
        } throws: { error in
            guard case .accessEnded(let reason) = error as? ScopedAccessError else { return false }
            return reason.contains("revoked")
        }
        // Garbage: a clear error, no request.
        #expect(throws: ScopedAccessError.self) {
            try SecurityScopedURL(
                resolvingBookmarkData: Data("not a bookmark".utf8), bookmarkDataIsStale: &stale, registry: registry)
        }
    }
}
