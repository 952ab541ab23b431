// The FUSE adapter against an in-memory FileSystem (the fuse-fixture executable), exercised with
// ordinary tools. Independent of providers and caches: these failures are the adapter's.

import FUSEAdapter
import Foundation
import LocalProvider
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct AdapterMountTests {
    /// A source tree with nested folders, odd names and a 3 MiB file of known bytes.
    static func makeTree() throws -> String {
        let root = try makeTemporaryDirectory(prefix: "tree")
        mkdir(root + "/docs", 0o755)
        mkdir(root + "/docs/deeper", 0o755)
        writeTestFile(root + "/hello.txt", Array("hello, world\n".utf8))
        writeTestFile(root + "/docs/name with spaces.txt", Array("spaces\n".utf8))
        writeTestFile(root + "/docs/ünïcødé.txt", Array("unicode\n".utf8))
        writeTestFile(root + "/docs/deeper/" + String(repeating: "n", count: 255), Array("long name\n".utf8))
        writeTestFile(root + "/big.bin", patternBytes(count: 3 << 20, seed: 42))
        symlink("hello.txt", root + "/link")
        return root
    }

    @Test func listingStatAndContentMatchTheSource() throws {
        guard requireFUSE() else { return }
        let tree = try Self.makeTree()
        defer { removeTreeWithinFileSystem(tree) }
        let mount = try MountedFileSystem.fixture(tree: tree)
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let t = quoted(tree)

        let listing = try shell("cd \(m) && ls -R | LC_ALL=C sort")
        let expected = try shell("cd \(t) && ls -R | LC_ALL=C sort")
        #expect(listing.status == 0)
        // The fixture adds slow.txt and xattrs.txt at the top.
        let extra = Set(["slow.txt", "xattrs.txt"])
        #expect(
            listing.output.split(separator: "\n").filter { !extra.contains(String($0)) }
                == expected.output.split(separator: "\n"))

        let sums = try shell("cd \(m) && sha256sum big.bin hello.txt 'docs/name with spaces.txt' docs/ünïcødé.txt")
        let sourceSums = try shell(
            "cd \(t) && sha256sum big.bin hello.txt 'docs/name with spaces.txt' docs/ünïcødé.txt")
        #expect(sums.status == 0)
        #expect(sums.output == sourceSums.output)

        let sizes = try shell("stat -c '%s %F' \(m)/big.bin \(m)/docs \(m)/link")
        #expect(sizes.output == "3145728 regular file\n4096 directory\n9 symbolic link\n")
        #expect(try shell("readlink \(m)/link").output == "hello.txt\n")
        #expect(try shell("cat \(m)/link").output == "hello, world\n")
        #expect(try shell("cat \(m)/docs/deeper/" + String(repeating: "n", count: 255)).output == "long name\n")
        #expect(try shell("stat \(m)/missing").status != 0)
        #expect(
            try shell(
                "cp \(m)/big.bin \(quoted(mount.directory))/copy && cmp \(m)/big.bin \(quoted(mount.directory))/copy"
            ).status == 0)
        #expect(try shell("df \(m) | tail -1 | awk '{print $1}'").output == "fuse-fixture\n")
    }

    /// The local provider's change tracking (D-224) is for file systems whose changes all go
    /// through this kernel; a FUSE file system's daemon changes it behind inotify's back.
    @Test func aLocalProviderOverAFUSEMountDoesNotTrackChanges() async throws {
        guard requireFUSE() else { return }
        let tree = try Self.makeTree()
        defer { removeTreeWithinFileSystem(tree) }
        let mount = try MountedFileSystem.fixture(tree: tree)
        defer { mount.stop() }
        let provider = LocalDirectoryProvider(root: mount.mountpoint)
        let listed = try await provider.trackedChildren(of: ItemIdentifier("docs"))
        #expect(listed.children.map(\.name).sorted() == ["deeper", "name with spaces.txt", "ünïcødé.txt"])
        #expect(listed.token == nil)
        let local = try await LocalDirectoryProvider(root: tree).trackedChildren(of: ItemIdentifier("docs"))
        #expect(local.token != nil, "the same tree on its local file system is tracked")
    }

    @Test func readsAtOffsetsWithDdAndPython() throws {
        guard requireFUSE() else { return }
        let tree = try Self.makeTree()
        defer { removeTreeWithinFileSystem(tree) }
        let mount = try MountedFileSystem.fixture(tree: tree)
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let t = quoted(tree)
        for (skip, count) in [(0, 1), (7, 3), (1023, 2), (3071, 1), (3071, 5)] {
            let mounted = try shell("dd if=\(m)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            let source = try shell("dd if=\(t)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            #expect(mounted.output == source.output, "dd skip=\(skip) count=\(count)")
        }
        let script = """
            import os, random, sys
            random.seed(7)
            a = open(sys.argv[1] + '/big.bin', 'rb'); b = open(sys.argv[2] + '/big.bin', 'rb')
            size = os.path.getsize(sys.argv[2] + '/big.bin')
            for _ in range(300):
                off = random.randrange(0, size + 10); n = random.randrange(1, 200000)
                a.seek(off); b.seek(off)
                if a.read(n) != b.read(n): print('mismatch', off, n); sys.exit(1)
            print('ok')
            """
        let result = try shell("python3 -c \(quoted(script)) \(m) \(t)")
        #expect(result.output == "ok\n", "\(result.error)")
    }

    @Test func everyChangeFailsWithEROFS() throws {
        guard requireFUSE() else { return }
        let tree = try Self.makeTree()
        defer { removeTreeWithinFileSystem(tree) }
        let mount = try MountedFileSystem.fixture(tree: tree)
        defer { mount.stop() }
        let script = """
            import errno, os, sys
            m = sys.argv[1]
            def code(f):
                try: f(); return 'ok'
                except OSError as e: return errno.errorcode[e.errno]
            print(code(lambda: open(m + '/new.txt', 'w')))
            print(code(lambda: open(m + '/hello.txt', 'a')))
            print(code(lambda: open(m + '/hello.txt', 'r+')))
            print(code(lambda: os.mkdir(m + '/dir')))
            print(code(lambda: os.rename(m + '/hello.txt', m + '/renamed.txt')))
            print(code(lambda: os.unlink(m + '/hello.txt')))
            print(code(lambda: os.rmdir(m + '/docs/deeper')))
            print(code(lambda: os.symlink('x', m + '/newlink')))
            print(code(lambda: os.truncate(m + '/hello.txt', 0)))
            print(code(lambda: os.chmod(m + '/hello.txt', 0o600)))
            print(code(lambda: os.setxattr(m + '/hello.txt', 'user.x', b'1')))
            print(code(lambda: os.removexattr(m + '/xattrs.txt', 'user.providerfs.state')))
            """
        let result = try shell("python3 -c \(quoted(script)) \(quoted(mount.mountpoint))")
        #expect(
            result.output.split(separator: "\n").map(String.init) == Array(repeating: "EROFS", count: 12), "\(result)")
        #expect(try shell("cat \(quoted(mount.path("hello.txt")))").output == "hello, world\n")
    }

    @Test func extendedAttributesFollowTheSizeQueryConvention() throws {
        guard requireFUSE() else { return }
        let mount = try MountedFileSystem.fixture()
        defer { mount.stop() }
        let path = mount.path("xattrs.txt")
        #expect(try shell("getfattr --only-values -n user.providerfs.state \(quoted(path))").output == "materialized")
        #expect(try shell("getfattr -d -m - \(quoted(path)) | grep -c '^user\\.'").output == "2\n")
        // Size query, then a buffer that is too small (ERANGE), then one that fits.
        #expect(ExtendedAttributes.rawGet("user.test.big", of: path, capacity: 0).result == 3000)
        let small = ExtendedAttributes.rawGet("user.test.big", of: path, capacity: 100)
        #expect(small.result == -1 && small.errno == .range)
        #expect(ExtendedAttributes.rawGet("user.test.big", of: path, capacity: 4000).result == 3000)
        #expect(
            ExtendedAttributes.rawList(of: path, capacity: 0).result
                == "user.providerfs.state\0user.test.big\0".utf8.count)
        let tiny = ExtendedAttributes.rawList(of: path, capacity: 5)
        #expect(tiny.result == -1 && tiny.errno == .range)
        let absent = ExtendedAttributes.rawGet("user.absent", of: path, capacity: 0)
        #expect(absent.result == -1 && absent.errno == .noData)
        #expect(try ExtendedAttributes.names(of: path).get() == ["user.providerfs.state", "user.test.big"])
        // The caller's identity reaches the file system (fuse_req_ctx).
        let caller = try shell("getfattr --only-values -n user.test.caller \(quoted(path))")
        #expect(caller.output.hasSuffix("uid=\(getuid()) gid=\(getgid())"), "\(caller.output)")
    }

    @Test func oneWorkerThreadServesConcurrentSlowReadsAndAnotherReader() throws {
        guard requireFUSE() else { return }
        let mount = try MountedFileSystem.fixture(extraArguments: ["--max-threads", "1", "--slow-delay", "400ms"])
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        // Four readers of the slow file (each read waits 400 ms inside the file system) plus a
        // reader of a fast file: with deferred replies one libfuse thread serves all of them.
        let start = ContinuousClock.now
        let result = try shell(
            "for i in 1 2 3 4; do dd if=\(m)/slow.txt iflag=direct bs=500 count=1 status=none of=/dev/null & done; "
                + "sleep 0.1; t0=$(date +%s%N); cat \(m)/xattrs.txt >/dev/null; t1=$(date +%s%N); wait; "
                + "echo $(( (t1 - t0) / 1000000 ))")
        let elapsed = ContinuousClock.now - start
        #expect(result.status == 0, "\(result.error)")
        #expect(elapsed < .milliseconds(1400), "4 × 400 ms slow reads took \(elapsed): replies are not deferred")
        let fastMilliseconds = Int(result.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 9999
        #expect(fastMilliseconds < 300, "a fast read waited \(fastMilliseconds) ms behind slow ones")
    }

    @Test func anInterruptedReadIsCancelledAndAnswered() throws {
        guard requireFUSE() else { return }
        let mount = try MountedFileSystem.fixture(extraArguments: ["--slow-delay", "30s"])
        defer { mount.stop() }
        // O_DIRECT makes the read synchronous in the caller, so the kernel forwards SIGINT as
        // FUSE_INTERRUPT; the adapter cancels the task and the file system answers EINTR.
        let reader = try ChildProcess(
            "/usr/bin/python3",
            [
                "-c", "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECT); os.read(fd, 4096)",
                mount.path("slow.txt"),
            ])
        usleep(500_000)
        #expect(reader.isRunning)
        reader.signal(SIGINT)
        let status = reader.wait(timeout: .seconds(5))
        #expect(status != nil, "the interrupted reader is still blocked")
        #expect(status != 0)
        if status == nil { reader.signal(SIGKILL); reader.wait(timeout: .seconds(5)) }
        // Nothing was left pending: the daemon reports no abandoned request on exit.
        #expect(mount.stop() == 0)
        #expect(mount.child.standardOutput.contains("EXIT signal=15 abandoned=0"), "\(mount.child.standardOutput)")
    }

    @Test func sigtermUnmountsCleanlyEvenWithARequestPending() throws {
        guard requireFUSE() else { return }
        let mount = try MountedFileSystem.fixture(extraArguments: ["--slow-delay", "30s"])
        let reader = try ChildProcess(
            "/usr/bin/python3",
            [
                "-c",
                "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECT)\ntry: os.read(fd, 4096)\nexcept OSError as e: print(e.errno)",
                mount.path("slow.txt"),
            ])
        usleep(500_000)
        let start = ContinuousClock.now
        #expect(mount.stop() == 0)
        #expect(ContinuousClock.now - start < .seconds(5))
        #expect(MountTable.entry(at: mount.mountpoint) == nil)
        #expect(access(mount.directory, F_OK) != 0, "the harness removes its directories")
        let readerStatus = reader.wait(timeout: .seconds(5))
        if readerStatus == nil { reader.signal(SIGKILL); reader.wait(timeout: .seconds(5)) }
        #expect(readerStatus == 0)
        // The pending read was answered (EIO from the drain, or the connection went away).
        #expect(["5\n", "103\n", "107\n"].contains(reader.standardOutput), "\(reader.standardOutput)")
        #expect(mount.child.standardOutput.contains("EXIT signal=15 abandoned=1"), "\(mount.child.standardOutput)")
    }
}
