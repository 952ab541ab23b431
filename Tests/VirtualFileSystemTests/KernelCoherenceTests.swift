// Kernel cache coherence (D-228): items the provider tells every change of are given to the
// kernel with `trackedTimeout` once the adapter can invalidate, and a change becomes the
// invalidations of what the kernel may hold.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

@Suite("Kernel cache coherence")
struct KernelCoherenceTests {
    @Test("tracked items get the long timeouts only while the kernel can be told, and a change is told")
    func trackedItemsAndInvalidations() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/a", .bytes([1]))
        fixture.provider.putFile("d/b", .bytes([2]))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let options = fixture.options
        let directory = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        var a = try await fileSystem.lookup(parent: directory.inode, name: "a", context: .kernel)
        #expect(a.entryTimeout == options.entryTimeout, "nobody to tell the kernel: the short timeouts")
        #expect(a.attributeTimeout == options.attributeTimeout)

        let sent = Locked<[KernelInvalidation]>([])
        fileSystem.setKernelInvalidation { invalidations in sent.withLock { $0 += invalidations } }
        a = try await fileSystem.lookup(parent: directory.inode, name: "a", context: .kernel)
        #expect(a.entryTimeout == options.trackedTimeout)
        #expect(a.attributeTimeout == options.trackedTimeout)
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).validFor == options.trackedTimeout)
        guard case .success(let now)? = fileSystem.getAttributesNow(a.inode, context: .kernel) else {
            Issue.record("fresh attributes are answered at once")
            return
        }
        #expect(now.validFor == options.trackedTimeout)
        let root = try await fileSystem.getAttributes(.root, context: .kernel)
        #expect(root.validFor == nil, "the root is in no listing: the mount's timeout")

        // Written on the provider: its name and its node are told, and the next answer is new.
        fixture.provider.putFile("d/a", .bytes([1, 1, 1]))
        provider.report([.entry(directory: ItemIdentifier("d"), name: "a")])
        #expect(Set(sent.value) == [.entry(parent: directory.inode, name: "a"), .attributes(a.inode)])
        #expect(fileSystem.lookupNow(parent: directory.inode, name: "a", context: .kernel) == nil, "asks again")
        #expect(fileSystem.getAttributesNow(a.inode, context: .kernel) == nil)
        let after = try await fileSystem.lookup(parent: directory.inode, name: "a", context: .kernel)
        #expect(after.inode == a.inode)
        #expect(after.attributes.size == 3)
        #expect(after.entryTimeout == options.trackedTimeout)

        // A name the kernel never saw: only the name is told (no node).
        sent.withLock { $0 = [] }
        fixture.provider.putFile("d/c", .bytes([3]))
        provider.report([.membership(directory: ItemIdentifier("d"), name: "c")])
        #expect(sent.value == [.entry(parent: directory.inode, name: "c")])

        // Not tellable any more: short timeouts again, nothing sent.
        fileSystem.setKernelInvalidation(nil)
        sent.withLock { $0 = [] }
        let b = try await fileSystem.lookup(parent: directory.inode, name: "b", context: .kernel)
        #expect(b.entryTimeout == options.entryTimeout)
        provider.report([.entry(directory: ItemIdentifier("d"), name: "b")])
        #expect(sent.value.isEmpty)
    }

    @Test("lost events invalidate every name and node the kernel may hold")
    func lostEventsInvalidateEverything() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/a", .bytes([1]))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let sent = Locked<[KernelInvalidation]>([])
        fileSystem.setKernelInvalidation { invalidations in sent.withLock { $0 += invalidations } }
        let directory = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        let a = try await fileSystem.lookup(parent: directory.inode, name: "a", context: .kernel)
        provider.report(nil)
        #expect(
            Set(sent.value) == [
                .entry(parent: .root, name: "d"), .attributes(directory.inode),
                .entry(parent: directory.inode, name: "a"), .attributes(a.inode),
            ])
    }

    @Test("without pushed changes nothing is tracked: the mount's timeouts, whatever the kernel can be told")
    func untrackedProvidersKeepTheShortTimeouts() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("a", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        fileSystem.setKernelInvalidation { _ in }
        let a = try await fileSystem.lookup(parent: .root, name: "a", context: .kernel)
        #expect(a.entryTimeout == fixture.options.entryTimeout)
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).validFor == nil)
    }
}
