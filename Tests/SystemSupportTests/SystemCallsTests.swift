// SystemCalls (D-516): the one layer the cache, the staging files and the local provider call the
// system through. EINTR is retried (close's never is), and a fault armed under a directory strikes
// the calls made there, by path or by descriptor (an unnamed O_TMPFILE file's too), and nothing
// elsewhere.

import Foundation
import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A new directory of its own under the temporary directory.
private func makeTemporaryDirectory(prefix: String) throws -> String {
    let path = FileManager.default.temporaryDirectory.path + "/\(prefix)-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
    return path
}

private func removeTreeWithinFileSystem(_ path: String) { try? FileManager.default.removeItem(atPath: path) }

@Suite struct SystemCallsTests {
    @Test func anInterruptedCallIsRetriedUntilItIsDone() throws {
        let directory = try makeTemporaryDirectory(prefix: "syscalls")
        defer { removeTreeWithinFileSystem(directory) }
        let fd = SystemCalls.open(directory + "/f", O_CREAT | O_RDWR, 0o600)
        #expect(fd >= 0)
        defer { SystemCalls.close(fd) }
        let fault = SystemCallFaults.arm(.pwrite, errno: EINTR, under: directory, times: 2)
        let bytes = Array("retried".utf8)
        #expect(SystemCalls.pwrite(fd, bytes, bytes.count, 0) == bytes.count)
        #expect(SystemCallFaults.disarm(fault) == 2)
        var back = [UInt8](repeating: 0, count: bytes.count)
        #expect(SystemCalls.pread(fd, &back, back.count, 0) == bytes.count)
        #expect(back == bytes)
    }

    @Test func aFaultStrikesItsDirectoryOnlyAndAsOftenAsAsked() throws {
        let directory = try makeTemporaryDirectory(prefix: "syscalls")
        defer { removeTreeWithinFileSystem(directory) }
        mkdir(directory + "/full", 0o755)
        mkdir(directory + "/fuller", 0o755)  // a name that starts with the faulted one
        let fault = SystemCallFaults.arm(.pwrite, errno: ENOSPC, under: directory + "/full", times: 2)
        defer { SystemCallFaults.disarm(fault) }
        let elsewhere = SystemCalls.open(directory + "/fuller/f", O_CREAT | O_RDWR, 0o600)
        defer { SystemCalls.close(elsewhere) }
        #expect(SystemCalls.pwrite(elsewhere, "x", 1, 0) == 1)
        // By descriptor: a named file, then an unnamed one (its place is "…/full/#n (deleted)").
        let full = SystemCalls.open(directory + "/full/f", O_CREAT | O_RDWR, 0o600)
        defer { SystemCalls.close(full) }
        #expect(SystemCalls.pwrite(full, "x", 1, 0) == -1 && errno == ENOSPC)
        let unnamed = SystemCalls.open(directory + "/full", openUnnamedTemporary | O_RDWR, 0o600)
        defer { SystemCalls.close(unnamed) }
        #expect(unnamed >= 0)
        #expect(SystemCalls.pwrite(unnamed, "x", 1, 0) == -1 && errno == ENOSPC)
        #expect(SystemCallFaults.struck(fault) == 2)
        // Struck out: the next call is the system's.
        #expect(SystemCalls.pwrite(full, "y", 1, 0) == 1)
        // By path relative to a directory's descriptor.
        let open = SystemCallFaults.arm(.open, errno: EACCES, under: directory + "/full")
        defer { SystemCallFaults.disarm(open) }
        let parent = SystemCalls.open(directory, O_RDONLY | O_DIRECTORY)
        defer { SystemCalls.close(parent) }
        #expect(SystemCalls.openat(parent, "fuller/f", O_RDONLY) >= 0)
        #expect(SystemCalls.openat(parent, "full/f", O_RDONLY) == -1 && errno == EACCES)
    }

    @Test func anInterruptedCloseIsNotRetriedAndTheDescriptorIsClosed() throws {
        let directory = try makeTemporaryDirectory(prefix: "syscalls")
        defer { removeTreeWithinFileSystem(directory) }
        let fd = SystemCalls.open(directory + "/f", O_CREAT | O_RDWR, 0o600)
        let fault = SystemCallFaults.arm(.close, errno: EINTR, under: directory)
        defer { SystemCallFaults.disarm(fault) }
        #expect(SystemCalls.close(fd) == -1 && errno == EINTR)
        #expect(fcntl(fd, F_GETFD) == -1 && errno == EBADF)
    }
}
