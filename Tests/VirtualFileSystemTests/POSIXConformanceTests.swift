// What pjdfstest found where bindfs does better (issue 23 item 4, D-391): mknod of each type,
// setuid/setgid/sticky on a read-only mount (LocalDirectoryWritingTests: as a local source stores
// them), EFBIG for a size past the largest file.

import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

@Suite("POSIX conformance (VFS, D-391)", .timeLimit(.minutes(3)))
struct POSIXConformanceTests {
    @Test("mknod of a FIFO, socket or device: a node kept by the mount alone, with its type, mode, device and owner")
    func mknodOfSpecialFilesKeepsThemLocally() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        fixture.provider.putFile("file", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let cases: [(String, MknodType, NodeType, UInt64)] = [
            ("fifo", .fifo, .fifo, 0), ("socket", .socket, .socket, 0),
            ("char", .characterDevice, .characterDevice, 0x0103), ("block", .blockDevice, .blockDevice, 0x0801),
        ]
        for (name, type, shown, device) in cases {
            let made = try await fileSystem.makeNode(
                parent: .root, name: name, type: type, permissions: 0o640, device: device, context: .kernel)
            #expect(made.attributes.type == shown, "\(name)")
            #expect(made.attributes.permissions == 0o640, "\(name)")
            #expect(made.attributes.device == device, "\(name)")
            #expect(made.attributes.size == 0, "\(name)")
            let found = try await fileSystem.lookup(parent: .root, name: name, context: .kernel)
            #expect(found.inode == made.inode && found.attributes.type == shown, "\(name)")
            #expect(try await xattr(fileSystem, made.inode, ProviderFileSystem.AttributeName.state) == "local-only")
            // Never at the provider.
            #expect((try? await fixture.provider.item(for: ItemIdentifier(name))) == nil, "\(name)")
        }
        #expect(try await childNames(fileSystem, .root).sorted() == ["block", "char", "fifo", "file", "socket"])
        #expect(try await listAll(fileSystem, .root).first { $0.name == "fifo" }?.type == .fifo)
        #expect(
            Set(fileSystem.cache.contentActivity().filter { $0.state == .localOnly }.map(\.identifier.rawValue))
                == ["block", "char", "fifo", "socket"])
        // The name is taken now: EEXIST, for a node of either kind.
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeNode(
                    parent: .root, name: "fifo", type: .fifo, permissions: 0o644, device: 0, context: .kernel)
            } == .fileExists)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeNode(
                    parent: .root, name: "file", type: .socket, permissions: 0o644, device: 0, context: .kernel)
            } == .fileExists)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeNode(
                    parent: .root, name: "a/b", type: .fifo, permissions: 0o644, device: 0, context: .kernel)
            } == .invalidArgument)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeNode(
                    parent: .root, name: String(repeating: "x", count: 256), type: .fifo, permissions: 0o644,
                    device: 0, context: .kernel)
            } == .nameTooLong)

        let readOnly = try VFSFixture()
        let readOnlyFileSystem = try readOnly.makeFileSystem()
        for type in [MknodType.regular, .fifo, .socket] {
            #expect(
                await failureErrno {
                    _ = try await readOnlyFileSystem.makeNode(
                        parent: .root, name: "n", type: type, permissions: 0o644, device: 0, context: .kernel)
                } == .readOnlyFileSystem, "\(type)")
        }
    }

    @Test(
        "a local-only node: chmod, utimens, rename, unlink in the mount; rmdir of its directory ENOTEMPTY; moves with it; kept across a restart"
    )
    func localOnlyNodesChangeMoveAndPersist() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        fixture.provider.addDirectory("dir")
        fixture.provider.putFile("dir/old", .bytes([1, 2]))
        fixture.provider.putFile("dir/target", .bytes([3]))
        let fileSystem = try fixture.makeFileSystem()
        let dir = try await fileSystem.lookup(parent: .root, name: "dir", context: .kernel)
        let fifo = try await fileSystem.makeNode(
            parent: dir.inode, name: "pipe", type: .fifo, permissions: 0o600, device: 0, context: .kernel)
        let time = Timestamp(seconds: 1_000_000, nanoseconds: 7)
        let changed = try await fileSystem.setAttributes(
            fifo.inode, changes: AttributeChanges(permissions: 0o4644, modificationTime: time), handle: nil,
            context: .kernel)
        #expect(changed.type == .fifo && changed.permissions == 0o4644 && changed.modificationTime == time)
        #expect((try? await fixture.provider.item(for: ItemIdentifier("dir/pipe"))) == nil)

        // rmdir of the directory holding it: not empty, though the provider's directory would be.
        try await fileSystem.unlink(parent: dir.inode, name: "old", context: .kernel)
        try await fileSystem.unlink(parent: dir.inode, name: "target", context: .kernel)
        #expect(
            await failureErrno { try await fileSystem.removeDirectory(parent: .root, name: "dir", context: .kernel) }
                == .notEmpty)
        #expect((try? await fixture.provider.item(for: ItemIdentifier("dir"))) != nil)
        // Nor may an empty directory be renamed over it.
        _ = try await fileSystem.makeDirectory(parent: .root, name: "empty", permissions: 0o755, context: .kernel)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "empty", newParent: .root, newName: "dir", flags: 0, context: .kernel)
            } == .notEmpty)
        try await fileSystem.removeDirectory(parent: .root, name: "empty", context: .kernel)

        // rename within the mount, over a provider file (which goes), then the directory moves
        // and takes it along.
        let (made, opened) = try await fileSystem.create(
            parent: dir.inode, name: "target", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY),
            context: .kernel)
        #expect(
            try await fileSystem.write(made.inode, handle: opened.handle, offset: 0, data: [3], context: .kernel) == 1)
        try await fileSystem.flush(made.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(made.inode, handle: opened.handle)
        #expect(await fileSystem.cache.writes.waitUntilUploaded(ItemIdentifier("dir/target")))
        #expect((try? await fixture.provider.item(for: ItemIdentifier("dir/target"))) != nil)
        try await fileSystem.rename(
            parent: dir.inode, name: "pipe", newParent: dir.inode, newName: "target", flags: 0, context: .kernel)
        #expect((try? await fixture.provider.item(for: ItemIdentifier("dir/target"))) == nil)
        #expect(try await childNames(fileSystem, dir.inode) == ["target"])
        try await fileSystem.rename(
            parent: .root, name: "dir", newParent: .root, newName: "moved", flags: 0, context: .kernel)
        let moved = try await fileSystem.lookup(parent: .root, name: "moved", context: .kernel)
        let carried = try await fileSystem.lookup(parent: moved.inode, name: "target", context: .kernel)
        #expect(carried.attributes.type == .fifo && carried.attributes.permissions == 0o4644)
        #expect(carried.attributes.serialNumber == fifo.attributes.serialNumber)

        // A restart over the same store: still there, still local-only.
        let restarted = try fixture.makeFileSystem()
        let movedAgain = try await restarted.lookup(parent: .root, name: "moved", context: .kernel)
        fixture.clock.advance(by: .seconds(10))  // past the listing's TTL: the provider is listed again
        #expect(try await childNames(restarted, movedAgain.inode) == ["target"])
        let kept = try await restarted.lookup(parent: movedAgain.inode, name: "target", context: .kernel)
        #expect(kept.attributes.type == .fifo && kept.attributes.permissions == 0o4644)
        #expect(try await xattr(restarted, kept.inode, ProviderFileSystem.AttributeName.state) == "local-only")

        // unlink: gone, and the directory can go.
        try await restarted.unlink(parent: movedAgain.inode, name: "target", context: .kernel)
        #expect(try await childNames(restarted, movedAgain.inode) == [])
        try await restarted.removeDirectory(parent: .root, name: "moved", context: .kernel)
        #expect((try? await fixture.provider.item(for: ItemIdentifier("moved"))) == nil)
    }

    @Test("mknod of a regular file makes an empty file with the mode asked for, as create and close would")
    func mknodOfARegularFileMakesIt() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        let fileSystem = try fixture.makeFileSystem()
        let made = try await fileSystem.makeNode(
            parent: .root, name: "plain", type: .regular, permissions: 0o640, device: 0, context: .kernel)
        #expect(made.attributes.type == .regular)
        #expect(made.attributes.size == 0)
        #expect(made.attributes.permissions == 0o640)
        #expect(fileSystem.openFileCount == 0)
        let found = try await fileSystem.lookup(parent: .root, name: "plain", context: .kernel)
        #expect(found.inode == made.inode)
        #expect(try await childNames(fileSystem, .root) == ["plain"])
        // The name is taken now: a second one is EEXIST, as mknod(2) answers.
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeNode(
                    parent: .root, name: "plain", type: .regular, permissions: 0o644, device: 0, context: .kernel)
            } == .fileExists)
    }

    @Test("a read-only mount drops write bits but shows setuid, setgid and sticky")
    func readOnlyMountShowsSpecialBits() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("tool", .bytes([1]))
        fixture.provider.addDirectory("shared")
        let fileSystem = try fixture.makeFileSystem()
        let tool = try await fileSystem.lookup(parent: .root, name: "tool", context: .kernel)
        _ = try await fixture.provider.setAttributes(ItemIdentifier("tool"), ItemAttributeChanges(permissions: 0o6775))
        _ = try await fixture.provider.setAttributes(
            ItemIdentifier("shared"), ItemAttributeChanges(permissions: 0o1777))
        fixture.clock.advance(by: .seconds(10))  // past the attribute and directory TTLs
        let toolAttributes = try await fileSystem.getAttributes(tool.inode, context: .kernel)
        #expect(toolAttributes.permissions == 0o6555)
        let shared = try await fileSystem.lookup(parent: .root, name: "shared", context: .kernel)
        #expect(shared.attributes.permissions == 0o1555)
    }

    @Test("a write by a caller other than root clears setuid, and setgid with group execute; root's keeps them")
    func writeByAnotherUserClearsSetuidAndSetgid() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        let cases: [(name: String, permissions: UInt16, uid: UInt32, after: UInt16)] = [
            ("suid", 0o4777, 1000, 0o777), ("sgid", 0o2775, 1000, 0o775), ("both", 0o6777, 1000, 0o777),
            // setgid without group execute marks mandatory locking: kept, as Linux keeps it.
            ("lock", 0o2764, 1000, 0o2764), ("root", 0o6777, 0, 0o6777),
        ]
        for item in cases {
            fixture.provider.putFile(item.name, .bytes([1, 2]))
            _ = try await fixture.provider.setAttributes(
                ItemIdentifier(item.name), ItemAttributeChanges(permissions: item.permissions))
        }
        let fileSystem = try fixture.makeFileSystem()
        for item in cases {
            let context = RequestContext(threadID: 0, uid: item.uid, gid: item.uid)
            let file = try await fileSystem.lookup(parent: .root, name: item.name, context: context)
            #expect(file.attributes.permissions == item.permissions, "\(item.name)")
            let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_WRONLY), context: context)
            // The FUSE thread's write leaves a write that clears bits to the async path.
            if fileSystem.writeNow(file.inode, handle: opened.handle, offset: 0, data: [9], context: context) == nil {
                #expect(
                    try await fileSystem.write(
                        file.inode, handle: opened.handle, offset: 0, data: [9], context: context) == 1)
            } else {
                #expect(item.after == item.permissions, "\(item.name): written on the FUSE thread, bits kept")
            }
            #expect(
                try await fileSystem.getAttributes(file.inode, context: context).permissions == item.after,
                "\(item.name)")
            try await fileSystem.flush(file.inode, handle: opened.handle, context: context)
            await fileSystem.release(file.inode, handle: opened.handle)
            let after = try await fileSystem.getAttributes(file.inode, context: context)
            #expect(after.permissions == item.after, "\(item.name)")
            #expect(try await readAll(fileSystem, file.inode) == [9, 2], "\(item.name)")
        }
    }

    @Test("a provider that stores owners: stat shows them, chown goes to it, a node made belongs to its maker")
    func ownersWhereTheProviderStoresThem() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        let provider = InMemoryProvider(capabilities: InMemoryProvider.defaultCapabilities.union(.storesOwnership))
        provider.putFile("given", .bytes([1]))
        provider.addDirectory("team")
        _ = try await provider.setAttributes(ItemIdentifier("given"), ItemAttributeChanges(uid: 65534, gid: 65534))
        _ = try await provider.setAttributes(
            ItemIdentifier("team"), ItemAttributeChanges(permissions: 0o2777, uid: 0, gid: 4242))
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let given = try await fileSystem.lookup(parent: .root, name: "given", context: .kernel)
        #expect(given.attributes.uid == 65534 && given.attributes.gid == 65534)

        // chown: at the provider, and shown.
        let changed = try await fileSystem.setAttributes(
            given.inode, changes: AttributeChanges(uid: 1000, gid: 1001), handle: nil, context: .kernel)
        #expect(changed.uid == 1000 && changed.gid == 1001)
        #expect(try await provider.item(for: ItemIdentifier("given")).owner == ItemOwner(uid: 1000, gid: 1001))
        let regrouped = try await fileSystem.setAttributes(
            given.inode, changes: AttributeChanges(gid: 7), handle: nil, context: .kernel)
        #expect(regrouped.uid == 1000 && regrouped.gid == 7)

        // Made by a user: theirs, at the provider too; in a setgid directory, its group.
        let user = RequestContext(threadID: 0, uid: 1000, gid: 1000)
        let (file, opened) = try await fileSystem.create(
            parent: .root, name: "made", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY), context: user)
        try await fileSystem.flush(file.inode, handle: opened.handle, context: user)
        await fileSystem.release(file.inode, handle: opened.handle)
        #expect(file.attributes.uid == 1000 && file.attributes.gid == 1000)
        #expect(try await provider.item(for: ItemIdentifier("made")).owner == ItemOwner(uid: 1000, gid: 1000))
        let directory = try await fileSystem.makeDirectory(
            parent: .root, name: "dir", permissions: 0o755, context: user)
        #expect(directory.attributes.uid == 1000 && directory.attributes.gid == 1000)
        #expect(try await provider.item(for: ItemIdentifier("dir")).owner == ItemOwner(uid: 1000, gid: 1000))
        let link = try await fileSystem.makeSymbolicLink(parent: .root, name: "link", target: "made", context: user)
        #expect(link.attributes.uid == 1000 && link.attributes.gid == 1000)
        let team = try await fileSystem.lookup(parent: .root, name: "team", context: .kernel)
        let inTeam = try await fileSystem.makeDirectory(
            parent: team.inode, name: "sub", permissions: 0o755, context: user)
        #expect(inTeam.attributes.uid == 1000 && inTeam.attributes.gid == 4242)
        #expect(try await provider.item(for: ItemIdentifier("team/sub")).owner == ItemOwner(uid: 1000, gid: 4242))
        // Root makes root's: nothing to change at the provider.
        let rootMade = try await fileSystem.makeDirectory(
            parent: .root, name: "rootdir", permissions: 0o755, context: .kernel)
        #expect(rootMade.attributes.uid == 0 && rootMade.attributes.gid == 0)
    }

    @Test(
        "atime set by utimens is kept where the provider stores times; without one it reads as mtime; ctime never before mtime"
    )
    func accessTimeWhereTheProviderKeepsIt() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        fixture.provider.putFile("file", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "file", context: .kernel)
        #expect(file.attributes.accessTime == file.attributes.modificationTime)
        #expect(file.attributes.changeTime == file.attributes.modificationTime)
        let atime = Timestamp(seconds: 1_900_000_000, nanoseconds: 9)
        #expect(
            fileSystem.setAttributesNow(file.inode, changes: AttributeChanges(accessTime: atime), context: .kernel)
                == nil)
        let changed = try await fileSystem.setAttributes(
            file.inode, changes: AttributeChanges(accessTime: atime), handle: nil, context: .kernel)
        #expect(changed.accessTime == atime)
        #expect(changed.modificationTime == file.attributes.modificationTime)
        #expect(
            try await fixture.provider.item(for: ItemIdentifier("file")).accessTime
                == ItemTime(seconds: 1_900_000_000, nanoseconds: 9))

        // A provider that keeps no times: the atime is not kept (reads as mtime), answered at once.
        let plain = try VFSFixture(options: VFSFixture.writableOptions())
        let provider = InMemoryProvider(capabilities: [.writing])
        provider.putFile("file", .bytes([1]))
        let plainFileSystem = try plain.makeFileSystem(provider: provider)
        let other = try await plainFileSystem.lookup(parent: .root, name: "file", context: .kernel)
        let answered = plainFileSystem.setAttributesNow(
            other.inode, changes: AttributeChanges(accessTime: atime), context: .kernel)
        guard case .success(let attributes)? = answered else {
            Issue.record("an atime alone at a provider without times was not answered at once")
            return
        }
        #expect(attributes.accessTime == attributes.modificationTime)
    }

    @Test("a provider without owners: every node the mounting user's, chown to another EPERM, to it a no-op")
    func noOwnersWithoutTheCapability() async throws {
        var options = VFSFixture.writableOptions()
        options.uid = 4321
        options.gid = 8765
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("file", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "file", context: .kernel)
        #expect(file.attributes.uid == 4321 && file.attributes.gid == 8765)
        #expect(
            await failureErrno {
                _ = try await fileSystem.setAttributes(
                    file.inode, changes: AttributeChanges(uid: 1000), handle: nil, context: .kernel)
            } == .notPermitted)
        let same = try await fileSystem.setAttributes(
            file.inode, changes: AttributeChanges(uid: 4321, gid: 8765), handle: nil, context: .kernel)
        #expect(same.uid == 4321)
        let user = RequestContext(threadID: 0, uid: 1000, gid: 1000)
        let made = try await fileSystem.makeDirectory(parent: .root, name: "dir", permissions: 0o755, context: user)
        #expect(made.attributes.uid == 4321 && made.attributes.gid == 8765)
    }

    @Test("truncate past the largest file the cache can hold: EFBIG (not EIO), the file unchanged")
    func truncatePastTheLargestFileIsEFBIG() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        fixture.provider.putFile("f", .bytes([1, 2, 3]))
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        // The largest file is the cache file system's (16 TiB on ext4); a file-size limit of
        // 1 TiB stands for it on any file system (SIGXFSZ ignored: the call fails with EFBIG).
        let limit: rlim_t = 1 << 40
        var saved = rlimit()
        #expect(getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &saved) == 0)
        let previousHandler = signal(SIGXFSZ, SIG_IGN)
        var lowered = saved
        lowered.rlim_cur = min(limit, saved.rlim_max)
        #expect(setrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &lowered) == 0)
        let refused = await failureErrno {
            _ = try await fileSystem.setAttributes(
                file.inode, changes: AttributeChanges(size: 1 << 41), handle: nil, context: .kernel)
        }
        #expect(setrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &saved) == 0)
        signal(SIGXFSZ, previousHandler)
        #expect(refused == .fileTooLarge)
        #expect(try await fileSystem.getAttributes(file.inode, context: .kernel).size == 3)
        #expect(try await readAll(fileSystem, file.inode) == [1, 2, 3])
    }
}
