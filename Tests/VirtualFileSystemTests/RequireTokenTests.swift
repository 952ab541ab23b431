// Require-token mode (docs/SEMANTICS.md, "Require-token mode"): with a `PlainPathPolicy`, every
// operation on a plain node asks it for the caller, the root's attributes, statfs and `.scoped`
// stay open, access paths keep working for anyone, and nothing the kernel could cache lets a
// refused caller in. A fake policy plays the callers; `MountPlainPaths` is tested over fake /proc
// facts.

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

/// The owner's providerfs command is thread 42 of uid 1000; everyone else is refused.
private struct FakePolicy: PlainPathPolicy {
    let asked = Locked(0)
    func decide(_ context: RequestContext) -> PlainPathDecision {
        asked.withLock { $0 += 1 }
        if context.uid == 1000 && context.threadID == 42 { return .allowed }
        return .refused(reason: "thread \(context.threadID) of uid \(context.uid) is a stranger")
    }
}

private let owner = RequestContext(threadID: 42, uid: 1000, gid: 1000)
/// Same user, another program (cat).
private let stranger = RequestContext(threadID: 77, uid: 1000, gid: 1000)

private struct SandboxFixture {
    let fixture: VFSFixture
    let policy = FakePolicy()
    let authority: TokenAuthority
    let fileSystem: ProviderFileSystem

    init(policy enabled: Bool = true) throws {
        var options = VFSFixture.defaultOptions()
        if enabled { options.plainPaths = policy }
        fixture = try VFSFixture(options: options)
        authority = TokenAuthority(storeDirectory: nil, clock: ManualClock())
        fixture.provider.addDirectory("d")
        fixture.provider.putFile("d/x", .bytes(Array("ex\n".utf8)))
        fixture.provider.addDirectory("d/sub")
        fixture.provider.putFile("d/sub/y", .bytes(Array("why\n".utf8)))
        fixture.provider.putFile("top.txt", .bytes(Array("top\n".utf8)))
        fileSystem = try fixture.makeFileSystem(
            scopedAccess: MountScopedAccess(authority: authority, processOfThread: { $0 }))
    }

    func walk(_ path: String, as context: RequestContext, from start: InodeNumber = .root) async throws -> Entry {
        var inode = start
        var entry: Entry?
        for component in path.split(separator: "/") {
            entry = try await fileSystem.lookup(parent: inode, name: String(component), context: context)
            inode = entry!.inode
        }
        return try #require(entry)
    }

    func read(_ inode: InodeNumber, as context: RequestContext) async throws -> [UInt8] {
        let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: 0), context: context)
        let data = try await fileSystem.read(inode, handle: opened.handle, offset: 0, count: 4096, context: context)
        await fileSystem.release(inode, handle: opened.handle)
        return data.bytes
    }
}

/// `body` fails with EACCES whose message says require-token mode.
private func expectRefused(
    _ what: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void
) async {
    do {
        try await body()
        Issue.record("\(what) was not refused", sourceLocation: sourceLocation)
    } catch let error as FileSystemError {
        #expect(error.errno == .permissionDenied, "\(what): \(error)", sourceLocation: sourceLocation)
        #expect(error.message.contains("require-token mode"), "\(what): \(error)", sourceLocation: sourceLocation)
        #expect(error.message.contains("stranger"), "the policy's reason: \(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("\(what): \(error)", sourceLocation: sourceLocation)
    }
}

private func expectFastRefusal<T>(
    _ what: String, _ result: Result<T, FileSystemError>?, sourceLocation: SourceLocation = #_sourceLocation
) {
    guard case .failure(let error)? = result else {
        Issue.record(
            "\(what) on the fast path was not refused: \(String(describing: result))", sourceLocation: sourceLocation)
        return
    }
    #expect(error.errno == .permissionDenied, "\(what): \(error)", sourceLocation: sourceLocation)
}

@Suite("Require-token mode (plain paths only for the owner's providerfs commands)", .timeLimit(.minutes(3)))
struct RequireTokenTests {
    @Test("a stranger is refused every operation on plain nodes, also nodes and handles the owner's command made")
    func strangerRefusedEverywhere() async throws {
        let sandbox = try SandboxFixture()
        let fs = sandbox.fileSystem
        // The owner's command looked these up and opened them: the kernel may hold them.
        let directory = try await sandbox.walk("d", as: owner)
        let file = try await sandbox.walk("d/x", as: owner)
        let top = try await sandbox.walk("top.txt", as: owner)
        let fileHandle = try await fs.open(file.inode, flags: OpenFlags(rawValue: 0), context: owner)
        let directoryHandle = try await fs.openDirectory(directory.inode, context: owner)
        let rootHandle = try await fs.openDirectory(.root, context: owner)

        await expectRefused("lookup in the root") {
            _ = try await fs.lookup(parent: .root, name: "top.txt", context: stranger)
        }
        await expectRefused("lookup of a missing name") {
            _ = try await fs.lookup(parent: .root, name: "nope", context: stranger)
        }
        await expectRefused("lookup in d") {
            _ = try await fs.lookup(parent: directory.inode, name: "x", context: stranger)
        }
        await expectRefused("getattr d") { _ = try await fs.getAttributes(directory.inode, context: stranger) }
        await expectRefused("getattr d/x") { _ = try await fs.getAttributes(file.inode, context: stranger) }
        await expectRefused("readlink") { _ = try await fs.readLink(top.inode, context: stranger) }
        await expectRefused("opendir /") { _ = try await fs.openDirectory(.root, context: stranger) }
        await expectRefused("opendir d") { _ = try await fs.openDirectory(directory.inode, context: stranger) }
        await expectRefused("readdir / on the owner's handle") {
            _ = try await fs.readDirectory(.root, handle: rootHandle, after: 0, limit: 100, context: stranger)
        }
        await expectRefused("readdir d on the owner's handle") {
            _ = try await fs.readDirectory(
                directory.inode, handle: directoryHandle, after: 0, limit: 100, context: stranger)
        }
        await expectRefused("open") {
            _ = try await fs.open(file.inode, flags: OpenFlags(rawValue: 0), context: stranger)
        }
        await expectRefused("read on the owner's handle") {
            _ = try await fs.read(file.inode, handle: fileHandle.handle, offset: 0, count: 10, context: stranger)
        }
        for inode in [InodeNumber.root, file.inode] {
            await expectRefused("getxattr \(inode)") {
                _ = try await fs.getExtendedAttribute(
                    inode, name: ProviderFileSystem.AttributeName.state, context: stranger)
            }
            await expectRefused("listxattr \(inode)") {
                _ = try await fs.listExtendedAttributes(inode, context: stranger)
            }
            await expectRefused("setxattr \(inode)") {
                try await fs.setExtendedAttribute(inode, name: "user.x", value: [1], flags: 0, context: stranger)
            }
            await expectRefused("removexattr \(inode)") {
                try await fs.removeExtendedAttribute(inode, name: "user.x", context: stranger)
            }
            await expectRefused("setattr \(inode)") {
                _ = try await fs.setAttributes(
                    inode, changes: AttributeChanges(size: 0), handle: nil, context: stranger)
            }
        }
        // EACCES before EROFS: a stranger learns nothing from the mutations either.
        await expectRefused("create") {
            _ = try await fs.create(
                parent: .root, name: "n", permissions: 0o644, flags: OpenFlags(rawValue: 0o1), context: stranger)
        }
        await expectRefused("mkdir") {
            _ = try await fs.makeDirectory(parent: directory.inode, name: "n", permissions: 0o755, context: stranger)
        }
        await expectRefused("symlink") {
            _ = try await fs.makeSymbolicLink(parent: .root, name: "n", target: "x", context: stranger)
        }
        await expectRefused("unlink") { try await fs.unlink(parent: .root, name: "top.txt", context: stranger) }
        await expectRefused("rmdir") { try await fs.removeDirectory(parent: .root, name: "d", context: stranger) }
        await expectRefused("rename") {
            try await fs.rename(
                parent: .root, name: "top.txt", newParent: directory.inode, newName: "t", flags: 0, context: stranger)
        }
        // The answers without waiting decide by the caller too.
        expectFastRefusal("lookupNow", fs.lookupNow(parent: .root, name: "top.txt", context: stranger))
        expectFastRefusal("lookupNow in d", fs.lookupNow(parent: directory.inode, name: "x", context: stranger))
        expectFastRefusal("getAttributesNow", fs.getAttributesNow(file.inode, context: stranger))
        expectFastRefusal(
            "readNow on the owner's handle",
            fs.readNow(file.inode, handle: fileHandle.handle, offset: 0, count: 10, context: stranger))
        #expect(fs.openNow(file.inode, flags: OpenFlags(rawValue: 0), context: stranger) == nil, "left to open")

        // The owner's command still works on the same nodes and handles.
        #expect(
            try await fs.read(file.inode, handle: fileHandle.handle, offset: 0, count: 10, context: owner).bytes
                == Array("ex\n".utf8))
        #expect(
            try await fs.readDirectory(.root, handle: rootHandle, after: 0, limit: 100, context: owner).map(\.name) == [
                ".", "..", "d", "top.txt",
            ])
        await fs.release(file.inode, handle: fileHandle.handle)
        fs.releaseDirectory(directory.inode, handle: directoryHandle)
        fs.releaseDirectory(.root, handle: rootHandle)
    }

    @Test("the root stays stat-able and statfs answers anyone (no item count for a stranger); .scoped is found")
    func rootStaysUsable() async throws {
        let sandbox = try SandboxFixture()
        let fs = sandbox.fileSystem
        let root = try await fs.getAttributes(.root, context: stranger)
        // Everyone's: cached by the kernel as usual (nil: the mount's attribute timeout).
        #expect(root.type == .directory && root.validFor == nil)
        if case .success(let attributes)? = fs.getAttributesNow(.root, context: stranger) {
            #expect(attributes.type == .directory)
        }
        _ = try await sandbox.walk("top.txt", as: owner)  // the catalog knows items now
        let strangers = try await fs.statistics(context: stranger)
        let owners = try await fs.statistics(context: owner)
        #expect(strangers.totalFiles == 0 && owners.totalFiles > 0)
        #expect(strangers.blockSize == owners.blockSize && strangers.totalBlocks == owners.totalBlocks)
        let scoped = try await fs.lookup(parent: .root, name: ".scoped", context: stranger)
        #expect(scoped.attributes.type == .directory)
    }

    @Test("the owner's command: every plain operation works, and nothing is cacheable by the kernel")
    func ownerAllowedNothingCached() async throws {
        let sandbox = try SandboxFixture()
        let fs = sandbox.fileSystem
        let directory = try await sandbox.walk("d", as: owner)
        let file = try await sandbox.walk("d/x", as: owner)
        #expect(directory.entryTimeout == .zero && directory.attributeTimeout == .zero)
        #expect(file.entryTimeout == .zero && file.attributeTimeout == .zero)
        #expect(try await fs.getAttributes(file.inode, context: owner).validFor == .zero)
        if case .success(let entry)? = fs.lookupNow(parent: directory.inode, name: "x", context: owner) {
            #expect(entry.entryTimeout == .zero && entry.attributeTimeout == .zero)
        }
        if case .success(let attributes)? = fs.getAttributesNow(file.inode, context: owner) {
            #expect(attributes.validFor == .zero)
        }
        let opened = try await fs.open(file.inode, flags: OpenFlags(rawValue: 0), context: owner)
        // Direct I/O, no keep_cache, never passed through: every read reaches the policy.
        #expect(opened.directIO && !opened.keepCache && opened.servedFrom == nil)
        #expect(
            try await fs.read(file.inode, handle: opened.handle, offset: 0, count: 10, context: owner).bytes
                == Array("ex\n".utf8))
        await fs.release(file.inode, handle: opened.handle)
        let again = try await fs.open(file.inode, flags: OpenFlags(rawValue: 0), context: owner)
        #expect(!again.keepCache, "the page cache of an earlier open is not kept")
        await fs.release(file.inode, handle: again.handle)
        #expect(try await xattr(fs, file.inode, ProviderFileSystem.AttributeName.state, as: owner) == "materialized")
        #expect(
            try await fs.listExtendedAttributes(file.inode, context: owner).contains(
                ProviderFileSystem.AttributeName.state))
        let handle = try await fs.openDirectory(directory.inode, context: owner)
        #expect(
            try await fs.readDirectory(directory.inode, handle: handle, after: 0, limit: 100, context: owner).count == 4
        )
        fs.releaseDirectory(directory.inode, handle: handle)
        // Mutations reach the read-only answer.
        do {
            try await fs.unlink(parent: directory.inode, name: "x", context: owner)
            Issue.record("unlink succeeded")
        } catch {
            #expect(error.errno == .readOnlyFileSystem)
        }
    }

    @Test("access paths work for anyone; `..` out of them reaches only the root, where nothing but stat is open")
    func accessPathsAndDotDot() async throws {
        let sandbox = try SandboxFixture()
        let fs = sandbox.fileSystem
        let issued = try sandbox.authority.grant("d", ttl: .seconds(60))
        let scoped = try await fs.lookup(parent: .root, name: ".scoped", context: stranger)
        let granted = try await fs.lookup(parent: scoped.inode, name: issued.token, context: stranger)
        let file = try await sandbox.walk("sub/y", as: stranger, from: granted.inode)
        #expect(try await sandbox.read(file.inode, as: stranger) == Array("why\n".utf8))
        #expect(try await fs.getAttributes(file.inode, context: stranger).size == 4)
        #expect(try await xattr(fs, file.inode, ProviderFileSystem.AttributeName.state, as: stranger) != "")

        // The kernel resolves `..` by the dentries it holds: a listing's `..` of the granted
        // directory is `.scoped`, and that of an inner directory an access-path node, never a
        // plain one. `.scoped`'s own `..` is the root, where every name is refused.
        let handle = try await fs.openDirectory(granted.inode, context: stranger)
        let entries = try await fs.readDirectory(granted.inode, handle: handle, after: 0, limit: 100, context: stranger)
        fs.releaseDirectory(granted.inode, handle: handle)
        #expect(entries.first(where: { $0.name == ".." })?.inode == scoped.inode)
        let sub = try await sandbox.walk("sub", as: stranger, from: granted.inode)
        let subHandle = try await fs.openDirectory(sub.inode, context: stranger)
        let subEntries = try await fs.readDirectory(
            sub.inode, handle: subHandle, after: 0, limit: 100, context: stranger)
        fs.releaseDirectory(sub.inode, handle: subHandle)
        let parent = try #require(subEntries.first(where: { $0.name == ".." })?.inode)
        #expect(parent == granted.inode)
        await expectRefused("lookup of d from the root reached by `..`") {
            _ = try await fs.lookup(parent: .root, name: "d", context: stranger)
        }
        await expectRefused("listing the root reached by `..`") {
            _ = try await fs.openDirectory(.root, context: stranger)
        }
        // The same item's plain node stays refused even while its access path is open.
        let plain = try await sandbox.walk("d/sub/y", as: owner)
        await expectRefused("the plain node of a granted item") {
            _ = try await fs.open(plain.inode, flags: OpenFlags(rawValue: 0), context: stranger)
        }
    }

    @Test("without a policy nothing changes: plain paths open to all, the usual timeouts and page cache")
    func withoutPolicy() async throws {
        let sandbox = try SandboxFixture(policy: false)
        let file = try await sandbox.walk("d/x", as: stranger)
        #expect(file.entryTimeout == .seconds(1))
        #expect(try await sandbox.read(file.inode, as: stranger) == Array("ex\n".utf8))
        let opened = try await sandbox.fileSystem.open(file.inode, flags: OpenFlags(rawValue: 0), context: stranger)
        #expect(!opened.directIO)
        await sandbox.fileSystem.release(file.inode, handle: opened.handle)
        #expect(sandbox.policy.asked.withLock { $0 } == 0)
    }
}

private func xattr(
    _ fileSystem: ProviderFileSystem, _ inode: InodeNumber, _ name: String, as context: RequestContext
) async throws -> String {
    String(decoding: try await fileSystem.getExtendedAttribute(inode, name: name, context: context), as: UTF8.self)
}

/// Fake /proc: processes by pid with a name and an executable; threads map to their process;
/// every look at an executable is counted.
private final class FakeProcesses: Sendable {
    struct Process: Sendable {
        var name: String
        var executable: FileIdentity?
    }
    let processes = Locked<[Int32: Process]>([:])
    let threads = Locked<[Int32: Int32]>([:])
    let executableLooks = Locked(0)

    func process(ofThread tid: Int32) -> Int32? {
        threads.withLock { $0[tid] } ?? (processes.withLock { $0[tid] } != nil ? tid : nil)
    }

    var facts: MountPlainPaths.ProcessFacts {
        MountPlainPaths.ProcessFacts(
            executableOfThread: { [self] tid in
                executableLooks.withLock { $0 += 1 }
                guard let pid = process(ofThread: tid) else { return nil }
                return processes.withLock { $0[pid]?.executable }
            },
            describeThread: { [self] tid in
                guard let pid = process(ofThread: tid), let name = processes.withLock({ $0[pid]?.name }) else {
                    return nil
                }
                return (pid, name)
            })
    }
}

@Suite("MountPlainPaths: the owner's providerfs commands, by uid and executable file")
struct MountPlainPathsTests {
    static let providerfs = FileIdentity(device: 8, inode: 1234)
    static let cat = FileIdentity(device: 8, inode: 99)

    @Test(
        "owner uid and the daemon's executable: allowed; another uid, another file under the same name, a gone or invisible process: refused with the reason"
    )
    func decisions() {
        let fake = FakeProcesses()
        fake.processes.withLock {
            $0[100] = .init(name: "providerfs", executable: Self.providerfs)
            $0[200] = .init(name: "providerfs", executable: Self.cat)  // a copy of cat named providerfs
            $0[300] = .init(name: "cat", executable: Self.cat)
        }
        fake.threads.withLock { $0[101] = 100 }  // a worker thread of the command
        let policy = MountPlainPaths(ownerUID: 1000, executable: Self.providerfs, facts: fake.facts)
        #expect(policy.decide(RequestContext(threadID: 100, uid: 1000, gid: 1000)) == .allowed)
        #expect(policy.decide(RequestContext(threadID: 101, uid: 1000, gid: 1000)) == .allowed)
        guard case .refused(let otherUser) = policy.decide(RequestContext(threadID: 100, uid: 1001, gid: 1001)) else {
            Issue.record("another uid was allowed")
            return
        }
        #expect(otherUser.contains("uid 1001") && otherUser.contains("owner"))
        guard case .refused(let impostor) = policy.decide(RequestContext(threadID: 200, uid: 1000, gid: 1000)) else {
            Issue.record("a file named providerfs that is not the daemon's was allowed")
            return
        }
        #expect(impostor.contains("providerfs (pid 200)"))
        guard case .refused(let cat) = policy.decide(RequestContext(threadID: 300, uid: 1000, gid: 1000)) else {
            Issue.record("cat was allowed")
            return
        }
        #expect(cat.contains("cat (pid 300)"))
        #expect(policy.decide(RequestContext(threadID: 0, uid: 1000, gid: 1000)) != .allowed, "pid 0: not visible")
        #expect(policy.decide(RequestContext(threadID: 999, uid: 1000, gid: 1000)) != .allowed, "gone")
        let blind = MountPlainPaths(ownerUID: 1000, executable: nil, facts: fake.facts)
        #expect(blind.decide(RequestContext(threadID: 100, uid: 1000, gid: 1000)) != .allowed)
    }

    @Test("decided on every request, from the executable now: a reused pid, an exec either way, nothing inherited")
    func nothingKept() {
        let fake = FakeProcesses()
        fake.processes.withLock { $0[100] = .init(name: "providerfs", executable: Self.providerfs) }
        let policy = MountPlainPaths(ownerUID: 1000, executable: Self.providerfs, facts: fake.facts)
        let context = RequestContext(threadID: 100, uid: 1000, gid: 1000)
        for _ in 0..<10 { #expect(policy.decide(context) == .allowed) }
        #expect(fake.executableLooks.withLock { $0 } == 10, "one look per request")
        // The command ended and its pid went to cat: not inherited.
        fake.processes.withLock { $0[100] = .init(name: "cat", executable: Self.cat) }
        #expect(policy.decide(context) != .allowed)
        // A refused shell that then execs providerfs (same pid): allowed from then on; and back.
        fake.processes.withLock { $0[300] = .init(name: "bash", executable: Self.cat) }
        let shell = RequestContext(threadID: 300, uid: 1000, gid: 1000)
        #expect(policy.decide(shell) != .allowed)
        fake.processes.withLock { $0[300] = .init(name: "providerfs", executable: Self.providerfs) }
        #expect(policy.decide(shell) == .allowed)
        fake.processes.withLock { $0[300] = .init(name: "providerfs", executable: Self.cat) }
        #expect(policy.decide(shell) != .allowed, "a providerfs process that exec'd another file under the same name")
    }

    @Test("the real /proc: this test process, and a thread of it, against its own file and another")
    func realProcess() async throws {
        let own = try #require(FileIdentity.ownExecutable())
        #expect(FileIdentity.executable(of: getpid()) == own)
        let identity = ProcessInfoFiles.identity(of: getpid())
        #expect(identity?.startTime == ProcessInfoFiles.startTime(of: getpid()))
        #expect(identity?.name.isEmpty == false)
        let same = MountPlainPaths(ownerUID: getuid(), executable: own)
        #expect(same.decide(RequestContext(threadID: getpid(), uid: getuid(), gid: getgid())) == .allowed)
        // A thread that is not the main one: its /proc/<tid>/exe is the process's file.
        var link = [UInt8](repeating: 0, count: 64)
        let length = link.withUnsafeMutableBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { readlink("/proc/thread-self", $0.baseAddress!, 63) }
        }  // "<pid>/task/<tid>"
        #expect(length > 0)
        let path = String(decoding: link.prefix(max(0, length)), as: UTF8.self)
        let tid = try #require(Int32(path.split(separator: "/").last.map(String.init) ?? ""))
        #expect(same.decide(RequestContext(threadID: tid, uid: getuid(), gid: getgid())) == .allowed)
        let other = MountPlainPaths(ownerUID: getuid(), executable: FileIdentity(device: 0, inode: 0))
        guard case .refused(let reason) = other.decide(RequestContext(threadID: tid, uid: getuid(), gid: getgid()))
        else {
            Issue.record("another file was allowed")
            return
        }
        #expect(reason.contains("(pid \(getpid()))"), "\(reason)")
    }
}
