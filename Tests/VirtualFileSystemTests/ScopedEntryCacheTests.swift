// The kernel's caching of access paths (D-345, D-346): entries and attributes of a token bound to
// no process are kept until its deadline (capped by the mount's timeouts) once the kernel can be
// told to forget them; every early end of a token makes the file system invalidate
// `.scoped/<token>` and the attributes of the token's nodes, before the ending call returns.

import AccessTokens
import ProviderFSCommands
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A real `TokenAuthority` on a manual clock with fake process start times, behind the daemon's
/// adapter (a caller's thread is its process), a file system over the fixture's provider and a
/// recording kernel notifier.
private struct EntryCacheFixture {
    let fixture: VFSFixture
    let tokenClock = ManualClock()
    /// pid → start time; a pid missing here has ended.
    let processes = Locked<[Int32: UInt64]>([4242: 77, 4343: 88])
    let authority: TokenAuthority
    let fileSystem: ProviderFileSystem
    let sent = Locked<[KernelInvalidation]>([])

    init(told: Bool = true) throws {
        var options = VFSFixture.defaultOptions()
        options.entryTimeout = .seconds(1)
        options.attributeTimeout = .milliseconds(700)
        fixture = try VFSFixture(options: options)
        let processes = self.processes
        authority = TokenAuthority(
            storeDirectory: nil, clock: tokenClock, processStartTime: { pid in processes.withLock { $0[pid] } })
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/x", .bytes(Array("x\n".utf8)))
        fixture.provider.addDirectory("d/sub")
        fixture.provider.putFile("d/sub/y", .bytes(Array("why\n".utf8)))
        fileSystem = try fixture.makeFileSystem(
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let sent = self.sent
        if told { fileSystem.setKernelInvalidation { invalidations in sent.withLock { $0 += invalidations } } }
    }

    var scopedDirectory: InodeNumber {
        get async throws { try await fileSystem.lookup(parent: .root, name: ".scoped", context: .kernel).inode }
    }

    func takeSent() -> [KernelInvalidation] {
        sent.withLock { sent in
            defer { sent = [] }
            return sent
        }
    }

    /// What `scopedTokenEnded` must send for `token` whose nodes the kernel was handed as `entries`.
    func expectEndInvalidations(
        _ token: String, _ entries: [Entry], sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let sent = takeSent()
        let directory = try await scopedDirectory
        let entryInvalidations = sent.filter { if case .entry = $0 { true } else { false } }
        #expect(entryInvalidations == [.entry(parent: directory, name: token)], sourceLocation: sourceLocation)
        let attributes = Set(sent.compactMap { if case .attributes(let inode) = $0 { inode } else { nil } })
        #expect(attributes == Set(entries.map(\.inode)), sourceLocation: sourceLocation)
        #expect(sent.first == .entry(parent: directory, name: token), "the entry first", sourceLocation: sourceLocation)
    }
}

@Suite("Access paths in the kernel's caches (D-345, D-346)", .timeLimit(.minutes(3)))
struct ScopedEntryCacheTests {
    @Test("the entry and attribute timeouts are the token's time left, capped by the mount's; the fast path's too")
    func timeoutIsTimeLeft() async throws {
        let cached = try EntryCacheFixture()
        let ttl = try cached.authority.grant("d", ttl: .seconds(60))
        for entry in try await cached.fileSystem.walkScoped(ttl.token, "sub/y") {
            #expect(entry.entryTimeout == .seconds(1) && entry.attributeTimeout == .milliseconds(700))
        }
        cached.tokenClock.advance(by: .milliseconds(59_600))
        let late = try await cached.fileSystem.walkScoped(ttl.token, "sub")
        for entry in late {
            #expect(entry.entryTimeout == .milliseconds(400) && entry.attributeTimeout == .milliseconds(400))
        }
        guard case .success(let fast)? = cached.fileSystem.lookupNow(parent: late[1].inode, name: "y", context: .kernel)
        else {
            Issue.record("lookupNow did not answer from memory")
            return
        }
        #expect(fast.entryTimeout == .milliseconds(400) && fast.attributeTimeout == .milliseconds(400))
        let attributes = try await cached.fileSystem.getAttributes(fast.inode, context: .kernel)
        #expect(attributes.validFor == .milliseconds(400))
        cached.tokenClock.advance(by: .milliseconds(400))
        await #expect(throws: FileSystemError.self) { _ = try await cached.fileSystem.walkScoped(ttl.token) }

        // No TTL: the mount's timeouts.
        let forever = try cached.authority.grant("d/x")
        for entry in try await cached.fileSystem.walkScoped(forever.token, "x") {
            #expect(entry.entryTimeout == .seconds(1) && entry.attributeTimeout == .milliseconds(700))
        }
    }

    @Test("without a way to tell the kernel, entries stay at 0 and attributes at 50 ms")
    func nothingCachedWithoutNotifier() async throws {
        let untold = try EntryCacheFixture(told: false)
        let issued = try untold.authority.grant("d")
        for entry in try await untold.fileSystem.walkScoped(issued.token, "sub/y") {
            #expect(entry.entryTimeout == .zero && entry.attributeTimeout == .milliseconds(50))
        }
    }

    @Test("tokens bound to a process, derived ones too, keep entry timeout 0 and 50 ms attributes")
    func boundTokensAreNotCached() async throws {
        let cached = try EntryCacheFixture()
        let process = RequestContext(threadID: 4242, uid: getuid(), gid: getgid())
        let bound = try cached.authority.grant("d", ttl: .seconds(60), pid: 4242)
        for entry in try await cached.fileSystem.walkScoped(bound.token, "sub/y", context: process) {
            #expect(entry.entryTimeout == .zero && entry.attributeTimeout == .milliseconds(50))
        }
        let parent = try cached.authority.grant("d")
        let derived = try cached.authority.derive(from: parent.token, by: TokenCaller(pid: 4242, uid: getuid()))
        for entry in try await cached.fileSystem.walkScoped(derived.token, "x", context: process) {
            #expect(entry.entryTimeout == .zero && entry.attributeTimeout == .milliseconds(50))
        }
        #expect(
            MountScopedAccess.caching(
                of: TokenGrant(id: "a", scope: TokenScope(identifier: "d", path: "d"), mode: .read))
                == .unbounded)
    }

    @Test("revoke and expire by command invalidate .scoped/<token> and its nodes' attributes before they return")
    func revokeAndExpireInvalidate() async throws {
        let cached = try EntryCacheFixture()
        let revoked = try cached.authority.grant("d")
        let expired = try cached.authority.grant("d", ttl: .seconds(60))
        let untouched = try cached.authority.grant("d")
        let revokedEntries = try await cached.fileSystem.walkScoped(revoked.token, "sub/y")
        let expiredEntries = try await cached.fileSystem.walkScoped(expired.token, "x")
        _ = try await cached.fileSystem.walkScoped(untouched.token, "x")
        #expect(cached.takeSent().isEmpty)

        try cached.authority.revoke(id: revoked.id)
        try await cached.expectEndInvalidations(revoked.token, revokedEntries)
        try cached.authority.expire(id: expired.id)
        try await cached.expectEndInvalidations(expired.token, expiredEntries)
        // A token the kernel holds nothing of: nothing to send.
        let unused = try cached.authority.grant("d")
        try cached.authority.revoke(id: unused.id)
        #expect(cached.takeSent().isEmpty)
        // The kernel's next walk asks again, and is refused.
        await #expect(throws: FileSystemError.self) { _ = try await cached.fileSystem.walkScoped(revoked.token) }
        #expect(try await cached.fileSystem.walkScoped(untouched.token, "x").count == 2)
    }

    @Test("the last use's end invalidates the used-up token's paths")
    func lastUseInvalidates() async throws {
        let cached = try EntryCacheFixture()
        let once = try cached.authority.grant("d", uses: 1)
        let entries = try await cached.fileSystem.walkScoped(once.token, "x")
        let opened = try await cached.fileSystem.open(entries[1].inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        #expect(cached.takeSent().isEmpty, "the use is held, not ended")
        await cached.fileSystem.release(entries[1].inode, handle: opened.handle)
        try await cached.expectEndInvalidations(once.token, entries)
    }

    @Test("a derived token released, ended with its parent or whose process ended invalidates its paths")
    func derivedEndsInvalidate() async throws {
        let cached = try EntryCacheFixture()
        let parent = try cached.authority.grant("d")
        let caller = TokenCaller(pid: 4242, uid: getuid())
        let process = RequestContext(threadID: 4242, uid: getuid(), gid: getgid())

        let released = try cached.authority.derive(from: parent.token, by: caller)
        let releasedEntries = try await cached.fileSystem.walkScoped(released.token, "x", context: process)
        try cached.authority.release(released.token, by: caller)
        try await cached.expectEndInvalidations(released.token, releasedEntries)

        // Ended with its parent: both are invalidated.
        let child = try cached.authority.derive(from: parent.token, by: caller)
        let childEntries = try await cached.fileSystem.walkScoped(child.token, "sub", context: process)
        let parentEntries = try await cached.fileSystem.walkScoped(parent.token, "x")
        try cached.authority.revoke(id: parent.id)
        let sent = cached.takeSent()
        let directory = try await cached.scopedDirectory
        #expect(
            Set(sent.filter { if case .entry = $0 { true } else { false } })
                == [.entry(parent: directory, name: parent.token), .entry(parent: directory, name: child.token)])
        #expect(
            Set(sent.compactMap { if case .attributes(let inode) = $0 { inode } else { nil } })
                == Set((childEntries + parentEntries).map(\.inode)))

        // The process of a derived token ended: the next derive ends it.
        let other = try cached.authority.grant("d")
        let orphan = try cached.authority.derive(from: other.token, by: caller)
        let orphanEntries = try await cached.fileSystem.walkScoped(orphan.token, "x", context: process)
        cached.processes.withLock { $0[4242] = nil }
        _ = try cached.authority.derive(from: other.token, by: TokenCaller(pid: 4343, uid: getuid()))
        try await cached.expectEndInvalidations(orphan.token, orphanEntries)
    }

    @Test("a forgotten token's nodes are not invalidated; the index follows the kernel's forgets")
    func forgottenNodes() async throws {
        let cached = try EntryCacheFixture()
        let issued = try cached.authority.grant("d")
        let entries = try await cached.fileSystem.walkScoped(issued.token, "x")
        for entry in entries { cached.fileSystem.forget(entry.inode, count: 1) }
        try cached.authority.revoke(id: issued.id)
        #expect(cached.takeSent().isEmpty)
    }
}
