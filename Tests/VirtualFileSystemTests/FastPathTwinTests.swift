// Every immediate answer (`*Now`) is the slow path's answer on the same state, checked the way
// the coordinator's `grantIfImmediate` is checked against `submit`: two identical file systems
// (same provider, same clock, same operations) are driven through a seeded random sequence of
// states; whenever the first answers an operation on the FUSE thread, the second answers it the
// async way, and the two answers must be equal. A declined immediate answer (nil) is always
// allowed; the test also demands that each twin answered at least once, so it cannot pass empty.
// The access-path twins (`.scoped/<token>/…`: token lookup, scoped lookup, getattr and open) run
// the same way on two instances that ask one token authority, through tokens that allow reading
// or writing, are revoked, expire or are no tokens, and a token whose scope moves away from the
// nodes made through it (D-512).
//
// Replay: PROVIDERFS_TEST_SEED=<seed> PROVIDERFS_TWIN_SEQUENCES=1 swift test --filter FastPathTwinTests
// Size:   PROVIDERFS_TWIN_SEQUENCES (default 8), PROVIDERFS_TWIN_STEPS (default 150).

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

@Suite("Fast path twins: the immediate answers are the async ones")
struct FastPathTwinTests {
    @Test(
        "lookupNow, getAttributesNow, setAttributesNow, openNow, readNow, writeNow, flushNow, releaseNow agree with their async twins"
    )
    func fileSystemTwinsAgree() async throws {
        let baseSeed = SeededRandom.seedFromEnvironment()
        let sequences = environmentInteger("PROVIDERFS_TWIN_SEQUENCES", default: 8)
        let steps = environmentInteger("PROVIDERFS_TWIN_STEPS", default: 150)
        var answered: [String: Int] = [:]
        for index in 0..<sequences {
            let seed = baseSeed &+ UInt64(index)
            let run = try TwinRun(seed: seed)
            let mismatches = await run.execute(steps: steps)
            await run.finish()
            for mismatch in mismatches.prefix(5) {
                Issue.record(
                    "\(mismatch)\nseed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed) PROVIDERFS_TWIN_SEQUENCES=1)")
            }
            answered.merge(run.answered, uniquingKeysWith: +)
        }
        for twin in [
            "lookup", "lookup miss", "getattr", "setattr", "getxattr", "open", "read", "write", "write ok", "flush",
            "release",
        ] {
            #expect(answered[twin, default: 0] > 0, "the immediate \(twin) never answered: the check is empty")
        }
    }

    @Test("tokenLookupNow, scopedLookupNow, scopedAttributesNow, scopedOpenNow agree with their async twins")
    func accessPathTwinsAgree() async throws {
        let baseSeed = SeededRandom.seedFromEnvironment()
        let sequences = environmentInteger("PROVIDERFS_TWIN_SEQUENCES", default: 8)
        let steps = environmentInteger("PROVIDERFS_TWIN_STEPS", default: 150)
        var answered: [String: Int] = [:]
        for index in 0..<sequences {
            let seed = baseSeed &+ UInt64(index)
            let run = try TwinRun(seed: seed, scoped: true)
            let mismatches = await run.executeScoped(steps: steps)
            await run.finish()
            for mismatch in mismatches.prefix(5) {
                Issue.record(
                    "\(mismatch)\nseed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed) PROVIDERFS_TWIN_SEQUENCES=1)")
            }
            answered.merge(run.answered, uniquingKeysWith: +)
        }
        // Each twin answered, with success too; and a refusal (EACCES) among the answers.
        for twin in ["token lookup", "scoped lookup", "scoped getattr", "scoped open"].flatMap({ [$0, $0 + " ok"] })
            + ["scoped refusal"]
        {
            #expect(answered[twin, default: 0] > 0, "the immediate \(twin) never answered: the check is empty")
        }
    }
}

/// D-460: a chmod and utimens of a file whose create upload runs (git's local clone, `cp -p`)
/// is answered on the FUSE thread, without waiting for that upload, with what the async path
/// answers on an identical mount, and getattr shows it at once; the source gets it once the
/// upload ends. (The random twins above never create files: both would race for one name.)
@Suite("Fast path twins: a setattr held by a running create")
struct HeldCreateTwinTests {
    @Test func aSetattrOfAFileWhoseCreateRunsIsAnsweredAtOnceAsTheAsyncPathAnswersIt() async throws {
        let changes = AttributeChanges(
            permissions: 0o640, accessTime: Timestamp(seconds: 3_000, nanoseconds: 0),
            modificationTime: Timestamp(seconds: 2_000, nanoseconds: 5))
        var answers: [NodeAttributes] = []
        for immediate in [true, false] {
            let fixture = try VFSFixture(options: VFSFixture.writableOptions())
            fixture.provider.defersCreates = true
            fixture.provider.answersImmediately = true
            let fileSystem = try fixture.makeFileSystem()
            let (entry, opened) = try await fileSystem.create(
                parent: .root, name: "object", permissions: 0o444, flags: OpenFlags(rawValue: O_WRONLY | O_CREAT),
                context: .kernel)
            let inode = entry.attributes.inode
            _ = try await fileSystem.write(inode, handle: opened.handle, offset: 0, data: [1, 2, 3], context: .kernel)
            fixture.provider.holdUploads()
            await fileSystem.release(inode, handle: opened.handle)
            #expect(await heldEventually { fixture.provider.heldUploadCount == 1 })
            let answer: NodeAttributes
            if immediate {
                let now = try #require(
                    fileSystem.setAttributesNow(inode, changes: changes, context: .kernel),
                    "declined: it would wait for the create upload")
                answer = try now.get()
                let shown = try #require(fileSystem.getAttributesNow(inode, context: .kernel)).get()
                #expect(shown == answer)
            } else {
                let done = Locked<NodeAttributes?>(nil)
                let task = Task {
                    let made = try await fileSystem.setAttributes(
                        inode, changes: changes, handle: nil, context: .kernel)
                    done.withLock { $0 = made }
                }
                #expect(await heldEventually { done.withLock { $0 } != nil }, "the async path waited for the upload")
                fixture.provider.releaseUploads()
                try await task.value
                answer = try #require(done.withLock { $0 })
            }
            #expect(answer.permissions == 0o640)
            #expect(answer.modificationTime == Timestamp(seconds: 2_000, nanoseconds: 5))
            #expect(fixture.provider.heldUploadCount <= 1, "still held while answered")
            answers.append(answer)
            fixture.provider.releaseUploads()
            #expect(await fileSystem.cache.writes.waitUntilUploaded(ItemIdentifier("object")))
            let atSource = try await fixture.provider.item(for: ItemIdentifier("object"))
            #expect(atSource.permissions == 0o640)
            #expect(atSource.modificationTime == ItemTime(seconds: 2_000, nanoseconds: 5))
            await fileSystem.shutdown()
        }
        #expect(answers.count == 2 && answers[0] == answers[1])
    }
}

/// Polls `condition` (real time, at most 120 s: the write-back runs in tasks of its own, and a
/// suite run in parallel can starve them; under TSan, on a two-thread pool, a run kept this
/// test's upload task from starting for over 30 s). It answers as soon as the condition holds.
private func heldEventually(_ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(120)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return condition()
}

/// Two file systems kept identical; `now` answers immediately, `slow` the async way.
private final class TwinRun: @unchecked Sendable {
    // Confined to the test's task: no concurrent access.
    let provider = InMemoryProvider()
    let clock = ManualClock()
    let directories: [TemporaryDirectory]
    let now: ProviderFileSystem
    let slow: ProviderFileSystem
    var random: SeededRandom
    /// Known nodes (same inode in both), by path.
    var nodes: [String: (inode: InodeNumber, isDirectory: Bool)] = ["": (.root, true)]
    /// Open handles (same number in both).
    var handles: [(inode: InodeNumber, handle: FileHandleID)] = []
    /// Handles open for writing (same number in both), kept open: a release publishes, and both
    /// instances publishing to the one provider would part them.
    var writers: [(inode: InodeNumber, handle: FileHandleID)] = []
    var answered: [String: Int] = [:]
    var mismatches: [String] = []
    var contentSeed: UInt64 = 1
    /// Access paths (`scoped`): one authority both instances ask, on a clock of its own.
    let tokenClock = ManualClock()
    let authority: TokenAuthority
    let port: TwinScopedPort
    /// The names looked up in `.scoped`, by a label that is the same in every replay (a token's
    /// text is random): tokens and names that are none.
    var tokens: [(label: String, name: String, id: String?)] = []
    /// Access-path nodes (same inode in both), by the token's label and the path below it.
    var scopedNodes: [String: (inode: InodeNumber, isDirectory: Bool)] = [:]
    var scopedRoot: InodeNumber?

    static let paths = ["a", "b", "d", "d/e", "d/f", "d/g"]
    /// The file the write twin writes, known to no other twin: an edit's times are the clock's
    /// at each write, different in the two instances.
    static let written = "w"

    init(seed: UInt64, scoped: Bool = false) throws {
        random = SeededRandom(seed: seed)
        var options = FileSystemOptions()
        options.cache.chunkSize = 64 << 10
        options.cache.firstChunkSize = 64 << 10
        options.cache.retryDelay = .zero
        options.cache.directoryTTL = .seconds(5)
        options.cache.attributeTTL = .seconds(1)
        options.cache.missRefreshInterval = .milliseconds(500)
        options.cache.listingRefreshAhead = nil
        // Whole files: what is present after the downloads settle does not depend on timing.
        options.cache.backgroundCompletion = true
        options.revalidateOnOpen = random.next() % 2 == 0
        // Every other sequence on a writable mount (setattr answers at once only there); by the
        // seed's parity, so that the eight sequences always include writable ones.
        options.writable = seed % 2 == 0
        provider.addDirectory("d")
        for path in ["a", "d/e", "d/f", Self.written] { provider.putFile(path, .ramp(seed: 1, size: 100_000)) }
        provider.answersImmediately = true
        directories = [
            try TemporaryDirectory(prefix: "providerfs-twin"), try TemporaryDirectory(prefix: "providerfs-twin"),
        ]
        authority = TokenAuthority(storeDirectory: nil, clock: tokenClock)
        port = TwinScopedPort(MountScopedAccess(authority: authority, processOfThread: { $0 }))
        let provider = self.provider
        let clock = self.clock
        let scopedAccess: (any ScopedAccessProvider)? = scoped ? port : nil
        func make(_ directory: TemporaryDirectory) throws -> ProviderFileSystem {
            let cache = try ProviderCache(
                provider: provider, directory: directory.path, store: InMemoryMetadataStore(), clock: clock,
                options: options.cache)
            return ProviderFileSystem(cache: cache, options: options, scopedAccess: scopedAccess)
        }
        now = try make(directories[0])
        slow = try make(directories[1])
        guard scoped else { return }
        for (path, mode, ttl) in [
            ("d", TokenMode.read, 600), ("d", .readWrite, 600), ("a", .read, 600), ("d/e", .readWrite, 600),
            ("d", .read, 20), ("d", .read, 600),
        ] {
            try grant(path, mode, ttl: .seconds(ttl))
        }
        try authority.revoke(id: tokens[5].id!)
        tokens += [("probe", ".git", nil), ("empty", "", nil), ("guess", "nope", nil)]
    }

    func finish() async {
        await now.shutdown()
        await slow.shutdown()
        for directory in directories { directory.remove() }
    }

    func pick<T>(_ choices: [T]) -> T { choices[Int(random.next() % UInt64(choices.count))] }

    func execute(steps: Int) async -> [String] {
        for step in 0..<steps {
            await settle()
            switch random.next() % 16 {
            case 0: clock.advance(by: pick([.milliseconds(100), .milliseconds(600), .milliseconds(1100), .seconds(6)]))
            case 1: remoteChange()
            case 2: provider.answersImmediately.toggle()
            case 3, 4: await mirrorLookup()
            case 5: await mirrorOpenAndRead()
            case 6: await checkLookup(step)
            case 7: await checkAttributes(step)
            case 8: await checkOpen(step)
            case 9, 10: await checkRead(step)
            case 11, 12: await checkSetAttributes(step)
            case 14, 15: await checkWrite(step)
            default: await checkRelease(step)
            }
        }
        return mismatches
    }

    /// Waits until neither instance downloads (their downloads run in tasks of their own).
    func settle() async {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline,
            [now, slow].contains(where: { $0.cache.contentActivity().contains { $0.state == .downloading } })
        {
            await Task.yield()
        }
    }

    func remoteChange() {
        let path = pick(Self.paths.filter { $0 != "d" })
        switch random.next() % 3 {
        case 0:
            contentSeed += 1
            provider.putFile(path, .ramp(seed: contentSeed, size: Int64(random.next() % 150_000)))
        case 1: provider.remove(path)
        default: provider.putFile(pick(["b", "d/g"]), .ramp(seed: 3, size: 10))
        }
    }

    func mirrorLookup() async {
        let path = pick(Self.paths)
        let parentPath = path.contains("/") ? "d" : ""
        guard let parent = nodes[parentPath] else { return }
        let name = String(path.split(separator: "/").last!)
        let first = await outcome { () throws(FileSystemError) in
            try await self.now.lookup(parent: parent.inode, name: name, context: .kernel)
        }
        let second = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: parent.inode, name: name, context: .kernel)
        }
        if case .success(let entry) = first {
            nodes[path] = (entry.inode, entry.attributes.type == .directory)
        }
        expectEqual("mirrored lookup \(path)", first, second)
    }

    func mirrorOpenAndRead() async {
        guard let file = pickFile() else { return }
        let first = await outcome { () throws(FileSystemError) in
            try await self.now.open(file, flags: OpenFlags(rawValue: 0), context: .kernel).handle
        }
        let second = await outcome { () throws(FileSystemError) in
            try await self.slow.open(file, flags: OpenFlags(rawValue: 0), context: .kernel).handle
        }
        expectEqual("mirrored open", first, second)
        guard case .success(let handle) = first, case .success(handle) = second else { return }
        handles.append((file, handle))
        let count = Int(random.next() % 70_000)
        let a = await outcome { () throws(FileSystemError) in
            try await self.now.read(file, handle: handle, offset: 0, count: count, context: .kernel).bytes
        }
        let b = await outcome { () throws(FileSystemError) in
            try await self.slow.read(file, handle: handle, offset: 0, count: count, context: .kernel).bytes
        }
        expectEqual("mirrored read", a, b)
    }

    func pickFile() -> InodeNumber? {
        let files = nodes.values.filter { !$0.isDirectory }.map(\.inode).sorted { $0.rawValue < $1.rawValue }
        return files.isEmpty ? nil : pick(files)
    }

    // MARK: The twins

    func checkLookup(_ step: Int) async {
        let directories = nodes.filter { $0.value.isDirectory }.sorted { $0.key < $1.key }
        let (parentPath, parent) = pick(directories)
        let name = pick(
            Self.paths.filter { $0.hasPrefix(parentPath.isEmpty ? "" : parentPath + "/") }
                .map { String($0.split(separator: "/").last!) } + ["nope"])
        guard let immediate = now.lookupNow(parent: parent.inode, name: name, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: parent.inode, name: name, context: .kernel)
        }
        answered[(try? immediate.get()) == nil ? "lookup miss" : "lookup", default: 0] += 1
        expectEqual("step \(step): lookup \(parentPath)/\(name)", Outcome(immediate), async)
    }

    func checkAttributes(_ step: Int) async {
        let (path, node) = pick(nodes.sorted { $0.key < $1.key })
        // Every other time an xattr: a name the mount never has (answered at once), or its own.
        if random.next() % 2 == 0 {
            let name = pick(["security.capability", "user.other", "trusted.x", ProviderFileSystem.AttributeName.state])
            guard let immediate = now.getExtendedAttributeNow(node.inode, name: name, context: .kernel) else { return }
            let async = await outcome { () throws(FileSystemError) in
                try await self.slow.getExtendedAttribute(node.inode, name: name, context: .kernel)
            }
            answered["getxattr", default: 0] += 1
            expectEqual("step \(step): getxattr \(name) of \(path)", Outcome(immediate), async)
            return
        }
        guard let immediate = now.getAttributesNow(node.inode, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.getAttributes(node.inode, context: .kernel)
        }
        answered["getattr", default: 0] += 1
        expectEqual("step \(step): getattr \(path)", Outcome(immediate), async)
    }

    /// A chown to the owner every node has, an atime alone, a mode or times (made at once by a
    /// provider that answers at once, D-426), or a change the immediate path declines (another
    /// owner).
    func checkSetAttributes(_ step: Int) async {
        let (path, node) = pick(nodes.sorted { $0.key < $1.key })
        // The mount's owner (FileSystemOptions' default).
        let owner = getuid()
        let group = getgid()
        let changes = pick([
            AttributeChanges(uid: owner, gid: group), AttributeChanges(uid: owner),
            AttributeChanges(accessTime: Timestamp(seconds: 1_000, nanoseconds: 0)),
            AttributeChanges(uid: owner &+ 1), AttributeChanges(permissions: 0o600),
            AttributeChanges(
                permissions: 0o640, accessTime: Timestamp(seconds: 3_000, nanoseconds: 0),
                modificationTime: Timestamp(seconds: 2_000, nanoseconds: 0)),
        ])
        guard let immediate = now.setAttributesNow(node.inode, changes: changes, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.setAttributes(node.inode, changes: changes, handle: nil, context: .kernel)
        }
        answered["setattr", default: 0] += 1
        expectEqual("step \(step): setattr \(changes) of \(path)", Outcome(immediate), async)
    }

    /// A write through a handle both instances opened for writing (`written`, truncated or not;
    /// only a writable mount opens one), or through a read handle (EBADF, or EROFS on a
    /// read-only mount). A write the immediate path declines is made the async way in both.
    func checkWrite(_ step: Int) async {
        if now.isWritable, writers.count < 3, writers.isEmpty || random.next() % 4 == 0 {
            let found = await outcome { () throws(FileSystemError) in
                try await self.now.lookup(parent: .root, name: Self.written, context: .kernel).inode
            }
            let other = await outcome { () throws(FileSystemError) in
                try await self.slow.lookup(parent: .root, name: Self.written, context: .kernel).inode
            }
            expectEqual("step \(step): mirrored lookup \(Self.written)", found, other)
            guard case .success(let file) = found, case .success(file) = other else { return }
            let flags = OpenFlags(rawValue: pick([O_WRONLY, O_RDWR, O_WRONLY | O_TRUNC]))
            let first = await outcome { () throws(FileSystemError) in
                try await self.now.open(file, flags: flags, context: .kernel).handle
            }
            let second = await outcome { () throws(FileSystemError) in
                try await self.slow.open(file, flags: flags, context: .kernel).handle
            }
            expectEqual("step \(step): mirrored open \(file) for writing", first, second)
            if case .success(let handle) = first, case .success(handle) = second { writers.append((file, handle)) }
        }
        let readers = random.next() % 4 == 0 || writers.isEmpty
        guard let target = readers ? (handles.isEmpty ? nil : pick(handles)) : pick(writers) else { return }
        let (file, handle) = target
        let offset = Int64(random.next() % 120_000)
        let data = (0..<Int(random.next() % 4_096)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
        guard let immediate = now.writeNow(file, handle: handle, offset: offset, data: data, context: .kernel) else {
            let first = await outcome { () throws(FileSystemError) in
                try await self.now.write(file, handle: handle, offset: offset, data: data, context: .kernel)
            }
            let second = await outcome { () throws(FileSystemError) in
                try await self.slow.write(file, handle: handle, offset: offset, data: data, context: .kernel)
            }
            expectEqual("step \(step): mirrored write \(offset)+\(data.count) to \(handle)", first, second)
            return
        }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.write(file, handle: handle, offset: offset, data: data, context: .kernel)
        }
        answered["write", default: 0] += 1
        if case .success = immediate { answered["write ok", default: 0] += 1 }
        expectEqual("step \(step): write \(offset)+\(data.count) to \(handle)", Outcome(immediate), async)
        // What the write left: the edit's length.
        let sizes = await (
            outcome { () throws(FileSystemError) in try await self.now.getAttributes(file, context: .kernel).size },
            outcome { () throws(FileSystemError) in try await self.slow.getAttributes(file, context: .kernel).size }
        )
        expectEqual("step \(step): size after the write to \(handle)", sizes.0, sizes.1)
    }

    func checkOpen(_ step: Int) async {
        guard let file = pickFile() else { return }
        guard let immediate = now.openNow(file, flags: OpenFlags(rawValue: 0), context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.open(file, flags: OpenFlags(rawValue: 0), context: .kernel)
        }
        answered["open", default: 0] += 1
        func comparable(_ opened: OpenedFile, _ fileSystem: ProviderFileSystem) -> String {
            // The complete cache file lives in each instance's own directory.
            let prefix = fileSystem.cache.directory
            let served = opened.servedFrom.map { $0.hasPrefix(prefix) ? String($0.dropFirst(prefix.count)) : $0 }
            return "handle \(opened.handle) keepCache \(opened.keepCache) directIO \(opened.directIO) \(served ?? "-")"
        }
        expectEqual(
            "step \(step): open \(file)", Outcome(immediate).map { comparable($0, now) },
            async.map { comparable($0, slow) })
        if case .success(let opened) = immediate { handles.append((file, opened.handle)) }
        // The async twin's handle, when only it opened, keeps the instances apart: close it.
        if case .success(let opened) = async, (try? immediate.get()) == nil {
            await slow.release(file, handle: opened.handle)
        }
    }

    func checkRead(_ step: Int) async {
        guard !handles.isEmpty else { return }
        let (file, handle) = pick(handles)
        let offset = Int64(random.next() % 160_000)
        let count = Int(random.next() % 140_000)
        guard let immediate = now.readNow(file, handle: handle, offset: offset, count: count, context: .kernel) else {
            return
        }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.read(file, handle: handle, offset: offset, count: count, context: .kernel)
        }
        answered["read", default: 0] += 1
        expectEqual(
            "step \(step): read \(offset)+\(count) of \(file)", Outcome(immediate).map { $0.bytes },
            async.map { $0.bytes })
    }

    func checkRelease(_ step: Int) async {
        guard !handles.isEmpty else { return }
        let index = Int(random.next() % UInt64(handles.count))
        let (file, handle) = handles[index]
        if let immediate = now.flushNow(file, handle: handle, context: .kernel) {
            let async = await outcome { () throws(FileSystemError) in
                try await self.slow.flush(file, handle: handle, context: .kernel)
            }
            answered["flush", default: 0] += 1
            expectEqual("step \(step): flush \(handle)", Outcome(immediate).map { "ok" }, async.map { "ok" })
        }
        if let immediate = now.releaseNow(file, handle: handle) {
            await slow.release(file, handle: handle)
            answered["release", default: 0] += 1
            handles.remove(at: index)
            expectEqual(
                "step \(step): release \(handle)", Outcome(immediate).map { now.openFileCount },
                .success(slow.openFileCount))
        }
    }

    // MARK: The access-path twins

    func executeScoped(steps: Int) async -> [String] {
        for step in 0..<steps {
            await settle()
            switch random.next() % 16 {
            case 0: clock.advance(by: pick([.milliseconds(600), .milliseconds(1100), .seconds(6)]))
            case 1: remoteChange()
            case 2: provider.answersImmediately.toggle()
            case 3: changeTokens()
            case 4, 5: await mirrorScopedLookup()
            case 6: await checkTokenLookup(step)
            case 7, 8: await checkScopedLookup(step)
            case 9: await checkScopedAttributes(step)
            case 10, 11: await checkScopedOpen(step)
            case 12: await checkRead(step)
            case 13: await checkRelease(step)
            default: await mirrorLookup()
            }
        }
        return mismatches
    }

    func grant(_ path: String, _ mode: TokenMode, ttl: Duration) throws {
        let issued = try authority.grant(path, mode, ttl: ttl)
        tokens.append(("t\(tokens.count)", issued.token, issued.id))
    }

    /// Time passes for the tokens (short ones expire), a token is granted, revoked or expired,
    /// or the moving token's scope moves.
    func changeTokens() {
        switch random.next() % 5 {
        case 0: tokenClock.advance(by: pick([.seconds(5), .seconds(30)]))
        case 1:
            guard tokens.count < 16 else { return }
            try? grant(pick(["d", "a", "d/f"]), pick([.read, .readWrite]), ttl: .seconds(pick([20, 600])))
        case 2:
            guard let id = pick(tokens).id else { return }
            if random.next() % 2 == 0 { try? authority.revoke(id: id) } else { try? authority.expire(id: id) }
        default: port.moved.withLock { $0.toggle() }
        }
    }

    /// `.scoped`, looked up the async way in both (the same node in both).
    func scopedDirectory() async -> InodeNumber? {
        if let scopedRoot { return scopedRoot }
        let first = await outcome { () throws(FileSystemError) in
            try await self.now.lookup(parent: .root, name: ".scoped", context: .kernel).inode
        }
        let second = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: .root, name: ".scoped", context: .kernel).inode
        }
        expectEqual("mirrored lookup .scoped", first, second)
        guard case .success(let inode) = first else { return nil }
        scopedRoot = inode
        return inode
    }

    /// An access-path directory (or `.scoped`), the key of the node a lookup in it finds, and the
    /// name to look up.
    func pickScopedLookup() async -> (parent: InodeNumber, key: String, name: String)? {
        let directories = scopedNodes.filter { $0.value.isDirectory }.sorted { $0.key < $1.key }
        if directories.isEmpty || random.next() % 4 == 0 {
            guard let root = await scopedDirectory() else { return nil }
            let token = pick(tokens)
            return (root, token.label, token.name)
        }
        let (key, parent) = pick(directories)
        let name = pick(["e", "f", "g", "e", "f", "a", "nope", ".."])
        return (parent.inode, key + "/" + name, name)
    }

    func mirrorScopedLookup() async {
        guard let (parent, key, name) = await pickScopedLookup() else { return }
        let first = await outcome { () throws(FileSystemError) in
            try await self.now.lookup(parent: parent, name: name, context: .kernel)
        }
        let second = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: parent, name: name, context: .kernel)
        }
        if case .success(let entry) = first { scopedNodes[key] = (entry.inode, entry.attributes.type == .directory) }
        expectEqual("mirrored lookup .scoped/\(key)", first, second)
    }

    func checkTokenLookup(_ step: Int) async {
        guard let root = await scopedDirectory() else { return }
        let token = pick(tokens)
        guard let immediate = now.lookupNow(parent: root, name: token.name, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: root, name: token.name, context: .kernel)
        }
        tally("token lookup", immediate)
        if case .success(let entry) = immediate {
            scopedNodes[token.label] = (entry.inode, entry.attributes.type == .directory)
        }
        expectEqual("step \(step): lookup .scoped/\(token.label)", Outcome(immediate), async)
    }

    func checkScopedLookup(_ step: Int) async {
        guard let (parent, key, name) = await pickScopedLookup(), parent != scopedRoot else { return }
        guard let immediate = now.lookupNow(parent: parent, name: name, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.lookup(parent: parent, name: name, context: .kernel)
        }
        tally("scoped lookup", immediate)
        if case .success(let entry) = immediate {
            scopedNodes[key] = (entry.inode, entry.attributes.type == .directory)
        }
        expectEqual("step \(step): lookup .scoped/\(key)", Outcome(immediate), async)
    }

    func checkScopedAttributes(_ step: Int) async {
        guard !scopedNodes.isEmpty else { return }
        let (key, node) = pick(scopedNodes.sorted { $0.key < $1.key })
        guard let immediate = now.getAttributesNow(node.inode, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.getAttributes(node.inode, context: .kernel)
        }
        tally("scoped getattr", immediate)
        expectEqual("step \(step): getattr .scoped/\(key)", Outcome(immediate), async)
    }

    /// Mostly files to read; a directory or a write now and then (the immediate form answers
    /// those only with a refusal: EACCES, EISDIR, EROFS).
    func checkScopedOpen(_ step: Int) async {
        let files = scopedNodes.filter { !$0.value.isDirectory }.sorted { $0.key < $1.key }
        let candidates = files.isEmpty || random.next() % 4 == 0 ? scopedNodes.sorted { $0.key < $1.key } : files
        guard !candidates.isEmpty else { return }
        let (key, node) = pick(candidates)
        let flags = OpenFlags(rawValue: pick([0, 0, 0, O_WRONLY]))
        guard let immediate = now.openNow(node.inode, flags: flags, context: .kernel) else { return }
        let async = await outcome { () throws(FileSystemError) in
            try await self.slow.open(node.inode, flags: flags, context: .kernel)
        }
        tally("scoped open", immediate)
        func comparable(_ opened: OpenedFile) -> String {
            "handle \(opened.handle) keepCache \(opened.keepCache) directIO \(opened.directIO) \(opened.servedFrom ?? "-")"
        }
        expectEqual(
            "step \(step): open .scoped/\(key) flags \(flags.rawValue)", Outcome(immediate).map(comparable),
            async.map(comparable))
        if case .success(let opened) = immediate { handles.append((node.inode, opened.handle)) }
        if case .success(let opened) = async, (try? immediate.get()) == nil {
            await slow.release(node.inode, handle: opened.handle)
        }
    }

    /// Counts an immediate answer of `twin`, and every refusal (EACCES) among them.
    func tally<T>(_ twin: String, _ immediate: Result<T, FileSystemError>) {
        answered[twin, default: 0] += 1
        switch immediate {
        case .success: answered[twin + " ok", default: 0] += 1
        case .failure(let error) where error.code == .accessDenied: answered["scoped refusal", default: 0] += 1
        case .failure: break
        }
    }

    // MARK: Answers

    enum Outcome<T> {
        case success(T)
        case failure(FileSystemError.Code)

        init(_ result: Result<T, FileSystemError>) {
            switch result {
            case .success(let value): self = .success(value)
            case .failure(let error): self = .failure(error.code)
            }
        }

        func map<U>(_ transform: (T) -> U) -> Outcome<U> {
            switch self {
            case .success(let value): .success(transform(value))
            case .failure(let code): .failure(code)
            }
        }
    }

    func outcome<T>(_ body: () async throws(FileSystemError) -> T) async -> Outcome<T> {
        do { return .success(try await body()) } catch { return .failure(error.code) }
    }

    func expectEqual<T: Equatable>(_ what: String, _ immediate: Outcome<T>, _ async: Outcome<T>) {
        if immediate != async { mismatches.append("\(what): immediate \(immediate), async \(async)") }
    }
}

extension TwinRun.Outcome: Equatable where T: Equatable {}

/// The daemon's adapter over the run's authority; while `moved`, every token of `d` grants `a`
/// instead, so the nodes made through it under `d` are outside its scope (which a real
/// authority never does: it tests the checks of the scope, D-307, D-348).
private final class TwinScopedPort: ScopedAccessProvider, Sendable {
    let base: MountScopedAccess
    let moved = Locked(false)

    init(_ base: MountScopedAccess) { self.base = base }

    func moving(_ decision: ScopedAccessDecision) -> ScopedAccessDecision {
        guard case .allowed(var grant) = decision, grant.scope == "d", moved.withLock({ $0 }) else { return decision }
        grant.scope = "a"
        return .allowed(grant)
    }

    func check(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        moving(base.check(token, context: context))
    }

    func recordUse(_ token: String, context: RequestContext) -> ScopedAccessDecision {
        moving(base.recordUse(token, context: context))
    }

    func endUse(id: String) { base.endUse(id: id) }
    func returnUse(id: String) { base.returnUse(id: id) }
    func hasEnded(id: String) -> Bool { base.hasEnded(id: id) }
    func observeEnds(_ observer: @escaping @Sendable (_ id: String) -> Void) { base.observeEnds(observer) }
}
