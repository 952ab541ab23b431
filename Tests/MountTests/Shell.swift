import Foundation
import SystemSupport
import TestSupport
public import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Runs a shell script (ordinary tools against the mount) and returns status and output.
@discardableResult
func shell(_ script: String, timeout: Duration = .seconds(60)) throws -> (status: Int32, output: String, error: String)
{
    try ChildProcess.run("/bin/sh", ["-c", script], timeout: timeout)
}

/// Single-quotes a path for a shell script.
func quoted(_ text: String) -> String {
    "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
}

/// Writes `bytes` to `path` (test fixtures).
func writeTestFile(_ path: String, _ bytes: [UInt8]) {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    precondition(fd >= 0, "cannot create \(path)")
    defer { close(fd) }
    var offset = 0
    while offset < bytes.count {
        let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        precondition(written > 0)
        offset += written
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a failing test is reproducible.
func patternBytes(count: Int, seed: UInt64) -> [UInt8] {
    var state = seed | 1
    return (0..<count).map { _ in
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return UInt8(truncatingIfNeeded: state)
    }
}

/// Fails the current test when /dev/fuse is unusable (mount tests never skip silently).
func requireFUSE() -> Bool {
    if let problem = MountTestGate.problem {
        Issue.record(Comment(rawValue: problem))
        return false
    }
    return true
}

/// Polls `condition` every 20 ms until it holds (true) or `limit` passes (false).
func waitUntil(_ limit: Duration = .seconds(20), _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = ContinuousClock.now + limit
    while try !condition() {
        if ContinuousClock.now > deadline { return false }
        usleep(20_000)
    }
    return true
}

/// Ends a child the test started: SIGTERM, then SIGKILL when it has not ended within 10 s.
func stopChild(_ child: ChildProcess) {
    child.signal(SIGTERM)
    if child.wait(timeout: .seconds(10)) == nil {
        child.signal(SIGKILL)
        child.wait(timeout: .seconds(5))
    }
}

extension ProviderKind: CustomTestStringConvertible {
    var testDescription: String { rawValue }
}
