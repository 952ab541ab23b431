// The control protocol and a ControlServer in this process, over a real socket: round trips,
// a seeded fuzz of the request parser, bad clients (garbage, truncated and oversized frames,
// silence, wrong versions and types) answered with an error or a clean close while others keep
// being served, a client that leaves mid-request, many clients at once, and refused peers (an
// injected allowed uid, and a real process of another uid).

import ControlWire
import Foundation
import SystemSupport
import TestSupport
import Testing

@testable import ProviderFSCommands

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// Answers `status` with {"kind":"status"} and `item`/`download` with {"path": …}; an item named
/// "slow" waits until `release()`.
final class StubHandler: ControlHandler, @unchecked Sendable {
    // Safe: `gate` is a Locked value.
    private let gate = Locked<(open: Bool, waiters: [CheckedContinuation<Void, Never>], started: Int)>((false, [], 0))

    func handle(_ request: ControlRequest, peer: UnixSocket.PeerCredentials) async -> Result<[UInt8], ControlError> {
        switch request {
        case .status:
            return .success(Array("{\"kind\":\"status\",\"uid\":\(peer.uid)}".utf8))
        case .item(let path), .download(let path), .evict(let path), .refresh(let path):
            if path == "slow" {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let open = gate.withLock { gate -> Bool in
                        gate.started += 1
                        if gate.open { return true }
                        gate.waiters.append(continuation)
                        return false
                    }
                    if open { continuation.resume() }
                }
            }
            if path == "missing" { return .failure(ControlError(.notFound, "missing is not in the mount")) }
            return ControlProtocol.encode(["path": path])
        case .pin, .faultAdd, .faultList, .faultClear, .tokenGrant, .tokenList, .tokenRevoke, .tokenExpire,
            .tokenLog, .tokenDerive, .tokenRelease, .identifyItem, .resolveItem:
            return ControlProtocol.encode(["kind": request.kind])
        }
    }

    var slowStarted: Int { gate.withLock { $0.started } }

    func release() {
        let waiters = gate.withLock { gate in
            gate.open = true
            defer { gate.waiters = [] }
            return gate.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// A server on a socket in a fresh directory; `stop()` removes both.
struct ServerFixture {
    let directory: String
    let socketPath: String
    let server: ControlServer
    let handler: StubHandler
    let log: Locked<[String]>

    init(allowedUID: UInt32 = getuid(), limits: ControlServer.Limits = ControlServer.Limits()) throws {
        directory = try makeTemporaryDirectory(prefix: "control")
        socketPath = directory + "/run/test.control.sock"
        handler = StubHandler()
        let log = Locked<[String]>([])
        self.log = log
        server = ControlServer(
            socketPath: socketPath, handler: handler, allowedUID: allowedUID, limits: limits,
            log: { message in log.withLock { $0.append(message) } })
        try server.start()
    }

    func stop() {
        handler.release()
        server.stop()
        removeTreeWithinFileSystem(directory)
    }
}

/// A raw client: bytes in, frames out, with a receive deadline (30 s by default: generous, since
/// with four compilers on two cores a reply once took over 5 s; a passing run never waits it out).
final class RawClient {
    let fd: Int32
    /// Bytes received and not yet returned (two replies may arrive in one recv).
    private var reader = ControlFrameReader()

    init(_ path: String, timeout: Int = 30) throws {
        fd = try UnixSocket.connect(path)
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    func send(_ bytes: [UInt8]) { try? UnixSocket.writeAll(fd, bytes) }

    func send(json: String) { send(ControlProtocol.frame(Array(json.utf8))) }

    enum Received {
        case frame([String: Any])
        case closed
        case timedOut
    }

    /// The next reply frame as a JSON object, `.closed` at EOF (or reset), `.timedOut` after the
    /// receive deadline.
    func receive() -> Received {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if let payload = try? reader.next() {
                let object = (try? JSONSerialization.jsonObject(with: Data(payload))) as? [String: Any] ?? [:]
                return .frame(object)
            }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                reader.append(Array(buffer[0..<count]))
                continue
            }
            if count < 0 && errno == EINTR { continue }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return .timedOut }
            return .closed
        }
    }

}

extension RawClient.Received {
    var isClosed: Bool {
        if case .closed = self { return true }
        return false
    }
    var errorCode: String? {
        guard case .frame(let object) = self else { return nil }
        return (object["error"] as? [String: Any])?["code"] as? String
    }
    var id: Int64? {
        guard case .frame(let object) = self else { return nil }
        return object["id"].flatMap(ControlProtocol.integer)
    }
    var ok: [String: Any]? {
        guard case .frame(let object) = self else { return nil }
        return object["ok"] as? [String: Any]
    }
    func ok(_ key: String) -> String? { ok?[key] as? String }
}

@Suite struct ControlProtocolTests {
    @Test func requestsRoundTripThroughTheParser() throws {
        for request in [ControlRequest.status, .item(path: "a/b"), .download(path: "c d/ü.bin")] {
            let frame = ControlProtocol.requestFrame(id: 42, request)
            var reader = ControlFrameReader()
            reader.append(frame)
            let payload = try #require(try reader.next())
            let (id, parsed) = ControlProtocol.parseRequest(payload)
            #expect(id == 42)
            #expect(try parsed.get() == request)
        }
    }

    @Test func pathsAreNormalizedAndMayNotClimb() {
        #expect(ControlRequest.normalizedRelativePath("./a//b/.") == "a/b")
        #expect(ControlRequest.normalizedRelativePath("") == "")
        #expect(ControlRequest.normalizedRelativePath("/etc/passwd") == nil)
        #expect(ControlRequest.normalizedRelativePath("a/../../b") == nil)
    }

    @Test func wrongTypesAndVersionsAreNamedErrors() {
        func code(_ json: String) -> ControlError.Code? {
            guard case .failure(let error) = ControlProtocol.parseRequest(Array(json.utf8)).request else { return nil }
            return error.code
        }
        #expect(code("") == .malformed)
        #expect(code("[1]") == .malformed)
        #expect(code("{\"version\":\"1\",\"request\":\"status\"}") == .malformed)
        #expect(code("{\"version\":true,\"request\":\"status\"}") == .malformed)
        #expect(code("{\"version\":1.5,\"request\":\"status\"}") == .malformed)
        #expect(code("{\"version\":2,\"request\":\"status\"}") == .unsupportedVersion)
        #expect(code("{\"version\":1,\"request\":5}") == .malformed)
        #expect(code("{\"version\":1,\"id\":\"x\",\"request\":\"status\"}") == .malformed)
        #expect(code("{\"version\":1,\"request\":\"reboot\"}") == .unknownRequest)
        #expect(code("{\"version\":1,\"request\":\"item\"}") == .invalidArguments)
        #expect(code("{\"version\":1,\"request\":\"item\",\"arguments\":[]}") == .invalidArguments)
        #expect(code("{\"version\":1,\"request\":\"item\",\"arguments\":{\"path\":5}}") == .invalidArguments)
        #expect(code("{\"version\":1,\"request\":\"download\",\"arguments\":{\"path\":\"../x\"}}") == .invalidArguments)
        #expect(code("{\"version\":1,\"request\":\"status\"}") == nil)
    }

    @Test func anOversizedLengthIsAnErrorNotAnAllocation() {
        var reader = ControlFrameReader()
        reader.append([0xFF, 0xFF, 0xFF, 0xFF])
        #expect(throws: ControlError.self) { try reader.next() }
    }

    /// Seeded random payloads and mutations of valid frames: the parser and the frame reader
    /// always answer (a request or a named error), never trap.
    @Test(arguments: [UInt64(1), 2, 3, 0xdead_beef])
    func fuzzedInputNeverCrashesTheParser(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let valid = [
            ControlProtocol.requestFrame(id: 1, .status), ControlProtocol.requestFrame(id: 2, .item(path: "a/b")),
            ControlProtocol.requestFrame(id: 3, .download(path: "x.bin")),
        ]
        var parsed = 0
        for round in 0..<3000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int.random(in: 0..<64, using: &random)).map { _ in
                    UInt8.random(in: 0...255, using: &random)
                }
            } else {
                bytes = valid[Int.random(in: 0..<valid.count, using: &random)]
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    let index = Int.random(in: 0..<bytes.count, using: &random)
                    switch Int.random(in: 0..<3, using: &random) {
                    case 0: bytes[index] = UInt8.random(in: 0...255, using: &random)
                    case 1: bytes.remove(at: index)
                    default: bytes.insert(UInt8.random(in: 0...255, using: &random), at: index)
                    }
                    if bytes.isEmpty { break }
                }
            }
            var reader = ControlFrameReader()
            reader.append(bytes)
            while true {
                guard let payload = try? reader.next() else { break }
                if case .success = ControlProtocol.parseRequest(payload).request { parsed += 1 }
            }
            // The payload alone (without framing) too.
            _ = ControlProtocol.parseRequest(bytes)
        }
        #expect(parsed >= 0)
    }
}

@Suite(.blockingThreads) struct ControlServerTests {
    @Test func requestsOnOneConnectionAreAnsweredWithTheirIDs() throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        let client = try RawClient(fixture.socketPath)
        client.send(
            ControlProtocol.requestFrame(id: 1, .status) + ControlProtocol.requestFrame(id: 2, .item(path: "a")))
        var replies: [Int64: RawClient.Received] = [:]
        for _ in 0..<2 {
            let reply = client.receive()
            replies[reply.id ?? -1] = reply
        }
        #expect(replies[1]?.ok("kind") == "status")
        #expect(replies[1]?.ok?["uid"].flatMap(ControlProtocol.integer) == Int64(getuid()))
        #expect(replies[2]?.ok("path") == "a")
        client.send(ControlProtocol.requestFrame(id: 3, .item(path: "missing")))
        let missing = client.receive()
        #expect(missing.id == 3)
        #expect(missing.errorCode == "notFound")
        // The socket file is private to its owner.
        var info = stat()
        #expect(stat(fixture.socketPath, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
    }

    @Test func badMessagesGetErrorRepliesAndTheConnectionGoesOn() throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        let client = try RawClient(fixture.socketPath)
        let cases: [(String, String)] = [
            ("not json", "malformed"),
            ("{\"version\":2,\"id\":5,\"request\":\"status\"}", "unsupportedVersion"),
            ("{\"version\":1,\"id\":6,\"request\":\"frobnicate\"}", "unknownRequest"),
            ("{\"version\":1,\"id\":7,\"request\":\"item\",\"arguments\":{\"path\":[1]}}", "invalidArguments"),
            ("{\"version\":\"one\",\"request\":\"status\"}", "malformed"),
        ]
        for (json, code) in cases {
            client.send(json: json)
            let reply = client.receive()
            #expect(reply.errorCode == code, "\(json): \(reply)")
        }
        client.send(json: "{\"version\":2,\"id\":5,\"request\":\"status\"}")
        #expect(client.receive().id == 5, "an error reply names the request when its id could be read")
        client.send(ControlProtocol.requestFrame(id: 9, .status))
        let after = client.receive()
        #expect(after.id == 9 && after.ok != nil)
    }

    @Test func anOversizedFrameIsAnsweredAndTheConnectionClosed() throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        let client = try RawClient(fixture.socketPath)
        client.send([0x7F, 0xFF, 0xFF, 0xFF] + Array(repeating: 0x41, count: 1000))
        #expect(client.receive().errorCode == "tooLarge")
        #expect(client.receive().isClosed)
        // Others are still served.
        let other = try RawClient(fixture.socketPath)
        other.send(ControlProtocol.requestFrame(id: 1, .status))
        #expect(other.receive().ok != nil)
    }

    @Test func aTruncatedFrameIsAnsweredWhenTheClientStopsSending() throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        let client = try RawClient(fixture.socketPath)
        let frame = ControlProtocol.requestFrame(id: 1, .status)
        client.send(Array(frame.prefix(frame.count - 3)))
        shutdown(client.fd, Int32(SHUT_WR))
        #expect(client.receive().errorCode == "truncated")
        #expect(client.receive().isClosed)
    }

    @Test func aSilentClientIsClosedAtItsDeadline() throws {
        var limits = ControlServer.Limits()
        limits.readDeadline = .milliseconds(300)
        limits.idleTimeout = .milliseconds(500)
        let fixture = try ServerFixture(limits: limits)
        defer { fixture.stop() }
        // Half a frame, then nothing: the frame's deadline.
        let partial = try RawClient(fixture.socketPath)
        partial.send([0, 0, 0, 50, 0x7B])
        // Nothing at all: the idle timeout.
        let idle = try RawClient(fixture.socketPath)
        let start = ContinuousClock.now
        #expect(partial.receive().errorCode == "truncated")
        #expect(partial.receive().isClosed)
        #expect(idle.receive().errorCode == "timedOut")
        #expect(idle.receive().isClosed)
        #expect(ContinuousClock.now - start < .seconds(4))
        #expect(fixture.server.connectionCount == 0)
    }

    @Test func aClientThatLeavesMidRequestCostsNothing() throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        do {
            let leaving = try RawClient(fixture.socketPath)
            leaving.send(ControlProtocol.requestFrame(id: 1, .download(path: "slow")))
            let deadline = ContinuousClock.now + .seconds(30)
            while fixture.handler.slowStarted == 0 && ContinuousClock.now < deadline { usleep(1000) }
            #expect(fixture.handler.slowStarted == 1)
        }  // closed here, its request still running
        let deadline = ContinuousClock.now + .seconds(30)
        while fixture.server.connectionCount > 0 && ContinuousClock.now < deadline { usleep(1000) }
        #expect(fixture.server.connectionCount == 0, "the connection is closed while its request runs")
        fixture.handler.release()  // the reply has nowhere to go
        let other = try RawClient(fixture.socketPath)
        other.send(ControlProtocol.requestFrame(id: 2, .download(path: "slow")))
        #expect(other.receive().ok("path") == "slow")
    }

    @Test func manyClientsAtOnceAreAllServed() async throws {
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        let pool = BlockingIOPool(threadCount: 16)
        defer { pool.shutdown() }
        let socketPath = fixture.socketPath
        let answered = await withTaskGroup(of: Int.self) { group in
            for client in 0..<48 {
                group.addTask {
                    await pool.run { () -> Int in
                        guard let connection = try? RawClient(socketPath) else { return 0 }
                        var good = 0
                        for request in 0..<5 {
                            let id = Int64(client * 10 + request)
                            connection.send(ControlProtocol.requestFrame(id: id, .item(path: "c\(client)/\(request)")))
                            let reply = connection.receive()
                            if reply.id == id && reply.ok("path") == "c\(client)/\(request)" { good += 1 }
                        }
                        return good
                    }
                }
            }
            return await group.reduce(0, +)
        }
        #expect(answered == 48 * 5)
    }

    @Test func aPeerOfAnotherUIDIsRefusedAndLogged() throws {
        let fixture = try ServerFixture(allowedUID: getuid() &+ 4242)
        defer { fixture.stop() }
        let client = try RawClient(fixture.socketPath)
        client.send(ControlProtocol.requestFrame(id: 1, .status))
        let reply = client.receive()
        #expect(reply.errorCode == "permissionDenied")
        #expect(reply.id == nil)
        #expect(client.receive().isClosed)
        #expect(fixture.log.withLock { $0.contains { $0.contains("refused") && $0.contains("uid \(getuid())") } })
    }

    @Test func aRealProcessOfAnotherUserIsRefusedByItsCredentials() throws {
        guard getuid() == 0 else { return }  // only root can become another user; CI runs as root
        let fixture = try ServerFixture()
        defer { fixture.stop() }
        // For this test only, the socket is reachable by everyone: the credential check alone
        // must keep the other user out.
        chmod(fixture.directory, 0o755)
        chmod(fixture.directory + "/run", 0o755)
        chmod(fixture.socketPath, 0o666)
        let script = """
            use IO::Socket::UNIX;
            $| = 1; $SIG{PIPE} = "IGNORE";  # the daemon may close before the request is written
            my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\\n";
            print "uid $<\\n";
            my $j = '{"version":1,"id":1,"request":"status"}';
            print $s pack("N", length $j) . $j;
            read($s, my $h, 4) == 4 or die "no reply\\n";
            read($s, my $b, unpack("N", $h));
            print "$b\\n";
            """
        let result = try ChildProcess.run(
            "/usr/bin/setpriv",
            ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/perl", "-e", script, fixture.socketPath],
            timeout: .seconds(20))
        #expect(result.output.hasPrefix("uid 65534\n"), "\(result)")
        #expect(result.output.contains("\"code\":\"permissionDenied\""), "\(result)")
        #expect(!result.output.contains("\"ok\""))
        #expect(fixture.log.withLock { $0.contains { $0.contains("refused") && $0.contains("uid 65534") } })
    }
}
