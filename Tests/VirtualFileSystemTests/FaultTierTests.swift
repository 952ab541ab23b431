// The fault tier (DESIGN §7, issue 11): every fault of `providerfs fault` × {a first read, a read
// after part of the file is cached, three concurrent readers}, through the file system with the
// fault wrapper and the cache on one manual clock — no sleeps decide anything. For each: the
// readers get a correct prefix and then exactly the errno SEMANTICS' fault table names (or every
// byte, for the faults that only slow things down), the item shows the failure, and once the
// fault is cleared a new open reads every byte while fetching only what was missing.

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

/// The faults of the tier, each at the middle of the file.
enum TierFault: String, CaseIterable, Sendable, CustomStringConvertible {
    case failAt, stallForever, stallBriefly, truncate, corrupt, changeVersion, slow, offline

    static let size: Int64 = 400_000
    static let at: Int64 = 200_000

    var fault: Fault {
        switch self {
        case .failAt: .failAfter(offset: Self.at, errno: EIO)
        case .stallForever: .stall(offset: Self.at)
        // Shorter than the stall deadline: late, never an error.
        case .stallBriefly: .stall(offset: Self.at, duration: .milliseconds(500))
        case .truncate: .truncate(offset: Self.at)
        case .corrupt: .corrupt(offset: Self.at)
        case .changeVersion: .changeVersion(offset: Self.at)
        // 400 KB/s: a second of the manual clock for the whole file, in 40 KB chunks.
        case .slow: .slow(bytesPerSecond: 400_000)
        case .offline: .offline
        }
    }

    /// The errno readers get (nil: they get every byte).
    var errno: Errno? {
        switch self {
        case .failAt, .truncate, .corrupt: .ioError
        case .stallForever: .timedOut
        case .stallBriefly, .slow: nil
        case .changeVersion: .stale
        case .offline: .networkUnreachable
        }
    }

    var description: String { rawValue }
}

enum TierSituation: String, CaseIterable, Sendable, CustomStringConvertible {
    /// Nothing cached; one reader from the start.
    case firstRead
    /// The first 100,000 bytes were read before the fault was added; one reader from the start.
    case afterPartialCache
    /// Three readers at once, from 0, 150,000 and 300,000 to the end.
    case concurrentReaders

    var description: String { rawValue }
}

@Suite("Fault tier: every fault × first read, partial cache, concurrent readers", .timeLimit(.minutes(3)))
struct FaultTierTests {
    /// What one reader got: its bytes in order, and the error that ended it (nil: read to the end).
    struct Outcome: Sendable {
        var start: Int64
        var bytes: [UInt8]
        var error: FileSystemError?
    }

    @Test(arguments: TierFault.allCases, TierSituation.allCases)
    func faultMeetsReaders(fault: TierFault, situation: TierSituation) async throws {
        var options = VFSFixture.defaultOptions()
        // Ranges only: nothing runs on in the background, so what is cached is what was read.
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 64 << 10
        options.cache.stallTimeout = .seconds(1)
        options.cache.retryDelay = .milliseconds(100)
        let fixture = try VFSFixture(options: options)
        let name = "doc.bin"
        fixture.provider.putFile(name, .ramp(seed: 11, size: TierFault.size))
        let expected = fixture.provider.content(of: name)!.0.slice(0..<TierFault.size)
        let fileSystem = try fixture.makeFileSystem(
            provider: FaultInjectingProvider(wrapping: fixture.provider, plan: fixture.faults, clock: fixture.clock))
        let identifier = ItemIdentifier(name)
        let entry = try await fileSystem.lookup(parent: .root, name: name, context: .kernel)

        let starts: [Int64] = situation == .concurrentReaders ? [0, 150_000, 300_000] : [0]
        var handles: [FileHandleID] = []
        for _ in starts {
            handles.append(
                try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel).handle)
        }
        let opened = handles
        if situation == .afterPartialCache {
            var offset: Int64 = 0
            while offset < 100_000 {
                let data = try await fileSystem.read(
                    entry.inode, handle: handles[0], offset: offset, count: 32 << 10, context: .kernel)
                #expect(byteDifference(data.bytes, expected[Int(offset)..<Int(offset) + data.bytes.count]) == nil)
                offset += Int64(data.bytes.count)
            }
        }
        let presentBefore = fileSystem.cache.status(of: identifier)?.presentBytes ?? 0
        fixture.faults.add(FaultRule(identifier: identifier, fault: fault.fault, times: .untilCleared))

        // The readers, each sequential in 32 KiB reads; the clock moves whenever something sleeps
        // on it (a stall deadline, a stall's duration, pacing), 100 ms at a time.
        let outcomes = try await withDeadline(.seconds(30), "\(fault) × \(situation)") {
            let readers = zip(starts, opened).map { start, handle in
                Task { () -> Outcome in
                    var outcome = Outcome(start: start, bytes: [], error: nil)
                    var offset = start
                    while offset < TierFault.size {
                        do throws(FileSystemError) {
                            let data = try await fileSystem.read(
                                entry.inode, handle: handle, offset: offset, count: 32 << 10, context: .kernel)
                            if data.bytes.isEmpty { break }
                            outcome.bytes += data.bytes
                            offset += Int64(data.bytes.count)
                        } catch {
                            outcome.error = error
                            break
                        }
                    }
                    return outcome
                }
            }
            let done = Locked(0)
            for reader in readers {
                Task {
                    _ = await reader.value
                    done.withLock { $0 += 1 }
                }
            }
            while done.value < readers.count {
                if fixture.clock.sleeperCount > 0 { fixture.clock.advance(by: .milliseconds(100)) }
                try await Task.sleep(for: .milliseconds(1))
            }
            var outcomes: [Outcome] = []
            for reader in readers { outcomes.append(await reader.value) }
            return outcomes
        }

        for outcome in outcomes {
            let start = Int(outcome.start)
            // Never a wrong byte, never zeros in place of data: what arrived is the content.
            #expect(
                byteDifference(outcome.bytes, expected[start..<(start + outcome.bytes.count)]) == nil,
                "reader from \(start)")
            if let errno = fault.errno {
                #expect(outcome.error?.errno == errno, "reader from \(start): \(String(describing: outcome.error))")
                // Nothing past the fault's byte arrived (a corrupt fetch gives none of its bytes).
                #expect(
                    outcome.bytes.isEmpty || outcome.start + Int64(outcome.bytes.count) <= TierFault.at,
                    "reader from \(start)")
            } else {
                #expect(outcome.error == nil, "reader from \(start): \(String(describing: outcome.error))")
                #expect(outcome.bytes.count == Int(TierFault.size) - start, "reader from \(start)")
            }
        }

        // The item shows the failure, with the errno readers got.
        let status = try #require(fileSystem.cache.status(of: identifier))
        if let errno = fault.errno, fault != .changeVersion {
            #expect(status.state == .error, "\(status)")
            let recorded = try #require(status.lastError, "\(status)")
            #expect(FileSystemError(CacheError(recorded.code, recorded.message)).errno == errno)
            if fault != .offline { #expect(recorded.offset != nil, "the byte where it happened: \(recorded)") }
        } else if fault.errno == nil {
            #expect(status.presentBytes == TierFault.size)
        }
        for handle in handles { await fileSystem.release(entry.inode, handle: handle) }

        // After the fault: a new open reads every byte, fetching only what was missing.
        let presentAfterFault = fileSystem.cache.status(of: identifier)?.presentBytes ?? 0
        #expect(presentAfterFault >= presentBefore, "bytes already verified stay valid")
        fixture.faults.clear()
        guard fault.errno != nil else { return }
        let servedBefore = fixture.provider.counters.bytesServed
        let retry = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        var all: [UInt8] = []
        while Int64(all.count) < TierFault.size {
            let data = try await fileSystem.read(
                entry.inode, handle: retry.handle, offset: Int64(all.count), count: 64 << 10, context: .kernel)
            if data.bytes.isEmpty { break }
            all += data.bytes
        }
        await fileSystem.release(entry.inode, handle: retry.handle)
        #expect(byteDifference(all, expected) == nil, "the retry reads the right bytes")
        if fault != .changeVersion {
            #expect(
                fixture.provider.counters.bytesServed - servedBefore == TierFault.size - presentAfterFault,
                "the retry fetched only the missing bytes")
        }
    }
}
