// Coordination across machines (issue 26 item 4, D-451): two mounts of one Apache mod_dav server
// (DavLockDB, class 2), each with its own cache, runtime directory and coordinator, stand for two
// laptops. A write open through either takes the server's lock on the file (after the local write
// claim), so read-modify-write increments from both lose no update; a holder killed with SIGKILL
// lets the other in once its lock's timeout passes.

import Foundation
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
struct WebDAVLockingMountTests {
    let scratch: String
    let served: String
    let providerfs = productsDirectory + "/providerfs"

    init() throws {
        scratch = try makeTemporaryDirectory(prefix: "webdav-locks")
        served = scratch + "/served"
        mkdir(served, 0o755)
        writeTestFile(served + "/counter.txt", Array("000000000000\n".utf8))
    }

    func cleanup() { removeTreeWithinFileSystem(scratch) }

    func requireServers() -> Bool {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return false
        }
        return true
    }

    /// A mount of `url` as one machine: its own cache and runtime directory.
    func machine(_ name: String, _ url: String, _ extra: [String] = []) throws -> MountedFileSystem {
        try MountedFileSystem.providerfs(
            ["--webdav", url, "--cache", scratch + "/cache-" + name, "--poll-interval", "0"] + extra,
            environment: ["PROVIDERFS_RUNTIME_DIR": scratch + "/run-" + name])
    }

    /// Increments the counter through `mountpoint` (open O_RDWR, read, write the next number,
    /// close) for `seconds`; prints how many increments it made.
    static let incrementer = """
        import os, sys, time
        path, seconds = sys.argv[1], float(sys.argv[2])
        end, count = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            fd = os.open(path, os.O_RDWR)
            value = int(os.pread(fd, 64, 0).strip() or b"0")
            os.pwrite(fd, b"%012d\\n" % (value + 1), 0)
            os.close(fd)
            count += 1
        print("count", count)
        """

    func stop(_ process: ChildProcess) {
        process.signal(SIGKILL)
        process.wait(timeout: .seconds(10))
    }

    @Test func readModifyWriteIncrementsFromTwoMountsLoseNoUpdate() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: served, kind: .apache)
        defer { dav.stop() }
        let laptopA = try machine("a", dav.url)
        defer { laptopA.stop() }
        let laptopB = try machine("b", dav.url)
        defer { laptopB.stop() }
        writeTestFile(scratch + "/increment.py", Array(Self.incrementer.utf8))

        let status = try shell(
            "PROVIDERFS_RUNTIME_DIR=\(quoted(scratch + "/run-a")) \(quoted(providerfs)) status \(quoted(laptopA.mountpoint))"
        )
        #expect(status.output.contains("machines: WebDAV locks (DAV class 2)"), "\(status.output) \(status.error)")

        let seconds = "8"
        let writers = try [laptopA, laptopB].map { mount in
            try ChildProcess("/usr/bin/python3", [scratch + "/increment.py", mount.path("counter.txt"), seconds])
        }
        defer { writers.forEach(stop) }
        #expect(waitUntil(.seconds(60)) { writers.allSatisfy { !$0.isRunning } })
        let counts = writers.map { writer -> Int in
            let line = writer.standardOutput.split(separator: "\n").first { $0.hasPrefix("count ") }
            return line.flatMap { Int($0.dropFirst(6)) } ?? -1
        }
        #expect(counts.allSatisfy { $0 > 0 }, "\(counts) \(writers.map(\.standardError))")
        let total = counts.reduce(0, +)
        print("two mounts: \(counts) increments in \(seconds) s")
        let expected = String(format: "%012d\n", total)
        // The last upload may still be on its way.
        #expect(
            waitUntil(.seconds(30)) { readTextFile(served + "/counter.txt") == expected },
            "server: \(readTextFile(served + "/counter.txt") ?? "nil"), expected \(expected)")
        #expect(try shell("ls \(quoted(served))").output == "counter.txt\n", "no conflict copies")
    }

    /// A class-1 server (`OPTIONS` says `DAV: 1`, LOCK answered 405: rclone behind a proxy that
    /// makes it one) works without exclusion across machines: `status` says so, and a write
    /// through the mount is not refused for want of a lock and reaches the server.
    @Test func aClassOneServerWritesWithoutLocksAndStatusSaysSo() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let upstream = try WebDAVTestServer(root: served)
        defer { upstream.stop() }
        let dav = try WebDAVTestServer(root: scratch + "/proxy-root", kind: .tampering(upstream: upstream.url))
        defer { dav.stop() }
        try dav.tamper(.classOne)
        let options = try shell("curl -s -i -X OPTIONS \(quoted(dav.url))")
        #expect(
            options.output.split(separator: "\r\n").contains { $0.lowercased() == "dav: 1" },
            "the server should be class 1: \(options.output)")
        let laptop = try machine("a", dav.url)
        defer { laptop.stop() }
        let status = try shell(
            "PROVIDERFS_RUNTIME_DIR=\(quoted(scratch + "/run-a")) \(quoted(providerfs)) status \(quoted(laptop.mountpoint))"
        )
        #expect(
            status.output.contains("machines: none: the server is DAV class 1 (no LOCK)"),
            "\(status.output) \(status.error)")
        let written = "000000000042\n"
        let write = try shell("printf %s \(quoted(written)) > \(quoted(laptop.path("counter.txt")))")
        #expect(write.status == 0, "a write without a server lock: \(write.error)")
        #expect(
            waitUntil(.seconds(30)) { readTextFile(served + "/counter.txt") == written },
            "server: \(readTextFile(served + "/counter.txt") ?? "nil")")
        #expect(try shell("ls \(quoted(served))").output == "counter.txt\n", "no conflict copies")
    }

    /// `providerfs coordinate --write` on one machine holds the server lock for its whole claim:
    /// its command's read-modify-write, with a pause between the read and the write, is not
    /// interleaved with the other machine's increment, which waits and then reads the result.
    @Test func aCoordinatedWriteClaimExcludesTheOtherMachineForItsWholeLength() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: served, kind: .apache)
        defer { dav.stop() }
        let laptopA = try machine("a", dav.url)
        defer { laptopA.stop() }
        let laptopB = try machine("b", dav.url)
        defer { laptopB.stop() }
        writeTestFile(scratch + "/increment.py", Array(Self.incrementer.utf8))
        let marker = scratch + "/claimed"
        let slow = """
            import os, sys, time
            path, marker = sys.argv[1], sys.argv[2]
            with open(path, "rb") as f:
                value = int(f.read().strip() or b"0")
            open(marker, "w").close()
            time.sleep(2)
            with open(path, "r+b") as f:
                f.write(b"%012d\\n" % (value + 1))
            """
        writeTestFile(scratch + "/slow.py", Array(slow.utf8))
        let counter = laptopA.path("counter.txt")
        let claim = try ChildProcess(
            providerfs,
            ["coordinate", "--write", counter, "--", "/usr/bin/python3", scratch + "/slow.py", counter, marker],
            environment: ["PROVIDERFS_RUNTIME_DIR": scratch + "/run-a"])
        defer { stop(claim) }
        #expect(waitUntil { access(marker, F_OK) == 0 || !claim.isRunning }, "\(claim.standardError)")
        // One increment on the other machine, started inside A's claim (after its read).
        let started = ContinuousClock.now
        let other = try ChildProcess(
            "/usr/bin/python3", [scratch + "/increment.py", laptopB.path("counter.txt"), "0.001"])
        defer { stop(other) }
        #expect(waitUntil(.seconds(60)) { !other.isRunning && !claim.isRunning })
        let waited = ContinuousClock.now - started
        #expect(claim.poll() == 0, "\(claim.standardError)")
        #expect(other.standardOutput.contains("count 1"), "\(other.standardOutput) \(other.standardError)")
        print("a coordinated claim and the other machine's increment inside it ended after \(waited)")
        #expect(
            waitUntil(.seconds(30)) { readTextFile(served + "/counter.txt") == "000000000002\n" },
            "\(readTextFile(served + "/counter.txt") ?? "nil")")
        #expect(try shell("ls \(quoted(served))").output == "counter.txt\n", "no conflict copies")
    }

    @Test func aKilledHoldersLockLapsesAndTheOtherGetsIn() throws {
        guard requireFUSE(), requireServers() else { return }
        defer { cleanup() }
        let dav = try WebDAVTestServer(root: served, kind: .apache)
        defer { dav.stop() }
        let timeout = 3.0
        let laptopA = try machine("a", dav.url, ["--lock-timeout", "3s"])
        defer { laptopA.stop() }
        let laptopB = try machine("b", dav.url, ["--lock-timeout", "3s"])
        defer { laptopB.stop() }

        // A holds the file open for writing: the server lock is A's.
        let holder = try ChildProcess(
            "/usr/bin/python3",
            [
                "-c",
                "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); print('holding', flush=True); "
                    + "time.sleep(120)",
                laptopA.mountpoint + "/counter.txt",
            ])
        defer { stop(holder) }
        #expect(waitUntil { holder.standardOutput.contains("holding") || !holder.isRunning })
        #expect(holder.isRunning, "\(holder.standardError)")

        // B's write open waits for A's lock; A's daemon dies without unlocking.
        let writer = try ChildProcess(
            "/usr/bin/python3",
            [
                "-c",
                """
                import os, sys, time
                start = time.monotonic()
                fd = os.open(sys.argv[1], os.O_RDWR)
                waited = time.monotonic() - start
                os.pwrite(fd, b"written by b\\n", 0)
                os.ftruncate(fd, 13)
                os.close(fd)
                print("waited %.3f" % waited, flush=True)
                """,
                laptopB.mountpoint + "/counter.txt",
            ])
        defer { stop(writer) }
        laptopA.child.signal(SIGKILL)
        #expect(waitUntil(.seconds(60)) { !writer.isRunning })
        let waited = writer.standardOutput.split(separator: " ").last.flatMap {
            Double($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        #expect(writer.poll() == 0, "\(writer.standardOutput) \(writer.standardError)")
        if let waited {
            print("a killed holder's 3 s lock let the other in after \(waited) s")
            // Not before A's lock lapsed (refreshed every third of the timeout), and well before
            // the claim deadline.
            #expect(waited >= timeout / 2 && waited < timeout * 10, "waited \(waited) s")
        } else {
            Issue.record("no wait reported: \(writer.standardOutput) \(writer.standardError)")
        }
        #expect(
            waitUntil(.seconds(30)) { readTextFile(served + "/counter.txt") == "written by b\n" },
            "\(readTextFile(served + "/counter.txt") ?? "nil")")
    }
}
