// Readers can always be stopped (SEMANTICS.md "Interrupts", D-285): a reader blocked on a
// stalled download gets EINTR at once from a caught signal (FUSE_INTERRUPT) and dies at once on
// SIGKILL, while the download goes on for the other readers of the file; and a stalled item holds
// up nothing else. The stall is a FUSE fixture source whose reads of "slow…" files wait
// --slow-delay (every read of the providerfs mount's download waits that long per request; as a
// `--source`, or served by rclone: a GET that stalls), or a stall on cue (`providerfs fault add
// --stall`, over a local directory and the same tree served by rclone and Apache; issue 26).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// A reader that calls libc pread() once through ctypes (so EINTR is seen, not retried by
/// Python), with a SIGUSR1 handler installed without SA_RESTART and a SIGWINCH handler with it
/// (a terminal resize: a notification). Prints READING before the read,
/// then `RESULT <count> <errno>` and `DIFF <first differing offset against EXPECTED, -1 if none>`.
/// Arguments: PATH OFFSET COUNT (buffered|direct) EXPECTED.
private let readerScript = """
    import ctypes, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pread.restype = ctypes.c_ssize_t
    libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    signal.signal(signal.SIGUSR1, lambda number, frame: None)
    signal.siginterrupt(signal.SIGUSR1, True)
    signal.signal(signal.SIGWINCH, lambda number, frame: None)
    signal.siginterrupt(signal.SIGWINCH, False)
    path, offset, count, mode, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0))
    buffer = libc.aligned_alloc(4096, count)
    print("READING", flush=True)
    n = libc.pread(fd, buffer, count, offset)
    print("RESULT", n, ctypes.get_errno() if n < 0 else 0, flush=True)
    if n > 0:
        data = ctypes.string_at(buffer, n)
        with open(expected, "rb") as f:
            f.seek(offset)
            want = f.read(n)
        diff = next((i for i in range(n) if data[i] != want[i]), -1 if len(want) == n else len(want))
        print("DIFF", diff, flush=True)
    """

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct InterruptMountTests: MountLayoutSuite {
    let layout: MountLayout
    let script: String

    init() throws {
        layout = try MountLayout(prefix: "interrupt-mount")
        script = layout.scratch + "/reader.py"
        mkdir(source + "/sub", 0o755)
        writeTestFile(source + "/slow-stalled.bin", patternBytes(count: 4 << 20, seed: 11))
        writeTestFile(source + "/slow-second.bin", patternBytes(count: 4 << 20, seed: 13))
        writeTestFile(source + "/other.bin", patternBytes(count: 300 << 10, seed: 12))
        writeTestFile(source + "/quick.txt", Array("quick\n".utf8))
        writeTestFile(source + "/sub/inner.txt", Array("inner\n".utf8))
        writeTestFile(script, Array(readerScript.utf8))
    }

    /// The providers a FUSE source can be served by: a local directory, and rclone (Apache's
    /// workers must own the tree they serve, which a FUSE fixture's cannot be given).
    static var stallingSourceKinds: [ProviderKind] { ProviderKind.available.filter { $0 != .apache } }

    /// A providerfs mount over a fixture whose "slow…" reads each wait `delay`: the fixture as a
    /// `--source`, or served by rclone (a GET that stalls).
    func mountOverStallingSource(delay: String, over kind: ProviderKind) throws -> (MountedFileSystem, ServedMount) {
        let source = try MountedFileSystem.fixture(tree: layout.source, extraArguments: ["--slow-delay", delay])
        do {
            let mount = try ServedMount(
                tree: source.mountpoint, kind: kind, arguments: ["--cache", cache],
                environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
            return (source, mount)
        } catch {
            source.stop()
            throw error
        }
    }

    /// A providerfs mount of the tree itself whose two "slow…" files stall until `fault clear`,
    /// under a stall deadline far beyond the test: readers stay blocked however slowly they start
    /// (a fixed source delay ran out on a loaded CI machine before the signals were sent).
    func mountWithStalledFiles(over kind: ProviderKind) throws -> ServedMount {
        let mount = try layout.mount(over: kind, arguments: ["--stall-timeout", "10m"])
        for file in ["slow-stalled.bin", "slow-second.bin"] {
            let added = try providerfs(
                ["fault", "add", mount.path(file), "--stall", "--times", "0"], runtime: runtime)
            #expect(added.status == 0, "\(added)")
        }
        return mount
    }

    /// Starts the reader script and waits (up to 20 s) until it is about to read.
    func startReader(
        _ path: String, offset: Int, count: Int, direct: Bool = false, expected: String = "slow-stalled.bin"
    ) throws -> ChildProcess {
        let reader = try ChildProcess(
            "/usr/bin/python3",
            [script, path, "\(offset)", "\(count)", direct ? "direct" : "buffered", source + "/" + expected])
        return try waitUntilReading(reader)
    }

    /// Waits (up to 20 s) until `reader` is about to read.
    func waitUntilReading(_ reader: ChildProcess) throws -> ChildProcess {
        let deadline = ContinuousClock.now + .seconds(20)
        while !reader.standardOutput.contains("READING") && reader.isRunning && ContinuousClock.now < deadline {
            usleep(5_000)
        }
        #expect(reader.standardOutput.contains("READING"), "the reader started: \(reader.standardError)")
        return reader
    }

    /// Whether `child`'s kernel stack waits in a FUSE request or a page lock, i.e. it is blocked on
    /// the stalled file, not still starting up (polled up to 10 s).
    func isBlockedInTheMount(_ child: ChildProcess) -> Bool {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let wchan = readTextFile("/proc/\(child.pid)/wchan") ?? ""
            if wchan.contains("request_wait_answer") || wchan.contains("folio") { return true }
            usleep(10_000)
        }
        return false
    }

    func stopReader(_ reader: ChildProcess) {
        reader.signal(SIGKILL)
        reader.wait(timeout: .seconds(10))
    }

    @Test(arguments: ProviderKind.available)
    func aSignalGivesEINTRAtOnceWhileTheDownloadGoesOnForTheOtherReader(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // Stalled until cleared, however long Python takes to start on a loaded machine.
        let mount = try mountWithStalledFiles(over: kind)
        defer { mount.stop() }
        let path = mount.path("slow-stalled.bin")
        // The waiting reader reads with O_DIRECT, so it waits in its own request on the same bytes
        // (a buffered reader of the same pages would wait on the first one's page lock instead).
        let waiting = try startReader(path, offset: 0, count: 64 << 10, direct: true)
        defer { stopReader(waiting) }
        #expect(isBlockedInTheMount(waiting))
        let interrupted = try startReader(path, offset: 0, count: 64 << 10)
        defer { stopReader(interrupted) }
        #expect(isBlockedInTheMount(interrupted))
        #expect(!waiting.standardOutput.contains("RESULT"), "the download stalls: \(waiting.standardOutput)")

        let signalled = ContinuousClock.now
        interrupted.signal(SIGUSR1)
        let status = interrupted.wait(timeout: .seconds(10))
        let elapsed = ContinuousClock.now - signalled
        #expect(status == 0, "\(interrupted.standardError)")
        #expect(interrupted.standardOutput.contains("RESULT -1 \(EINTR)\n"), "\(interrupted.standardOutput)")
        #expect(elapsed < .seconds(1), "EINTR came \(elapsed) after the signal")
        #expect(waiting.isRunning, "the other reader still waits: \(waiting.standardOutput)")

        // The download was not cancelled: once the stall is cleared, the other reader gets its
        // bytes from it, and they are right.
        let cleared = try providerfs(["fault", "clear", mount.path("slow-stalled.bin")], runtime: runtime)
        #expect(cleared.status == 0, "\(cleared)")
        #expect(waiting.wait(timeout: .seconds(45)) == 0, "\(waiting.standardError)")
        #expect(waiting.standardOutput.contains("RESULT \(64 << 10) 0\n"), "\(waiting.standardOutput)")
        #expect(waiting.standardOutput.contains("DIFF -1\n"), "\(waiting.standardOutput)")
    }

    @Test(arguments: ProviderKind.available)
    func aNotificationSignalLeavesTheReadWaitingAndAStopSignalAfterItStillEndsIt(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // Stalled until cleared: every reader below is still blocked when it is signalled, however
        // slowly Python starts on a loaded machine (the whole suite in parallel).
        let mount = try mountWithStalledFiles(over: kind)
        defer { mount.stop() }
        func reader(_ file: String, offset: Int) throws -> ChildProcess {
            try ChildProcess(
                "/usr/bin/python3",
                [script, mount.path(file), "\(offset)", "\(64 << 10)", "buffered", source + "/" + file])
        }
        // Started together: Python's start-up is slow on a loaded machine.
        let patient = try reader("slow-stalled.bin", offset: 0)
        let interrupted = try reader("slow-second.bin", offset: 0)
        let killed = try reader("slow-second.bin", offset: 2 << 20)
        let readers = [patient, interrupted, killed]
        defer { readers.forEach(stopReader) }
        for reader in readers {
            _ = try waitUntilReading(reader)
            #expect(isBlockedInTheMount(reader))
        }
        // A terminal resize (SIGWINCH, handled with SA_RESTART) interrupts none of them.
        for reader in readers { reader.signal(SIGWINCH) }
        usleep(300_000)
        for reader in readers {
            #expect(reader.isRunning, "still reading after SIGWINCH: \(reader.standardOutput)")
        }
        // A signal that stops still ends the wait, though the kernel sent its one interrupt.
        var start = ContinuousClock.now
        interrupted.signal(SIGUSR1)
        #expect(interrupted.wait(timeout: .seconds(10)) == 0, "\(interrupted.standardError)")
        var elapsed = ContinuousClock.now - start
        #expect(interrupted.standardOutput.contains("RESULT -1 \(EINTR)\n"), "\(interrupted.standardOutput)")
        #expect(elapsed < .seconds(1), "EINTR came \(elapsed) after SIGUSR1")
        start = ContinuousClock.now
        killed.signal(SIGKILL)
        #expect(killed.wait(timeout: .seconds(10)) == 128 + SIGKILL)
        elapsed = ContinuousClock.now - start
        #expect(elapsed < .seconds(1), "the reader took \(elapsed) to end after SIGKILL")
        // The one that only had SIGWINCH gets its bytes, right, once the stall is cleared.
        let cleared = try providerfs(["fault", "clear", mount.path("slow-stalled.bin")], runtime: runtime)
        #expect(cleared.status == 0, "\(cleared)")
        #expect(patient.wait(timeout: .seconds(60)) == 0, "\(patient.standardError)")
        #expect(patient.standardOutput.contains("RESULT \(64 << 10) 0\n"), "\(patient.standardOutput)")
        #expect(patient.standardOutput.contains("DIFF -1\n"), "\(patient.standardOutput)")
    }

    @Test(arguments: stallingSourceKinds)
    func sigkillEndsEveryBlockedReaderOfAStalledFileAtOnce(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // Nothing arrives within the test: every reader below stays blocked until killed.
        let (source, mount) = try mountOverStallingSource(delay: "60s", over: kind)
        defer {
            // The source first: its pending reads end (EIO), so the mount's download ends too.
            source.stop()
            mount.stop()
        }
        let path = mount.path("slow-stalled.bin")
        // rclone's case: a `cat` from the start, and a second reader of the same file at another
        // offset (`dd skip=…`), which ignored SIGKILL for minutes there; plus a second `cat` that
        // waits for the pages the first one is fetching.
        let cat = try ChildProcess("/bin/cat", [path])
        let dd = try ChildProcess("/bin/dd", ["if=" + path, "of=/dev/null", "bs=1M", "skip=2"])
        #expect(isBlockedInTheMount(cat))
        #expect(isBlockedInTheMount(dd))
        let samePages = try ChildProcess("/bin/cat", [path])
        #expect(isBlockedInTheMount(samePages))
        let readers = [cat, dd, samePages]
        #expect(readers.allSatisfy { $0.isRunning })

        let killed = ContinuousClock.now
        for reader in readers { reader.signal(SIGKILL) }
        for reader in readers {
            let status = reader.wait(timeout: .seconds(10))
            #expect(status == 128 + SIGKILL, "\(reader.arguments): \(String(describing: status))")
        }
        let elapsed = ContinuousClock.now - killed
        #expect(elapsed < .seconds(1), "the killed readers took \(elapsed) to end")
        // The mount still answers.
        #expect(try shell("cat \(quoted(mount.path("quick.txt")))", timeout: .seconds(10)).output == "quick\n")
    }

    @Test(arguments: stallingSourceKinds)
    func whileOneItemIsStalledListingsStatsAndOtherReadsStayFast(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let (source, mount) = try mountOverStallingSource(delay: "60s", over: kind)
        defer {
            // The source first: its pending reads end (EIO), so the mount's download ends too.
            source.stop()
            mount.stop()
        }
        let stalled = try ChildProcess("/bin/cat", [mount.path("slow-stalled.bin")])
        defer { stopReader(stalled) }
        #expect(isBlockedInTheMount(stalled))

        // Each probe is a fresh process; none of them was answered before (cold kernel caches
        // for the directory "sub" and the file "other.bin").
        let probes = [
            "ls -l \(quoted(mount.mountpoint)) > /dev/null",
            "stat \(quoted(mount.path("quick.txt"))) > /dev/null",
            "stat \(quoted(mount.path("slow-stalled.bin"))) > /dev/null",
            "ls -l \(quoted(mount.path("sub"))) > /dev/null",
            "cat \(quoted(mount.path("sub/inner.txt"))) > /dev/null",
            "cmp \(quoted(mount.path("other.bin"))) \(quoted(layout.source + "/other.bin"))",
            "getfattr -n user.providerfs.state \(quoted(mount.path("slow-stalled.bin"))) > /dev/null",
        ]
        for probe in probes {
            let start = ContinuousClock.now
            let result = try shell(probe, timeout: .seconds(10))
            let elapsed = ContinuousClock.now - start
            #expect(result.status == 0, "\(probe): \(result)")
            #expect(elapsed < .milliseconds(700), "\(probe) took \(elapsed) while another item was stalled")
        }
        #expect(stalled.isRunning, "the stalled reader is still waiting")
    }
}
