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

@Suite("ProviderFileSystem", .timeLimit(.minutes(3)))
struct ProviderFileSystemTests {
    @Test("ls -lR and stat of every item read metadata only, never content")
    func listingReadsNoContent() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("a")
        fixture.provider.addDirectory("a/b")
        for index in 0..<30 { fixture.provider.putFile("a/b/f\(index)", .ramp(seed: UInt64(index), size: 5000)) }
        fixture.provider.putFile("top.txt", .bytes(Array("top\n".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        var stack: [InodeNumber] = [.root]
        var seen = 0
        while let directory = stack.popLast() {
            for entry in try await listAll(fileSystem, directory, limit: 7)
            where entry.name != "." && entry.name != ".." {
                let found = try await fileSystem.lookup(parent: directory, name: entry.name, context: .kernel)
                let attributes = try await fileSystem.getAttributes(found.inode, context: .kernel)
                #expect(attributes.blocks == 0)
                _ = try await fileSystem.listExtendedAttributes(found.inode, context: .kernel)
                _ = try await xattr(fileSystem, found.inode, "user.providerfs.state")
                seen += 1
                if attributes.type == .directory { stack.append(found.inode) }
            }
        }
        #expect(seen == 33)
        #expect(fixture.provider.counters.fetchCalls == 0)
        #expect(fixture.provider.counters.bytesServed == 0)
    }

    @Test("readdir cookies resume where they left off; . and .. come first")
    func readdirCookies() async throws {
        let fixture = try VFSFixture()
        for name in ["c", "a", "b", "d e", "ü"] { fixture.provider.putFile(name, .bytes([1])) }
        let fileSystem = try fixture.makeFileSystem()
        let all = try await listAll(fileSystem, .root, limit: 1000)
        let paged = try await listAll(fileSystem, .root, limit: 2)
        #expect(all.map(\.name) == [".", "..", "a", "b", "c", "d e", "ü"])
        #expect(paged == all)
        #expect(Set(all.map(\.cookie)).count == all.count)
    }

    @Test("every mutating operation fails with EROFS")
    func readOnly() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .bytes([1, 2, 3]))
        fixture.provider.addDirectory("d")
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let context = RequestContext.kernel
        func expectEROFS(_ body: () async throws -> Void, line: Int = #line) async {
            do {
                try await body()
                Issue.record("expected EROFS (line \(line))")
            } catch {
                #expect((error as? FileSystemError)?.errno == .readOnlyFileSystem, "line \(line)")
            }
        }
        await expectEROFS {
            _ = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_WRONLY), context: context)
        }
        await expectEROFS {
            _ = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_RDWR), context: context)
        }
        await expectEROFS {
            _ = try await fileSystem.create(
                parent: .root, name: "n", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY), context: context)
        }
        await expectEROFS {
            _ = try await fileSystem.makeDirectory(parent: .root, name: "n", permissions: 0o755, context: context)
        }
        await expectEROFS {
            _ = try await fileSystem.makeSymbolicLink(parent: .root, name: "n", target: "f", context: context)
        }
        await expectEROFS { try await fileSystem.unlink(parent: .root, name: "f", context: context) }
        await expectEROFS { try await fileSystem.removeDirectory(parent: .root, name: "d", context: context) }
        await expectEROFS {
            try await fileSystem.rename(
                parent: .root, name: "f", newParent: .root, newName: "g", flags: 0, context: context)
        }
        await expectEROFS {
            _ = try await fileSystem.setAttributes(
                file.inode, changes: AttributeChanges(size: 0), handle: nil, context: context)
        }
        await expectEROFS {
            try await fileSystem.setExtendedAttribute(
                file.inode, name: "user.x", value: [1], flags: 0, context: context)
        }
        await expectEROFS {
            try await fileSystem.removeExtendedAttribute(file.inode, name: "user.providerfs.state", context: context)
        }
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_RDONLY), context: context)
        await expectEROFS {
            _ = try await fileSystem.write(file.inode, handle: opened.handle, offset: 0, data: [9], context: context)
        }
        await fileSystem.release(file.inode, handle: opened.handle)
        // Nothing changed on the provider.
        #expect(fixture.provider.content(of: "f")?.0 == .bytes([1, 2, 3]))
    }

    @Test("xattrs show state, progress, version; unknown names are ENODATA; error appears after a failure")
    func extendedAttributes() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("ok", .ramp(seed: 1, size: 100_000))
        fixture.provider.putFile("bad", .ramp(seed: 2, size: 100_000))
        fixture.faults.add(FaultRule(identifier: ItemIdentifier("bad"), fault: .failAfter(offset: 50_000, errno: EIO)))
        let fileSystem = try fixture.makeFileSystem()
        let ok = try await fileSystem.lookup(parent: .root, name: "ok", context: .kernel)
        #expect(try await xattr(fileSystem, ok.inode, "user.providerfs.state") == "dataless")
        #expect(try await xattr(fileSystem, ok.inode, "user.providerfs.progress") == "0/100000")
        #expect(
            try await xattr(fileSystem, ok.inode, "user.providerfs.version")
                == fixture.provider.content(of: "ok")!.1.rawValue)
        #expect(
            try await fileSystem.listExtendedAttributes(ok.inode, context: .kernel) == [
                "user.providerfs.state", "user.providerfs.progress", "user.providerfs.version",
                "user.providerfs.pin", "user.providerfs.policy",
            ])
        await #expect(throws: FileSystemError.self) { _ = try await xattr(fileSystem, ok.inode, "user.other") }
        do {
            _ = try await xattr(fileSystem, ok.inode, "user.providerfs.error")
            Issue.record("expected ENODATA")
        } catch let error as FileSystemError {
            #expect(error.errno == .noData)
        }
        _ = try await readAll(fileSystem, ok.inode)
        #expect(try await xattr(fileSystem, ok.inode, "user.providerfs.state") == "materialized")
        #expect(try await xattr(fileSystem, ok.inode, "user.providerfs.progress") == "100000/100000")
        #expect(try await fileSystem.getAttributes(ok.inode, context: .kernel).blocks == (100_000 + 511) / 512)

        let bad = try await fileSystem.lookup(parent: .root, name: "bad", context: .kernel)
        do {
            _ = try await readAll(fileSystem, bad.inode)
            Issue.record("expected EIO")
        } catch let error as FileSystemError {
            #expect(error.errno == .ioError)
        }
        #expect(try await xattr(fileSystem, bad.inode, "user.providerfs.state") == "error")
        // The errno readers got, then the byte where the download failed, then the message.
        #expect(try await xattr(fileSystem, bad.inode, "user.providerfs.error").hasPrefix("EIO: at byte 50000: "))
        #expect(
            try await fileSystem.listExtendedAttributes(bad.inode, context: .kernel).contains("user.providerfs.error"))
    }

    @Test("open keeps the page cache only while the content version is unchanged")
    func keepCache() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .bytes(Array("one".utf8)))
        let fileSystem = try fixture.makeFileSystem()
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        // A new node's cache is empty: nothing to drop, and dropping it could wait on pages that
        // a concurrent first open's stalled read has locked (D-366).
        let first = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(first.keepCache)
        let concurrent = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(concurrent.keepCache)
        await fileSystem.release(file.inode, handle: concurrent.handle)
        await fileSystem.release(file.inode, handle: first.handle)
        let second = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(second.keepCache)
        await fileSystem.release(file.inode, handle: second.handle)
        fixture.provider.putFile("f", .bytes(Array("two!".utf8)))
        let third = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(!third.keepCache)
        let data = try await fileSystem.read(file.inode, handle: third.handle, offset: 0, count: 100, context: .kernel)
        #expect(data.bytes == Array("two!".utf8))
        await fileSystem.release(file.inode, handle: third.handle)
        #expect(try await fileSystem.getAttributes(file.inode, context: .kernel).size == 4)
    }

    @Test(
        "open names the cache file (servedFrom) only when the pinned version is complete; the file stays unchanged until the last release"
    )
    func servedFromCompleteContentOnly() async throws {
        var options = VFSFixture.defaultOptions()
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 0
        let fixture = try VFSFixture(options: options)
        let content = InMemoryContent.ramp(seed: 9, size: 300_000)
        fixture.provider.putFile("f", content)
        fixture.provider.putFile("p", .ramp(seed: 10, size: 300_000))
        let fileSystem = try fixture.makeFileSystem()
        let readOnly = OpenFlags(rawValue: 0)
        let file = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)

        // Nothing local at open: every read must reach the file system.
        let first = try await fileSystem.open(file.inode, flags: readOnly, context: .kernel)
        #expect(first.servedFrom == nil)
        var offset: Int64 = 0
        while true {
            let data = try await fileSystem.read(
                file.inode, handle: first.handle, offset: offset, count: 64 << 10, context: .kernel)
            if data.count == 0 { break }
            offset += Int64(data.count)
        }
        await fileSystem.release(file.inode, handle: first.handle)

        // Complete now: the next open names the cache file, which holds exactly the content.
        let second = try await fileSystem.open(file.inode, flags: readOnly, context: .kernel)
        let path = try #require(second.servedFrom)
        #expect(byteDifference(try #require(localFileBytes(path)), content.slice(0..<300_000)) == nil)

        // Partly local (ranges only): never named, its holes would read as zeros.
        let partial = try await fileSystem.lookup(parent: .root, name: "p", context: .kernel)
        let reader = try await fileSystem.open(partial.inode, flags: readOnly, context: .kernel)
        _ = try await fileSystem.read(partial.inode, handle: reader.handle, offset: 0, count: 4096, context: .kernel)
        await fileSystem.release(partial.inode, handle: reader.handle)
        #expect(try await xattr(fileSystem, partial.inode, "user.providerfs.state") == "partial")
        let again = try await fileSystem.open(partial.inode, flags: readOnly, context: .kernel)
        #expect(again.servedFrom == nil)
        await fileSystem.release(partial.inode, handle: again.handle)

        // A new version on the provider: the new open pins it (not local yet); the handle that
        // pinned the old one keeps its file, unchanged, until it is released; then it is deleted.
        fixture.provider.putFile("f", .ramp(seed: 11, size: 300_000))
        let third = try await fileSystem.open(file.inode, flags: readOnly, context: .kernel)
        #expect(third.servedFrom == nil)
        #expect(byteDifference(try #require(localFileBytes(path)), content.slice(0..<300_000)) == nil)
        await fileSystem.release(file.inode, handle: third.handle)
        #expect(byteDifference(try #require(localFileBytes(path)), content.slice(0..<300_000)) == nil)
        await fileSystem.release(file.inode, handle: second.handle)
        #expect(access(path, F_OK) != 0, "superseded content is deleted at its last release")
    }

    @Test("an item deleted on the provider: open gives ENOENT, a read of an open handle EIO, never a hang")
    func deletedItem() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("gone", .ramp(seed: 3, size: 300_000))
        fixture.provider.putFile("going", .ramp(seed: 4, size: 300_000))
        let fileSystem = try fixture.makeFileSystem()
        let gone = try await fileSystem.lookup(parent: .root, name: "gone", context: .kernel)
        let going = try await fileSystem.lookup(parent: .root, name: "going", context: .kernel)
        let opened = try await fileSystem.open(going.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        fixture.provider.hold()
        fixture.provider.remove("gone")
        fixture.provider.remove("going")
        do {
            _ = try await fileSystem.open(gone.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
            Issue.record("expected ENOENT")
        } catch {
            #expect(error.errno == .noSuchFileOrDirectory)
        }
        fixture.provider.release()
        do {
            _ = try await withDeadline(.seconds(30), "a read of a deleted item") {
                try await fileSystem.read(
                    going.inode, handle: opened.handle, offset: 200_000, count: 10, context: .kernel)
            }
            Issue.record("expected EIO")
        } catch {
            #expect((error as? FileSystemError)?.errno == .ioError, "\(error)")
        }
        await fileSystem.release(going.inode, handle: opened.handle)
        // The clock passes the listing TTL: the directory no longer shows them.
        fixture.clock.advance(by: .seconds(6))
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", ".."])
        do {
            _ = try await fileSystem.lookup(parent: .root, name: "gone", context: .kernel)
            Issue.record("expected ENOENT")
        } catch {
            #expect(error.errno == .noSuchFileOrDirectory)
        }
    }

    @Test("a lookup miss re-lists the directory (rate-limited); listings refresh after their TTL")
    func remoteChangesRefresh() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("old", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", "..", "old"])
        fixture.provider.putFile("new", .bytes([2]))
        // Within the miss interval the listing is trusted.
        await #expect(throws: FileSystemError.self) {
            _ = try await fileSystem.lookup(parent: .root, name: "new", context: .kernel)
        }
        fixture.clock.advance(by: .milliseconds(600))
        let found = try await fileSystem.lookup(parent: .root, name: "new", context: .kernel)
        #expect(found.attributes.size == 1)
        fixture.provider.remove("old")
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", "..", "new", "old"])
        fixture.clock.advance(by: .seconds(5))
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", "..", "new"])
    }

    @Test("a listing that answers lookups is re-listed in the background after listingRefreshAhead")
    func listingRefreshAhead() async throws {
        var options = VFSFixture.defaultOptions()
        options.cache.listingRefreshAhead = .seconds(2)
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("a", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        #expect(try await fileSystem.lookup(parent: .root, name: "a", context: .kernel).attributes.size == 1)
        let listed = fixture.provider.counters.childrenCalls
        fixture.provider.putFile("a", .bytes([1, 2]))
        // A young listing answers alone.
        fixture.clock.advance(by: .seconds(1))
        #expect(try await fileSystem.lookup(parent: .root, name: "a", context: .kernel).attributes.size == 1)
        await fileSystem.cache.catalog.waitForBackgroundRefreshes()
        #expect(fixture.provider.counters.childrenCalls == listed)
        // Past listingRefreshAhead (still within directoryTTL): answered from the listing at once,
        // which is listed again behind the answer, once however many lookups ask.
        fixture.clock.advance(by: .seconds(2))
        #expect(try await fileSystem.lookup(parent: .root, name: "a", context: .kernel).attributes.size == 1)
        #expect(fileSystem.lookupNow(parent: .root, name: "a", context: .kernel) != nil)
        await fileSystem.cache.catalog.waitForBackgroundRefreshes()
        #expect(fixture.provider.counters.childrenCalls == listed + 1)
        #expect(try await fileSystem.lookup(parent: .root, name: "a", context: .kernel).attributes.size == 2)
        // The refreshed listing counts from when it was taken: 4 s later it still answers (and is
        // refreshed again, which finds the removal).
        fixture.clock.advance(by: .seconds(4))
        fixture.provider.remove("a")
        #expect(try await fileSystem.lookup(parent: .root, name: "a", context: .kernel).attributes.size == 2)
        await fileSystem.cache.catalog.waitForBackgroundRefreshes()
        #expect(fixture.provider.counters.childrenCalls == listed + 2)
        do {
            _ = try await fileSystem.lookup(parent: .root, name: "a", context: .kernel)
            Issue.record("a removed item must not be found once the listing is refreshed")
        } catch {
            #expect(error.errno == .noSuchFileOrDirectory)
        }
    }

    @Test("with a provider that looks names up, a miss asks for that name only, never a listing")
    func missesAskForOneName() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("old", .bytes([1]))
        let provider = NameLookupProvider(base: fixture.provider)
        let fileSystem = try fixture.makeFileSystem(provider: provider)
        #expect(try await listAll(fileSystem, .root).map(\.name) == [".", "..", "old"])
        let listings = fixture.provider.counters.childrenCalls
        fixture.provider.putFile("new", .bytes([2, 3]))
        // Within missRefreshInterval the listing answers alone.
        await #expect(throws: FileSystemError.self) {
            _ = try await fileSystem.lookup(parent: .root, name: "new", context: .kernel)
        }
        #expect(provider.pointLookups.value == 0)
        fixture.clock.advance(by: .milliseconds(600))
        // Past it: one name asked, found, and answered from the index from then on.
        let found = try await fileSystem.lookup(parent: .root, name: "new", context: .kernel)
        #expect(found.attributes.size == 2)
        #expect(provider.pointLookups.value == 1)
        #expect(fileSystem.lookupNow(parent: .root, name: "new", context: .kernel) != nil)
        // A name that does not exist: ENOENT, one lookup each time, still no listing.
        for expected in 2...3 {
            do {
                _ = try await fileSystem.lookup(parent: .root, name: "missing", context: .kernel)
                Issue.record("a missing name was found")
            } catch {
                #expect(error.errno == .noSuchFileOrDirectory)
            }
            #expect(provider.pointLookups.value == expected)
        }
        #expect(fixture.provider.counters.childrenCalls == listings)
        // The found child is part of the directory as the cache knows it.
        #expect(fileSystem.cache.catalog.knownItem(ItemIdentifier("new"))?.size == 2)
    }

    @Test("names are matched byte for byte; 255-byte names work; longer is ENAMETOOLONG")
    func names() async throws {
        let fixture = try VFSFixture()
        let long = String(repeating: "n", count: 255)
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        fixture.provider.putFile(long, .bytes([1]))
        fixture.provider.putFile(composed, .bytes([2]))
        fixture.provider.putFile("line\nbreak", .bytes([3]))
        let fileSystem = try fixture.makeFileSystem()
        #expect(try await fileSystem.lookup(parent: .root, name: long, context: .kernel).attributes.size == 1)
        #expect(try await fileSystem.lookup(parent: .root, name: "line\nbreak", context: .kernel).attributes.size == 1)
        #expect(try await fileSystem.lookup(parent: .root, name: composed, context: .kernel).attributes.size == 1)
        do {
            _ = try await fileSystem.lookup(parent: .root, name: decomposed, context: .kernel)
            Issue.record("a decomposed name must not match a composed one")
        } catch {
            #expect(error.errno == .noSuchFileOrDirectory)
        }
        do {
            _ = try await fileSystem.lookup(parent: .root, name: long + "x", context: .kernel)
            Issue.record("expected ENAMETOOLONG")
        } catch {
            #expect(error.errno == .nameTooLong)
        }
    }

    @Test("forget drops nodes; a node number comes back only for its own item, with a new generation (D-389)")
    func inodeLifecycle() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let first = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        let again = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        #expect(first.inode == again.inode)
        fileSystem.forget(first.inode, count: 2)
        await #expect(throws: FileSystemError.self) {
            _ = try await fileSystem.getAttributes(first.inode, context: .kernel)
        }
        let later = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        // The item's serial number is its node id while no other node holds it: (node id,
        // generation) is still never the same twice, as FUSE requires.
        #expect(later.inode == first.inode && later.attributes.serialNumber == first.attributes.serialNumber)
        #expect(later.generation > first.generation)
        // Another item under the name (a directory now): another number. (A file deleted and
        // made again between two looks is, to a provider whose identifiers are paths, the same
        // item changed: SEMANTICS "Identity".)
        fixture.provider.remove("f")
        fixture.provider.addDirectory("f")
        fixture.clock.advance(by: .seconds(3600))
        let other = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        #expect(other.attributes.serialNumber != first.attributes.serialNumber && other.inode != first.inode)
    }

    @Test("open takes a read claim and release gives it back; a refused claim fails the open")
    func readClaims() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("dir")
        fixture.provider.putFile("dir/f", .bytes([1]))
        let claims = RecordingClaims()
        let fileSystem = try fixture.makeFileSystem(claims: claims)
        let directory = try await fileSystem.lookup(parent: .root, name: "dir", context: .kernel)
        let file = try await fileSystem.lookup(parent: directory.inode, name: "f", context: .kernel)
        let opened = try await fileSystem.open(
            file.inode, flags: OpenFlags(rawValue: 0), context: RequestContext(threadID: 42, uid: 0, gid: 0))
        #expect(claims.events == ["acquire dir/f tid 42"])
        await fileSystem.release(file.inode, handle: opened.handle)
        #expect(claims.events == ["acquire dir/f tid 42", "release 1"])
        claims.refuse()
        do {
            _ = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
            Issue.record("expected the claim failure")
        } catch {
            #expect(error.errno == .timedOut)
        }
        #expect(fileSystem.openFileCount == 0)
    }

    @Test("statfs answers from the cache directory's file system")
    func statistics() async throws {
        let fixture = try VFSFixture()
        let fileSystem = try fixture.makeFileSystem()
        let statistics = try await fileSystem.statistics(context: .kernel)
        #expect(statistics.blockSize > 0 && statistics.totalBlocks > 0)
        #expect(statistics.maximumNameLength == 255)
    }
}

/// Records claim traffic; can be told to refuse.
final class RecordingClaims: ReadClaimProvider {
    private let state = Locked((events: [String](), next: UInt64(0), refusing: false, grantsNow: false))
    var events: [String] { state.value.events }
    func refuse() { state.withLock { $0.refusing = true } }
    /// Grant `acquireReadClaimNow` too (it declines by default, like a provider without one).
    func grantNow(_ grants: Bool) { state.withLock { $0.grantsNow = grants } }
    func acquireReadClaimNow(_ request: ReadClaimRequest) -> ReadClaimToken? {
        state.withLock { state -> ReadClaimToken? in
            guard state.grantsNow, !state.refusing else { return nil }
            state.next += 1
            state.events.append("acquire now \(request.relativePath) tid \(request.context.threadID)")
            return ReadClaimToken(rawValue: state.next)
        }
    }
    func acquireReadClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> ReadClaimToken {
        try state.withLock { state throws(FileSystemError) -> ReadClaimToken in
            if state.refusing { throw FileSystemError(.coordinationFailed, "a writer holds the item") }
            state.next += 1
            state.events.append("acquire \(request.relativePath) tid \(request.context.threadID)")
            return ReadClaimToken(rawValue: state.next)
        }
    }
    func releaseReadClaim(_ token: ReadClaimToken) {
        state.withLock { $0.events.append("release \(token.rawValue)") }
    }
}

/// The bytes of a local file (nil when it cannot be opened).
func localFileBytes(_ path: String) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 64 << 10)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count <= 0 { return count == 0 ? result : nil }
        result += buffer[0..<count]
    }
}
