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

/// Records the namespace claims asked for and their ends.
private final class RecordingNamespaceClaims: NamespaceClaimProvider {
    let log = Locked<[String]>([])
    func acquireNamespaceClaims(_ request: NamespaceClaimRequest) async throws(FileSystemError) -> NamespaceClaimToken {
        switch request.change {
        case .deleting(let path, let isDirectory): log.withLock { $0.append("delete \(path) \(isDirectory)") }
        case .moving(let from, let to, _, let exchanging):
            log.withLock { $0.append("move \(from) \(to)\(exchanging ? " exchange" : "")") }
        }
        return NamespaceClaimToken(rawValue: 1)
    }
    func finishNamespaceChange(_ token: NamespaceClaimToken, happened: Bool) {
        log.withLock { $0.append("finish \(happened)") }
    }
}

/// Token "rw" grants directory "d" read-write, "ro" read-only, "file" the file "d/f" read-write.
private struct TwoTokens: ScopedAccessProvider {
    func check(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        switch token {
        case "rw": .allowed(scope: "d", writable: true, id: "rw")
        case "ro": .allowed(scope: "d", writable: false, id: "ro")
        case "file": .allowed(scope: "d/f", writable: true, id: "file")
        default: .denied(reason: "unknown")
        }
    }
    func recordUse(_ token: String, context: RequestContext) -> ScopedAccessDecision { check(token, context: context) }
    func endUse(id: String) {}
    func returnUse(id: String) {}
}

private func writableFixture() throws -> VFSFixture {
    try VFSFixture(options: VFSFixture.writableOptions())
}

@Suite("Namespace changes (VFS)", .timeLimit(.minutes(3)))
struct NamespaceTests {
    @Test("mkdir answers an entry that lookup then finds, counted like a lookup; the provider has it")
    func makeDirectory() async throws {
        let fixture = try writableFixture()
        let fileSystem = try fixture.makeFileSystem()
        #expect(try await childNames(fileSystem, .root) == [])
        let made = try await fileSystem.makeDirectory(parent: .root, name: "d", permissions: 0o755, context: .kernel)
        #expect(made.attributes.type == .directory)
        let found = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        #expect(found.inode == made.inode)
        // Two references (mkdir's and lookup's): one forget leaves the node known.
        fileSystem.forget(made.inode, count: 1)
        _ = try await fileSystem.getAttributes(made.inode, context: .kernel)
        #expect(try await childNames(fileSystem, .root) == ["d"])
        #expect(try await fixture.provider.item(for: ItemIdentifier("d")).kind == .directory)
        let nested = try await fileSystem.makeDirectory(
            parent: made.inode, name: "e", permissions: 0o700, context: .kernel)
        #expect(try await childNames(fileSystem, made.inode) == ["e"])
        #expect(nested.attributes.type == .directory)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(parent: .root, name: "d", permissions: 0o755, context: .kernel)
            }
                == .fileExists)
    }

    @Test("bad names: EINVAL, ENAMETOOLONG; a file as parent: ENOTDIR; read-only: EROFS before anything")
    func badNames() async throws {
        let fixture = try writableFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        for name in ["", ".", "..", "a/b"] {
            #expect(
                await failureErrno {
                    _ = try await fileSystem.makeDirectory(
                        parent: .root, name: name, permissions: 0o755, context: .kernel)
                }
                    == .invalidArgument)
        }
        let long = String(repeating: "x", count: 256)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(parent: .root, name: long, permissions: 0o755, context: .kernel)
            }
                == .nameTooLong)
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(
                    parent: file.inode, name: "x", permissions: 0o755, context: .kernel)
            }
                == .notDirectory)
        #expect(
            await failureErrno { try await fileSystem.unlink(parent: .root, name: "missing", context: .kernel) }
                == .noSuchFileOrDirectory)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeHardLink(file.inode, newParent: .root, newName: "g", context: .kernel)
            }
                == .notPermitted)
        // A provider without symbolic links: EPERM, as vfat answers.
        let linkless = InMemoryProvider(capabilities: [.writing])
        let withoutLinks = try fixture.makeFileSystem(provider: linkless)
        #expect(
            await failureErrno {
                _ = try await withoutLinks.makeSymbolicLink(parent: .root, name: "l", target: "f", context: .kernel)
            }
                == .notPermitted)

        // Not writable (the default), or a provider without `.writing`: EROFS.
        let readOnly = try VFSFixture()
        let plain = try readOnly.makeFileSystem()
        #expect(
            await failureErrno {
                _ = try await plain.makeDirectory(parent: .root, name: "d", permissions: 0o755, context: .kernel)
            }
                == .readOnlyFileSystem)
        let unwritable = try writableFixture()
        let readOnlyProvider = InMemoryProvider(capabilities: [])
        readOnlyProvider.putFile("f", .bytes([1]))
        let declining = try unwritable.makeFileSystem(provider: readOnlyProvider)
        #expect(
            await failureErrno { try await declining.unlink(parent: .root, name: "f", context: .kernel) }
                == .readOnlyFileSystem)
    }

    @Test("unlink and rmdir: gone from provider and listing; EISDIR, ENOTDIR, ENOTEMPTY; claims taken first")
    func removing() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .bytes([1, 2]))
        fixture.provider.addDirectory("e")
        let claims = RecordingNamespaceClaims()
        let fileSystem = try fixture.makeFileSystem(namespaceClaims: claims)
        let d = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        #expect(
            await failureErrno { try await fileSystem.unlink(parent: .root, name: "d", context: .kernel) }
                == .isDirectory)
        #expect(
            await failureErrno { try await fileSystem.removeDirectory(parent: d.inode, name: "f", context: .kernel) }
                == .notDirectory)
        #expect(
            await failureErrno { try await fileSystem.removeDirectory(parent: .root, name: "d", context: .kernel) }
                == .notEmpty)
        #expect(try await childNames(fileSystem, d.inode) == ["f"])
        try await fileSystem.unlink(parent: d.inode, name: "f", context: .kernel)
        #expect(try await childNames(fileSystem, d.inode) == [])
        #expect(
            await failureErrno { _ = try await fileSystem.lookup(parent: d.inode, name: "f", context: .kernel) }
                == .noSuchFileOrDirectory)
        try await fileSystem.removeDirectory(parent: .root, name: "d", context: .kernel)
        #expect(try await childNames(fileSystem, .root) == ["e"])
        #expect(fixture.provider.allItems.map(\.identifier.rawValue).sorted() == ["", "e"])
        #expect(
            claims.log.withLock { $0 } == [
                "delete d true", "finish false", "delete d/f false", "finish true", "delete d true", "finish true",
            ])
    }

    @Test("an unlinked open file reads all its bytes to the end, even those not downloaded before")
    func unlinkedOpenFileStaysReadable() async throws {
        let fixture = try writableFixture()
        let bytes = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 * 7) }
        fixture.provider.putFile("f", .bytes(bytes))
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let first = try await fileSystem.read(file.inode, handle: opened.handle, offset: 0, count: 10, context: .kernel)
        #expect(first.bytes == Array(bytes[0..<10]))
        try await fileSystem.unlink(parent: .root, name: "f", context: .kernel)
        #expect(fixture.provider.content(of: "f") == nil)
        var read: [UInt8] = []
        while read.count < bytes.count {
            let data = try await fileSystem.read(
                file.inode, handle: opened.handle, offset: Int64(read.count), count: 65536, context: .kernel)
            if data.bytes.isEmpty { break }
            read += data.bytes
        }
        #expect(read == bytes)
        await fileSystem.release(file.inode, handle: opened.handle)
    }

    @Test("rename across directories re-keys the subtree: old names gone, new ones listed, nodes keep their numbers")
    func renameDirectory() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("a")
        fixture.provider.addDirectory("a/sub")
        fixture.provider.putFile("a/sub/f", .bytes(Array("hello".utf8)))
        fixture.provider.addDirectory("b")
        let claims = RecordingNamespaceClaims()
        let fileSystem = try fixture.makeFileSystem(namespaceClaims: claims)
        let a = try await fileSystem.lookup(parent: .root, name: "a", context: .kernel)
        let b = try await fileSystem.lookup(parent: .root, name: "b", context: .kernel)
        let sub = try await fileSystem.lookup(parent: a.inode, name: "sub", context: .kernel)
        let f = try await fileSystem.lookup(parent: sub.inode, name: "f", context: .kernel)
        try await fileSystem.rename(
            parent: a.inode, name: "sub", newParent: b.inode, newName: "moved", flags: 0, context: .kernel)
        #expect(try await childNames(fileSystem, a.inode) == [])
        #expect(try await childNames(fileSystem, b.inode) == ["moved"])
        let moved = try await fileSystem.lookup(parent: b.inode, name: "moved", context: .kernel)
        #expect(moved.inode == sub.inode)
        #expect(try await childNames(fileSystem, moved.inode) == ["f"])
        let movedFile = try await fileSystem.lookup(parent: moved.inode, name: "f", context: .kernel)
        #expect(movedFile.inode == f.inode)
        let opened = try await fileSystem.open(movedFile.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let data = try await fileSystem.read(
            movedFile.inode, handle: opened.handle, offset: 0, count: 100, context: .kernel)
        #expect(String(decoding: data.bytes, as: UTF8.self) == "hello")
        await fileSystem.release(movedFile.inode, handle: opened.handle)
        #expect(fileSystem.cache.catalog.path(of: ItemIdentifier("b/moved/f")) == "b/moved/f")
        #expect(fileSystem.cache.catalog.knownItem(ItemIdentifier("a/sub/f")) == nil)
        #expect(claims.log.withLock { $0 } == ["move a/sub b/moved", "finish true"])
        // Into itself: EINVAL.
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "b", newParent: moved.inode, newName: "x", flags: 0, context: .kernel)
            } == .invalidArgument)
    }

    @Test("rename over a file replaces it (its open handle keeps its bytes); NOREPLACE: EEXIST; EXCHANGE swaps")
    func renameOver() async throws {
        let fixture = try writableFixture()
        fixture.provider.putFile("x", .bytes(Array("new".utf8)))
        fixture.provider.putFile("y", .bytes(Array("old".utf8)))
        fixture.provider.addDirectory("d")
        fixture.provider.addDirectory("full")
        fixture.provider.putFile("full/f", .bytes([1]))
        fixture.provider.addDirectory("empty")
        fixture.provider.putFile("p", .bytes(Array("P".utf8)))
        fixture.provider.addDirectory("q")
        let fileSystem = try fixture.makeFileSystem()
        let y = try await fileSystem.lookup(parent: .root, name: "y", context: .kernel)
        let opened = try await fileSystem.open(y.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "x", newParent: .root, newName: "y", flags: 1, context: .kernel)
            } == .fileExists)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "x", newParent: .root, newName: "d", flags: 0, context: .kernel)
            } == .isDirectory)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "d", newParent: .root, newName: "x", flags: 0, context: .kernel)
            } == .notDirectory)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "d", newParent: .root, newName: "full", flags: 0, context: .kernel)
            } == .notEmpty)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "x", newParent: .root, newName: "y", flags: 4, context: .kernel)
            } == .invalidArgument)
        try await fileSystem.rename(
            parent: .root, name: "d", newParent: .root, newName: "empty", flags: 0, context: .kernel)
        try await fileSystem.rename(
            parent: .root, name: "x", newParent: .root, newName: "y", flags: 0, context: .kernel)
        #expect(try await childNames(fileSystem, .root) == ["empty", "full", "p", "q", "y"])
        let old = try await fileSystem.read(y.inode, handle: opened.handle, offset: 0, count: 10, context: .kernel)
        #expect(String(decoding: old.bytes, as: UTF8.self) == "old")
        await fileSystem.release(y.inode, handle: opened.handle)
        let newY = try await fileSystem.lookup(parent: .root, name: "y", context: .kernel)
        let reopened = try await fileSystem.open(newY.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let new = try await fileSystem.read(newY.inode, handle: reopened.handle, offset: 0, count: 10, context: .kernel)
        #expect(String(decoding: new.bytes, as: UTF8.self) == "new")
        await fileSystem.release(newY.inode, handle: reopened.handle)

        try await fileSystem.rename(
            parent: .root, name: "p", newParent: .root, newName: "q", flags: 2, context: .kernel)
        let q = try await fileSystem.lookup(parent: .root, name: "q", context: .kernel)
        let p = try await fileSystem.lookup(parent: .root, name: "p", context: .kernel)
        #expect(q.attributes.type == .regular)
        #expect(p.attributes.type == .directory)
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "p", newParent: .root, newName: "nothing", flags: 2, context: .kernel)
            } == .noSuchFileOrDirectory)
    }

    @Test(
        "chmod and utimens at a provider that does not store them: kept by the mount, shown, and kept across a restart")
    func attributesKept() async throws {
        let fixture = try writableFixture()
        let provider = InMemoryProvider(capabilities: [.writing])
        provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let f = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let time = Timestamp(seconds: 1_000_000, nanoseconds: 5)
        let after = try await fileSystem.setAttributes(
            f.inode, changes: AttributeChanges(permissions: 0o600, modificationTime: time), handle: nil,
            context: .kernel)
        #expect(after.permissions == 0o600)
        #expect(after.modificationTime == time)
        #expect(
            await failureErrno {
                _ = try await fileSystem.setAttributes(
                    f.inode, changes: AttributeChanges(uid: 12345), handle: nil, context: .kernel)
            } == .notPermitted)
        #expect(provider.allItems.first { $0.name == "f" }?.permissions == 0o644, "the provider keeps its own")
        let restarted = try fixture.makeFileSystem(provider: provider)
        let again = try await restarted.lookup(parent: .root, name: "f", context: .kernel)
        #expect(again.attributes.permissions == 0o600)
        #expect(again.attributes.modificationTime == time)
    }

    @Test("chmod and utimens at a provider that stores them reach the provider")
    func attributesStored() async throws {
        let fixture = try writableFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let f = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let time = Timestamp(seconds: 2_000_000, nanoseconds: 0)
        let after = try await fileSystem.setAttributes(
            f.inode, changes: AttributeChanges(permissions: 0o640, modificationTime: time), handle: nil,
            context: .kernel)
        #expect(after.permissions == 0o640)
        let stored = try #require(fixture.provider.allItems.first { $0.name == "f" })
        #expect(stored.permissions == 0o640)
        #expect(stored.modificationTime == ItemTime(seconds: 2_000_000))
    }

    @Test("the provider's own change reports after a change through the mount never lose or double an entry")
    func pushedChangesConverge() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .bytes([1]))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let d = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        #expect(try await childNames(fileSystem, d.inode) == ["f"])
        _ = try await fileSystem.makeDirectory(parent: d.inode, name: "new", permissions: 0o755, context: .kernel)
        try await fileSystem.rename(
            parent: d.inode, name: "f", newParent: d.inode, newName: "g", flags: 0, context: .kernel)
        // What inotify would say afterwards about each name.
        provider.report([
            .membership(directory: ItemIdentifier("d"), name: "new"),
            .membership(directory: ItemIdentifier("d"), name: "f"),
            .membership(directory: ItemIdentifier("d"), name: "g"),
        ])
        #expect(try await childNames(fileSystem, d.inode) == ["g", "new"])
        _ = try await fileSystem.lookup(parent: d.inode, name: "g", context: .kernel)
        #expect(try await childNames(fileSystem, d.inode) == ["g", "new"])
    }

    @Test("a listing taken before a mkdir and applied after it does not lose the new directory")
    func racingListingConverges() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .bytes([1]))
        let provider = ChangeNotifyingProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        let d = try await fileSystem.lookup(parent: .root, name: "d", context: .kernel)
        provider.holdNextListing()
        let listing = Task { try await childNames(fileSystem, d.inode) }
        while !provider.isHoldingListing { await Task.yield() }
        _ = try await fileSystem.makeDirectory(parent: d.inode, name: "new", permissions: 0o755, context: .kernel)
        provider.releaseListing()
        _ = try await listing.value
        #expect(try await childNames(fileSystem, d.inode) == ["f", "new"])
        _ = try await fileSystem.lookup(parent: d.inode, name: "new", context: .kernel)
    }

    @Test(
        "access paths: a read token refuses changes with EACCES; a read-write token changes inside its directory only")
    func accessPaths() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/f", .bytes([1]))
        fixture.provider.putFile("top", .bytes([2]))
        let fileSystem = try fixture.makeFileSystem(scopedAccess: TwoTokens())
        let scoped = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        let readOnly = try await fileSystem.lookup(parent: scoped.inode, name: "ro", context: .kernel)
        let readWrite = try await fileSystem.lookup(parent: scoped.inode, name: "rw", context: .kernel)
        let file = try await fileSystem.lookup(parent: scoped.inode, name: "file", context: .kernel)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(
                    parent: readOnly.inode, name: "x", permissions: 0o755, context: .kernel)
            } == .permissionDenied)
        #expect(
            await failureErrno { try await fileSystem.unlink(parent: readOnly.inode, name: "f", context: .kernel) }
                == .permissionDenied)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(
                    parent: scoped.inode, name: "x", permissions: 0o755, context: .kernel)
            } == .permissionDenied)
        // Beside a granted file: refused; the granted file itself cannot be removed through it.
        #expect(
            await failureErrno { try await fileSystem.unlink(parent: file.inode, name: "f", context: .kernel) }
                == .permissionDenied)
        let made = try await fileSystem.makeDirectory(
            parent: readWrite.inode, name: "new", permissions: 0o755, context: .kernel)
        #expect(made.attributes.type == .directory)
        #expect(try await fixture.provider.item(for: ItemIdentifier("d/new")).kind == .directory)
        try await fileSystem.rename(
            parent: readWrite.inode, name: "f", newParent: made.inode, newName: "g", flags: 0, context: .kernel)
        #expect(try await fixture.provider.item(for: ItemIdentifier("d/new/g")).kind == .file)
        // A directory moved through the access path keeps working under its node.
        try await fileSystem.rename(
            parent: readWrite.inode, name: "new", newParent: readWrite.inode, newName: "newer", flags: 0,
            context: .kernel)
        #expect(try await childNames(fileSystem, made.inode) == ["g"])
        try await fileSystem.rename(
            parent: readWrite.inode, name: "newer", newParent: readWrite.inode, newName: "new", flags: 0,
            context: .kernel)
        // Between an access path and a plain path: EXDEV.
        #expect(
            await failureErrno {
                try await fileSystem.rename(
                    parent: .root, name: "top", newParent: made.inode, newName: "top", flags: 0, context: .kernel)
            } == .crossDevice)
        try await fileSystem.unlink(parent: made.inode, name: "g", context: .kernel)
        try await fileSystem.removeDirectory(parent: readWrite.inode, name: "new", context: .kernel)
        #expect(try await childNames(fileSystem, readWrite.inode) == [])
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeDirectory(
                    parent: .root, name: ".scoped", permissions: 0o755, context: .kernel)
            } == .permissionDenied)
    }

    /// RENAME_EXCHANGE of two directories whose files have published versions not uploaded yet:
    /// each file keeps its written bytes and its upload, under the swapped identifiers (the
    /// catalog forgot both subtrees and superseded their content: the next open was ESTALE, the
    /// uploads found no content).
    @Test func exchangingDirectoriesKeepsTheirFilesUnuploadedVersions() async throws {
        let fixture = try writableFixture()
        fixture.provider.addDirectory("a")
        fixture.provider.addDirectory("b")
        fixture.provider.putFile("a/h", .bytes(Array("A0".utf8)))
        fixture.provider.putFile("b/h", .bytes(Array("B0".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        func inode(_ directory: String, _ name: String) async throws -> InodeNumber {
            let parent = try await fileSystem.lookup(parent: .root, name: directory, context: .kernel).inode
            return try await fileSystem.lookup(parent: parent, name: name, context: .kernel).inode
        }
        func read(_ directory: String) async throws -> [UInt8] {
            let file = try await inode(directory, "h")
            let opened = try await fileSystem.open(file, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
            defer { Task { await fileSystem.release(file, handle: opened.handle) } }
            return try await fileSystem.read(file, handle: opened.handle, offset: 0, count: 100, context: .kernel).bytes
        }
        for (path, bytes) in [("a/h", "A1"), ("b/h", "B1")] {
            fixture.faults.add(
                FaultRule(identifier: ItemIdentifier(path), fault: .failAfter(offset: 0, errno: EIO), on: .upload))
            let file = try await inode(String(path.prefix(1)), "h")
            let writer = try await fileSystem.open(
                file, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
            _ = try await fileSystem.write(
                file, handle: writer.handle, offset: 0, data: Array(bytes.utf8), context: .kernel)
            try await fileSystem.flush(file, handle: writer.handle, context: .kernel)
            await fileSystem.release(file, handle: writer.handle)
        }
        // RENAME_EXCHANGE
        try await fileSystem.rename(
            parent: .root, name: "a", newParent: .root, newName: "b", flags: 1 << 1, context: .kernel)
        #expect(try await read("a") == Array("B1".utf8))
        #expect(try await read("b") == Array("A1".utf8))
        _ = fixture.faults.clear()
        let deadline = ContinuousClock.now + .seconds(15)
        func uploaded() -> Bool {
            fixture.provider.content(of: "a/h")?.0 == .bytes(Array("B1".utf8))
                && fixture.provider.content(of: "b/h")?.0 == .bytes(Array("A1".utf8))
        }
        while !uploaded() && ContinuousClock.now < deadline {
            fixture.clock.advance(by: .seconds(1))
            try? await Task.sleep(for: .milliseconds(5))
        }
        #expect(
            uploaded(),
            "a/h: \(String(describing: fixture.provider.content(of: "a/h"))), b/h: \(String(describing: fixture.provider.content(of: "b/h")))"
        )
        #expect(try await childNames(fileSystem, .root) == ["a", "b"])
    }

    @Test("a file renamed while a write handle is open, or while its upload waits, ends up whole under the new name")
    func renameCarriesOpenWritersAndUploads() async throws {
        let fixture = try writableFixture()
        fixture.provider.putFile("f", .bytes(Array("old".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        func read(_ name: String) async throws -> [UInt8] {
            let inode = try await fileSystem.lookup(parent: .root, name: name, context: .kernel).inode
            let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
            defer { Task { await fileSystem.release(inode, handle: opened.handle) } }
            return try await fileSystem.read(inode, handle: opened.handle, offset: 0, count: 100, context: .kernel)
                .bytes
        }
        func providerBytes(_ name: String, _ expected: String) async -> Bool {
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline {
                if case .bytes(let bytes)? = fixture.provider.content(of: name)?.0, bytes == Array(expected.utf8) {
                    return true
                }
                // The write-back's retry backoff runs on the cache's manual clock.
                fixture.clock.advance(by: .seconds(1))
                try? await Task.sleep(for: .milliseconds(5))
            }
            return false
        }
        // A writer open across the rename (a logger whose file is rotated): everything it wrote,
        // before and after, is the renamed file's.
        let f = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel).inode
        let writer = try await fileSystem.open(f, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        _ = try await fileSystem.write(
            f, handle: writer.handle, offset: 0, data: Array("hello ".utf8), context: .kernel)
        try await fileSystem.rename(
            parent: .root, name: "f", newParent: .root, newName: "g", flags: 0, context: .kernel)
        _ = try await fileSystem.write(f, handle: writer.handle, offset: 6, data: Array("after".utf8), context: .kernel)
        try await fileSystem.flush(f, handle: writer.handle, context: .kernel)
        await fileSystem.release(f, handle: writer.handle)
        #expect(try await read("g") == Array("hello after".utf8))
        #expect(
            await failureErrno { _ = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel) }
                == .noSuchFileOrDirectory)
        #expect(await providerBytes("g", "hello after"), "\(String(describing: fixture.provider.content(of: "g")))")
        #expect(fixture.provider.content(of: "f") == nil)

        // A published version whose upload is held at the provider when the file is renamed (an
        // editor's save-via-rename right after a write): the rename waits for the upload call
        // (D-372), which lands under the old name, then moves it.
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("g"), fault: .stall(offset: 0), on: .upload))
        let g = try await fileSystem.lookup(parent: .root, name: "g", context: .kernel).inode
        let second = try await fileSystem.open(g, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        _ = try await fileSystem.write(g, handle: second.handle, offset: 0, data: Array("v2".utf8), context: .kernel)
        try await fileSystem.flush(g, handle: second.handle, context: .kernel)
        await fileSystem.release(g, handle: second.handle)
        let renaming = Task {
            try await fileSystem.rename(
                parent: .root, name: "g", newParent: .root, newName: "h", flags: 0, context: .kernel)
        }
        _ = fixture.faults.clear()
        try await renaming.value
        #expect(try await read("h") == Array("v2".utf8))
        #expect(await providerBytes("h", "v2"), "\(String(describing: fixture.provider.content(of: "h")))")
        #expect(try await childNames(fileSystem, .root) == ["h"], "no conflict copy, nothing left under the old names")
        #expect(fileSystem.cache.writes.pendingUploads.isEmpty)
    }

    @Test("a file deleted while its upload is queued is not brought back, and a new file of that name uploads cleanly")
    func deleteDropsTheQueuedUpload() async throws {
        let fixture = try writableFixture()
        fixture.provider.putFile("f", .bytes(Array("old".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        // Every upload of f fails: the edit waits in the queue, retried on the clock.
        fixture.faults.add(
            FaultRule(identifier: ItemIdentifier("f"), fault: .failAfter(offset: 0, errno: EIO), on: .upload))
        let f = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel).inode
        let writer = try await fileSystem.open(f, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        _ = try await fileSystem.write(f, handle: writer.handle, offset: 0, data: Array("edit".utf8), context: .kernel)
        try await fileSystem.flush(f, handle: writer.handle, context: .kernel)
        await fileSystem.release(f, handle: writer.handle)
        var deadline = ContinuousClock.now + .seconds(10)
        while fileSystem.cache.writes.uploadRecord(of: ItemIdentifier("f"))?.phase != .error,
            ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fileSystem.cache.writes.uploadRecord(of: ItemIdentifier("f"))?.phase == .error)
        try await fileSystem.unlink(parent: .root, name: "f", context: .kernel)
        #expect(fileSystem.cache.writes.pendingUploads.isEmpty, "the deleted file's upload went with it")
        _ = fixture.faults.clear()
        for _ in 0..<20 {
            fixture.clock.advance(by: .seconds(2))
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fixture.provider.content(of: "f") == nil, "no retry brought it back")

        // A new file of the same name: its own upload, no conflict copy.
        let (created, opened) = try await fileSystem.create(
            parent: .root, name: "f", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            created.inode, handle: opened.handle, offset: 0, data: Array("new".utf8), context: .kernel)
        try await fileSystem.flush(created.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(created.inode, handle: opened.handle)
        deadline = ContinuousClock.now + .seconds(10)
        while fixture.provider.content(of: "f")?.0 != .bytes(Array("new".utf8)), ContinuousClock.now < deadline {
            fixture.clock.advance(by: .seconds(1))
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fixture.provider.content(of: "f")?.0 == .bytes(Array("new".utf8)))
        #expect(try await childNames(fileSystem, .root) == ["f"], "no conflict copy")
    }

    @Test(
        "a file moved onto the name of one whose edit waits for its upload (replaced, or unlinked before) shows its own bytes"
    )
    func aMovedFileDoesNotTakeTheLocalVersionOfTheNameItTakes() async throws {
        let fixture = try writableFixture()
        for name in ["f", "g", "x", "y"] {
            fixture.provider.putFile(name, .bytes(Array("\(name) at the provider".utf8)))
        }
        let fileSystem = try fixture.makeFileSystem()
        func text(_ name: String) async throws -> String {
            let inode = try await fileSystem.lookup(parent: .root, name: name, context: .kernel).inode
            let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
            defer { Task { await fileSystem.release(inode, handle: opened.handle) } }
            return String(
                decoding: try await fileSystem.read(
                    inode, handle: opened.handle, offset: 0, count: 100, context: .kernel
                )
                .bytes, as: UTF8.self)
        }
        /// An edit of `name` published whose upload fails (it stays pending: a write-back settle, an
        /// offline provider).
        func pendingEdit(_ name: String) async throws {
            fixture.faults.add(
                FaultRule(identifier: ItemIdentifier(name), fault: .failAfter(offset: 0, errno: EIO), on: .upload))
            let inode = try await fileSystem.lookup(parent: .root, name: name, context: .kernel).inode
            let writer = try await fileSystem.open(
                inode, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
            _ = try await fileSystem.write(
                inode, handle: writer.handle, offset: 0, data: Array("a longer edit of \(name)".utf8), context: .kernel)
            try await fileSystem.flush(inode, handle: writer.handle, context: .kernel)
            await fileSystem.release(inode, handle: writer.handle)
            #expect(fileSystem.cache.writes.uploadRecord(of: ItemIdentifier(name))?.isPending == true)
        }
        // g replaces f, whose edit waits: f is g's file now, with g's bytes and size.
        try await pendingEdit("f")
        try await fileSystem.rename(
            parent: .root, name: "g", newParent: .root, newName: "f", flags: 0, context: .kernel)
        #expect(try await fileSystem.lookup(parent: .root, name: "f", context: .kernel).attributes.size == 17)
        #expect(try await text("f") == "g at the provider")
        // x, whose edit waits, is unlinked; y then takes its name.
        try await pendingEdit("x")
        try await fileSystem.unlink(parent: .root, name: "x", context: .kernel)
        try await fileSystem.rename(
            parent: .root, name: "y", newParent: .root, newName: "x", flags: 0, context: .kernel)
        #expect(try await fileSystem.lookup(parent: .root, name: "x", context: .kernel).attributes.size == 17)
        #expect(try await text("x") == "y at the provider")
        #expect(
            fileSystem.cache.writes.pendingUploads.isEmpty, "the replaced and the unlinked edits went with their files")
    }
}
