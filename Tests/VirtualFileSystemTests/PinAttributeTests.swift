// `user.providerfs.pin` through the file system (D-445): getxattr reads the item's own state and
// `user.providerfs.policy` the effective one; setxattr takes pinned, unpinned or inherited (EINVAL
// otherwise, EEXIST with XATTR_CREATE), `unpinned` evicts before it returns, removexattr inherits;
// every other name stays EROFS.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import VirtualFileSystem

@Suite struct PinAttributeTests {
    func errno(_ body: () async throws -> Void) async -> Errno? {
        do {
            try await body()
            return nil
        } catch {
            return (error as? FileSystemError)?.errno
        }
    }

    @Test("set, read back, inherit by removal; bad values EINVAL; XATTR_CREATE EEXIST; unpinned evicts")
    func roundTrip() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .ramp(seed: 3, size: 120_000))
        let fileSystem = try fixture.makeFileSystem()
        let d = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        let f = try await fileSystem.lookup(parent: d.inode, name: "f", context: .kernel)
        let pin = ProviderFileSystem.AttributeName.pin
        let policy = ProviderFileSystem.AttributeName.policy
        #expect(try await xattr(fileSystem, d.inode, pin) == "inherited")
        #expect(try await xattr(fileSystem, f.inode, policy) == "unpinned")
        #expect(try await fileSystem.listExtendedAttributes(d.inode, context: .kernel).contains(pin))

        try await fileSystem.setExtendedAttribute(
            d.inode, name: pin, value: Array("pinned".utf8), flags: 0, context: .kernel)
        #expect(try await xattr(fileSystem, d.inode, pin) == "pinned")
        #expect(try await xattr(fileSystem, f.inode, pin) == "inherited")
        #expect(try await xattr(fileSystem, f.inode, policy) == "pinned")
        await fileSystem.cache.waitForPinnedDownloads()
        #expect(try await xattr(fileSystem, f.inode, "user.providerfs.state") == "materialized")

        #expect(
            await errno {
                try await fileSystem.setExtendedAttribute(
                    d.inode, name: pin, value: Array("sometimes".utf8), flags: 0, context: .kernel)
            } == .invalidArgument)
        #expect(
            await errno {
                try await fileSystem.setExtendedAttribute(
                    d.inode, name: pin, value: Array("pinned".utf8), flags: 1, context: .kernel)
            } == .fileExists)
        #expect(
            await errno {
                try await fileSystem.setExtendedAttribute(
                    d.inode, name: "user.other", value: [1], flags: 0, context: .kernel)
            } == .readOnlyFileSystem)
        #expect(try await xattr(fileSystem, d.inode, pin) == "pinned")

        // "unpinned\n" (as echo leaves it): the state, and the file evicted by the time it returns.
        try await fileSystem.setExtendedAttribute(
            d.inode, name: pin, value: Array("unpinned\n".utf8), flags: 0, context: .kernel)
        #expect(try await xattr(fileSystem, d.inode, pin) == "unpinned")
        #expect(try await xattr(fileSystem, f.inode, "user.providerfs.state") == "dataless")

        try await fileSystem.removeExtendedAttribute(d.inode, name: pin, context: .kernel)
        #expect(try await xattr(fileSystem, d.inode, pin) == "inherited")
        await fileSystem.shutdown()
    }
}
