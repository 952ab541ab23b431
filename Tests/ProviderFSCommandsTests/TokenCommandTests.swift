// `providerfs token`: the command line (usage errors), the control requests (strict arguments, a
// seeded fuzz that never grants), and the daemon's side over a real ProviderFileSystem and a
// TokenAuthority on a manual clock (grant, list without the secret, revoke, expire, the log).

import AccessTokens
import ControlWire
import Foundation
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import VirtualFileSystem

@testable import ProviderFSCommands

private func parseGrant(_ words: [String]) throws(UsageError) -> TokenGrantRequest {
    var list = ArgumentList(words, commandName: "providerfs token")
    let request = try TokenCommand.parseGrant(&list)
    _ = try list.requiredPositional("PATH")
    try list.finish()
    return request
}

private func usageError(_ words: [String]) -> String? {
    do {
        _ = try parseGrant(words)
        return nil
    } catch {
        return error.message
    }
}

private func parsed(_ kind: String, _ arguments: [String: Any]) -> Result<ControlRequest, ControlError> {
    let object: [String: Any] = ["version": 1, "id": 1, "request": kind, "arguments": arguments]
    let data = try! JSONSerialization.data(withJSONObject: object)
    return ControlProtocol.parseRequest(Array(data)).request
}

@Suite("providerfs token: the command line")
struct TokenCommandLineTests {
    @Test("grant flags parse to the request the daemon gets")
    func grantFlags() throws {
        #expect(try parseGrant(["f"]) == TokenGrantRequest(path: "", write: false))
        let full = try parseGrant(["--write", "f", "--ttl", "10m", "--pid=123", "--uses", "3"])
        #expect(full == TokenGrantRequest(path: "", write: true, ttlMilliseconds: 600_000, pid: 123, uses: 3))
        #expect(try parseGrant(["f", "--ttl", "500ms"]).ttlMilliseconds == 500)
        #expect(try parseGrant(["f", "--ttl", "1h"]).ttlMilliseconds == 3_600_000)
        #expect(try parseGrant(["f", "--ttl=2s"]).ttl == .seconds(2))
    }

    @Test("usage errors name what is wrong")
    func usageErrors() {
        let cases: [([String], String)] = [
            ([], "missing PATH"),
            (["f", "--ttl"], "--ttl needs a value"),
            (["f", "--ttl", "5"], "not a valid duration"),
            (["f", "--ttl", "-5s"], "not a valid duration"),
            (["f", "--ttl", "0s"], "a TTL must be longer than zero"),
            (["f", "--ttl", "0.5ms"], "a TTL is at least 1ms"),
            (["f", "--ttl", "9000h"], "longer than the maximum"),
            (["f", "--ttl", "99999999999h"], "not a valid duration"),
            (["f", "--pid", "0"], "not a process id"),
            (["f", "--pid", "-3"], "not a process id"),
            (["f", "--pid", "abc"], "not a process id"),
            (["f", "--pid", "99999999999"], "not a process id"),
            (["f", "--uses", "0"], "not a count from 1"),
            (["f", "--uses", "many"], "not a count from 1"),
            (["f", "--write=yes"], "takes no value"),
            (["f", "--read"], "unknown option '--read'"),
            (["f", "g"], "unexpected argument 'g'"),
        ]
        for (words, expected) in cases {
            let message = usageError(words)
            #expect(message?.contains(expected) == true, "\(words): \(message ?? "accepted")")
        }
    }

    @Test("the command exits 64 on usage errors and 1 for a path outside any mount", .blockingThreads)
    func exitStatuses() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        #expect(await ProviderFSCLI.main(["providerfs", "token"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "steal"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "grant"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "grant", directory.path, "--ttl", "0s"]) == 64)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "grant", directory.path, "--bogus"]) == 64)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "revoke"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "revoke", "not-an-id", directory.path]) == 64)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "list", "--bogus"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "log", "a", "b"]) == ExitStatus.usage)
        #expect(
            await ProviderFSCLI.main(["providerfs", "token", "grant", directory.path, "--ttl", "1h"])
                == ExitStatus.failure)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "list", directory.path]) == ExitStatus.failure)
        #expect(
            await ProviderFSCLI.main(["providerfs", "token", "expire", "0123456789ab", directory.path])
                == ExitStatus.failure)
        #expect(await ProviderFSCLI.main(["providerfs", "token", "--help"]) == ExitStatus.success)
    }

    @Test("time left and the access path")
    func formatting() {
        #expect(TokenCommand.timeLeft(milliseconds: 850) == "850ms")
        #expect(TokenCommand.timeLeft(milliseconds: 42_000) == "42s")
        #expect(TokenCommand.timeLeft(milliseconds: 250_000) == "4m 10s")
        #expect(TokenCommand.timeLeft(milliseconds: 7_500_000) == "2h 5m")
        #expect(TokenCommand.timeLeft(milliseconds: 100_000_000) == "1d 3h")
        let row = #"{"id":"a","path":"docs/a.txt","identifier":"i","mode":"read","state":"live","grantedAt":0}"#
        guard let info = try? JSONDecoder().decode(ControlToken.self, from: Data(row.utf8)) else {
            Issue.record("cannot decode a row")
            return
        }
        let file = ControlTokenGrant(token: "pfs_x_y", isDirectory: false, name: "a.txt", info: info)
        #expect(
            TokenCommand.accessPath(mountpoint: "/m", token: "pfs_x_y", granted: file) == "/m/.scoped/pfs_x_y/a.txt")
        let folder = ControlTokenGrant(token: "pfs_x_y", isDirectory: true, name: "docs", info: info)
        #expect(TokenCommand.accessPath(mountpoint: "/m", token: "pfs_x_y", granted: folder) == "/m/.scoped/pfs_x_y")
        let now = Date()
        var live = info
        live.timeLeftMilliseconds = 250_000
        live.expiresAt = now.addingTimeInterval(250)
        #expect(TokenCommand.expiry(live, now: now).hasSuffix("(in 4m 10s)"))
        #expect(TokenCommand.expiry(live, now: now).hasPrefix("expires "))
        #expect(TokenCommand.expiry(info, now: now) == "no expiry")
    }
}

@Suite("Token control requests")
struct TokenControlRequestTests {
    @Test("token requests round trip through the parser")
    func roundTrip() throws {
        let requests: [ControlRequest] = [
            .tokenGrant(TokenGrantRequest(path: "a/b", write: true, ttlMilliseconds: 5, pid: 7, uses: 2)),
            .tokenGrant(TokenGrantRequest(path: "", write: false)),
            .tokenList(includeEnded: false), .tokenList(includeEnded: true),
            .tokenRevoke(id: "0123456789ab"), .tokenExpire(id: "ffffffffffff"),
            .tokenLog(after: 0), .tokenLog(after: 42),
        ]
        for request in requests {
            let frame = ControlProtocol.requestFrame(id: 9, request)
            let (id, result) = ControlProtocol.parseRequest(Array(frame.dropFirst(4)))
            #expect(id == 9)
            #expect(try result.get() == request)
        }
    }

    @Test("bad arguments are invalidArguments with a clear message")
    func strictArguments() {
        let cases: [(String, [String: Any], String)] = [
            ("tokenGrant", [:], "needs a string argument \"path\""),
            ("tokenGrant", ["path": 5], "needs a string argument \"path\""),
            ("tokenGrant", ["path": "/etc/passwd"], "relative to the mount root"),
            ("tokenGrant", ["path": "a/../../x"], "relative to the mount root"),
            ("tokenGrant", ["path": ".."], "relative to the mount root"),
            ("tokenGrant", ["path": ".scoped/pfs_x/a"], "access path"),
            ("tokenGrant", ["path": "a", "write": 1], "true or false"),
            ("tokenGrant", ["path": "a", "ttlMilliseconds": 0], "a TTL must be longer than zero"),
            ("tokenGrant", ["path": "a", "ttlMilliseconds": -5], "a TTL must be longer than zero"),
            ("tokenGrant", ["path": "a", "ttlMilliseconds": 1 << 50], "longer than the maximum"),
            ("tokenGrant", ["path": "a", "ttlMilliseconds": 1.5], "integer number of milliseconds"),
            ("tokenGrant", ["path": "a", "ttlMilliseconds": "1h"], "integer number of milliseconds"),
            ("tokenGrant", ["path": "a", "pid": 0], "is not a process id"),
            ("tokenGrant", ["path": "a", "pid": -1], "is not a process id"),
            ("tokenGrant", ["path": "a", "pid": 1 << 40], "is not a process id"),
            ("tokenGrant", ["path": "a", "pid": true], "must be an integer"),
            ("tokenGrant", ["path": "a", "uses": 0], "uses must be at least 1"),
            ("tokenGrant", ["path": "a", "uses": 1 << 40], "at most"),
            ("tokenGrant", ["path": "a", "token": "pfs_x"], "\"token\" is not an argument"),
            ("tokenList", ["includeEnded": "yes"], "true or false"),
            ("tokenList", ["all": true], "not an argument"),
            ("tokenRevoke", [:], "needs a string argument \"id\""),
            ("tokenRevoke", ["id": 12], "needs a string argument \"id\""),
            ("tokenRevoke", ["id": "../../etc"], "is not a token id"),
            ("tokenRevoke", ["id": ""], "is not a token id"),
            ("tokenExpire", ["id": String(repeating: "a", count: 65)], "is not a token id"),
            ("tokenExpire", ["id": "0123456789ab", "x": 1], "\"x\" is not an argument"),
            ("tokenLog", ["after": -1], "sequence number"),
            ("tokenLog", ["after": "3"], "sequence number"),
            ("tokenLog", ["since": 3], "not an argument"),
        ]
        for (kind, arguments, expected) in cases {
            guard case .failure(let error) = parsed(kind, arguments) else {
                Issue.record("\(kind) \(arguments) was accepted")
                continue
            }
            #expect(error.code == .invalidArguments, "\(kind) \(arguments)")
            #expect(error.message.contains(expected), "\(kind) \(arguments): \(error.message)")
        }
    }

    /// Random values in every field of tokenGrant, sent to a real daemon handler: a grant happens
    /// only for a request whose every field is valid, and nothing traps.
    @Test(.blockingThreads, arguments: [UInt64(11), 12, 13])
    func fuzzedArgumentsNeverGrantWhatIsInvalid(seed: UInt64) async throws {
        let fixture = try TokenDaemonFixture()
        defer { fixture.remove() }
        var random = SeededRandom(seed: seed)
        let keys = ["path", "write", "ttlMilliseconds", "pid", "uses", "token", "id"]
        let values: [Any] = [
            "a.txt", "", "/", "..", "docs/../..", ".scoped", "missing", "docs", 0, -1, 1, 2, Int64.max, Int64.min,
            1.5, true, false, NSNull(), [1], ["k": 1], 1 << 50,
        ]
        for _ in 0..<300 {
            var arguments: [String: Any] = [:]
            for _ in 0..<Int.random(in: 0...5, using: &random) {
                arguments[keys[Int.random(in: 0..<keys.count, using: &random)]] =
                    values[Int.random(in: 0..<values.count, using: &random)]
            }
            let before = fixture.authority.list(includeEnded: true).count
            switch parsed("tokenGrant", arguments) {
            case .failure(let error):
                #expect(error.code == .invalidArguments, "\(arguments): \(error)")
            case .success(let request):
                let result = await fixture.reply(request)
                let after = fixture.authority.list(includeEnded: true).count
                switch result {
                case .success:
                    #expect(after == before + 1)
                    guard case .tokenGrant(let grant) = request else { Issue.record("not a grant"); continue }
                    #expect(["a.txt", "", "docs"].contains(grant.path), "\(arguments)")
                    #expect(grant.ttlMilliseconds.map { $0 > 0 } ?? true)
                    #expect(grant.uses.map { $0 >= 1 } ?? true)
                case .failure:
                    #expect(after == before, "\(arguments) failed yet granted")
                }
            }
        }
        // Random ids for revoke and expire: only a live token's own id ends it, nothing else.
        let liveIDs = Set(fixture.authority.list().map(\.id))
        let idValues: [Any] = [
            "", "0", "zz", "../x", String(repeating: "f", count: 12), String(repeating: "a", count: 65), 7, NSNull(),
            liveIDs.first ?? "", (liveIDs.first ?? "").uppercased(), "pfs_abc",
        ]
        for index in 0..<200 {
            let kind = index % 2 == 0 ? "tokenRevoke" : "tokenExpire"
            let raw = idValues[Int.random(in: 0..<idValues.count, using: &random)]
            let before = Set(fixture.authority.list().map(\.id))
            switch parsed(kind, ["id": raw]) {
            case .failure(let error): #expect(error.code == .invalidArguments, "\(raw): \(error)")
            case .success(let request):
                let result = await fixture.reply(request)
                let ended = before.subtracting(fixture.authority.list().map(\.id))
                if case .success = result, let id = (raw as? String)?.lowercased() {
                    #expect(ended == [id], "\(raw)")
                } else {
                    #expect(ended.isEmpty, "\(raw) failed yet ended \(ended)")
                }
            }
        }
        await fixture.fileSystem.shutdown()
    }
}

/// A daemon's token side: a ProviderFileSystem over a temporary source and a TokenAuthority on
/// a manual clock, answering control requests as `MountControl` does.
struct TokenDaemonFixture {
    let source: TemporaryDirectory
    let cache: TemporaryDirectory
    let clock = ManualClock()
    let fileSystem: ProviderFileSystem
    let authority: TokenAuthority
    let control: MountControl
    let peer = UnixSocket.PeerCredentials(pid: 4242, uid: 1000, gid: 1000)

    init() throws {
        source = try TemporaryDirectory()
        cache = try TemporaryDirectory()
        try source.write("a.txt", Array("hello".utf8))
        try source.write("docs/b.txt", Array("inside".utf8))
        fileSystem = try MountComposition.makeFileSystem(source: source.path, cacheDirectory: cache.path)
        authority = TokenAuthority(storeDirectory: cache.path, clock: clock)
        control = MountControl(
            fileSystem: fileSystem, mountpoint: "/m", source: source.path, started: .now, tokens: authority)
    }

    func reply(_ request: ControlRequest) async -> Result<[String: Any], ControlError> {
        await control.handle(request, peer: peer).map {
            (try? JSONSerialization.jsonObject(with: Data($0))) as? [String: Any] ?? [:]
        }
    }

    func remove() {
        source.remove()
        cache.remove()
    }
}

@Suite("Tokens in the daemon", .blockingThreads)
struct MountTokensTests {
    @Test("grant resolves the path, list shows it without the secret, revoke and expire end it, the log has it all")
    func grantListRevokeExpireLog() async throws {
        let fixture = try TokenDaemonFixture()
        defer { fixture.remove() }
        let granted = try await fixture.reply(
            .tokenGrant(TokenGrantRequest(path: "a.txt", write: false, ttlMilliseconds: 60_000, uses: 3))
        ).get()
        let token = try #require(granted["token"] as? String)
        #expect(token.hasPrefix("pfs_") && token.count == 45)
        #expect(granted["isDirectory"] as? Bool == false)
        #expect(granted["name"] as? String == "a.txt")
        let info = try #require(granted["info"] as? [String: Any])
        let id = try #require(info["id"] as? String)
        #expect(info["path"] as? String == "a.txt")
        #expect(info["identifier"] as? String == "a.txt")
        #expect(info["mode"] as? String == "read")
        #expect(info["timeLeftMilliseconds"] as? Int == 60_000)
        #expect(info["usesLeft"] as? Int == 3)
        // The authority recognises the token as a grant on the resolved item.
        #expect(
            fixture.authority.check(token, caller: TokenCaller(pid: 1, uid: 1000)).grant?.scope.identifier == "a.txt")

        let folder = try await fixture.reply(
            .tokenGrant(TokenGrantRequest(path: "docs", write: true, pid: getpid()))
        ).get()
        #expect(folder["isDirectory"] as? Bool == true)
        let folderID = try #require((folder["info"] as? [String: Any])?["id"] as? String)
        #expect((folder["info"] as? [String: Any])?["boundPID"] as? Int == Int(getpid()))
        #expect((folder["info"] as? [String: Any])?["mode"] as? String == "readWrite")

        // Refusals: a missing item, a pid that is not running, an unknown id; nothing granted.
        let missing = await fixture.reply(.tokenGrant(TokenGrantRequest(path: "nope", write: false)))
        if case .failure(let error) = missing { #expect(error.code == .notFound) } else { Issue.record("granted") }
        let noProcess = await fixture.reply(
            .tokenGrant(TokenGrantRequest(path: "a.txt", write: false, pid: 999_999_999)))
        if case .failure(let error) = noProcess {
            #expect(error.code == .invalidArguments && error.message.contains("no process"), "\(error)")
        } else {
            Issue.record("granted to a process that does not run")
        }
        let unknown = await fixture.reply(.tokenRevoke(id: "0123456789ab"))
        if case .failure(let error) = unknown {
            #expect(error.code == .invalidArguments && error.message.contains("no token has the id"), "\(error)")
        } else {
            Issue.record("revoked an unknown id")
        }

        // The list: both, ids only; the secret appears nowhere in the reply bytes.
        let listBytes = try await fixture.control.handle(.tokenList(includeEnded: false), peer: fixture.peer).get()
        #expect(!String(decoding: listBytes, as: UTF8.self).contains(token))
        let listed = try await fixture.reply(.tokenList(includeEnded: false)).get()["tokens"] as? [[String: Any]] ?? []
        #expect(Set(listed.compactMap { $0["id"] as? String }) == [id, folderID])

        // Time passes on the manual clock: time left follows.
        fixture.clock.advance(by: .seconds(20))
        let row = try #require(fixture.authority.info(id: id))
        #expect(ControlToken(row).timeLeftMilliseconds == 40_000)

        // Revoke one, expire the other; revoking again is a failure, not a second revocation.
        let revoked = try await fixture.reply(.tokenRevoke(id: id)).get()
        #expect(revoked["state"] as? String == "revoked")
        let again = await fixture.reply(.tokenRevoke(id: id))
        if case .failure(let error) = again {
            #expect(error.code == .failed && error.message.contains("already ended"), "\(error)")
        } else {
            Issue.record("revoked twice")
        }
        let expired = try await fixture.reply(.tokenExpire(id: folderID.uppercased().lowercased())).get()
        #expect(expired["state"] as? String == "expired")
        #expect(fixture.authority.check(token, caller: TokenCaller(pid: 1, uid: 1000)).denialReason == .revoked)

        let live = try await fixture.reply(.tokenList(includeEnded: false)).get()["tokens"] as? [[String: Any]]
        #expect(live?.isEmpty == true)
        let all = try await fixture.reply(.tokenList(includeEnded: true)).get()["tokens"] as? [[String: Any]] ?? []
        #expect(Set(all.compactMap { $0["state"] as? String }) == ["revoked", "expired"])

        // The log: grants, the revocation and the expiry, by the peer; never the token.
        let logBytes = try await fixture.control.handle(.tokenLog(after: 0), peer: fixture.peer).get()
        #expect(!String(decoding: logBytes, as: UTF8.self).contains(token))
        let entries = try await fixture.reply(.tokenLog(after: 0)).get()["entries"] as? [[String: Any]] ?? []
        let events = entries.map { "\($0["event"] as? String ?? "?") \($0["tokenID"] as? String ?? "-")" }
        #expect(events.contains("grant \(id)") && events.contains("grant \(folderID)"), "\(events)")
        #expect(events.contains("revocation \(id)") && events.contains("expiry \(folderID)"), "\(events)")
        let grantEntry = entries.first { $0["event"] as? String == "grant" }
        #expect(grantEntry?["pid"] as? Int == 4242 && grantEntry?["uid"] as? Int == 1000, "\(entries)")
        let lastSequence = try #require(entries.last?["sequence"] as? Int)
        let later = try await fixture.reply(.tokenLog(after: UInt64(lastSequence))).get()["entries"] as? [Any]
        #expect(later?.isEmpty == true)
        await fixture.fileSystem.shutdown()
    }

    @Test("a mount without an authority answers token requests with a failure")
    func noAuthority() async throws {
        let fixture = try TokenDaemonFixture()
        defer { fixture.remove() }
        let control = MountControl(
            fileSystem: fixture.fileSystem, mountpoint: "/m", source: fixture.source.path, started: .now)
        let result = await control.handle(.tokenList(includeEnded: false), peer: fixture.peer)
        if case .failure(let error) = result {
            #expect(error.message.contains("no tokens"))
        } else {
            Issue.record("answered")
        }
        await fixture.fileSystem.shutdown()
    }

    @Test("token list of 10,000 tokens: one reply, decoded and formatted well within a second or two")
    func tenThousandTokens() async throws {
        let fixture = try TokenDaemonFixture()
        defer { fixture.remove() }
        // Without a store: 10,000 grants each rewriting the token file is the library's cost,
        // not the list's (TokenScaleTests measures it).
        let authority = TokenAuthority(storeDirectory: nil, clock: fixture.clock)
        for index in 0..<10_000 {
            _ = try authority.grant(
                scope: TokenScope(identifier: "a.txt", path: "a.txt"), mode: .read,
                ttl: .seconds(60 + index), uses: index % 7 + 1)
        }
        let control = MountControl(
            fileSystem: fixture.fileSystem, mountpoint: "/m", source: fixture.source.path, started: .now,
            tokens: authority)
        let clock = ContinuousClock()
        let started = clock.now
        let bytes = try await control.handle(.tokenList(includeEnded: false), peer: fixture.peer).get()
        let answered = clock.now
        // The client's side: the whole reply payload, decoded in one pass (D-338), then formatted.
        let payload = Array(ControlProtocol.responseFrame(id: 1, .success(bytes)).dropFirst(4))
        let (id, parsed) = ControlProtocol.parseResponse(payload, as: ControlTokenList.self)
        let list = try parsed.get()
        let decoded = clock.now
        let now = Date()
        let lines = list.tokens.map { TokenCommand.describe($0, now: now) }
        let elapsed = clock.now - started
        #expect(id == 1)
        #expect(lines.count == 10_000)
        #expect(bytes.count < ControlClient.maximumReplySize, "\(bytes.count) bytes")
        #expect(elapsed < .seconds(5), "answer \(answered - started), all \(elapsed)")
        print(
            "token list of 10,000: \(bytes.count) bytes, answered in \(answered - started), decoded in "
                + "\(decoded - answered), formatted in \(clock.now - decoded)")
        // Over a real control socket, as the CLI sends it: one reply of ~2 MB, past the 1 MiB of
        // a request.
        let socketDirectory = try makeTemporaryDirectory(prefix: "token-socket")
        defer { removeTreeWithinFileSystem(socketDirectory) }
        let server = ControlServer(socketPath: socketDirectory + "/control.sock", handler: control, log: { _ in })
        try server.start()
        defer { server.stop() }
        let client = ControlClient(socketPath: socketDirectory + "/control.sock", mountpoint: "/m")
        let socketStarted = clock.now
        let overSocket = try await client.send(.tokenList(includeEnded: false), as: ControlTokenList.self)
        #expect(overSocket.tokens.count == 10_000)
        print("token list of 10,000 over the socket: \(clock.now - socketStarted)")
        await fixture.fileSystem.shutdown()
    }
}

@Suite("Control reply parsing")
struct ControlReplyParsingTests {
    struct Reply: Decodable, Sendable, Equatable {
        var count: Int
    }

    static func parse(_ text: String) -> (id: Int64?, result: Result<Reply, ControlProtocol.ReplyFailure>) {
        ControlProtocol.parseResponse(Array(text.utf8), as: Reply.self)
    }

    static func code(_ result: Result<Reply, ControlProtocol.ReplyFailure>) -> ControlError.Code? {
        if case .failure(.control(let error)) = result { return error.code }
        return nil
    }

    @Test("one pass: the ok value typed, the daemon's error, and each kind of bad reply told apart")
    func kinds() {
        let ok = Self.parse(#"{"version":1,"id":7,"ok":{"count":3}}"#)
        #expect(ok.id == 7)
        #expect((try? ok.result.get()) == Reply(count: 3))
        // Key order does not matter; an error wins over ok; its code and message are kept.
        let error = Self.parse(#"{"error":{"code":"notFound","message":"no such item"},"id":8,"version":1}"#)
        if case .failure(.control(let failure)) = error.result {
            #expect(failure.code == .notFound && failure.message == "no such item" && error.id == 8)
        } else {
            Issue.record("\(error)")
        }
        #expect(Self.code(Self.parse(#"{"version":1,"id":9,"error":{"code":"newKind"}}"#).result) == .failed)
        for text in ["", "[]", "{", "null", #""text""#] {
            #expect(Self.code(Self.parse(text).result) == .malformed, "\(text)")
        }
        #expect(Self.code(Self.parse(#"{"version":2,"id":1,"ok":{"count":3}}"#).result) == .unsupportedVersion)
        #expect(Self.code(Self.parse(#"{"id":1,"ok":{"count":3}}"#).result) == .unsupportedVersion)
        #expect(Self.code(Self.parse(#"{"version":1,"id":1}"#).result) == .malformed)
        #expect(Self.code(Self.parse(#"{"version":1,"id":1,"ok":null}"#).result) == .malformed)
        // An ok this version cannot read is not a malformed message.
        if case .failure(.unreadable(let why)) = Self.parse(#"{"version":1,"id":1,"ok":{"count":"3"}}"#).result {
            #expect(why.contains("count"), "\(why)")
        } else {
            Issue.record("an unreadable ok was not reported as unreadable")
        }
        // A bad id does not hide the reply.
        #expect(Self.parse(#"{"version":1,"id":true,"ok":{"count":1}}"#).id == nil)
    }
}
