// An open that waits for the provider to confirm its item's version starts fetching the first
// bytes of the version it knows meanwhile (D-535), and a reader still gets only the version the
// open confirmed.

import Foundation
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

/// The fixture's provider as a network provider offers it (no `.immediateMetadata`, like
/// WebDAV), whose `item(for:)` calls (an open's revalidation) wait, once `hold()` was called,
/// until released.
final class HeldItemCallsProvider: InMemoryProviderWrapper {
    let base: InMemoryProvider
    let capabilities: ProviderCapabilities
    private let gate = Locked<(holding: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    init(base: InMemoryProvider) {
        self.base = base
        capabilities = base.capabilities.subtracting(.immediateMetadata)
    }

    var heldCalls: Int { gate.withLock { $0.waiting.count } }

    func hold() { gate.withLock { $0.holding = true } }

    func release() {
        let waiting = gate.withLock { gate in
            gate.holding = false
            defer { gate.waiting = [] }
            return gate.waiting
        }
        for continuation in waiting { continuation.resume() }
    }

    func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = gate.withLock { gate -> Bool in
                guard gate.holding else { return false }
                gate.waiting.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        return try await base.item(for: identifier)
    }
}

@Suite struct OpenPrefetchTests {
    /// Polls `condition` until it holds or 30 s pass.
    private func eventually(_ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(2))
        }
        return condition()
    }

    private func opened(
        _ fixture: VFSFixture, _ wrapper: HeldItemCallsProvider
    ) async throws -> (ProviderFileSystem, InodeNumber) {
        let fileSystem = try fixture.makeFileSystem(provider: wrapper)
        let entry = try await fileSystem.lookup(parent: .root, name: "big", context: .kernel)
        wrapper.hold()
        return (fileSystem, entry.inode)
    }

    @Test("the first bytes are fetched while the open's revalidation waits, once, and read from there")
    func firstBytesComeDuringTheRevalidation() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("big", .ramp(seed: 5, size: 1 << 20))
        let wrapper = HeldItemCallsProvider(base: fixture.provider)
        let (fileSystem, inode) = try await opened(fixture, wrapper)
        #expect(fixture.provider.counters.fetchCalls == 0)
        let open = Task { try await fileSystem.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel) }
        #expect(await eventually { wrapper.heldCalls == 1 }, "the open asks the provider for the version")
        #expect(
            await eventually { fixture.provider.counters.fetchCalls == 1 },
            "no bytes fetched while the revalidation waits")
        #expect(wrapper.heldCalls == 1)
        wrapper.release()
        let handle = try await open.value.handle
        let data = try await fileSystem.read(inode, handle: handle, offset: 0, count: 4096, context: .kernel)
        #expect(data.bytes == InMemoryContent.ramp(seed: 5, size: 1 << 20).slice(0..<4096))
        #expect(fixture.provider.counters.fetchCalls == 1, "the read joined the fetch the open started")
        await fileSystem.release(inode, handle: handle)
    }

    @Test("a version changed before the revalidation answers: the reader gets the new one")
    func aChangedVersionIsNotRead() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("big", .ramp(seed: 5, size: 1 << 20))
        let wrapper = HeldItemCallsProvider(base: fixture.provider)
        let (fileSystem, inode) = try await opened(fixture, wrapper)
        let open = Task { try await fileSystem.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel) }
        #expect(await eventually { wrapper.heldCalls == 1 && fixture.provider.counters.fetchCalls >= 1 })
        fixture.provider.putFile("big", .ramp(seed: 9, size: 1 << 19))
        wrapper.release()
        let handle = try await open.value.handle
        let data = try await fileSystem.read(inode, handle: handle, offset: 0, count: 4096, context: .kernel)
        #expect(data.bytes == InMemoryContent.ramp(seed: 9, size: 1 << 19).slice(0..<4096))
        await fileSystem.release(inode, handle: handle)
    }

    /// A fault that strikes the next download strikes the reader whose open fetched ahead: its
    /// read meets the fetch's failure (EIO) instead of starting another fetch, and the next
    /// open reads the file.
    @Test("the fetch ahead failing: the first read gets its error, the next open reads")
    func aFailedFetchAheadIsTheReadersFailure() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("big", .ramp(seed: 5, size: 1 << 20))
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("big"), fault: .failAfter(offset: 0, errno: EIO), times: .downloads(1))
        )
        let wrapper = HeldItemCallsProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(
            provider: FaultInjectingProvider(wrapping: wrapper, plan: fixture.faults))
        let entry = try await fileSystem.lookup(parent: .root, name: "big", context: .kernel)
        wrapper.hold()
        let flags = OpenFlags(rawValue: O_RDONLY)
        let open = Task { try await fileSystem.open(entry.inode, flags: flags, context: .kernel) }
        #expect(await eventually { wrapper.heldCalls == 1 && fixture.provider.counters.fetchCalls >= 1 })
        // A rule whose times are spent goes once its download has ended.
        #expect(await eventually { fixture.faults.states.isEmpty }, "the fetch ahead did not end")
        wrapper.release()
        let handle = try await open.value.handle
        let failed = await failureErrno {
            _ = try await fileSystem.read(entry.inode, handle: handle, offset: 0, count: 4096, context: .kernel)
        }
        #expect(failed == .ioError)
        await fileSystem.release(entry.inode, handle: handle)
        let again = try await fileSystem.open(entry.inode, flags: flags, context: .kernel)
        let data = try await fileSystem.read(
            entry.inode, handle: again.handle, offset: 0, count: 4096, context: .kernel)
        #expect(data.bytes == InMemoryContent.ramp(seed: 5, size: 1 << 20).slice(0..<4096))
        await fileSystem.release(entry.inode, handle: again.handle)
    }

    /// Every wait can be stopped: a read waiting for a stalled fetch ahead ends when its task is
    /// cancelled (the kernel's interrupt), with the stall still on.
    @Test("a read waiting for the fetch ahead is interrupted")
    func aReadWaitingForTheFetchAheadIsInterrupted() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("big", .ramp(seed: 5, size: 1 << 20))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("big"), fault: .stall(offset: 0)))
        let wrapper = HeldItemCallsProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(
            provider: FaultInjectingProvider(wrapping: wrapper, plan: fixture.faults))
        let entry = try await fileSystem.lookup(parent: .root, name: "big", context: .kernel)
        wrapper.hold()
        let open = Task {
            try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        }
        #expect(await eventually { wrapper.heldCalls == 1 && fixture.provider.counters.fetchCalls >= 1 })
        wrapper.release()
        let handle = try await open.value.handle
        let done = Locked(false)
        let reader = Task {
            defer { done.withLock { $0 = true } }
            return await failureErrno {
                _ = try await fileSystem.read(entry.inode, handle: handle, offset: 0, count: 4096, context: .kernel)
            }
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(!done.withLock { $0 }, "the read did not wait for the stalled fetch")
        reader.cancel()
        #expect(await eventually { done.withLock { $0 } }, "the interrupted read still waits")
        #expect(await reader.value == .interrupted)
        await fileSystem.release(entry.inode, handle: handle)
    }

    @Test("a provider that answers at once: nothing is fetched before the read")
    func anImmediateAnswerFetchesNothingAhead() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("big", .ramp(seed: 5, size: 1 << 20))
        fixture.provider.answersImmediately = true
        let fileSystem = try fixture.makeFileSystem()
        let entry = try await fileSystem.lookup(parent: .root, name: "big", context: .kernel)
        let opened = try await fileSystem.open(entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        #expect(fixture.provider.counters.fetchCalls == 0)
        await fileSystem.release(entry.inode, handle: opened.handle)
    }
}
