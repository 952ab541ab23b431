// The wire protocol and an embedded server in this process: round trips, a seeded fuzz of the
// decoder, bad clients (garbage, truncated frames, silence, wrong version) that are dropped while
// others keep being served, and claims taken on behalf of kernel callers.
import FileCoordination
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

let sampleMessages: [WireMessage] = [
    .hello(magic: WireProtocol.magic, version: WireProtocol.version),
    .submit(
        local: 7, purpose: "p", waitTimeout: 1_000, presenterTimeout: 2_000, held: [1, 2],
        intents: [
            ClaimIntent(
                kind: .write, path: "/a/b", writingOptions: .forDeleting, identity: ItemIdentity(device: 1, inode: 2),
                isDirectory: true, packageRoot: "/a"),
            ClaimIntent(kind: .read, path: "/c", readingOptions: [.withoutChanges, .forUploading]),
        ]),
    .release(local: 3), .cancel(local: 4), .removePresenter(local: 5),
    .addPresenter(
        local: 9, purpose: "q", path: "/x", identity: nil, isDirectory: false, packageRoot: nil, methods: 0x3ff),
    .reply(messageID: 11, error: "no"), .reply(messageID: 12, error: nil),
    .itemMoved(from: "/a", to: "/b", purpose: "r"), .dumpRequest(requestID: 1),
    .welcome(version: 1, serverPid: 42, owner: 3), .granted(local: 1, paths: ["/a", "/b"]),
    .failed(local: 2, code: 2, message: "timed out"),
    .deliver(
        presenter: 1, messageID: 2, message: .subitemDidMove(from: "/a", to: "/b"), claim: ClaimID(owner: 1, local: 2)),
    .deliver(presenter: 1, messageID: 0, message: .accommodateSubitemDeletion(at: "/p/x"), claim: nil),
    .dump(requestID: 1, json: "{}"), .fatal(code: 9, message: "bye"),
    .versionChanged(path: "/a", change: 2, version: "/v", versionName: "n"),
    .deliver(
        presenter: 1, messageID: 0,
        message: .versionChanged(change: .lost, item: "/a", version: "/v", versionName: "n"),
        claim: nil),
    .reclaim(
        previousServer: 4242, previousOwner: 7,
        claims: [
            ReclaimedClaim(
                local: 3, purpose: "p", presenterTimeout: 5, intents: [ClaimIntent(kind: .write, path: "/a")]),
            ReclaimedClaim(local: 4, purpose: "q", presenterTimeout: 6, intents: []),
        ]),
    .reclaim(previousServer: 1, previousOwner: 2, claims: []),
    .holdFor(pid: 4242, startTime: 1_234_567),
]

func decodeFrame(_ frame: [UInt8]) throws -> WireMessage {
    var buffer = FrameBuffer()
    frame.withUnsafeBytes { buffer.append($0) }
    guard let payload = try buffer.next() else { throw WireError("incomplete") }
    return try WireMessage.decode(payload)
}

@Suite struct WireProtocolTests {
    @Test func everyMessageRoundTrips() throws {
        for message in sampleMessages { #expect(try decodeFrame(message.frame()) == message) }
    }

    @Test(arguments: [UInt64(1), 2, 3, 0xdead_beef])
    func fuzzedPayloadsAreRejectedOrDecodedNeverCrash(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var decoded = 0
        for round in 0..<3000 {
            var payload: [UInt8]
            if round % 2 == 0 {
                // A valid frame, mutated: flipped bytes, truncation, or extension.
                payload = Array(sampleMessages[Int(random.next() % UInt64(sampleMessages.count))].frame().dropFirst(4))
                for _ in 0..<(1 + random.next() % 4) where !payload.isEmpty {
                    payload[Int(random.next() % UInt64(payload.count))] = UInt8(truncatingIfNeeded: random.next())
                }
                if random.next() % 3 == 0 {
                    payload = Array(payload.prefix(Int(random.next() % UInt64(payload.count + 1))))
                }
                if random.next() % 5 == 0 { payload += [UInt8(truncatingIfNeeded: random.next())] }
            } else {
                payload = (0..<(random.next() % 64)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            }
            if let message = try? WireMessage.decode(ArraySlice(payload)) {
                decoded += 1
                // Whatever decodes must survive a re-encode unchanged.
                #expect((try? decodeFrame(message.frame())) == message, "seed \(seed) round \(round)")
            }
        }
        #expect(decoded < 3000, "most garbage is rejected")
    }

    @Test func frameBufferRejectsOversizedAndWaitsForPartialFrames() throws {
        var buffer = FrameBuffer()
        let frame = WireMessage.release(local: 1).frame()
        frame.prefix(5).withUnsafeBytes { buffer.append($0) }
        #expect(try buffer.next() == nil)
        frame.dropFirst(5).withUnsafeBytes { buffer.append($0) }
        #expect(try buffer.next().map { try WireMessage.decode($0) } == .release(local: 1))
        var huge = FrameBuffer()
        [UInt8]([0x7f, 0xff, 0xff, 0xff, 1]).withUnsafeBytes { huge.append($0) }
        #expect(throws: WireError.self) { try huge.next() }
    }

    @Test func mountInfoParsingFindsProviderMounts() {
        let text = """
            22 1 0:21 / /proc rw,nosuid - proc proc rw
            40 22 0:35 / /mnt/cloud\\040drive rw,nosuid,nodev - fuse.providerfs providerfs rw,user_id=0
            41 22 0:36 / /mnt/other rw - fuse.sshfs host: rw
            """
        #expect(CoordinationServer.providerMountPoints(in: MountTable.parse(text)) == ["/mnt/cloud drive"])
        let a = CoordinationServer.socketPath(
            forMountPoint: "/mnt/cloud drive", environment: ["PROVIDERFS_RUNTIME_DIR": "/r"])
        let b = CoordinationServer.socketPath(
            forMountPoint: "/mnt/cloud drive/", environment: ["PROVIDERFS_RUNTIME_DIR": "/r"])
        #expect(a == b && a.hasPrefix("/r/mounts/") && a.hasSuffix(".sock"))
    }
}

/// An embedded server on a private socket, stopped at the end of each test.
final class EmbeddedServer: @unchecked Sendable {
    // Safe: set up once, then only read.
    let directory: String
    let server: CoordinationServer
    var socketPath: String { server.socketPath }

    /// `holders`: the holders file a dead predecessor left (D-402), written before the start.
    init(helloTimeout: Duration = .seconds(5), grace: Duration = .seconds(10), holders: String? = nil) throws {
        var template = Array("/tmp/pfs-srv-XXXXXX".utf8CString)
        directory = String(cString: template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }!)
        if let holders { try holders.write(toFile: directory + "/s.holders", atomically: false, encoding: .utf8) }
        server = CoordinationServer(socketPath: directory + "/s.sock", helloTimeout: helloTimeout, grace: grace)
        try server.start()
    }

    /// A server on an existing directory's socket (a successor), not started.
    init(successorIn directory: String, grace: Duration = .seconds(10)) {
        self.directory = directory
        server = CoordinationServer(socketPath: directory + "/s.sock", grace: grace)
    }

    func stop() {
        server.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A raw connection for misbehaving on purpose.
    func rawConnection() -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in socketPath.utf8.enumerated() { raw[index] = byte }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        precondition(rc == 0)
        return fd
    }

    /// Everything the server sends until it closes the connection (at most 5 s).
    static func readUntilClosed(_ fd: Int32) -> [WireMessage] {
        var buffer = FrameBuffer()
        var messages: [WireMessage] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 5000) > 0 else { return messages }
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count <= 0 { return messages }
            chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            while let payload = try? buffer.next(), let message = try? WireMessage.decode(payload) {
                messages.append(message)
            }
        }
    }

    /// A claim through a proper client still works.
    func stillServes() throws -> Bool {
        let domain = CoordinationDomain(socketPath: socketPath)
        return try FileCoordinator(domain: domain).coordinate(writingItemAt: URL(fileURLWithPath: directory + "/probe"))
        {
            _ in true
        }
    }
}

@Suite(.blockingThreads) struct ServerRobustnessTests {
    @Test func garbageIsAnsweredWithAFatalMessageAndDropped() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        defer { close(fd) }
        let garbage: [UInt8] = [0, 0, 0, 5, 0xff, 1, 2, 3, 4]
        _ = garbage.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let replies = EmbeddedServer.readUntilClosed(fd)
        guard case .fatal(_, let text)? = replies.last else {
            Issue.record("expected a fatal message, got \(replies)")
            return
        }
        #expect(text.contains("hello") || text.contains("Unknown"))
        #expect(try embedded.stillServes())
    }

    @Test func truncatedFrameThenHangUpIsDropped() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        let frame = WireMessage.hello(magic: WireProtocol.magic, version: WireProtocol.version).frame()
        _ = frame.prefix(6).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        #expect(try embedded.stillServes())
    }

    @Test func helloSplitAcrossWritesIsAssembled() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        defer { close(fd) }
        let frame = WireMessage.hello(magic: WireProtocol.magic, version: WireProtocol.version).frame()
        _ = frame.prefix(3).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        #expect(try embedded.stillServes())
        _ = frame.dropFirst(3).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        shutdown(fd, Int32(SHUT_WR))
        guard case .welcome(let version, let pid, _)? = EmbeddedServer.readUntilClosed(fd).first else {
            Issue.record("no welcome")
            return
        }
        #expect(version == WireProtocol.version && pid == getpid())
    }

    /// Version 3 is the one before `holdFor` (D-406): its clients are told, not misunderstood.
    @Test(arguments: [UInt16(3), 99]) func wrongVersionIsRefusedWithAReason(version: UInt16) throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        defer { close(fd) }
        let frame = WireMessage.hello(magic: WireProtocol.magic, version: version).frame()
        _ = frame.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard case .fatal(_, let text)? = EmbeddedServer.readUntilClosed(fd).last else {
            Issue.record("no fatal message")
            return
        }
        #expect(text == "Protocol version \(version) is not supported; this server speaks 4.")
    }

    @Test func silentClientIsDroppedAndDoesNotBlockOthers() throws {
        let embedded = try EmbeddedServer(helloTimeout: .milliseconds(200))
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        defer { close(fd) }
        #expect(try embedded.stillServes(), "served while the silent client is connected")
        let replies = EmbeddedServer.readUntilClosed(fd)
        guard case .fatal(_, let text)? = replies.last else {
            Issue.record("expected the silent client to be dropped with a reason, got \(replies)")
            return
        }
        #expect(text.contains("No hello"))
    }

    @Test func disconnectReleasesClaimsAtOnce() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let fd = embedded.rawConnection()
        func send(_ message: WireMessage) {
            let frame = message.frame()
            _ = frame.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        }
        send(.hello(magic: WireProtocol.magic, version: WireProtocol.version))
        send(
            .submit(
                local: 1, purpose: "raw", waitTimeout: 10_000_000_000, presenterTimeout: 1_000_000_000, held: [],
                intents: [ClaimIntent(kind: .write, path: embedded.directory + "/probe")]))
        for _ in 0..<1000 where embedded.server.host.dump().claims.isEmpty { usleep(1000) }
        #expect(embedded.server.host.dump().claims.map(\.state) == ["held"])
        close(fd)
        #expect(try embedded.stillServes())
    }

    @Test func kernelCallerIsNotBlockedByItsOwnClaimButOthersAre() async throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let file = embedded.directory + "/f"
        let domain = CoordinationDomain(socketPath: embedded.socketPath)
        let server = embedded.server
        try await FileCoordinator(domain: domain).coordinate(
            writingItemAt: URL(fileURLWithPath: file),
            performing: { _ in
                // This process holds the write claim: its own kernel-side access goes through.
                let own = try await server.claim(file, kind: .write, onBehalfOf: getpid(), deadline: .seconds(5))
                own.release()
                // Another process (pid 1 is not in our ancestry) waits, here until its deadline.
                do {
                    let other = try await server.claim(file, kind: .read, onBehalfOf: 1, deadline: .milliseconds(100))
                    other.release()
                    Issue.record("a stranger's claim was granted while the write is held")
                } catch let error as CoordinationError {
                    #expect(error.code == .timedOut)
                }
            })
        let later = try await server.claim(file, kind: .read, onBehalfOf: 1, deadline: .seconds(5))
        later.release()
    }

    @Test func holdForNamesAnotherProcessAsTheClaimsHolder() async throws {
        // D-406: inside the accessor the claim is said to be a child's (`coordinate -- CMD`):
        // the server's claim then names the child, whose kernel calls pass it, and no longer
        // this process, whose kernel calls wait. A name with the wrong start time is ignored.
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let file = embedded.directory + "/f"
        let domain = CoordinationDomain(socketPath: embedded.socketPath)
        let server = embedded.server
        var spawned: pid_t = 0
        let words: [String] = ["/bin/sleep", "30"]
        let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        try #require(posix_spawn(&spawned, "/bin/sleep", nil, nil, argv, environ) == 0)
        let pid = spawned
        defer {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        let started = try #require(ProcessInfoFiles.startTime(of: pid))
        @Sendable func holder() -> Int32? { server.host.dump().claims.first?.pid }
        try await FileCoordinator(domain: domain).coordinate(
            writingItemAt: URL(fileURLWithPath: file),
            performing: { _ in
                #expect(holder() == getpid())
                FileCoordinator.holdClaims(forProcess: pid, startTime: started &+ 1)
                FileCoordinator.holdClaims(forProcess: pid, startTime: started)
                for _ in 0..<2000 where holder() != pid { usleep(1000) }
                #expect(holder() == pid, "the claim names the child")
                let childs = try await server.claim(file, kind: .write, onBehalfOf: pid, deadline: .seconds(5))
                childs.release()
                do {
                    let mine = try await server.claim(
                        file, kind: .read, onBehalfOf: getpid(), deadline: .milliseconds(100))
                    mine.release()
                    Issue.record("the claim still passes the process that named another holder")
                } catch let error as CoordinationError {
                    #expect(error.code == .timedOut)
                }
            })
        for _ in 0..<2000 where !server.host.dump().claims.isEmpty { usleep(1000) }
        #expect(server.host.dump().claims.isEmpty)
    }
}

/// Records grants, for host-level tests.
final class GrantRecorder: ArbiterSink, @unchecked Sendable {
    // Safe: `grants` is only touched under `lock`.
    private let lock = Lock()
    private var grants: [ClaimID] = []
    var grantedClaims: [ClaimID] { lock.withLock { grants } }
    func granted(_ claim: ClaimID, paths: [String]) { lock.withLock { grants.append(claim) } }
    func failed(_ claim: ClaimID, error: CoordinationError) {}
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {}
}

@Suite struct KernelClaimAncestryTests {
    /// A mount open reads the caller's ancestry from /proc only when a claim is held or waiting
    /// (ancestry is only consulted against granted claims).
    @Test func ancestryIsWorkedOutOnlyWhenAClaimExists() {
        let host = ArbiterHost()
        let sink = GrantRecorder()
        let owner = host.addOwner(sink)
        let lookups = Locked(0)
        func request(_ local: UInt64, _ kind: AccessKind, pid: Int32) -> ClaimRequest {
            ClaimRequest(
                id: ClaimID(owner: owner, local: local), pid: pid, purpose: "p\(local)",
                intents: [ClaimIntent(kind: kind, path: "/data/f")], waitDeadline: host.now + 60_000_000_000,
                presenterTimeout: 1_000_000_000)
        }
        let ancestry = { () -> [Int32] in
            lookups.withLock { $0 += 1 }
            return [200, 100]
        }
        // No claim anywhere: granted without asking.
        host.submit(request(1, .read, pid: 300), ancestry: ancestry)
        #expect(lookups.value == 0)
        host.release(ClaimID(owner: owner, local: 1))
        // A write held by process 100; its descendant 200 asks: ancestry is read and lets it through.
        host.submit(request(2, .write, pid: 100), ancestry: { [] })
        host.submit(request(3, .read, pid: 200), ancestry: ancestry)
        #expect(lookups.value == 1)
        #expect(sink.grantedClaims.map(\.local) == [1, 2, 3])
        host.release(ClaimID(owner: owner, local: 2))
        host.release(ClaimID(owner: owner, local: 3))
    }
}
