// Remote changes (issue 26 item 3, D-450): a file changed on the WebDAV server directly (written
// into the served directory, as another client's PUT leaves it) reaches the mount through
// `providerfs refresh PATH` at once and through the poll within its interval, by the path every
// provider change takes: the kernel's caches, presenters (`providerfs present` in another
// process), open readers of the old version (ESTALE). Against Apache mod_dav and rclone, each
// started on 127.0.0.1 and stopped by its PID.

import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(
    .enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"),
    .enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVRemoteChangeMountTests: MountLayoutSuite {
    let layout: MountLayout
    let providerfs = productsDirectory + "/providerfs"
    var environment: [String: String] { ["PROVIDERFS_RUNTIME_DIR": runtime] }
    /// `providerfs` for a shell script, with the mounts' runtime directory.
    var tool: String { "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) \(quoted(providerfs))" }

    enum Server: String, CaseIterable, Sendable, CustomStringConvertible {
        case apache, rclone
        var kind: WebDAVTestServer.Kind { self == .apache ? .apache : .rclone(user: nil, password: nil) }
        var description: String { rawValue }
    }

    init() throws {
        layout = try MountLayout(prefix: "webdav-changes")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/notes.txt", Array("version one\n".utf8))
        writeTestFile(source + "/docs/a.txt", Array("alpha\n".utf8))
        writeTestFile(source + "/big.bin", patternBytes(count: 4 << 20, seed: 3))
    }

    func requireServers() -> Bool {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return false
        }
        return true
    }

    /// `providerfs present PATH` in its own process, once it said it is ready.
    func presenter(_ path: String) throws -> ChildProcess {
        let presenter = try ChildProcess(providerfs, ["present", path], environment: environment)
        let ready = waitUntil { presenter.standardOutput.contains(#""event":"ready""#) || !presenter.isRunning }
        #expect(ready && presenter.isRunning, "\(presenter.standardError)")
        return presenter
    }

    func stop(_ process: ChildProcess) {
        process.signal(SIGTERM)
        if process.wait(timeout: .seconds(10)) == nil {
            process.signal(SIGKILL)
            process.wait(timeout: .seconds(5))
        }
    }

    /// Rewrites a served file as another client would: a new file renamed over the old (a new
    /// inode and mtime, so every server gives it a new ETag).
    func rewriteOnServer(_ relative: String, _ text: String) {
        writeTestFile(source + "/.incoming", Array(text.utf8))
        #expect(rename(source + "/.incoming", source + "/" + relative) == 0)
    }

    @Test(arguments: Server.allCases)
    func refreshAppliesAServerChangeAtOnce(_ server: Server) throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: source, kind: server.kind)
        defer { dav.stop() }
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", dav.url, "--cache", cache, "--poll-interval", "0"], environment: environment)
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        #expect(try shell("ls \(m)/docs").output == "a.txt\n")
        #expect(try shell("cat \(m)/notes.txt").output == "version one\n")
        let watcher = try presenter(mount.path("notes.txt"))
        defer { stop(watcher) }

        // Another client changes the server: a file rewritten, one created, one deleted.
        rewriteOnServer("notes.txt", "version two, longer\n")
        writeTestFile(source + "/docs/b.txt", Array("beta\n".utf8))
        #expect(unlink(source + "/docs/a.txt") == 0)
        let refreshed = try shell("\(tool) refresh \(m)/notes.txt \(m)/docs")
        #expect(refreshed.status == 0, "\(refreshed.output) \(refreshed.error)")
        #expect(refreshed.output.contains("notes.txt: refreshed (file"), "\(refreshed.output)")

        // At once, well within the listing's and the kernel's cache times: the new listing, the
        // new size, the new bytes, and the presenter was told.
        #expect(try shell("ls \(m)/docs").output == "b.txt\n")
        #expect(try shell("stat -c %s \(m)/notes.txt").output == "20\n")
        #expect(try shell("cat \(m)/notes.txt").output == "version two, longer\n")
        #expect(
            waitUntil(.seconds(10)) { watcher.standardOutput.contains("presentedItemDidChange") },
            "\(watcher.standardOutput)")

        // A path the server no longer has: refreshed, and gone from the mount.
        let gone = try shell("\(tool) refresh \(m)/docs/a.txt --json")
        #expect(gone.status == 0 && gone.output.contains(#""outcome":"absent""#), "\(gone.output) \(gone.error)")
        // Not a mount: refused, saying why.
        let outside = try shell("\(tool) refresh \(quoted(scratch))")
        #expect(outside.status != 0 && outside.error.contains("not inside a ProviderFS mount"), "\(outside.error)")
    }

    /// An open reader pinned the old version and lacks its bytes: once `refresh` applied the new
    /// version, its read fails with ESTALE (never bytes of the new version); a new open reads the
    /// new bytes.
    @Test(arguments: Server.allCases)
    func anOpenReaderOfTheOldVersionGetsESTALE(_ server: Server) throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: source, kind: server.kind)
        defer { dav.stop() }
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", dav.url, "--cache", cache, "--poll-interval", "0"], environment: environment)
        defer { mount.stop() }
        writeTestFile(scratch + "/new.bin", patternBytes(count: 4 << 20, seed: 4))
        let script = """
            import errno, os, subprocess, sys
            mnt, src, new, tool = sys.argv[1:5]
            fd = os.open(mnt + "/big.bin", os.O_RDONLY)
            os.rename(new, src + "/big.bin")
            r = subprocess.run([tool, "refresh", mnt + "/big.bin"], capture_output=True, text=True)
            print("refresh", r.returncode, r.stderr.strip())
            try:
                os.pread(fd, 65536, 1 << 20)
                print("read ok")
            except OSError as e:
                print("read", errno.errorcode[e.errno])
            os.close(fd)
            with open(mnt + "/big.bin", "rb") as f:
                print("new", f.read(16).hex())
            """
        let result = try shell(
            "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) python3 - \(m(mount)) \(quoted(source)) \(quoted(scratch + "/new.bin")) \(quoted(providerfs)) <<'PY'\n"
                + script + "\nPY")
        let newHead = patternBytes(count: 16, seed: 4).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        #expect(result.output.contains("refresh 0"), "\(result.output) \(result.error)")
        #expect(result.output.contains("read ESTALE"), "\(result.output) \(result.error)")
        #expect(result.output.contains("new \(newHead)"), "\(result.output) \(result.error)")
    }

    /// Nobody touches the mount: the poll alone finds the change and tells the presenter within
    /// a few intervals; the mount then shows the new bytes.
    @Test(arguments: Server.allCases)
    func thePollFindsAServerChangeWithinItsInterval(_ server: Server) throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: source, kind: server.kind)
        defer { dav.stop() }
        let interval = Duration.milliseconds(500)
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", dav.url, "--cache", cache, "--poll-interval", "500ms"], environment: environment)
        defer { mount.stop() }
        #expect(try shell("ls \(m(mount))").status == 0)
        #expect(try shell("cat \(m(mount))/notes.txt").output == "version one\n")
        let watcher = try presenter(mount.path("notes.txt"))
        defer { stop(watcher) }
        let changed = ContinuousClock.now
        rewriteOnServer("notes.txt", "polled\n")
        let heard = waitUntil(.seconds(20)) { watcher.standardOutput.contains("presentedItemDidChange") }
        let latency = ContinuousClock.now - changed
        #expect(heard, "\(watcher.standardOutput)")
        // Within about one interval plus a listing; 10 intervals is the bound (a loaded machine).
        #expect(latency < interval * 10, "heard after \(latency)")
        print("poll: a server change heard after \(latency) (interval \(interval))")
        #expect(try shell("cat \(m(mount))/notes.txt").output == "polled\n")
    }

    /// The poll at a server that sends `getctag` (D-518; rclone behind a proxy that adds an honest
    /// one): folders whose ctag is unchanged are asked with a Depth 0 and never listed again; a
    /// file rewritten in place changes its folder's ctag alone, that folder is listed again and
    /// the mount shows the new bytes.
    @Test func thePollListsAgainOnlyFoldersWhoseCtagChanged() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: source, kind: .rclone(user: nil, password: nil))
        defer { dav.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: dav.url))
        defer { proxy.stop() }
        try proxy.tamper(.getctag)
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", proxy.url, "--cache", cache, "--poll-interval", "300ms"], environment: environment)
        defer { mount.stop() }
        #expect(try shell("ls \(m(mount)) \(m(mount))/docs").status == 0)
        #expect(try shell("cat \(m(mount))/docs/a.txt").output == "alpha\n")
        func propfinds(after seen: Int) -> [String] {
            proxy.requestLog().dropFirst(seen).filter { $0.hasPrefix("PROPFIND ") }
        }

        // Several passes with nothing changed: Depth 0 of both folders, no listing.
        var seen = proxy.requestLog().count
        #expect(
            waitUntil(.seconds(30)) {
                propfinds(after: seen).filter { $0 == "PROPFIND /docs/ depth=0" }.count >= 3
            }, "\(propfinds(after: seen))")
        #expect(propfinds(after: seen).contains("PROPFIND / depth=0"), "\(propfinds(after: seen))")
        #expect(!propfinds(after: seen).contains { $0.hasSuffix("depth=1") }, "\(propfinds(after: seen))")

        // Rewritten in place (the folder's own date stays): docs is listed again, the root is not.
        seen = proxy.requestLog().count
        writeTestFile(source + "/docs/a.txt", Array("alpha, rewritten\n".utf8))
        #expect(
            waitUntil(.seconds(30)) { propfinds(after: seen).contains("PROPFIND /docs/ depth=1") },
            "\(propfinds(after: seen))")
        // That listing is applied once its answer has come (the log has its request).
        let rewritten = try waitUntil(.seconds(30)) {
            try shell("cat \(m(mount))/docs/a.txt").output == "alpha, rewritten\n"
        }
        #expect(rewritten)
        // A few more passes: the root's ctag never changed.
        let later = proxy.requestLog().count
        #expect(waitUntil(.seconds(30)) { propfinds(after: later).filter { $0 == "PROPFIND / depth=0" }.count >= 2 })
        #expect(!propfinds(after: seen).contains("PROPFIND / depth=1"), "\(propfinds(after: seen))")
    }

    /// `--ctag-covers-subtree` (D-525) reaches the daemon: at a server whose ctag changes with any
    /// change below (the proxy's `getctag-tree`), each poll pass of the unchanged mount is one
    /// PROPFIND Depth 0 of the root; a file rewritten in `docs` lists the root and `docs` again,
    /// and its new bytes are read.
    @Test func aCtagOverTheSubtreeMakesAPollOneRequest() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: source, kind: .rclone(user: nil, password: nil))
        defer { dav.stop() }
        let proxy = try WebDAVTestServer(root: scratch + "/proxy", kind: .tampering(upstream: dav.url))
        defer { proxy.stop() }
        try proxy.tamper(.getctagTree)
        let mount = try MountedFileSystem.providerfs(
            ["--webdav", proxy.url, "--cache", cache, "--poll-interval", "300ms", "--ctag-covers-subtree"],
            environment: environment)
        defer { mount.stop() }
        #expect(try shell("ls \(m(mount)) \(m(mount))/docs").status == 0)
        #expect(try shell("cat \(m(mount))/docs/a.txt").output == "alpha\n")
        func propfinds(after seen: Int) -> [String] {
            proxy.requestLog().dropFirst(seen).filter { $0.hasPrefix("PROPFIND ") }
        }

        let seen = proxy.requestLog().count
        #expect(
            waitUntil(.seconds(30)) { propfinds(after: seen).filter { $0 == "PROPFIND / depth=0" }.count >= 3 },
            "\(propfinds(after: seen))")
        #expect(Set(propfinds(after: seen)) == ["PROPFIND / depth=0"], "\(propfinds(after: seen))")

        let changed = proxy.requestLog().count
        writeTestFile(source + "/docs/a.txt", Array("alpha, rewritten\n".utf8))
        #expect(
            waitUntil(.seconds(30)) { propfinds(after: changed).contains("PROPFIND /docs/ depth=1") },
            "\(propfinds(after: changed))")
        #expect(propfinds(after: changed).contains("PROPFIND / depth=1"), "\(propfinds(after: changed))")
        let rewritten = try waitUntil(.seconds(30)) {
            try shell("cat \(m(mount))/docs/a.txt").output == "alpha, rewritten\n"
        }
        #expect(rewritten)
    }

    /// `refresh` on a local-directory mount rescans the path: a file and an entry changed in the
    /// source are shown, and the command answers for each path.
    @Test func refreshRescansALocalDirectory() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(["--source", source, "--cache", cache], environment: environment)
        defer { mount.stop() }
        #expect(try shell("cat \(m(mount))/notes.txt").output == "version one\n")
        rewriteOnServer("notes.txt", "local two\n")
        writeTestFile(source + "/docs/c.txt", Array("gamma\n".utf8))
        let refreshed = try shell("\(tool) refresh \(m(mount))/notes.txt \(m(mount))/docs --json")
        #expect(refreshed.status == 0, "\(refreshed.output) \(refreshed.error)")
        #expect(refreshed.output.contains(#""outcome":"present""#), "\(refreshed.output)")
        #expect(try shell("cat \(m(mount))/notes.txt").output == "local two\n")
        #expect(try shell("ls \(m(mount))/docs").output == "a.txt\nc.txt\n")
    }

    func m(_ mount: MountedFileSystem) -> String { quoted(mount.mountpoint) }
}
