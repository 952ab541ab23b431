// Reading through access paths on a real `--source` mount, with tokens granted by
// `providerfs token grant` (docs/SEMANTICS.md, "Scoped access paths"): a file grant reads with
// `cat`, a folder grant lists and copies with `cp -r`, revocation stops a handle already open
// (EACCES on its next read), and a 2 s token stops working after its TTL.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct ScopedAccessMountTests: MountLayoutSuite, TokenGranting {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "scoped-mount")
        mkdir(source + "/docs", 0o755)
        mkdir(source + "/docs/inner", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
        writeTestFile(source + "/docs/inner/notes.txt", Array("notes\n".utf8))
        writeTestFile(source + "/private.txt", Array("private\n".utf8))
    }

    @Test func fileAndFolderGrantsReadThenRevocationAndExpiryRefuse() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }

        // A file: `cat` of the printed path.
        let file = try grant(mounted.path("docs/report.txt"))
        #expect(try shell("cat \(quoted(file.accessPath))").output == "quarterly")
        #expect(
            try shell("ls \(quoted((file.accessPath as NSString).deletingLastPathComponent))").output == "report.txt\n")

        // A folder: ls and cp -r of the printed path; nothing outside it is reachable.
        let folder = try grant(mounted.path("docs"))
        let a = quoted(folder.accessPath)
        #expect(try shell("ls \(a)").output == "inner\nreport.txt\n")
        #expect(try shell("cat \(a)/inner/notes.txt").output == "notes\n")
        #expect(
            try shell("cp -r \(a) \(quoted(scratch + "/copy")) && cat \(quoted(scratch + "/copy/inner/notes.txt"))")
                .output == "notes\n")
        // `..` of the folder's path is `.scoped`, where "private.txt" cannot even be a token: no
        // such entry (D-394). (Two levels up is the mount's root: a plain path, open to anyone
        // until --require-token.)
        let outside = try shell("cat \(a)/../private.txt 2>&1")
        #expect(outside.status != 0 && outside.output.contains("No such file or directory"), "\(outside.output)")

        // Revocation while a handle is open: its next read fails with EACCES.
        let descriptor = open(file.accessPath, O_RDONLY)
        #expect(descriptor >= 0, "open \(file.accessPath): \(errno)")
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 4)
        #expect(read(descriptor, &buffer, 4) == 4)
        let revoke = try providerfs(["token", "revoke", file.id], runtime: runtime)
        #expect(revoke.status == 0, "\(revoke)")
        errno = 0
        #expect(read(descriptor, &buffer, 4) == -1)
        #expect(errno == EACCES)
        let after = try shell("cat \(quoted(file.accessPath)) 2>&1")
        #expect(after.status != 0 && after.output.contains("Permission denied"), "\(after.output)")
        #expect(try shell("cat \(a)/report.txt").output == "quarterly", "the folder's token still works")

        // A 2 s token: readable now, refused once the TTL has passed (polled, bounded).
        // Taken before the grant: the daemon's deadline is at least `granted` + 2 s.
        let granted = ContinuousClock.now
        let short = try grant(mounted.path("docs/inner/notes.txt"), ["--ttl", "2s"])
        #expect(try shell("cat \(quoted(short.accessPath))").output == "notes\n")
        var refused = false
        while !refused, ContinuousClock.now - granted < .seconds(10) {
            let attempt = try shell("cat \(quoted(short.accessPath)) 2>&1")
            refused = attempt.status != 0 && attempt.output.contains("Permission denied")
            if !refused { usleep(50_000) }
        }
        #expect(refused, "the 2 s token still reads after 10 s")
        #expect(ContinuousClock.now - granted >= .seconds(2), "refused before its TTL")
        #expect(try shell("cat \(quoted(mounted.path("private.txt")))").output == "private\n", "plain paths unchanged")
    }

    @Test func aOneUseTokenCatsOnceThenIsUsedUp() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        // The use is the open and its handle (D-315): cat reads the whole file with one use.
        let once = try grant(mounted.path("docs/report.txt"), ["--uses", "1"])
        #expect(try shell("cat \(quoted(once.accessPath))").output == "quarterly")
        let again = try shell("cat \(quoted(once.accessPath)) 2>&1")
        #expect(again.status != 0 && again.output.contains("Permission denied"), "\(again.output)")
        // The kernel sends the release after cat's close returns: polled, bounded.
        let deadline = ContinuousClock.now + .seconds(10)
        var list = try providerfs(["token", "list", "--all"], runtime: runtime)
        while !list.output.contains("used up"), ContinuousClock.now < deadline {
            usleep(20_000)
            list = try providerfs(["token", "list", "--all"], runtime: runtime)
        }
        #expect(list.output.contains("\(once.id)") && list.output.contains("used up"), "\(list.output)")
        let log = try providerfs(["token", "log", "--json"], runtime: runtime)
        #expect(log.output.contains("\"usedUp\""), "\(log.output)")
    }

    @Test func claimsOnAnAccessPathShowNoToken() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { mounted.stop() }
        let file = try grant(mounted.path("docs/report.txt"))
        let holder = try ChildProcess(
            productsDirectory + "/providerfs", ["coordinate", "--read", file.accessPath, "--", "sleep", "60"],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer {
            holder.signal(SIGKILL)
            _ = holder.wait(timeout: .seconds(10))
        }
        // Polled until the claim is held (bounded).
        let deadline = ContinuousClock.now + .seconds(30)
        var dump = ""
        while ContinuousClock.now < deadline {
            dump = try providerfs(["claims", "--mount", mounted.mountpoint, "--json"], runtime: runtime).output
            if dump.contains("report.txt") { break }
            usleep(20_000)
        }
        #expect(dump.contains(".scoped/<token>/report.txt"), "\(dump)")
        #expect(!dump.contains("pfs_"), "a token in `providerfs claims`: \(dump)")
        let text = try providerfs(["claims", "--mount", mounted.mountpoint], runtime: runtime).output
        #expect(!text.contains("pfs_") && text.contains("<token>"), "\(text)")
    }
}
