// A handle that met a failed download keeps failing for the bytes it still lacks (D-288): the
// kernel retries a failed page read at once, and a reader given a short count reads on; without
// the hold each would start a new download, and a fault on one download would never be seen.

import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

@Suite("A failed download holds for the handle that met it", .timeLimit(.minutes(3)))
struct HandleFailureTests {
    @Test("later reads of missing bytes fail at once with no fetch; present bytes are served; a new open retries")
    func failureHoldsUntilReopened() async throws {
        // Ranges only: a read fetches what it needs, nothing runs on in the background.
        var options = VFSFixture.defaultOptions()
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 0
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("f", .ramp(seed: 7, size: 200_000))
        fixture.faults.add(
            FaultRule(
                identifier: ItemIdentifier("f"), fault: .failAfter(offset: 100_000, errno: EIO), times: .downloads(1)))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let first = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)

        func read(_ handle: FileHandleID, at offset: Int64) async -> Result<[UInt8], FileSystemError> {
            do throws(FileSystemError) {
                return .success(
                    try await fileSystem.read(
                        entry.inode, handle: handle, offset: offset, count: 1000, context: .kernel
                    )
                    .bytes)
            } catch {
                return .failure(error)
            }
        }
        let expected = { (offset: Int64) in expectedRamp(fixture.provider, "f", offset..<(offset + 1000)) }

        #expect(try await read(first.handle, at: 0).get() == expected(0))
        guard case .failure(let failed) = await read(first.handle, at: 150_000) else {
            Issue.record("the read past the fault succeeded")
            return
        }
        #expect(failed.errno == .ioError)
        #expect(fixture.faults.isEmpty, "the one-download fault is used up")
        let fetches = fixture.provider.counters.fetchCalls
        guard case .failure(let again) = await read(first.handle, at: 150_000) else {
            Issue.record("the same handle read the failed range again")
            return
        }
        #expect(again.errno == .ioError)
        #expect(fixture.provider.counters.fetchCalls == fetches, "no new download for the handle that failed")
        #expect(try await read(first.handle, at: 0).get() == expected(0), "present bytes are still served")

        // A new open is a new attempt: the fault is used up, the bytes arrive.
        let second = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        #expect(try await read(second.handle, at: 150_000).get() == expected(150_000))
        await fileSystem.release(entry.inode, handle: first.handle)
        await fileSystem.release(entry.inode, handle: second.handle)
    }

    @Test("the hold is the handle's: another handle open at the time downloads, and its bytes serve the failed handle")
    func holdIsPerHandle() async throws {
        var options = VFSFixture.defaultOptions()
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 0
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("f", .ramp(seed: 9, size: 200_000))
        fixture.faults.add(
            FaultRule(
                identifier: ItemIdentifier("f"), fault: .failAfter(offset: 100_000, errno: EIO), times: .downloads(1)))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let failing = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        let other = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        let read = { (handle: FileHandleID, offset: Int64) in
            await readResult(fileSystem, entry.inode, handle, offset)
        }
        let expected = { (offset: Int64) in expectedRamp(fixture.provider, "f", offset..<(offset + 1000)) }

        #expect(await read(failing.handle, 150_000).errno == .ioError, "the faulted download fails its reader")
        #expect(fixture.faults.isEmpty, "the one-download fault is used up")
        let fetches = fixture.provider.counters.fetchCalls
        #expect(await read(failing.handle, 150_000).errno == .ioError, "the failed handle is held")
        #expect(fixture.provider.counters.fetchCalls == fetches, "no new download for the held handle")
        // The other handle, opened before the failure but not the one that met it, is not held.
        #expect(try await read(other.handle, 150_000).get() == expected(150_000))
        #expect(fixture.provider.counters.fetchCalls > fetches, "the other handle downloaded")
        // The failed handle is served what is present now.
        #expect(try await read(failing.handle, 150_000).get() == expected(150_000), "bytes another handle brought")
        await fileSystem.release(entry.inode, handle: failing.handle)
        await fileSystem.release(entry.inode, handle: other.handle)
    }

    @Test("an interrupted read is not held: it was the reader's, so the same handle's next read downloads")
    func interruptIsNotHeld() async throws {
        var options = VFSFixture.defaultOptions()
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 0
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("f", .ramp(seed: 13, size: 200_000))
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let opened = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        fixture.provider.hold()
        let reader = Task { await readResult(fileSystem, entry.inode, opened.handle, 150_000) }
        while fixture.provider.heldCount < 1 { try await Task.sleep(for: .milliseconds(1)) }
        reader.cancel()
        let interrupted = await reader.value
        fixture.provider.release()
        #expect(interrupted.errno == .interrupted, "the cancelled read: \(interrupted)")
        let again = try await readResult(fileSystem, entry.inode, opened.handle, 150_000).get()
        #expect(again == expectedRamp(fixture.provider, "f", 150_000..<151_000))
        await fileSystem.release(entry.inode, handle: opened.handle)
    }
}

/// One read of 1000 bytes at `offset` through `handle`, as a result.
private func readResult(
    _ fileSystem: ProviderFileSystem, _ inode: InodeNumber, _ handle: FileHandleID, _ offset: Int64
) async -> Result<[UInt8], FileSystemError> {
    do throws(FileSystemError) {
        return .success(
            try await fileSystem.read(inode, handle: handle, offset: offset, count: 1000, context: .kernel).bytes)
    } catch {
        return .failure(error)
    }
}

extension Result where Failure == FileSystemError {
    /// The errno of a failure, nil for a success.
    fileprivate var errno: Errno? {
        if case .failure(let error) = self { return error.errno }
        return nil
    }
}

/// Bytes of the fixture provider's file `path` in `range`.
private func expectedRamp(_ provider: InMemoryProvider, _ path: String, _ range: Range<Int64>) -> [UInt8] {
    provider.content(of: path)!.0.slice(range)
}
