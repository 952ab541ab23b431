import Dispatch
import Foundation
import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite("ProcessInfoFiles", .blockingThreads)
struct ProcessInfoFilesTests {
    @Test("thread group, parent and ancestry agree with the kernel's own answers")
    func ownProcess() throws {
        let pid = getpid()
        #expect(ProcessInfoFiles.threadGroup(ofThread: pid) == pid)
        #expect(ProcessInfoFiles.parentProcess(of: pid) == getppid())
        let ancestry = ProcessInfoFiles.ancestry(of: pid)
        #expect(ancestry.first == pid)
        #expect(ancestry.count >= 2 && ancestry[1] == getppid())
        #expect(ancestry.last == 1 || ancestry.count == 64 || ProcessInfoFiles.parentProcess(of: ancestry.last!) == 0)
        // Another thread of this process (kept alive until it was looked up) maps to it.
        let started = DispatchSemaphore(value: 0)
        let finish = DispatchSemaphore(value: 0)
        let tid = Locked<Int32>(0)
        let thread = Thread {
            // /proc/thread-self links to "<pid>/task/<tid>".
            let link = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self")) ?? ""
            tid.withLock { $0 = Int32(link.split(separator: "/").last ?? "") ?? 0 }
            started.signal()
            finish.wait()
        }
        thread.start()
        started.wait()
        #expect(tid.value != pid)
        #expect(ProcessInfoFiles.threadGroup(ofThread: tid.value) == pid)
        finish.signal()
    }

    @Test("a command name with spaces and parentheses does not shift the fields")
    func awkwardCommandName() throws {
        let name = ") S 999 (x"
        var pid: pid_t = 0
        // `exec -a` sets argv[0], and prctl-style comm comes from the file name: use a symlink
        // named like that to /bin/sleep, so /proc/PID/stat carries the awkward comm.
        let directory = "/tmp/providerfs-comm-\(getpid())"
        mkdir(directory, 0o700)
        defer {
            unlink(directory + "/" + name)
            rmdir(directory)
        }
        #expect(symlink("/bin/sleep", directory + "/" + name) == 0)
        let path = directory + "/" + name
        var argv: [UnsafeMutablePointer<CChar>?] = [strdup(path), strdup("5"), nil]
        defer { argv.forEach { free($0) } }
        #expect(posix_spawn(&pid, path, nil, nil, &argv, environ) == 0)
        defer {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        #expect(ProcessInfoFiles.parentProcess(of: pid) == getpid())
        #expect(ProcessInfoFiles.threadGroup(ofThread: pid) == pid)
        // The child started after this process, and its start time is read past the awkward name.
        let child = try #require(ProcessInfoFiles.startTime(of: pid))
        let own = try #require(ProcessInfoFiles.startTime(of: getpid()))
        #expect(child >= own)
    }

    @Test("start time: field 22 of /proc/PID/stat, nil for a process that is gone")
    func startTime() throws {
        let text = try String(contentsOfFile: "/proc/self/stat", encoding: .utf8)
        let afterName = text[text.index(after: try #require(text.lastIndex(of: ")")))...]
        let fields = afterName.split(separator: " ")
        // fields[0] is the 3rd field (state), so the 22nd is fields[19].
        #expect(ProcessInfoFiles.startTime(of: getpid()) == UInt64(fields[19]))
        #expect(ProcessInfoFiles.startTime(of: 0) == nil)
        #expect(ProcessInfoFiles.startTime(of: -1) == nil)
        #expect(ProcessInfoFiles.startTime(of: Int32.max) == nil)
    }

    @Test("running: this pid with its start time; not with another start, not once a zombie, not gone")
    func running() throws {
        let own = try #require(ProcessInfoFiles.startTime(of: getpid()))
        #expect(ProcessInfoFiles.isRunning(getpid(), startedAt: own))
        #expect(!ProcessInfoFiles.isRunning(getpid(), startedAt: own + 1), "a reused pid starts later")
        #expect(!ProcessInfoFiles.isRunning(Int32.max, startedAt: own))
        #expect(!ProcessInfoFiles.isRunning(0, startedAt: own))
        var pid: pid_t = 0
        var argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
        defer { argv.forEach { free($0) } }
        try #require(posix_spawn(&pid, "/bin/true", nil, nil, &argv, environ) == 0)
        let child = try #require(ProcessInfoFiles.startTime(of: pid))
        // Exited but not reaped: a zombie, which counts as gone. waitid with WNOWAIT waits for
        // the exit and leaves the zombie in place.
        var info = siginfo_t()
        #expect(waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) == 0)
        #expect(ProcessInfoFiles.startTime(of: pid) == child, "the zombie still has its stat")
        #expect(!ProcessInfoFiles.isRunning(pid, startedAt: child))
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        #expect(!ProcessInfoFiles.isRunning(pid, startedAt: child))
    }

    /// A process whose main thread has exited shows `Z` in /proc/<pid>/stat while its other
    /// threads still run and hold its descriptors (a killed Apache worker's listening socket
    /// accepted then): it is running until every thread is gone.
    @Test("running: a process whose main thread exited while another thread runs")
    func mainThreadExited() throws {
        let script = """
            import ctypes, threading, time
            threading.Thread(target=time.sleep, args=(60,)).start()
            ctypes.CDLL(None).pthread_exit(None)
            """
        var pid: pid_t = 0
        var argv: [UnsafeMutablePointer<CChar>?] = [strdup("python3"), strdup("-c"), strdup(script), nil]
        defer { argv.forEach { free($0) } }
        try #require(posix_spawnp(&pid, "python3", nil, nil, &argv, environ) == 0)
        defer {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        let start = try #require(ProcessInfoFiles.startTime(of: pid))
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline, mainThreadState(pid) != "Z" { usleep(5000) }
        try #require(mainThreadState(pid) == "Z", "the main thread did not exit")
        #expect(ProcessInfoFiles.isRunning(pid, startedAt: start), "its other thread still runs")
        kill(pid, SIGKILL)
        var info = siginfo_t()
        #expect(waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) == 0)
        #expect(!ProcessInfoFiles.isRunning(pid, startedAt: start), "every thread is gone")
    }

    private func mainThreadState(_ pid: pid_t) -> Character? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        return stat[close...].dropFirst(2).first
    }

    @Test("pending signals: a signal this thread blocks shows until it is taken")
    func pendingSignals() {
        var block = sigset_t()
        sigemptyset(&block)
        sigaddset(&block, SIGUSR2)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &block, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        // This thread's id: /proc/thread-self links to "<pid>/task/<tid>".
        var link = [CChar](repeating: 0, count: 64)
        let length = readlink("/proc/thread-self", &link, link.count - 1)
        let target = String(decoding: link[0..<max(0, length)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let thread = target.split(separator: "/").last.flatMap({ Int32($0) }) else {
            Issue.record("no thread id in /proc/thread-self: \(target)")
            return
        }
        let bit = UInt64(1) << UInt64(SIGUSR2 - 1)
        #expect((ProcessInfoFiles.pendingSignals(ofThread: thread) ?? bit) & bit == 0)
        pthread_kill(pthread_self(), SIGUSR2)
        #expect((ProcessInfoFiles.pendingSignals(ofThread: thread) ?? 0) & bit == bit)
        var taken: Int32 = 0
        #expect(sigwait(&block, &taken) == 0 && taken == SIGUSR2)
        #expect((ProcessInfoFiles.pendingSignals(ofThread: thread) ?? bit) & bit == 0)
        #expect(ProcessInfoFiles.pendingSignals(ofThread: Int32.max) == nil)
    }

    @Test("a process that does not exist has no parent and no thread group")
    func missing() {
        #expect(ProcessInfoFiles.parentProcess(of: Int32.max) == nil)
        #expect(ProcessInfoFiles.threadGroup(ofThread: Int32.max) == nil)
        #expect(ProcessInfoFiles.ancestry(of: Int32.max) == [Int32.max])
        #expect(ProcessInfoFiles.parentProcess(of: -1) == nil)
    }
}
