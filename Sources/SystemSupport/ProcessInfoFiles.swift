// Facts about other processes from /proc, read with one read(2) into a stack buffer and parsed as
// bytes: these run on every open through the mount (whose thread is the caller, and which of its
// ancestors may hold a claim), where Foundation's file reading and String splitting cost more
// than the system calls themselves.

import CLinuxHeaders

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

public enum ProcessInfoFiles {
    /// The process (thread group) of thread `tid`: `tid` itself for a process's main thread (the
    /// usual caller), which pidfd_open accepts and any other thread it refuses with EINVAL; else
    /// the `Tgid:` line of /proc/<tid>/status, which the kernel formats at a cost of ~15 µs. Nil
    /// when the thread is gone or the file does not say.
    public static func threadGroup(ofThread tid: Int32) -> Int32? {
        guard tid > 0 else { return nil }
        let pidfd = pidfd_open(pid_t(tid), 0)
        if pidfd >= 0 {
            close(pidfd)
            return tid
        }
        if errno == ESRCH { return nil }
        return withContents(of: "/proc/\(tid)/status") { bytes in
            let key = Array("\nTgid:".utf8)
            guard let start = find(key, in: bytes) else { return nil }
            return parseNumber(bytes, from: start + key.count)
        }
    }

    /// The parent of process `pid`: the 4th field of /proc/<pid>/stat, counted after the command
    /// name's closing parenthesis (the name itself may contain spaces and parentheses). Nil when
    /// the process is gone.
    public static func parentProcess(of pid: Int32) -> Int32? {
        guard pid > 0 else { return nil }
        return withContents(of: "/proc/\(pid)/stat") { bytes in
            guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
            // ") S 1234 …": skip ") ", the one-letter state and its space.
            let at = close + 4
            guard at < bytes.count else { return nil }
            return parseNumber(bytes, from: at)
        }
    }

    /// When process `pid` started, in clock ticks after boot: the 22nd field of /proc/<pid>/stat,
    /// counted after the command name's closing parenthesis. With the pid it names one process
    /// for the life of the system (a reused pid has a later start). Nil when the process is gone.
    public static func startTime(of pid: Int32) -> UInt64? {
        guard pid > 0 else { return nil }
        return withContents(of: "/proc/\(pid)/stat") { startTime(in: $0) }
    }

    /// The 22nd field of a /proc/<pid>/stat text.
    private static func startTime(in bytes: UnsafeBufferPointer<UInt8>) -> UInt64? {
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        // Fields after ")" start with the 3rd (state); the 22nd is 19 spaces further.
        var index = close + 1
        var field = 2
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: " ") {
                field += 1
                if field == 22 { break }
            }
            index += 1
        }
        guard field == 22 else { return nil }
        index += 1
        var value: UInt64 = 0
        var digits = 0
        while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
            let (times, overflowed) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflowedSum) = times.addingReportingOverflow(UInt64(bytes[index] - UInt8(ascii: "0")))
            if overflowed || overflowedSum { return nil }
            value = sum
            digits += 1
            index += 1
        }
        return digits > 0 ? value : nil
    }

    /// Process `pid` as one process for the life of the system: its start time (as `startTime`)
    /// and its command name (the `comm` field, which exec changes), from one read of
    /// /proc/<pid>/stat. Nil when the process is gone.
    public static func identity(of pid: Int32) -> (startTime: UInt64, name: String)? {
        guard pid > 0 else { return nil }
        return withContents(of: "/proc/\(pid)/stat") { bytes -> (UInt64, String)? in
            guard let open = bytes.firstIndex(of: UInt8(ascii: "(")),
                let close = bytes.lastIndex(of: UInt8(ascii: ")")), open < close,
                let start = startTime(in: bytes)
            else { return nil }
            return (start, String(decoding: UnsafeBufferPointer(rebasing: bytes[(open + 1)..<close]), as: UTF8.self))
        }
    }

    /// True while process `pid` exists, started at `startTime` (as `startTime(of:)` gives: a
    /// reused pid has another) and is not a zombie (exited, not yet reaped), from one read of
    /// /proc/<pid>/stat. A zombie main thread is not enough: it shows `Z` while the process's
    /// other threads are still exiting, and those still hold its descriptors (a listening
    /// socket accepts until the last one is gone), so its threads are read then.
    public static func isRunning(_ pid: Int32, startedAt startTime: UInt64) -> Bool {
        guard pid > 0 else { return false }
        let state = withContents(of: "/proc/\(pid)/stat") { bytes -> UInt8? in
            self.startTime(in: bytes) == startTime ? self.state(in: bytes) : nil
        }
        guard let state else { return false }
        return state != UInt8(ascii: "Z") || hasLiveThread(pid)
    }

    /// The one-letter state of process or thread `path` names ("<pid>" or "<pid>/task/<tid>"):
    /// `R`, `S`, `T` (stopped), `Z` (zombie)… Nil when it is gone.
    public static func state(of path: String) -> Character? {
        withContents(of: "/proc/\(path)/stat") { state(in: $0) }.map { Character(UnicodeScalar($0)) }
    }

    /// The state field of a /proc/<pid>/stat text: the byte after the command name's ") ".
    private static func state(in bytes: UnsafeBufferPointer<UInt8>) -> UInt8? {
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")), close + 2 < bytes.count else { return nil }
        return bytes[close + 2]
    }

    /// Whether a thread of `pid` other than a zombie is listed in /proc/<pid>/task.
    private static func hasLiveThread(_ pid: Int32) -> Bool {
        guard let stream = opendir("/proc/\(pid)/task") else { return false }
        defer { closedir(stream) }
        while let entry = readdir(stream) {
            let tid = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                Int32(String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self))
            }
            guard let tid, tid != pid else { continue }
            if let state = state(of: "\(pid)/task/\(tid)"), state != "Z", state != "X" { return true }
        }
        return false
    }

    /// `pid`, its parent, grandparent… up to init (at most 64 entries, stopping at a loop).
    public static func ancestry(of pid: Int32) -> [Int32] {
        var chain: [Int32] = []
        var current = pid
        while current > 0 && chain.count < 64 && !chain.contains(current) {
            chain.append(current)
            guard let parent = parentProcess(of: current) else { break }
            current = parent
        }
        return chain
    }

    /// The signals pending for thread `tid`, its own (`SigPnd:`) and its process's (`ShdPnd:`)
    /// from /proc/<tid>/status: bit n-1 for signal n. Nil when the thread is gone.
    public static func pendingSignals(ofThread tid: Int32) -> UInt64? {
        guard tid > 0 else { return nil }
        return withContents(of: "/proc/\(tid)/status") { bytes in
            guard let own = parseHexField(Array("\nSigPnd:".utf8), in: bytes),
                let shared = parseHexField(Array("\nShdPnd:".utf8), in: bytes)
            else { return nil }
            return own | shared
        }
    }

    /// The hexadecimal number after `key`, after spaces and tabs; nil if there is none.
    private static func parseHexField(_ key: [UInt8], in bytes: UnsafeBufferPointer<UInt8>) -> UInt64? {
        guard let start = find(key, in: bytes) else { return nil }
        var index = start + key.count
        while index < bytes.count, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\t") {
            index += 1
        }
        var value: UInt64 = 0
        var digits = 0
        while index < bytes.count, digits < 16 {
            let byte = bytes[index]
            let digit: UInt64
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt64(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt64(byte - UInt8(ascii: "a") + 10)
            default: return digits > 0 ? value : nil
            }
            value = value << 4 | digit
            digits += 1
            index += 1
        }
        return digits > 0 ? value : nil
    }

    /// Runs `body` over the first 4 KiB of `path` (enough for the lines read here).
    private static func withContents<T>(of path: String, _ body: (UnsafeBufferPointer<UInt8>) -> T?) -> T? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 4096) { buffer -> T? in
            var count = 0
            while count < buffer.count {
                let got = read(fd, buffer.baseAddress! + count, buffer.count - count)
                if got < 0 && errno == EINTR { continue }
                if got <= 0 { break }
                count += got
            }
            return body(UnsafeBufferPointer(rebasing: buffer[0..<count]))
        }
    }

    private static func find(_ key: [UInt8], in bytes: UnsafeBufferPointer<UInt8>) -> Int? {
        guard bytes.count >= key.count else { return nil }
        var index = 0
        while index <= bytes.count - key.count {
            if bytes[index] == key[0] {
                var matched = true
                for offset in 1..<key.count where bytes[index + offset] != key[offset] {
                    matched = false
                    break
                }
                if matched { return index }
            }
            index += 1
        }
        return nil
    }

    /// A decimal number at `start`, after spaces and tabs; nil if there is none or it overflows.
    private static func parseNumber(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Int32? {
        var index = start
        while index < bytes.count, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\t") {
            index += 1
        }
        var value: Int32 = 0
        var digits = 0
        while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
            let (times, overflowed) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflowedSum) = times.addingReportingOverflow(Int32(bytes[index] - UInt8(ascii: "0")))
            if overflowed || overflowedSum { return nil }
            value = sum
            digits += 1
            index += 1
        }
        return digits > 0 ? value : nil
    }
}
