// Require-token mode on a real `--source` mount (`providerfs mount --require-token`,
// docs/SEMANTICS.md "Require-token mode"): ordinary programs of the same user (cat, ls, stat,
// getfattr, this test process) get EACCES on every plain path, also on a path the owner's
// providerfs commands just looked up; the mount point itself still stats; the providerfs
// commands (status, download, token grant, fault, coordinate, claims) work on plain paths; a
// granted access path reads; `..` out of it to the root reaches nothing.

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
struct RequireTokenMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "require-token-mount")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
        writeTestFile(source + "/docs/big.bin", patternBytes(count: 300_000, seed: 3))
        writeTestFile(source + "/private.txt", Array("private\n".utf8))
    }

    func cli(_ arguments: [String]) throws -> (status: Int32, output: String, error: String) {
        try providerfs(arguments, runtime: runtime)
    }

    /// `script` (ordinary programs) fails with "Permission denied".
    func expectRefused(_ script: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let result = try shell(script + " 2>&1")
        #expect(
            result.status != 0 && result.output.contains("Permission denied"), "\(script): \(result)",
            sourceLocation: sourceLocation)
    }

    @Test func plainPathsRefusedToProgramsOpenToProviderfsCommandsAndTokens() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache, "--require-token"], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        let m = quoted(mounted.mountpoint)
        // Until the daemon answers (INIT done): the root's attributes are open to everyone.
        let deadline = ContinuousClock.now + .seconds(20)
        while try shell("stat \(m) >/dev/null 2>&1").status != 0, ContinuousClock.now < deadline { usleep(20_000) }

        // The mount point stats, for anyone: stat, df, findmnt keep working.
        #expect(try shell("stat -c %F \(m)").output == "directory\n")
        #expect(try shell("df \(m) >/dev/null").status == 0)

        // Ordinary programs of the same user are refused every plain path, with EACCES.
        try expectRefused("cat \(m)/private.txt")
        try expectRefused("ls \(m)")
        try expectRefused("ls \(m)/docs")
        try expectRefused("stat \(m)/docs/report.txt")
        try expectRefused("getfattr -n user.providerfs.state \(m)/docs/report.txt")
        errno = 0
        #expect(open(mounted.path("private.txt"), O_RDONLY) == -1 && errno == EACCES, "this test process too")

        // The owner's providerfs commands work on plain paths (each of them looks the path up,
        // stats it, reads its xattrs, lists the folder).
        let status = try cli(["status", mounted.mountpoint])
        #expect(status.status == 0 && status.output.contains("require-token"), "\(status)")
        let statusJSON = try cli(["status", mounted.mountpoint, "--json"])
        #expect(statusJSON.output.contains("\"requireToken\":true"), "\(statusJSON)")
        let item = try cli(["status", mounted.path("docs/report.txt")])
        #expect(item.status == 0 && item.output.contains("state:    dataless"), "\(item)")
        let download = try cli(["download", mounted.path("docs")])
        #expect(download.status == 0 && download.output.contains("2 of 2 files downloaded"), "\(download)")
        let downloaded = try cli(["status", mounted.path("docs/big.bin"), "--json"])
        #expect(downloaded.output.contains("materialized"), "\(downloaded)")
        let fault = try cli(["fault", "add", mounted.path("private.txt"), "--stall", "1ms"])
        #expect(fault.status == 0, "\(fault)")
        #expect(try cli(["fault", "clear", "--all"]).status == 0)
        let coordinate = try cli(["coordinate", "--read", mounted.path("docs/report.txt"), "--", "true"])
        #expect(coordinate.status == 0, "\(coordinate)")
        #expect(try cli(["claims", "--mount", mounted.mountpoint]).status == 0)
        // `present` registers inside a coordinated read of the plain path, then waits for a signal.
        let presenter = try ChildProcess(
            productsDirectory + "/providerfs", ["present", mounted.path("docs/report.txt")],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer {
            if presenter.isRunning {
                presenter.signal(SIGKILL)
                _ = presenter.wait(timeout: .seconds(5))
            }
        }
        let ready = ContinuousClock.now + .seconds(20)
        while !presenter.standardOutput.contains("\"ready\""), presenter.isRunning, ContinuousClock.now < ready {
            usleep(20_000)
        }
        #expect(presenter.standardOutput.contains("\"ready\""), "\(presenter.standardError)")
        presenter.signal(SIGINT)
        #expect(presenter.wait(timeout: .seconds(10)) == 0, "\(presenter.standardError)")
        #expect(presenter.standardOutput.contains("\"stopped\""))

        // What those commands looked up is no way in for anyone else: every walk asks again.
        try expectRefused("cat \(m)/docs/report.txt")
        try expectRefused("stat \(m)/docs/big.bin")
        try expectRefused("head -c 10 \(m)/docs/big.bin")

        // A granted access path reads, for any program; `..` out of it reaches the root, where
        // every name is refused.
        let grant = try cli(["token", "grant", mounted.path("docs")])
        #expect(grant.status == 0, "\(grant)")
        let accessPath = try #require(grant.output.split(separator: "\n").first.map(String.init))
        let a = quoted(accessPath)
        #expect(try shell("cat \(a)/report.txt").output == "quarterly")
        #expect(try shell("ls \(a)").output == "big.bin\nreport.txt\n")
        #expect(try shell("cmp \(a)/big.bin \(quoted(source + "/docs/big.bin"))").status == 0)
        try expectRefused("cat \(a)/../../private.txt")
        try expectRefused("ls \(a)/../..")
        try expectRefused("cat \(a)/../../docs/report.txt")
        // Still refused after all that traffic through the access path.
        try expectRefused("cat \(m)/docs/report.txt")

        // The refusals are explained in the daemon's log, naming the program.
        let log = mounted.child.standardError
        #expect(log.contains("require-token mode") && log.contains("cat (pid"), "\(log.suffix(2000))")
    }

    /// Another user, let in by `--allow-other`: refused by uid on plain paths, and the reason
    /// says so; a token's access path works for it like for anyone.
    @Test(.enabled(if: getuid() == 0, "runs a command as nobody with setpriv, which needs root"))
    func anotherUserIsRefusedByUidButAnAccessPathWorks() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache, "--require-token", "--allow-other"],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        chmod(mounted.directory, 0o755)  // nobody must reach the mount point
        let m = quoted(mounted.mountpoint)
        let deadline = ContinuousClock.now + .seconds(20)
        while try shell("stat \(m) >/dev/null 2>&1").status != 0, ContinuousClock.now < deadline { usleep(20_000) }
        let asNobody = "setpriv --reuid=65534 --regid=65534 --clear-groups "
        #expect(try shell(asNobody + "stat -c %F \(m)").output == "directory\n", "the mount point stats for anyone")
        try expectRefused(asNobody + "cat \(m)/private.txt")
        try expectRefused(asNobody + "ls \(m)")
        let grant = try cli(["token", "grant", mounted.path("docs/report.txt")])
        #expect(grant.status == 0, "\(grant)")
        let accessPath = try #require(grant.output.split(separator: "\n").first.map(String.init))
        #expect(try shell(asNobody + "cat \(quoted(accessPath))").output == "quarterly")
        let log = mounted.child.standardError
        #expect(log.contains("uid 65534 is not the mount's owner (uid 0)"), "\(log.suffix(2000))")
    }

    /// The control socket in this mode (D-319): a program of the owner that is not a providerfs
    /// command gets no plain item through it (a bookmark of a plain path needs `identifyItem`), while
    /// an access path's start and bookmark (requests that present the token) work.
    @Test func theControlSocketGivesProgramsOnlyWhatTheirTokensGive() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache, "--require-token"], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        let registry = ScopedAccessRegistry(backend: ControlSocketBackend(mountsDirectory: runtime + "/mounts"))
        do {
            _ = try SecurityScopedURL(path: mounted.path("private.txt"), registry: registry).bookmarkData()
            Issue.record("a bookmark of a plain path was made by a program in require-token mode")
        } catch {
            #expect("\(error)".contains("require-token"), "\(error)")
        }
        let grant = try cli(["token", "grant", mounted.path("docs/report.txt")])
        #expect(grant.status == 0, "\(grant)")
        let accessPath = try #require(grant.output.split(separator: "\n").first.map(String.init))
        let url = SecurityScopedURL(path: accessPath, registry: registry)
        #expect(url.startAccessingSecurityScopedResource(), "\(String(describing: url.lastError))")
        #expect(try readFile(url.path) == Array("quarterly".utf8))
        url.stopAccessingSecurityScopedResource()
        #expect(!(try SecurityScopedURL(path: accessPath, registry: registry).bookmarkData()).isEmpty)
    }
}
