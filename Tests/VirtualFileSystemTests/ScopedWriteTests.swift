// Content writes through access paths on a writable mount (issue 14 item 6, D-369): a read-write
// token's path creates, writes, truncates and publishes; a read token's path refuses every write
// with EACCES; when a token ends with a handle open, its next write, truncate, flush and fsync are
// EACCES and nothing it wrote is published, while a plain writer of the same item loses nothing.
// A real `TokenAuthority` on a manual clock behind the daemon's adapter.

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

private struct ScopedWriteFixture {
    let fixture: VFSFixture
    let provider = InMemoryProvider()
    let tokenClock = ManualClock()
    let authority: TokenAuthority
    let fs: ProviderFileSystem

    init() throws {
        var options = VFSFixture.defaultOptions()
        options.writable = true
        fixture = try VFSFixture(options: options)
        authority = TokenAuthority(storeDirectory: nil, clock: tokenClock)
        provider.addDirectory("d")
        provider.putFile("d/x", .bytes(Array("original x\n".utf8)))
        provider.putFile("top.txt", .bytes(Array("top\n".utf8)))
        fs = try fixture.makeFileSystem(
            provider: provider, scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
    }

    func plain(_ path: String) async throws -> InodeNumber {
        var inode = InodeNumber.root
        for component in path.split(separator: "/") {
            inode = try await fs.lookup(parent: inode, name: String(component), context: .kernel).inode
        }
        return inode
    }

    /// The whole content through a new read handle of `inode`.
    func read(_ inode: InodeNumber) async throws -> [UInt8] {
        let opened = try await fs.open(inode, flags: OpenFlags(rawValue: O_RDONLY), context: .kernel)
        let data = try await fs.read(inode, handle: opened.handle, offset: 0, count: 1 << 20, context: .kernel)
        await fs.release(inode, handle: opened.handle)
        return data.bytes
    }

    func write(_ inode: InodeNumber, _ handle: FileHandleID, _ text: String, at offset: Int64 = 0) async throws {
        _ = try await fs.write(inode, handle: handle, offset: offset, data: Array(text.utf8), context: .kernel)
    }
}

@Suite("Writes through access paths")
struct ScopedWriteTests {
    @Test("a read-write token's path creates, writes, truncates and publishes; the plain path and the provider see it")
    func readWriteTokenWrites() async throws {
        let scoped = try ScopedWriteFixture()
        let issued = try scoped.authority.grant("d", .readWrite, ttl: .seconds(60), uses: 10)
        let directory = try await scoped.fs.resolveScoped(issued.token)
        // create(2) through the access path: a use, like an open; the file is the token's.
        let (created, opened) = try await scoped.fs.create(
            parent: directory.inode, name: "new.txt", permissions: 0o644,
            flags: OpenFlags(rawValue: O_WRONLY | O_CREAT), context: .kernel)
        #expect(scoped.authority.info(id: issued.id)?.openUses == 1)
        #expect(created.attributes.inode != (try await scoped.plain("d/new.txt")), "the access path's own node")
        try await scoped.write(created.inode, opened.handle, "made through a token\n")
        try await scoped.fs.flush(created.inode, handle: opened.handle, context: .kernel)
        await scoped.fs.release(created.inode, handle: opened.handle)
        #expect(scoped.authority.info(id: issued.id)?.openUses == 0, "the release ended the use")
        #expect(try await scoped.read(try await scoped.plain("d/new.txt")) == Array("made through a token\n".utf8))
        #expect(await waitForProvider(scoped.provider, "d/new.txt", "made through a token\n"))

        // O_TRUNC of an existing file, O_RDWR reads what the handle wrote, fsync publishes.
        let x = try await scoped.fs.resolveScoped(issued.token, "x")
        let rw = try await scoped.fs.open(x.inode, flags: OpenFlags(rawValue: O_RDWR | O_TRUNC), context: .kernel)
        #expect(rw.directIO)
        try await scoped.write(x.inode, rw.handle, "rewritten")
        let staged = try await scoped.fs.read(x.inode, handle: rw.handle, offset: 0, count: 100, context: .kernel)
        #expect(staged.bytes == Array("rewritten".utf8))
        #expect(try await scoped.read(try await scoped.plain("d/x")) == Array("original x\n".utf8), "not published")
        try await scoped.fs.fsync(x.inode, handle: rw.handle, dataOnly: false, context: .kernel)
        #expect(try await scoped.read(try await scoped.plain("d/x")) == Array("rewritten".utf8))
        // ftruncate through the handle, then truncate(2) of the path with no handle.
        _ = try await scoped.fs.setAttributes(
            x.inode, changes: AttributeChanges(size: 3), handle: rw.handle, context: .kernel)
        await scoped.fs.release(x.inode, handle: rw.handle)
        #expect(try await scoped.read(x.inode) == Array("rew".utf8))
        let truncated = try await scoped.fs.setAttributes(
            x.inode, changes: AttributeChanges(size: 1), handle: nil, context: .kernel)
        #expect(truncated.size == 1)
        #expect(try await scoped.read(try await scoped.plain("d/x")) == Array("r".utf8))
        #expect(await waitForProvider(scoped.provider, "d/x", "r"))
        await scoped.fs.shutdown()
    }

    @Test("a read token's path refuses every write with EACCES and takes no use; the mount's plain path still writes")
    func readTokenRefusesWrites() async throws {
        let scoped = try ScopedWriteFixture()
        let issued = try scoped.authority.grant("d", .read, ttl: .seconds(60), uses: 5)
        let directory = try await scoped.fs.resolveScoped(issued.token)
        let x = try await scoped.fs.resolveScoped(issued.token, "x")
        for flags in [O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC, O_WRONLY | O_APPEND] {
            let message = await expectFailure(.accessDenied, "open with flags \(flags)") {
                _ = try await scoped.fs.open(x.inode, flags: OpenFlags(rawValue: flags), context: .kernel)
            }
            #expect(message.contains("read token"), "\(message)")
        }
        await expectFailure(.accessDenied, "create") {
            _ = try await scoped.fs.create(
                parent: directory.inode, name: "no.txt", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY),
                context: .kernel)
        }
        await expectFailure(.accessDenied, "truncate") {
            _ = try await scoped.fs.setAttributes(
                x.inode, changes: AttributeChanges(size: 0), handle: nil, context: .kernel)
        }
        #expect(scoped.authority.info(id: issued.id)?.usesLeft == 5, "refused opens took no use")
        #expect(scoped.provider.content(of: "d/no.txt") == nil)
        #expect(try await scoped.read(x.inode) == Array("original x\n".utf8))
        // A read handle of a read token still reads; the plain path writes.
        let plain = try await scoped.plain("d/x")
        let writer = try await scoped.fs.open(plain, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        try await scoped.write(plain, writer.handle, "plain")
        await scoped.fs.release(plain, handle: writer.handle)
        #expect(try await scoped.read(x.inode) == Array("plain".utf8))
        await scoped.fs.shutdown()
    }

    @Test(
        "a token that expires with a handle open: the next write, truncate, flush and fsync are EACCES, nothing is published, a plain writer loses nothing"
    )
    func expiryMidWritePublishesNothing() async throws {
        let scoped = try ScopedWriteFixture()
        let issued = try scoped.authority.grant("d", .readWrite, ttl: .seconds(10))
        let x = try await scoped.fs.resolveScoped(issued.token, "x")
        let directory = try await scoped.fs.resolveScoped(issued.token)
        // A cp into the access path: the new file is made (empty, D-361), the first chunk written.
        let (created, copy) = try await scoped.fs.create(
            parent: directory.inode, name: "copy.bin", permissions: 0o644,
            flags: OpenFlags(rawValue: O_WRONLY | O_CREAT), context: .kernel)
        try await scoped.write(created.inode, copy.handle, "first chunk of the copy ")
        // An editor rewriting x through the token, and a plain writer of top.txt and of x.
        let edit = try await scoped.fs.open(x.inode, flags: OpenFlags(rawValue: O_RDWR | O_TRUNC), context: .kernel)
        try await scoped.write(x.inode, edit.handle, "half an edit")
        let plainX = try await scoped.plain("d/x")
        let plainWriter = try await scoped.fs.open(plainX, flags: OpenFlags(rawValue: O_RDWR), context: .kernel)
        try await scoped.write(plainX, plainWriter.handle, "PLAIN")

        scoped.tokenClock.advance(by: .seconds(11))
        await expectFailure(.accessDenied, "write after the expiry") {
            try await scoped.write(created.inode, copy.handle, "second chunk", at: 24)
        }
        await expectFailure(.accessDenied, "ftruncate after the expiry") {
            _ = try await scoped.fs.setAttributes(
                x.inode, changes: AttributeChanges(size: 0), handle: edit.handle, context: .kernel)
        }
        await expectFailure(.accessDenied, "fsync after the expiry") {
            try await scoped.fs.fsync(x.inode, handle: edit.handle, dataOnly: false, context: .kernel)
        }
        await expectFailure(.accessDenied, "read through the write handle after the expiry") {
            _ = try await scoped.fs.read(x.inode, handle: edit.handle, offset: 0, count: 10, context: .kernel)
        }
        await expectFailure(.accessDenied, "close (flush) after the expiry") {
            try await scoped.fs.flush(created.inode, handle: copy.handle, context: .kernel)
        }
        await scoped.fs.release(created.inode, handle: copy.handle)
        await scoped.fs.release(x.inode, handle: edit.handle)
        #expect(scoped.authority.info(id: issued.id)?.state == .expired)

        // Nothing either handle wrote was published: the copy stays the empty file its create
        // made, x keeps its version.
        let copyPlain = try await scoped.plain("d/copy.bin")
        #expect(try await scoped.read(copyPlain).isEmpty)
        #expect(try await scoped.fs.getAttributes(copyPlain, context: .kernel).size == 0)
        #expect(scoped.provider.content(of: "d/copy.bin")?.0 == .bytes([]))
        #expect(scoped.fs.cache.writes.pendingUploads.isEmpty, "no upload of anything the token wrote")
        // The plain writer's staging copy of x was its own: its close publishes its bytes over
        // the old version, untouched by the token's half edit.
        await scoped.fs.release(plainX, handle: plainWriter.handle)
        #expect(try await scoped.read(plainX) == Array("PLAINnal x\n".utf8))
        #expect(await waitForProvider(scoped.provider, "d/x", "PLAINnal x\n"))
        await scoped.fs.shutdown()
    }

    @Test("a revoke ends every handle of the token: both its writers are refused, and neither close publishes")
    func revokeEndsEveryHandle() async throws {
        let scoped = try ScopedWriteFixture()
        let issued = try scoped.authority.grant("d/x", .readWrite, ttl: .seconds(60))
        let x = try await scoped.fs.resolveScoped(issued.token, "x")
        let first = try await scoped.fs.open(x.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        let second = try await scoped.fs.open(x.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        try await scoped.write(x.inode, first.handle, "AAAA")
        try await scoped.write(x.inode, second.handle, "BB", at: 4)
        // One staging copy for the token's handles: each sees the other's bytes.
        let shared = scoped.fs.cache.writes.staging(of: ItemIdentifier("d/x"), owner: issued.id)
        #expect(shared?.size == 11)
        try scoped.authority.revoke(id: issued.id)
        await expectFailure(.accessDenied, "first writer after the revoke") {
            try await scoped.write(x.inode, first.handle, "C")
        }
        await expectFailure(.accessDenied, "second writer after the revoke") {
            try await scoped.write(x.inode, second.handle, "D")
        }
        #expect(scoped.fs.cache.writes.staging(of: ItemIdentifier("d/x"), owner: issued.id) == nil, "dropped")
        await scoped.fs.release(x.inode, handle: first.handle)
        await scoped.fs.release(x.inode, handle: second.handle)
        #expect(try await scoped.read(try await scoped.plain("d/x")) == Array("original x\n".utf8))
        await scoped.fs.shutdown()
    }
}

private func waitForProvider(_ provider: InMemoryProvider, _ path: String, _ expected: String) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < deadline {
        if provider.content(of: path)?.0 == .bytes(Array(expected.utf8)) { return true }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return false
}
