// WebDAV locks (D-451) against Apache mod_dav (DavLockDB) and rclone, two providers standing for
// two machines: the server's class, exclusion, writes carrying the token, refresh, unlock, and a
// lock that lapses when its holder stops refreshing it. The `DAV` header parsing on its own.

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
struct WebDAVLockingTests {
    @Test(arguments: DAVServer.allCases) func aLockExcludesTheOtherClientUntilUnlockedOrLapsed(
        on server: DAVServer
    ) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-lock")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        try write(served + "/counter.txt", Array("0\n".utf8))
        let dav = try WebDAVTestServer(root: served, kind: server.kind)
        defer { dav.stop() }
        let location = try WebDAVLocation(dav.url)
        let one = WebDAVProvider(configuration: WebDAVConfiguration(location: location))
        let other = WebDAVProvider(configuration: WebDAVConfiguration(location: location))
        let file = ItemIdentifier("counter.txt")

        #expect(try await one.complianceClasses().contains("2"))

        #expect(try await one.lock(file, timeout: .seconds(30), owner: "one") == .acquired)
        #expect(one.holdsLock(on: file))
        #expect(try await other.lock(file, timeout: .seconds(30), owner: "other") == .lockedByOther)
        #expect(!other.holdsLock(on: file))

        // The other client's write is refused while the lock is held; the holder's carries the
        // token and goes through.
        try write(scratch + "/theirs", Array("theirs\n".utf8))
        try write(scratch + "/ours", Array("ours\n".utf8))
        await #expect(throws: ProviderError.self) {
            _ = try await other.upload(
                from: scratch + "/theirs", to: .replace(file, baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        _ = try await one.upload(
            from: scratch + "/ours", to: .replace(file, baseVersion: nil), permissions: nil, modificationTime: nil)
        #expect(try read(served + "/counter.txt") == Array("ours\n".utf8))
        #expect(try await one.lock(file, timeout: .seconds(30), owner: "one") == .acquired, "a refresh")

        // Unlocked: the other gets it.
        await one.unlock(file)
        #expect(!one.holdsLock(on: file))
        #expect(try await other.lock(file, timeout: .seconds(2), owner: "other") == .acquired)
        #expect(try await one.lock(file, timeout: .seconds(30), owner: "one") == .lockedByOther)

        // A holder that stops refreshing (a crashed machine): its lock lapses after its timeout.
        let start = ContinuousClock.now
        var lapsed: Duration?
        while ContinuousClock.now - start < .seconds(20) {
            if try await one.lock(file, timeout: .seconds(30), owner: "one") == .acquired {
                lapsed = ContinuousClock.now - start
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(lapsed != nil, "the lock never lapsed")
        if let lapsed {
            print("\(server): a 2 s lock lapsed after \(lapsed)")
            // Not before its timeout (Apache counts whole seconds: more than 1 s of the 2).
            #expect(lapsed >= .milliseconds(900))
        }
        // The lapsed holder's refresh finds it gone.
        #expect(try await other.lock(file, timeout: .seconds(1), owner: "other") == .lost)
        await one.unlock(file)
    }

    /// A locked file is renamed by its holder (the MOVE names the source's lock), not by the
    /// other client (423: EBUSY).
    @Test(arguments: DAVServer.allCases) func onlyTheHolderMovesALockedFile(on server: DAVServer) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav-lock-move")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        try write(served + "/a.txt", Array("a\n".utf8))
        let dav = try WebDAVTestServer(root: served, kind: server.kind)
        defer { dav.stop() }
        let location = try WebDAVLocation(dav.url)
        let one = WebDAVProvider(configuration: WebDAVConfiguration(location: location))
        let other = WebDAVProvider(configuration: WebDAVConfiguration(location: location))
        let file = ItemIdentifier("a.txt")
        #expect(try await one.lock(file, timeout: .seconds(30), owner: "one") == .acquired)
        await #expect(throws: ProviderError.self) {
            _ = try await other.move(file, to: .root, named: "theirs.txt", mode: .replacing)
        }
        #expect(access(served + "/a.txt", F_OK) == 0)
        _ = try await one.move(file, to: .root, named: "ours.txt", mode: .replacing)
        #expect(try read(served + "/ours.txt") == Array("a\n".utf8))
        await one.unlock(file)
    }

    @Test func complianceClassesFromTheDAVHeader() {
        #expect(
            WebDAVProvider.complianceClasses("1,2, <http://apache.org/dav/propset/fs/1>") == [
                "1", "2", "<http://apache.org/dav/propset/fs/1>",
            ])
        #expect(WebDAVProvider.complianceClasses("1") == ["1"])
        #expect(WebDAVProvider.complianceClasses(nil).isEmpty)
    }
}
