import AccessTokens
import ProviderCache
import ProviderFSCommands
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A real `TokenAuthority` on its own manual clock, behind the daemon's adapter (the caller's
/// thread is its process here), and a file system over the fixture's in-memory provider.
private struct ScopedFixture {
    let fixture: VFSFixture
    let tokenClock = ManualClock()
    let authority: TokenAuthority
    let fileSystem: ProviderFileSystem

    init() throws {
        fixture = try VFSFixture()
        authority = TokenAuthority(storeDirectory: nil, clock: tokenClock)
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/x", .ramp(seed: 1, size: 300_000))
        fixture.provider.addDirectory("d/sub")
        fixture.provider.putFile("d/sub/y", .bytes(Array("why\n".utf8)))
        fixture.provider.addDirectory("e")
        fixture.provider.putFile("e/secret", .bytes(Array("secret\n".utf8)))
        fixture.provider.putFile("top.txt", .bytes(Array("top\n".utf8)))
        fileSystem = try fixture.makeFileSystem(
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
    }

}

/// `body` fails with EACCES (FileSystemError.accessDenied); returns its message.
@discardableResult
private func expectDenied(
    _ what: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void
) async -> String {
    do {
        try await body()
        Issue.record("\(what) was not refused", sourceLocation: sourceLocation)
    } catch let error as FileSystemError {
        #expect(error.code == .accessDenied, "\(what): \(error)", sourceLocation: sourceLocation)
        #expect(error.errno == .permissionDenied, sourceLocation: sourceLocation)
        return error.message
    } catch {
        Issue.record("\(what): \(error)", sourceLocation: sourceLocation)
    }
    return ""
}

@Suite("Scoped access paths (.scoped/<token>/…)", .timeLimit(.minutes(3)))
struct ScopedPathTests {
    @Test("the root does not list .scoped; lookup finds it; listing it is refused; without a port it does not exist")
    func hiddenDirectory() async throws {
        let scoped = try ScopedFixture()
        let names = try await listAll(scoped.fileSystem, .root).map(\.name)
        #expect(names == [".", "..", "d", "e", "top.txt"])
        let directory = try await scoped.fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        #expect(directory.attributes.type == .directory)
        #expect(directory.attributes.permissions == 0o111)
        // The fast path answers `.scoped` as the async path does (never a fast ENOENT; D-512).
        let now = scoped.fileSystem.lookupNow(parent: .root, name: ".scoped", context: .kernel)
        #expect((try? now?.get())?.inode == directory.inode)
        await expectDenied("opendir .scoped") {
            _ = try await scoped.fileSystem.openDirectory(directory.inode, context: .kernel)
        }
        let plain = try scoped.fixture.makeFileSystem()
        await expectFailure(.notFound, "lookup .scoped without a port") {
            _ = try await plain.lookup(parent: .root, name: ".scoped", context: .kernel)
        }
    }

    @Test("malformed, truncated and unknown tokens are refused with EACCES and the reason")
    func badTokens() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(60))
        let message = await expectDenied("malformed") { _ = try await scoped.fileSystem.resolveScoped("pfs_garbage!") }
        #expect(message.contains("malformed"))
        await expectDenied("truncated") {
            _ = try await scoped.fileSystem.resolveScoped(String(issued.token.dropLast(3)))
        }
        var other = Array(issued.token)
        other[other.count - 1] = other.last == "a" ? "b" : "a"
        await expectDenied("unknown") { _ = try await scoped.fileSystem.resolveScoped(String(other)) }
    }

    @Test("names that cannot be tokens (the coordinator's package probe, .git): ENOENT, unlogged, never throttling")
    func probesAreNotGuesses() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(60))
        let directory = try await scoped.fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        // Far more than the 20 guesses a second that throttle a user, all within one instant.
        for round in 0..<500 {
            let name = [".providerfs-package", ".git", "Thumbs.db", "PFS_X"][round % 4]
            do {
                _ = try await scoped.fileSystem.lookup(parent: directory.inode, name: name, context: .kernel)
                Issue.record("\(name) was found under .scoped")
            } catch {
                #expect(error.code == .notFound && error.errno == .noSuchFileOrDirectory, "\(name): \(error)")
                #expect(error.message.contains("not an access token"))
            }
        }
        #expect(scoped.authority.auditLog().map(\.event) == [.grant])
        // The user's real access path still works, and reads its bytes.
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "sub/y")
        #expect(try await readAll(scoped.fileSystem, file.inode) == Array("why\n".utf8))
        // Real guesses are still limited.
        let guess = "pfs_\(scoped.authority.mountTag)_" + String(repeating: "c", count: 32)
        for _ in 0..<21 { await expectDenied("guess") { _ = try await scoped.fileSystem.resolveScoped(guess) } }
        let message = await expectDenied("throttled") { _ = try await scoped.fileSystem.resolveScoped(issued.token) }
        #expect(message.contains("too many unknown or malformed tokens"))
    }

    @Test("a file grant: .scoped/<token>/ holds just the file; reads give its bytes, direct I/O, no caches")
    func fileGrant() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d/x", ttl: .seconds(60), uses: 5)
        let tokenDirectory = try await scoped.fileSystem.resolveScoped(issued.token)
        // The fast path answers from memory too (D-341), with the same zero timeouts.
        guard
            case .success(let fast)? = scoped.fileSystem.lookupNow(
                parent: tokenDirectory.inode, name: "x", context: .kernel)
        else {
            Issue.record("lookupNow through the access path did not answer from memory")
            return
        }
        #expect(
            fast.entryTimeout == .zero && fast.attributeTimeout == .milliseconds(50) && fast.attributes.size == 300_000)
        #expect(tokenDirectory.attributes.type == .directory)
        #expect(tokenDirectory.entryTimeout == .zero && tokenDirectory.attributeTimeout == .milliseconds(50))
        #expect(try await listAll(scoped.fileSystem, tokenDirectory.inode).map(\.name) == [".", "..", "x"])
        await expectFailure(.notFound, "a sibling of the granted file") {
            _ = try await scoped.fileSystem.lookup(parent: tokenDirectory.inode, name: "sub", context: .kernel)
        }
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        #expect(file.entryTimeout == .zero && file.attributeTimeout == .milliseconds(50))
        #expect(file.attributes.size == 300_000)
        let plain = try await resolve(scoped.fileSystem, "d/x")
        #expect(file.inode != plain.inode)
        #expect(try await scoped.fileSystem.getAttributes(file.inode, context: .kernel).validFor == .milliseconds(50))
        // The fast path's getattr: after the same check, never cached by the kernel.
        guard case .success(let attributes)? = scoped.fileSystem.getAttributesNow(file.inode, context: .kernel) else {
            Issue.record("getAttributesNow through the access path did not answer from memory")
            return
        }
        #expect(attributes.validFor == .milliseconds(50) && attributes.size == 300_000)

        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(opened.directIO && !opened.keepCache && opened.servedFrom == nil)
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        let bytes = try await readAll(scoped.fileSystem, file.inode, chunk: 64 << 10)
        let expected = try await readAll(scoped.fileSystem, plain.inode)
        #expect(bytes.count == 300_000)
        #expect(expected.count == 300_000)
        #expect(bytes.indices.first(where: { bytes[$0] != expected[$0] }) == nil)
        // Two opens took two uses; lookups, getattrs and reads took none.
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 3)
    }

    @Test("a directory grant: .scoped/<token> is the directory; it covers everything inside, also items created later")
    func directoryGrant() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(60))
        let directory = try await scoped.fileSystem.resolveScoped(issued.token)
        #expect(directory.attributes.type == .directory)
        #expect(directory.entryTimeout == .zero && directory.attributeTimeout == .milliseconds(50))
        let entries = try await listAll(scoped.fileSystem, directory.inode)
        #expect(Set(entries.map(\.name)) == [".", "..", "x", "sub"])
        let scopedDirectory = try await scoped.fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        #expect(entries.first(where: { $0.name == ".." })?.inode == scopedDirectory.inode)
        let deep = try await scoped.fileSystem.resolveScoped(issued.token, "sub/y")
        #expect(try await readAll(scoped.fileSystem, deep.inode) == Array("why\n".utf8))
        await expectFailure(.notFound, "a sibling of the granted directory") {
            _ = try await scoped.fileSystem.resolveScoped(issued.token, "e")
        }
        scoped.fixture.provider.putFile("d/sub/later", .bytes(Array("later\n".utf8)))
        scoped.fixture.clock.advance(by: .seconds(10))
        let later = try await scoped.fileSystem.resolveScoped(issued.token, "sub/later")
        #expect(try await readAll(scoped.fileSystem, later.inode) == Array("later\n".utf8))
    }

    @Test("expiry mid-read: the next read of the open handle, getattr, lookup and readdir fail with EACCES")
    func expiryMidRead() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(2))
        let directory = try await scoped.fileSystem.resolveScoped(issued.token)
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let first = try await scoped.fileSystem.read(
            file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        #expect(first.count == 4096)
        // Bytes now present: the fast path serves them while the token is valid.
        if case .success(let data)? = scoped.fileSystem.readNow(
            file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        {
            #expect(data.bytes == first.bytes)
        } else {
            Issue.record("readNow of present bytes with a valid token did not answer")
        }
        scoped.tokenClock.advance(by: .milliseconds(1999))
        _ = try await scoped.fileSystem.read(
            file.inode, handle: opened.handle, offset: 4096, count: 4096, context: .kernel)
        scoped.tokenClock.advance(by: .milliseconds(1))
        let message = await expectDenied("read after expiry") {
            _ = try await scoped.fileSystem.read(
                file.inode, handle: opened.handle, offset: 8192, count: 4096, context: .kernel)
        }
        #expect(message.contains("expired"))
        guard
            case .failure(let error)? = scoped.fileSystem.readNow(
                file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        else {
            Issue.record("readNow after expiry did not refuse")
            return
        }
        #expect(error.code == .accessDenied)
        await expectDenied("getattr") { _ = try await scoped.fileSystem.getAttributes(file.inode, context: .kernel) }
        await expectDenied("lookup") {
            _ = try await scoped.fileSystem.lookup(parent: directory.inode, name: "x", context: .kernel)
        }
        await expectDenied("opendir") {
            _ = try await scoped.fileSystem.openDirectory(directory.inode, context: .kernel)
        }
        await expectDenied("open") {
            _ = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        }
        await expectDenied("a new path") { _ = try await scoped.fileSystem.resolveScoped(issued.token) }
        await expectDenied("getxattr") { _ = try await xattr(scoped.fileSystem, file.inode, "user.providerfs.state") }
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        #expect(scoped.fileSystem.openFileCount == 0)
    }

    @Test("revocation during a read: the next read fails with EACCES; an open directory handle too")
    func revocationMidRead() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(60))
        let directory = try await scoped.fileSystem.resolveScoped(issued.token)
        let listing = try await scoped.fileSystem.openDirectory(directory.inode, context: .kernel)
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        _ = try await scoped.fileSystem.read(
            file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
        try scoped.authority.revoke(id: issued.id)
        let message = await expectDenied("read after revoke") {
            _ = try await scoped.fileSystem.read(
                file.inode, handle: opened.handle, offset: 4096, count: 4096, context: .kernel)
        }
        #expect(message.contains("revoked"))
        await expectDenied("readdir after revoke") {
            _ = try await scoped.fileSystem.readDirectory(
                directory.inode, handle: listing, after: 0, limit: 100, context: .kernel)
        }
        scoped.fileSystem.releaseDirectory(directory.inode, handle: listing)
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        // The plain path is untouched.
        #expect(try await readAll(scoped.fileSystem, try await resolve(scoped.fileSystem, "e/secret").inode).count == 7)
    }

    @Test("opens take uses: the last use opens and reads to its close, then the token is used up; writes stay EROFS")
    func usesAndWrites() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d/x", ttl: .seconds(60), uses: 1)
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        #expect(try await xattr(scoped.fileSystem, file.inode, "user.providerfs.state") == "dataless")
        await expectFailure(.readOnlyFileSystem, "setattr") {
            _ = try await scoped.fileSystem.setAttributes(
                file.inode, changes: AttributeChanges(size: 0), handle: nil, context: .kernel)
        }
        await expectFailure(.readOnlyFileSystem, "open for writing") {
            _ = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: O_RDWR), context: .kernel)
        }
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 1)
        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        await expectDenied("second open") {
            _ = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        }
        // The handle holding the last use reads the whole file (what `cat` of a 1-use path needs).
        var bytes: [UInt8] = []
        while true {
            let data = try await scoped.fileSystem.read(
                file.inode, handle: opened.handle, offset: Int64(bytes.count), count: 128 << 10, context: .kernel)
            if data.bytes.isEmpty { break }
            bytes += data.bytes
        }
        #expect(bytes == InMemoryContent.ramp(seed: 1, size: 300_000).slice(0..<300_000))
        _ = try await scoped.fileSystem.getAttributes(file.inode, context: .kernel)
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        // Its close ends the last use: the token is used up, lookups are refused.
        #expect(scoped.authority.info(id: issued.id)?.state == .usedUp)
        await expectDenied("lookup after the last use ended") {
            _ = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        }
    }

    @Test("an open that fails after its use was taken gives the use back")
    func failedOpenReturnsUse() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/x", .bytes([1, 2, 3]))
        let authority = TokenAuthority(storeDirectory: nil, clock: ManualClock())
        let claims = RefusingClaims()
        let fileSystem = try fixture.makeFileSystem(
            claims: claims, scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let issued = try authority.grant("d", uses: 1)
        let scopedDirectory = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        let directory = try await fileSystem.lookup(parent: scopedDirectory.inode, name: issued.token, context: .kernel)
        let file = try await fileSystem.lookup(parent: directory.inode, name: "x", context: .kernel)
        claims.refusing.withLock { $0 = true }
        await expectFailure(.timedOut, "open while the claim is refused") {
            _ = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        }
        #expect(authority.info(id: issued.id)?.usesLeft == 1)
        #expect(authority.info(id: issued.id)?.state == .live)
        claims.refusing.withLock { $0 = false }
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(
            try await fileSystem.read(file.inode, handle: opened.handle, offset: 0, count: 3, context: .kernel).bytes
                == [1, 2, 3])
        await fileSystem.release(file.inode, handle: opened.handle)
        #expect(authority.info(id: issued.id)?.state == .usedUp)
    }

    @Test("an item whose identifier is not inside the token's scope is refused on every operation")
    func outOfScopeIdentifier() async throws {
        let fixture = try VFSFixture()
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/x", .bytes([1, 2, 3]))
        fixture.provider.addDirectory("e")
        fixture.provider.putFile("e/secret", .bytes([4]))
        let port = SwitchingScopePort(scope: "d")
        let fileSystem = try fixture.makeFileSystem(scopedAccess: port)
        let scopedDirectory = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        let directory = try await fileSystem.lookup(parent: scopedDirectory.inode, name: "t", context: .kernel)
        let file = try await fileSystem.lookup(parent: directory.inode, name: "x", context: .kernel)
        let opened = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        // The same token now grants another item: the nodes under "d" are outside it.
        port.scope.withLock { $0 = "e" }
        await expectDenied("read") {
            _ = try await fileSystem.read(file.inode, handle: opened.handle, offset: 0, count: 3, context: .kernel)
        }
        await expectDenied("getattr") { _ = try await fileSystem.getAttributes(file.inode, context: .kernel) }
        await expectDenied("lookup") {
            _ = try await fileSystem.lookup(parent: directory.inode, name: "x", context: .kernel)
        }
        await expectDenied("open") {
            _ = try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        }
        await expectFailure(.invalidArgument, "..") {
            _ = try await fileSystem.lookup(parent: directory.inode, name: "..", context: .kernel)
        }
        await fileSystem.release(file.inode, handle: opened.handle)
        // The refused open asked once, with a use it gave back (D-348, D-512): the token's scope
        // changed under its node, which a real authority never does.
        #expect(port.uses.withLock { $0 } == 2)
        // A grant of the root (the library refuses to make one) has no name to stand under.
        port.scope.withLock { $0 = "" }
        let message = await expectDenied("a root scope") {
            _ = try await fileSystem.lookup(parent: scopedDirectory.inode, name: "t", context: .kernel)
        }
        #expect(message.contains("root cannot be granted"))
    }

    @Test("symbolic links: inside the scope they resolve; absolute or climbing out they are refused")
    func symbolicLinks() async throws {
        let source = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            source.remove()
            cacheDirectory.remove()
        }
        #expect(mkdir(source.path + "/d", 0o755) == 0)
        #expect(mkdir(source.path + "/d/sub", 0o755) == 0)
        #expect(FileManagerLite.write(source.path + "/d/x", "x\n"))
        #expect(symlink("../x", source.path + "/d/sub/inside") == 0)
        #expect(symlink("../../top", source.path + "/d/sub/outside") == 0)
        #expect(symlink("/etc/passwd", source.path + "/d/sub/absolute") == 0)
        let authority = TokenAuthority(storeDirectory: nil, clock: ManualClock())
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cacheDirectory.path,
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let plainDirectory = try await resolve(fileSystem, "d")
        let identifier = fileSystem.cache.catalog.knownItem(
            try await fileSystem.cache.catalog.child(named: "d", of: .root)!.identifier)!.identifier
        #expect(plainDirectory.attributes.type == .directory)
        let issued = try authority.grant(
            scope: TokenScope(identifier: identifier.rawValue, path: "d"), mode: .read, ttl: .seconds(60))
        let walked = try await resolve(fileSystem, ".scoped/\(issued.token)/sub")
        let inside = try await fileSystem.lookup(parent: walked.inode, name: "inside", context: .kernel)
        #expect(try await fileSystem.readLink(inside.inode, context: .kernel) == "../x")
        for name in ["outside", "absolute"] {
            let link = try await fileSystem.lookup(parent: walked.inode, name: name, context: .kernel)
            let message = await expectDenied("readlink \(name)") {
                _ = try await fileSystem.readLink(link.inode, context: .kernel)
            }
            #expect(message.contains("out of the token's scope"))
        }
        await fileSystem.shutdown()
    }

    @Test("access ends within 100 ms of expiry on the real monotonic clock")
    func accessEndsWithin100ms() async throws {
        let fixture = try VFSFixture()
        fixture.provider.putFile("f", .ramp(seed: 3, size: 64 << 10))
        let authority = TokenAuthority(storeDirectory: nil, clock: ContinuousClock())
        let fileSystem = try fixture.makeFileSystem(
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let clock = ContinuousClock()
        // Load-independent bounds: the deadline lies in [beforeGrant + ttl, afterGrant + ttl]. No
        // read that *ends* before the earliest deadline may be refused, and no read that *starts*
        // 100 ms after the latest deadline may be allowed. A machine so loaded that the setup
        // outlives the TTL retries with a longer one (the bounds do not depend on speed).
        for ttl in [Duration.seconds(1), .seconds(5), .seconds(20)] {
            let beforeGrant = clock.now
            let issued = try authority.grant("f", ttl: ttl)
            let afterGrant = clock.now
            let opened: (InodeNumber, OpenedFile)
            do {
                let scopedDirectory = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
                let directory = try await fileSystem.lookup(
                    parent: scopedDirectory.inode, name: issued.token, context: .kernel)
                let file = try await fileSystem.lookup(parent: directory.inode, name: "f", context: .kernel)
                opened = (
                    file.inode, try await fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
                )
            } catch {
                #expect(clock.now >= beforeGrant + ttl, "refused before the TTL: \(error)")
                continue
            }
            var allowed = 0
            var refused = false
            var lastTry = false
            // Until refused, or one read started 10 s after the expiry (after a sleep that woke
            // seconds late on a starved pool, that read is still made, and must be refused).
            while !refused, !lastTry {
                let start = clock.now
                lastTry = start - afterGrant >= ttl + .seconds(10)
                do {
                    _ = try await fileSystem.read(
                        opened.0, handle: opened.1.handle, offset: 0, count: 4096, context: .kernel)
                    allowed += 1
                    #expect(start - (afterGrant + ttl) < .milliseconds(100), "a read allowed after the expiry")
                } catch {
                    #expect(error.code == .accessDenied)
                    #expect(clock.now >= beforeGrant + ttl, "a read refused before the expiry")
                    refused = true
                }
                try await Task.sleep(for: .milliseconds(5))
            }
            await fileSystem.release(opened.0, handle: opened.1.handle)
            #expect(refused, "reads still allowed 10 s after the expiry")
            if allowed > 0 { return }
        }
        Issue.record("the machine never opened and read within a TTL of 20 s")
    }

    @Test("the adapter maps the caller's thread to its process and explains denials")
    func adapter() throws {
        let authority = TokenAuthority(storeDirectory: nil, clock: ManualClock(), processStartTime: { _ in 7 })
        let issued = try authority.grant("d", ttl: .seconds(60), pid: 42)
        let access = MountScopedAccess(authority: authority, processOfThread: { $0 == 4242 ? 42 : $0 })
        let ownThread = RequestContext(threadID: 4242, uid: 1000, gid: 1000)
        #expect(access.check(issued.token, context: ownThread) == .allowed(scope: "d", writable: false, id: issued.id))
        let other = RequestContext(threadID: 99, uid: 1000, gid: 1000)
        guard case .denied(let reason) = access.check(issued.token, context: other) else {
            Issue.record("another process was allowed")
            return
        }
        #expect(reason == TokenDenialReason.wrongProcess.explanation)
        #expect(
            access.recordUse("pfs_nope!", context: ownThread)
                == .denied(reason: TokenDenialReason.malformed.explanation))
        #expect(
            access.recordUse("nope", context: ownThread)
                == .notAToken(reason: TokenDenialReason.notAToken.explanation))
        let real = MountScopedAccess(authority: authority)
        #expect(real.caller(RequestContext(threadID: getpid(), uid: 1, gid: 1)).pid == getpid())
    }

    @Test(
        "a read that waited for its bytes is checked again: a revoke during the wait refuses it (no byte after the end)"
    )
    func revokedWhileWaitingForBytes() async throws {
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d", ttl: .seconds(60))
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        scoped.fixture.provider.hold()
        let fileSystem = scoped.fileSystem
        let reader = Task { () -> Result<Int, FileSystemError> in
            do throws(FileSystemError) {
                return .success(
                    try await fileSystem.read(
                        file.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel
                    )
                    .count)
            } catch {
                return .failure(error)
            }
        }
        // The read passed its check and waits at the provider's gate.
        let deadline = ContinuousClock.now + .seconds(10)
        while scoped.fixture.provider.heldCount == 0, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(scoped.fixture.provider.heldCount > 0, "the read never waited for its download")
        try scoped.authority.revoke(id: issued.id)
        scoped.fixture.provider.release()
        guard case .failure(let error) = await reader.value else {
            Issue.record("the read that waited across the revoke delivered bytes")
            return
        }
        #expect(error.code == .accessDenied)
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
    }

    @Test("a check of a token bound to no process looks no process up; a pid-bound token, a use and a denial do")
    func processLookedUpOnlyWhenNeeded() throws {
        let authority = TokenAuthority(storeDirectory: nil, clock: ManualClock(), processStartTime: { _ in 7 })
        let free = try authority.grant("d", ttl: .seconds(60))
        let bound = try authority.grant("d", pid: 42)
        let lookups = Locked(0)
        let access = MountScopedAccess(
            authority: authority,
            processOfThread: { thread in
                lookups.withLock { $0 += 1 }
                return thread == 4242 ? 42 : thread
            })
        let context = RequestContext(threadID: 4242, uid: 1000, gid: 1000)
        for _ in 0..<3 {
            // The time left on the manual clock (D-345).
            #expect(
                access.check(free.token, context: context)
                    == .allowed(scope: "d", writable: false, id: free.id, caching: .atMost(.seconds(60))))
        }
        #expect(lookups.withLock { $0 } == 0)
        #expect(access.check(bound.token, context: context) == .allowed(scope: "d", writable: false, id: bound.id))
        #expect(lookups.withLock { $0 } == 1)
        // A use is logged with the caller's pid.
        #expect(
            access.recordUse(free.token, context: context)
                == .allowed(scope: "d", writable: false, id: free.id, caching: .atMost(.seconds(60))))
        #expect(lookups.withLock { $0 } == 2)
        #expect(authority.auditLog().last?.pid == 42)
        // A denial too: an expired token is logged with its caller.
        try authority.expire(id: free.id)
        #expect(access.check(free.token, context: context) == .denied(reason: TokenDenialReason.expired.explanation))
        #expect(lookups.withLock { $0 } == 3)
        #expect(authority.auditLog().last?.pid == 42 && authority.auditLog().last?.reason == .expired)
        // Another process, refused by the pid-bound token.
        let other = RequestContext(threadID: 99, uid: 1000, gid: 1000)
        #expect(
            access.check(bound.token, context: other) == .denied(reason: TokenDenialReason.wrongProcess.explanation))
    }

    @Test(
        "access paths on the fast path: lookup, getattr, open (one use, in its one check) and read; refused there once revoked"
    )
    func fastPath() async throws {
        // Over a local source, as the daemon mounts one: opens are answered at once (D-229).
        let source = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            source.remove()
            cacheDirectory.remove()
        }
        try source.write("d/sub/y", Array("why\n".utf8))
        let authority = TokenAuthority(storeDirectory: nil, clock: ManualClock())
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cacheDirectory.path,
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let issued = try authority.grant("d", uses: 3)
        let scopedDirectory = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        let granted = try await fileSystem.lookup(parent: scopedDirectory.inode, name: issued.token, context: .kernel)
        let directory = try await fileSystem.lookup(parent: granted.inode, name: "sub", context: .kernel)
        let file = try await fileSystem.lookup(parent: directory.inode, name: "y", context: .kernel)
        let scoped = (fileSystem: fileSystem, authority: authority)
        guard
            case .success(let entry)? = scoped.fileSystem.lookupNow(
                parent: directory.inode, name: "y", context: .kernel)
        else {
            Issue.record("lookupNow did not answer")
            return
        }
        #expect(entry.inode == file.inode && entry.entryTimeout == .zero)
        guard
            case .success(let opened)? = scoped.fileSystem.openNow(
                file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        else {
            Issue.record("openNow did not answer")
            return
        }
        #expect(opened.directIO && !opened.keepCache && opened.servedFrom == nil)
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 2)
        let bytes = try await scoped.fileSystem.read(
            file.inode, handle: opened.handle, offset: 0, count: 100, context: .kernel)
        #expect(Array(bytes.bytes) == Array("why\n".utf8))
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        // A write open on a read-only mount: EROFS after the token's check, as `open` answers it,
        // with no use taken (the core both forms share, D-512).
        let writeOpen = scoped.fileSystem.openNow(file.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        if case .failure(let error)? = writeOpen {
            #expect(error.code == .readOnlyFileSystem)
        } else {
            Issue.record("a write open was not answered EROFS: \(String(describing: writeOpen))")
        }
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 2)

        try scoped.authority.revoke(id: issued.id)
        for (what, result) in [
            (
                "lookupNow",
                scoped.fileSystem.lookupNow(parent: directory.inode, name: "y", context: .kernel).map {
                    $0.map { _ in () }
                }
            ),
            (
                "getAttributesNow",
                scoped.fileSystem.getAttributesNow(file.inode, context: .kernel).map { $0.map { _ in () } }
            ),
            (
                "openNow",
                scoped.fileSystem.openNow(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel).map {
                    $0.map { _ in () }
                }
            ),
        ] {
            guard case .failure(let error)? = result else {
                Issue.record("\(what) after the revoke: \(String(describing: result))")
                continue
            }
            #expect(error.code == .accessDenied, "\(what)")
        }
        #expect(scoped.fileSystem.openFileCount == 0)
    }

    @Test("the fast open takes its use in its one check and gives it back when it leaves the open to `open` (D-348)")
    func fastOpenDeclinedReturnsUse() async throws {
        // The content is not at hand (dataless): `openNow` declines after its check took the use.
        let scoped = try ScopedFixture()
        let issued = try scoped.authority.grant("d/x", ttl: .seconds(60), uses: 1)
        let file = try await scoped.fileSystem.resolveScoped(issued.token, "x")
        #expect(scoped.fileSystem.openNow(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel) == nil)
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 1)
        #expect(scoped.authority.info(id: issued.id)?.state == .live)
        let events = scoped.authority.auditLog().filter { $0.tokenID == issued.id }.map(\.event)
        #expect(events == [.grant, .use, .useReturned], "\(events)")
        // `cat` of a `--uses 1` path: the async open takes the one use and reads to the end.
        let opened = try await scoped.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let bytes = try await scoped.fileSystem.read(
            file.inode, handle: opened.handle, offset: 0, count: 128 << 10, context: .kernel)
        #expect(bytes.bytes == InMemoryContent.ramp(seed: 1, size: 300_000).slice(0..<(128 << 10)))
        await scoped.fileSystem.release(file.inode, handle: opened.handle)
        #expect(scoped.authority.info(id: issued.id)?.state == .usedUp)
        #expect(scoped.fileSystem.openFileCount == 0)
    }

    @Test("the fast open's one check refuses with the reasons of the two checks it replaced (D-348)")
    func fastOpenDenialReasons() async throws {
        let source = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            source.remove()
            cacheDirectory.remove()
        }
        try source.write("d/y", Array("why\n".utf8))
        let tokenClock = ManualClock()
        let authority = TokenAuthority(storeDirectory: nil, clock: tokenClock)
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cacheDirectory.path,
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let scopedDirectory = try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel)
        // Lookups as this process (a pid-bound token allows it); the opens as another (.kernel).
        let owner = RequestContext(threadID: getpid(), uid: 0, gid: 0)
        func file(_ issued: IssuedToken) async throws -> InodeNumber {
            let granted = try await fileSystem.lookup(parent: scopedDirectory.inode, name: issued.token, context: owner)
            return try await fileSystem.lookup(parent: granted.inode, name: "y", context: owner).inode
        }
        func fastOpenRefusal(_ inode: InodeNumber) -> String? {
            guard case .failure(let error)? = fileSystem.openNow(inode, flags: OpenFlags(rawValue: 0), context: .kernel)
            else { return nil }
            #expect(error.code == .accessDenied)
            return error.message
        }
        let scope = TokenScope(identifier: "d", path: "d")
        // Revoked, expired: refused before any use, one denial entry each.
        let revoked = try authority.grant(scope: scope, mode: .read)
        let revokedFile = try await file(revoked)
        try authority.revoke(id: revoked.id)
        #expect(fastOpenRefusal(revokedFile)?.contains(TokenDenialReason.revoked.explanation) == true)
        let expiring = try authority.grant(scope: scope, mode: .read, ttl: .seconds(10))
        let expiringFile = try await file(expiring)
        tokenClock.advance(by: .seconds(11))
        #expect(fastOpenRefusal(expiringFile)?.contains(TokenDenialReason.expired.explanation) == true)
        // Used up: the one use is held by an open handle; the next open is refused `usedUp`.
        let once = try authority.grant(scope: scope, mode: .read, uses: 1)
        let onceFile = try await file(once)
        guard case .success(let held)? = fileSystem.openNow(onceFile, flags: OpenFlags(rawValue: 0), context: .kernel)
        else {
            Issue.record("openNow did not answer")
            return
        }
        #expect(fastOpenRefusal(onceFile)?.contains(TokenDenialReason.usedUp.explanation) == true)
        await fileSystem.release(onceFile, handle: held.handle)
        #expect(authority.info(id: once.id)?.state == .usedUp)
        // A token bound to another process: `wrongProcess`.
        let bound = try authority.grant(scope: scope, mode: .read, pid: getpid())
        let boundFile = try await file(bound)
        #expect(fastOpenRefusal(boundFile)?.contains(TokenDenialReason.wrongProcess.explanation) == true)
        // The audit entries: one denial per refused open, the one open's use, and no other use.
        let log = authority.auditLog()
        for (id, reason) in [
            (revoked.id, TokenDenialReason.revoked), (expiring.id, .expired), (once.id, .usedUp),
            (bound.id, .wrongProcess),
        ] {
            #expect(log.filter { $0.tokenID == id && $0.reason == reason }.count == 1, "\(reason)")
        }
        #expect(log.filter { $0.event == .use }.map(\.tokenID) == [once.id])
        #expect(fileSystem.openFileCount == 0)
    }
}

/// A port that allows token "t" for a scope the test changes, and counts uses.
private final class SwitchingScopePort: ScopedAccessProvider, Sendable {
    let scope: Locked<String>
    let uses = Locked(0)
    init(scope: String) { self.scope = Locked(scope) }
    func check(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        token == "t" ? .allowed(scope: scope.withLock { $0 }, writable: false, id: "id") : .denied(reason: "unknown")
    }
    func recordUse(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        uses.withLock { $0 += 1 }
        return check(token, context: context)
    }
    func endUse(id: String) {}
    func returnUse(id: String) {}
}

/// Read claims that time out while `refusing` is set.
private final class RefusingClaims: ReadClaimProvider, Sendable {
    let refusing = Locked(false)
    func acquireReadClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> ReadClaimToken {
        if refusing.withLock({ $0 }) { throw FileSystemError(.timedOut, "the claim was refused (test)") }
        return ReadClaimToken(rawValue: 0)
    }
    func releaseReadClaim(_ token: ReadClaimToken) {}
}

private enum FileManagerLite {
    static func write(_ path: String, _ text: String) -> Bool {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) } == bytes.count
    }
}
