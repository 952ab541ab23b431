// `providerfs token` on a real mount (over each provider): a grant prints an access path under
// MOUNTPOINT/.scoped/, `token list` shows the id and never the token, `token revoke` ends it,
// `token log --json` has the grant and the revocation, and tokens survive a remount. Reading
// through the access path is enforcement's test (it is built separately).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct TokenMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "token-mount")
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
    }

    /// A mount of `source` over `kind`: the directory, or rclone or Apache serving it.
    func mount(over kind: ProviderKind = .local) throws -> ServedMount {
        try layout.mount(over: kind)
    }

    func jsonLines(_ text: String) -> [[String: Any]] {
        text.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    @Test(arguments: ProviderKind.available) func grantListRevokeLogAndARemount(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        var first: ServedMount? = try mount(over: kind)
        defer { first?.stop() }
        let mounted = try #require(first)

        // Grant: the access path and the id; the token is the path component after .scoped/.
        let grant = try providerfs(
            ["token", "grant", mounted.path("docs/report.txt"), "--ttl", "1h"], runtime: runtime)
        #expect(grant.status == 0, "\(grant)")
        let lines = grant.output.split(separator: "\n").map(String.init)
        let accessPath = try #require(lines.first)
        let prefix = mounted.mountpoint + "/.scoped/"
        #expect(accessPath.hasPrefix(prefix) && accessPath.hasSuffix("/report.txt"), "\(grant.output)")
        let token = String(accessPath.dropFirst(prefix.count).prefix { $0 != "/" })
        #expect(token.hasPrefix("pfs_") && token.count == 45, "\(token)")
        let id = try #require(
            lines.dropFirst().first?.split(separator: ",").first.map { String($0.dropFirst("id ".count)) })
        #expect(id.count == 12, "\(grant.output)")

        // A second grant, as JSON: one object with accessPath, id and expiry.
        let folder = try providerfs(["token", "grant", mounted.path("docs"), "--write", "--json"], runtime: runtime)
        #expect(folder.status == 0, "\(folder)")
        let folderGrant = try #require(jsonLines(folder.output).first)
        #expect((folderGrant["accessPath"] as? String)?.hasPrefix(prefix) == true)
        #expect(folderGrant["expiry"] is NSNull, "no TTL: no expiry")
        let folderID = try #require(folderGrant["id"] as? String)

        // List (the only mount: no MOUNTPOINT needed): ids, never the token.
        let list = try providerfs(["token", "list"], runtime: runtime)
        #expect(list.status == 0, "\(list)")
        #expect(list.output.contains(id) && list.output.contains(folderID), "\(list.output)")
        #expect(list.output.contains("docs/report.txt  read  expires "), "\(list.output)")
        #expect(list.output.contains("docs  read-write  no expiry"), "\(list.output)")
        #expect(!list.output.contains(token))
        let listJSON = try providerfs(["token", "list", mounted.mountpoint, "--json"], runtime: runtime)
        #expect(!listJSON.output.contains(token))
        let rows = jsonLines(listJSON.output)
        #expect(Set(rows.compactMap { $0["id"] as? String }) == [id, folderID], "\(listJSON.output)")
        let row = try #require(rows.first { $0["id"] as? String == id })
        let left = try #require(row["timeLeftMilliseconds"] as? Int)
        #expect(left > 3_500_000 && left <= 3_600_000, "\(row)")

        // Revoke; an unknown id and a second revoke are one clear sentence each, exit 1.
        let revoke = try providerfs(["token", "revoke", id], runtime: runtime)
        #expect(revoke.status == 0 && revoke.output.contains("revoked"), "\(revoke)")
        let again = try providerfs(["token", "revoke", id, mounted.mountpoint], runtime: runtime)
        #expect(again.status == 1 && again.error.contains("already ended"), "\(again)")
        let unknown = try providerfs(["token", "expire", "0123456789ab", mounted.mountpoint], runtime: runtime)
        #expect(unknown.status == 1 && unknown.error.contains("no token has the id 0123456789ab"), "\(unknown)")
        let live = try providerfs(["token", "list", "--json"], runtime: runtime)
        #expect(jsonLines(live.output).compactMap { $0["id"] as? String } == [folderID], "\(live.output)")

        // The log: the grant and the revocation of the first token, never the token.
        let log = try providerfs(["token", "log", "--json"], runtime: runtime)
        #expect(log.status == 0, "\(log)")
        #expect(!log.output.contains(token))
        let events = jsonLines(log.output).map { "\($0["event"] as? String ?? "?") \($0["tokenID"] as? String ?? "-")" }
        #expect(events.contains("grant \(id)") && events.contains("revocation \(id)"), "\(events)")
        #expect(
            !mounted.mount.child.standardError.contains(token) && !mounted.mount.child.standardOutput.contains(token))

        // With a second mount running, a command without MOUNTPOINT asks for one (ids are per mount).
        let other = try MountedFileSystem.providerfs(
            ["--source", source, "--cache", scratch + "/cache2"], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        defer { other.stop() }  // stopping twice is safe
        let ambiguous = try providerfs(["token", "list"], runtime: runtime)
        other.stop()
        #expect(ambiguous.status == 64, "\(ambiguous)")
        #expect(
            ambiguous.error.contains("2 ProviderFS mounts are running")
                && ambiguous.error.contains("name the MOUNTPOINT"),
            "\(ambiguous)")

        // A remount on the same cache: the live token is still there, the ended one too (--all).
        mounted.stop()
        first = nil
        let second = try mount(over: kind)
        defer { second.stop() }
        let after = try providerfs(["token", "list", second.mountpoint, "--json"], runtime: runtime)
        #expect(jsonLines(after.output).compactMap { $0["id"] as? String } == [folderID], "\(after)")
        let all = try providerfs(["token", "list", "--all", "--json"], runtime: runtime)
        let states = jsonLines(all.output).reduce(into: [String: String]()) {
            $0[$1["id"] as? String ?? "?"] = $1["state"] as? String
        }
        #expect(states == [id: "revoked", folderID: "live"], "\(all)")

        // A path outside any mount is refused in one sentence.
        let outside = try providerfs(["token", "grant", source + "/docs/report.txt"], runtime: runtime)
        #expect(outside.status == 1 && outside.error.contains("is not inside a ProviderFS mount"), "\(outside)")
    }
}

// MARK: 10,000 tokens

/// One request on an open control connection (the protocol of docs/CONTROL.md, by hand: this
/// target does not link the CLI's client) and its reply object.
private func controlRequest(_ fd: Int32, id: Int, _ request: String, _ arguments: [String: Any]) throws -> [String: Any]
{
    let bytes = try controlRequestBytes(fd, id: id, request, arguments)
    let reply = try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any] ?? [:]
    guard reply["id"] as? Int == id else { throw TestSupportError("reply to another request: \(reply)") }
    return reply
}

/// One request and its reply's payload, unread.
private func controlRequestBytes(
    _ fd: Int32, id: Int, _ request: String, _ arguments: [String: Any]
) throws -> [UInt8] {
    let body = try JSONSerialization.data(
        withJSONObject: ["version": 1, "id": id, "request": request, "arguments": arguments])
    let length = UInt32(body.count)
    try UnixSocket.writeAll(
        fd,
        [UInt8(length >> 24), UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF)]
            + Array(body))
    func read(_ count: Int) throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let got = bytes.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + done, count - done, 0) }
            if got < 0 && errno == EINTR { continue }
            guard got > 0 else { throw TestSupportError("the daemon closed the control connection") }
            done += got
        }
        return bytes
    }
    let prefix = try read(4)
    let size = Int(prefix[0]) << 24 | Int(prefix[1]) << 16 | Int(prefix[2]) << 8 | Int(prefix[3])
    return try read(size)
}

private func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

private func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct TokenScaleMountTests {
    /// 200 `providerfs token grant` in a shell loop: each one's seconds, from the shell.
    static func grantLoop(_ file: String, runtime: String, count: Int = 200) throws -> [Double] {
        let script = """
            for i in $(seq \(count)); do
              s=$(date +%s%N)
              \(quoted(productsDirectory + "/providerfs")) token grant \(quoted(file)) --ttl 1h > /dev/null || exit 1
              e=$(date +%s%N)
              echo $((e - s))
            done
            """
        let run = try shell(
            "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) exec sh -c \(quoted(script))", timeout: .seconds(600))
        #expect(run.status == 0, "\(run.error)")
        return run.output.split(separator: "\n").compactMap { Double($0).map { $0 / 1e9 } }
    }

    /// `providerfs token list` (with `extra` arguments) three times, each after the daemon's own
    /// reply to `tokenList` fetched raw over the socket: the output, the CLI's best time (start to
    /// exit) and the raw reply's best time (the daemon's list, its encoding and the socket).
    /// Three rounds of the daemon's raw reply to `tokenList` and of `providerfs token list`, each
    /// pair in the same moments. Returns the CLI's output, its best wall time, its best processor
    /// time (what it computes itself: decoding and formatting) and the raw reply's best time.
    static func listThrice(
        _ extra: [String], runtime: String, socket: String
    ) throws -> (output: String, best: Double, processor: Double, raw: Double) {
        var (best, processor, raw) = (Double.infinity, Double.infinity, Double.infinity)
        var output = ""
        let clock = ContinuousClock()
        for round in 0..<3 {
            let fd = try UnixSocket.connect(socket)
            defer { close(fd) }
            let rawStart = clock.now
            let bytes = try controlRequestBytes(fd, id: 100_000 + round, "tokenList", [:])
            raw = min(raw, seconds(clock.now - rawStart))
            #expect(bytes.count > 1_000_000)
            let start = clock.now
            let list = try ChildProcess.runMeasured(
                productsDirectory + "/providerfs", ["token", "list"] + extra,
                environment: ["PROVIDERFS_RUNTIME_DIR": runtime], timeout: .seconds(90))
            best = min(best, seconds(clock.now - start))
            processor = min(processor, list.processorSeconds)
            #expect(list.status == 0, "\(list.error)")
            output = list.output
        }
        return (output, best, processor, raw)
    }

    @Test func tenThousandTokensGrantedListedAndRemounted() throws {
        guard requireFUSE() else { return }
        let layout = try MountLayout(prefix: "token-scale")
        defer { layout.remove() }
        let (source, runtime, cache) = (layout.source, layout.runtime, layout.cache)
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
        func mount() throws -> MountedFileSystem {
            try MountedFileSystem.providerfs(
                ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        }
        var first: MountedFileSystem? = try mount()
        defer { first?.stop() }
        let mounted = try #require(first)
        let file = mounted.path("docs/report.txt")

        // 200 grants from the shell with no tokens yet…
        let early = try Self.grantLoop(file, runtime: runtime)
        #expect(early.count == 200)

        // …10,000 through the control socket, 8 connections at once…
        let sockets = try FileManager.default.contentsOfDirectory(atPath: runtime + "/mounts")
            .filter { $0.hasSuffix(".control.sock") }
        let socket = try #require(sockets.count == 1 ? runtime + "/mounts/" + sockets[0] : nil, "\(sockets)")
        let clock = ContinuousClock()
        let socketStart = clock.now
        let failures = Locked<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            do {
                let fd = try UnixSocket.connect(socket)
                defer { close(fd) }
                for index in stride(from: worker, to: 10_000, by: 8) {
                    var arguments: [String: Any] = ["path": "docs/report.txt"]
                    if index % 2 == 0 { arguments["ttlMilliseconds"] = 3_600_000 + index }
                    if index % 3 == 0 { arguments["uses"] = index % 7 + 1 }
                    let reply = try controlRequest(fd, id: index + 1, "tokenGrant", arguments)
                    if reply["ok"] == nil { throw TestSupportError("grant \(index): \(reply)") }
                }
            } catch {
                failures.withLock { $0.append("\(error)") }
            }
        }
        let socketTime = clock.now - socketStart
        #expect(failures.value.isEmpty, "\(failures.value.prefix(3))")

        // …and 200 from the shell again, with 10,200 tokens: each grant writes its own row, so it
        // costs what it did with none. (The whole-file store took ~0.5 s a grant here at 10,000
        // tokens in a debug build, ~16× a grant with none; medians, so that the load of other
        // tests does not decide.)
        let late = try Self.grantLoop(file, runtime: runtime)
        let (earlyMedian, lateMedian) = (median(early), median(late))
        print(
            "token scale: 10,000 grants over the socket in \(socketTime); shell loop median per grant: "
                + "\(earlyMedian) s with 0–200 tokens, \(lateMedian) s with 10,200–10,400")
        #expect(
            lateMedian < max(3 * earlyMedian, earlyMedian + 0.1),
            "a grant cost \(lateMedian) s with 10,200 tokens, \(earlyMedian) s with none")

        // The CLI lists them all. What it computes itself (decoding the reply, formatting) is
        // bounded by its processor time, within 3× the daemon's raw reply + 0.25 s: its wall time
        // mostly waits for the daemon, whose reply slows with the load of the tests beside it
        // (a clean-clone CI saw 1.3 s of wall time for 0.3 s of raw reply in one run and 0.15 s in
        // another). Debug build: the CLI's processor time 0.05–0.11 s now; 1.5–2.4 s before D-338
        // (the client re-encoded the reply through JSONSerialization and formatted with
        // Calendar), which this bound refuses.
        let text = try Self.listThrice([], runtime: runtime, socket: socket)
        #expect(text.output.split(separator: "\n").count == 10_400)
        #expect(
            text.processor < 3 * text.raw + 0.25,
            "token list of 10,400 took \(text.processor) s of processor time at best, the raw reply \(text.raw) s")
        let json = try Self.listThrice(["--json"], runtime: runtime, socket: socket)
        let ids = Set(
            json.output.split(separator: "\n").compactMap {
                ((try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any])?["id"] as? String
            })
        #expect(ids.count == 10_400)
        #expect(
            json.processor < 3 * json.raw + 0.25,
            "token list --json of 10,400 took \(json.processor) s of processor time at best, the raw reply \(json.raw) s"
        )
        print(
            "token scale: token list of 10,400 best \(text.best) s (processor \(text.processor) s), --json best "
                + "\(json.best) s (processor \(json.processor) s); the daemon's raw reply best \(min(text.raw, json.raw)) s"
        )

        // All of them survive a remount.
        mounted.stop()
        first = nil
        let second = try mount()
        defer { second.stop() }
        let after = try providerfs(["token", "list", second.mountpoint], runtime: runtime)
        #expect(after.output.split(separator: "\n").count == 10_400, "\(after.error)")
    }

    @Test func killedMidGrantKeepsEveryGrantItAnswered() throws {
        guard requireFUSE() else { return }
        let layout = try MountLayout(prefix: "token-kill")
        defer { layout.remove() }
        let (source, runtime, cache) = (layout.source, layout.runtime, layout.cache)
        writeTestFile(source + "/a.txt", Array("a".utf8))
        func mount() throws -> MountedFileSystem {
            try MountedFileSystem.providerfs(
                ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
        }
        let first = try mount()
        defer { first.stop() }
        let sockets = try FileManager.default.contentsOfDirectory(atPath: runtime + "/mounts")
            .filter { $0.hasSuffix(".control.sock") }
        let socket = try #require(sockets.count == 1 ? runtime + "/mounts/" + sockets[0] : nil, "\(sockets)")

        // 4 connections grant as fast as they can; the daemon is killed (-9) once 300 are
        // answered, with grants in flight. Every grant answered must survive: it was on disk
        // before its reply was sent.
        let answered = Locked<[String]>([])
        let finished = DispatchSemaphore(value: 0)
        // Threads of their own: each loops until the daemon dies (concurrentPerform would run
        // only as many at once as there are cores).
        for worker in 0..<4 {
            Thread {
                defer { finished.signal() }
                guard let fd = try? UnixSocket.connect(socket) else { return }
                defer { close(fd) }
                var index = 0
                while true {
                    index += 1
                    guard
                        let reply = try? controlRequest(
                            fd, id: index, "tokenGrant", ["path": "a.txt", "uses": worker + 1]),
                        let id = (reply["ok"] as? [String: Any]).flatMap({ $0["info"] as? [String: Any] })?["id"]
                            as? String
                    else { return }
                    answered.withLock { $0.append(id) }
                }
            }.start()
        }
        let deadline = ContinuousClock.now + .seconds(120)
        while answered.value.count < 300 && ContinuousClock.now < deadline { usleep(1000) }
        first.child.signal(SIGKILL)
        for _ in 0..<4 {
            #expect(finished.wait(timeout: .now() + 30) == .success, "a worker still waits on a dead daemon")
        }
        #expect(first.child.wait(timeout: .seconds(10)) != nil, "the daemon did not die")
        first.stop()
        let granted = Set(answered.value)
        #expect(granted.count >= 300)

        let second = try mount()
        defer { second.stop() }
        let list = try providerfs(["token", "list", second.mountpoint, "--json"], runtime: runtime)
        #expect(list.status == 0, "\(list.error)")
        let listed = Set(
            list.output.split(separator: "\n").compactMap {
                ((try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any])?["id"] as? String
            })
        let lost = granted.subtracting(listed)
        #expect(lost.isEmpty, "\(lost.count) of \(granted.count) answered grants lost by a kill -9")
        print("token kill: \(granted.count) grants answered before the kill -9, \(listed.count) listed after")
    }
}
