// WebDAVProvider against real servers on 127.0.0.1: `rclone serve webdav` of a temporary directory
// (listing, stat, ranged reads, writes, conflicts, authentication), Apache 2.4 mod_dav_fs (the same
// listing, read, write and conflict tests, parameterized over both servers), Python's http.server
// (a server that ignores Range and sends no ETag), and a socket that never answers (deadlines).
// Every server is stopped by its PID when the test ends, passed or failed. Without rclone or
// apache2 these tests fail unless PROVIDERFS_SKIP_WEBDAV_TESTS=1 (then the suite is reported
// skipped with that reason).

import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import WebDAVProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite(.enabled(if: WebDAVTestGate.enabled, "PROVIDERFS_SKIP_WEBDAV_TESTS=1"), .blockingThreads)
struct WebDAVProviderServerTests {
    /// A served directory and a provider over it; everything goes when `body` ends.
    func withServer(
        kind: WebDAVTestServer.Kind = .rclone(user: nil, password: nil),
        configure: (inout WebDAVConfiguration) -> Void = { _ in },
        _ body: (String, WebDAVTestServer, WebDAVProvider) async throws -> Void
    ) async throws {
        if let problem = WebDAVTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let scratch = try makeTemporaryDirectory(prefix: "webdav")
        defer { removeTreeWithinFileSystem(scratch) }
        let served = scratch + "/served"
        mkdir(served, 0o755)
        try makeTree(in: served)
        let server = try WebDAVTestServer(root: served, kind: kind)
        defer { server.stop() }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation(server.url))
        configure(&configuration)
        try await body(served, server, WebDAVProvider(configuration: configuration))
    }

    static let big = pattern(count: 3 << 20, seed: 11)
    static let awkward = "a b%#?ü.txt"

    func makeTree(in root: String) throws {
        mkdir(root + "/docs", 0o755)
        mkdir(root + "/docs/nested", 0o755)
        try write(root + "/hello.txt", Array("hello, webdav\n".utf8))
        try write(root + "/docs/" + Self.awkward, Array("awkward\n".utf8))
        try write(root + "/big.bin", Self.big)
    }

    @Test(arguments: DAVServer.allCases) func listsAndStatsWhatTheServerHolds(on server: DAVServer) async throws {
        try await withServer(kind: server.kind) { served, _, provider in
            let top = try await provider.children(of: .root)
            #expect(Set(top.map(\.name)) == ["hello.txt", "docs", "big.bin"])
            let byName = Dictionary(uniqueKeysWithValues: top.map { ($0.name, $0) })
            #expect(byName["docs"]?.kind == .directory)
            #expect(byName["big.bin"]?.kind == .file && byName["big.bin"]?.size == Int64(Self.big.count))
            #expect(byName["hello.txt"]?.size == 14)
            // The ETag; Apache marks it weak while the file is less than a second old (D-422).
            let etag = byName["hello.txt"]?.contentVersion.rawValue ?? ""
            #expect(etag.hasPrefix("\"") || etag.hasPrefix("W/\""), "\(etag)")
            #expect(byName["docs"]?.parent == .root && byName["docs"]?.identifier == ItemIdentifier("docs"))

            let docs = try await provider.children(of: ItemIdentifier("docs"))
            #expect(Set(docs.map(\.name)) == [Self.awkward, "nested"])
            let awkward = try await provider.item(for: ItemIdentifier("docs/" + Self.awkward))
            #expect(awkward.name == Self.awkward && awkward.parent == ItemIdentifier("docs") && awkward.size == 8)
            var info = stat()
            #expect(stat(served + "/docs/" + Self.awkward, &info) == 0)
            #expect(awkward.modificationTime.seconds == Int64(info.st_mtim.tv_sec))
            #expect(try await provider.children(of: ItemIdentifier("docs/nested")).isEmpty)
            #expect(try await provider.item(for: .root).kind == .directory)

            // One-name lookups: found, absent, and in a directory that is not there.
            #expect(try await provider.child(named: "hello.txt", of: .root)?.size == 14)
            #expect(try await provider.child(named: "absent", of: .root) == nil)
            await expectCode(.noSuchItem) { try await provider.child(named: "x", of: ItemIdentifier("absent")) }
            await expectCode(.noSuchItem) { try await provider.item(for: ItemIdentifier("absent")) }
            await expectCode(.wrongKind) { try await provider.children(of: ItemIdentifier("hello.txt")) }
        }
    }

    @Test(arguments: DAVServer.allCases) func rangedReadsAreByteExact(on server: DAVServer) async throws {
        try await withServer(kind: server.kind) { _, _, provider in
            let item = try await provider.item(for: ItemIdentifier("big.bin"))
            let size = Int64(Self.big.count)
            for range in [0..<100, 1_000_000..<1_500_001, size - 10..<size, 0..<size] as [Range<Int64>] {
                let stream = try await provider.fetchContents(
                    of: item.identifier, version: item.contentVersion, range: range)
                let bytes = try await readAll(stream, chunk: 50_000)
                #expect(bytes == Array(Self.big[Int(range.lowerBound)..<Int(range.upperBound)]), "\(range)")
            }
            // Past the end: the bytes that exist, then the end.
            let tail = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: size - 10..<size + 100)
            #expect(try await readAll(tail) == Array(Self.big.suffix(10)))
            let empty = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 5..<5)
            #expect(try await readAll(empty).isEmpty)
            let awkward = try await provider.item(for: ItemIdentifier("docs/" + Self.awkward))
            let stream = try await provider.fetchContents(
                of: awkward.identifier, version: awkward.contentVersion, range: 1..<4)
            #expect(try await readAll(stream) == Array("wkw".utf8))
        }
    }

    @Test(arguments: DAVServer.allCases) func aFileChangedOnTheServerIsNotReadUnderItsOldVersion(
        on server: DAVServer
    ) async throws {
        try await withServer(kind: server.kind) { served, _, provider in
            let item = try await provider.item(for: ItemIdentifier("hello.txt"))
            try write(served + "/hello.txt", Array("changed on the server\n".utf8))
            await expectCode(.versionChanged) {
                try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: 0..<5)
            }
            let now = try await provider.item(for: item.identifier)
            #expect(now.contentVersion != item.contentVersion)
            let stream = try await provider.fetchContents(of: now.identifier, version: now.contentVersion, range: 0..<7)
            #expect(try await readAll(stream) == Array("changed".utf8))
        }
    }

    @Test(arguments: DAVServer.allCases) func writesThroughTheProvider(on server: DAVServer) async throws {
        try await withServer(kind: server.kind) { served, _, provider in
            let scratch = try makeTemporaryDirectory(prefix: "webdav-upload")
            defer { removeTreeWithinFileSystem(scratch) }
            let directory = try await provider.createDirectory(named: "new dir", in: .root, permissions: 0o755)
            #expect(directory.kind == .directory && directory.identifier == ItemIdentifier("new dir"))
            #expect(isDirectory(served + "/new dir"))
            await expectCode(.alreadyExists) {
                try await provider.createDirectory(named: "new dir", in: .root, permissions: 0o755)
            }
            await expectCode(.noSuchItem) {
                try await provider.createDirectory(named: "x", in: ItemIdentifier("absent"), permissions: 0o755)
            }

            let first = pattern(count: 300_000, seed: 3)
            try write(scratch + "/first", first)
            let name = "f #1 ü?.txt"
            let created = try await provider.upload(
                from: scratch + "/first", to: .create(name: name, in: directory.identifier), permissions: nil,
                modificationTime: nil)
            #expect(created.identifier == ItemIdentifier("new dir/" + name) && created.size == 300_000)
            #expect(try read(served + "/new dir/" + name) == first)
            #expect(try await provider.item(for: created.identifier).contentVersion == created.contentVersion)
            await expectCode(.alreadyExists) {
                try await provider.upload(
                    from: scratch + "/first", to: .create(name: name, in: directory.identifier), permissions: nil,
                    modificationTime: nil)
            }

            let second = Array("second version\n".utf8)
            try write(scratch + "/second", second)
            let replaced = try await provider.upload(
                from: scratch + "/second", to: .replace(created.identifier, baseVersion: created.contentVersion),
                permissions: nil, modificationTime: nil)
            #expect(replaced.size == Int64(second.count) && replaced.contentVersion != created.contentVersion)
            #expect(try read(served + "/new dir/" + name) == second)

            let renamed = try await provider.move(
                replaced.identifier, to: .root, named: "renamed.txt", mode: .noReplace)
            #expect(renamed.identifier == ItemIdentifier("renamed.txt"))
            #expect(try read(served + "/renamed.txt") == second)
            #expect(access(served + "/new dir/" + name, F_OK) != 0)
            await expectCode(.alreadyExists) {
                try await provider.move(renamed.identifier, to: .root, named: "hello.txt", mode: .noReplace)
            }
            let overwrote = try await provider.move(renamed.identifier, to: .root, named: "hello.txt", mode: .replacing)
            #expect(overwrote.size == Int64(second.count))
            #expect(try read(served + "/hello.txt") == second)
            await expectCode(.wrongKind) {
                try await provider.move(overwrote.identifier, to: .root, named: "docs", mode: .replacing)
            }
            await expectCode(.notSupported) {
                try await provider.move(overwrote.identifier, to: .root, named: "big.bin", mode: .exchange)
            }
            await expectCode(.invalidName) {
                try await provider.move(
                    ItemIdentifier("docs"), to: ItemIdentifier("docs/nested"), named: "d", mode: .noReplace)
            }

            await expectCode(.notEmpty) { try await provider.delete(ItemIdentifier("docs"), kind: .directory) }
            await expectCode(.wrongKind) { try await provider.delete(ItemIdentifier("docs"), kind: .file) }
            await expectCode(.wrongKind) { try await provider.delete(overwrote.identifier, kind: .directory) }
            try await provider.delete(overwrote.identifier, kind: .file)
            #expect(access(served + "/hello.txt", F_OK) != 0)
            try await provider.delete(ItemIdentifier("docs/nested"), kind: .directory)
            #expect(access(served + "/docs/nested", F_OK) != 0)
            await expectCode(.noSuchItem) { try await provider.delete(ItemIdentifier("docs/nested"), kind: .directory) }
            await expectCode(.invalidName) {
                try await provider.upload(
                    from: scratch + "/first", to: .create(name: ".providerfs-upload-x", in: .root), permissions: nil,
                    modificationTime: nil)
            }

            // No staging file is left behind, and none was ever listed.
            #expect(try shellOutput("find '\(served)' -name '.providerfs-upload-*'").isEmpty)
        }
    }

    @Test(arguments: DAVServer.allCases) func aReplaceOverAVersionChangedOnTheServerIsAConflict(
        on server: DAVServer
    ) async throws {
        try await withServer(kind: server.kind) { served, _, provider in
            let scratch = try makeTemporaryDirectory(prefix: "webdav-upload")
            defer { removeTreeWithinFileSystem(scratch) }
            let base = try await provider.item(for: ItemIdentifier("hello.txt"))
            let theirs = Array("their edit, made on the server\n".utf8)
            try write(served + "/hello.txt", theirs)
            try write(scratch + "/mine", Array("my edit\n".utf8))
            await expectCode(.versionChanged) {
                try await provider.upload(
                    from: scratch + "/mine", to: .replace(base.identifier, baseVersion: base.contentVersion),
                    permissions: nil, modificationTime: nil)
            }
            // Nothing was overwritten, and nothing was left behind.
            #expect(try read(served + "/hello.txt") == theirs)
            #expect(
                try shellOutput("ls -A '\(served)'").split(separator: "\n").sorted() == [
                    "big.bin", "docs", "hello.txt",
                ])
            // Without a base version the replace goes through.
            let forced = try await provider.upload(
                from: scratch + "/mine", to: .replace(base.identifier, baseVersion: nil), permissions: nil,
                modificationTime: nil)
            #expect(forced.size == 8)
            #expect(try read(served + "/hello.txt") == Array("my edit\n".utf8))
        }
    }

    /// Apache lists a file changed less than a second ago with a weak ETag (`W/"x"`) and the same
    /// file later with `"x"`: an edit based on the weak one is no conflict (D-422). The file's
    /// mtime is set an hour back, so the server's tag is strong now, whatever the clock does.
    @Test(arguments: DAVServer.allCases) func aWeakBaseVersionWithTheSameTagIsNoConflict(
        on server: DAVServer
    )
        async throws
    {
        try await withServer(kind: server.kind) { served, _, provider in
            let scratch = try makeTemporaryDirectory(prefix: "webdav-upload")
            defer { removeTreeWithinFileSystem(scratch) }
            #expect(try shellOutput("touch -d '1 hour ago' '\(served)/hello.txt' && echo ok") == "ok\n")
            let now = try await provider.item(for: ItemIdentifier("hello.txt"))
            #expect(now.contentVersion.rawValue.hasPrefix("\""), "a strong ETag: \(now.contentVersion)")
            let weak = ContentVersion("W/" + now.contentVersion.rawValue)
            try write(scratch + "/mine", Array("my edit\n".utf8))
            let replaced = try await provider.upload(
                from: scratch + "/mine", to: .replace(now.identifier, baseVersion: weak), permissions: nil,
                modificationTime: nil)
            #expect(replaced.size == 8)
            #expect(try read(served + "/hello.txt") == Array("my edit\n".utf8))
            // Another tag, weak or strong, is still a conflict.
            await expectCode(.versionChanged) {
                try await provider.upload(
                    from: scratch + "/mine", to: .replace(now.identifier, baseVersion: weak), permissions: nil,
                    modificationTime: nil)
            }
        }
    }

    /// Apache's parent forks its workers: `stop` (SIGTERM) and `kill` (SIGKILL) leave none running,
    /// and nothing accepts on its port until it starts again there. Each process is checked by
    /// its PID and start time (a PID given again to another process is not Apache's), and the
    /// port is one no other server of the run can take while Apache is stopped (`freePort`).
    @Test func apacheStopsWithItsWorkers() async throws {
        try await withServer(kind: .apache) { _, server, provider in
            for stopping in [false, true] {
                #expect(try await provider.children(of: .root).count == 3)
                let parent = try #require(server.process?.pid)
                let workers = WebDAVTestServer.children(of: parent)
                #expect(!workers.isEmpty)
                let apache = try workers + [#require(WebDAVTestServer.ProcessIdentity(parent))]
                if stopping { server.stop() } else { server.kill() }
                for process in apache {
                    #expect(!process.isRunning, "\(process) still runs")
                }
                #expect(!WebDAVTestServer.accepts(server.port))
                if !stopping { try server.start(samePort: true) }
            }
        }
    }

    /// A test server's port is never one the kernel gives a bind to port 0 (another test's
    /// server, a client socket), and never one another server of the run got: a server stopped
    /// and started again on its port finds it free, and nothing else answers there meanwhile.
    @Test func serverPortsAreOutsideTheEphemeralRangeAndNeverGivenTwice() throws {
        let bounds = (readTextFile("/proc/sys/net/ipv4/ip_local_port_range") ?? "")
            .split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int32($0) }
        let ephemeral = try #require(bounds.count == 2 ? bounds[0]...bounds[1] : nil)
        let ports = try (0..<200).map { _ in try WebDAVTestServer.freePort() }
        #expect(Set(ports).count == ports.count, "a port was given twice")
        #expect(ports.allSatisfy { !ephemeral.contains($0) }, "\(ports.filter { ephemeral.contains($0) })")
    }

    @Test func authenticatesWithBasicAuth() async throws {
        try await withServer(kind: .rclone(user: "alice", password: "pa ss:wörd")) { _, server, provider in
            await expectCode(.accessDenied) { try await provider.children(of: .root) }
            var configuration = WebDAVConfiguration(location: try WebDAVLocation(server.url), user: "alice")
            configuration.password = "wrong"
            await expectCode(.accessDenied) {
                try await WebDAVProvider(configuration: configuration).item(for: .root)
            }
            configuration.password = "pa ss:wörd"
            #expect(try await WebDAVProvider(configuration: configuration).children(of: .root).count == 3)
            #expect(!configuration.description.contains("pa ss"), "the password is never described")
        }
    }

    /// https: a certificate the system does not trust is refused; trusted through `caFile`
    /// (`mount --ca-file`), the same server lists.
    @Test func httpsTrustsTheSystemStoreOrTheGivenCAFile() async throws {
        let keys = try makeTemporaryDirectory(prefix: "webdav-tls")
        defer { removeTreeWithinFileSystem(keys) }
        let made = try ChildProcess.run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", keys + "/key.pem", "-out", keys + "/cert.pem",
            ])
        #expect(made.status == 0, "\(made.error)")
        try await withServer(kind: .rcloneTLS(certificate: keys + "/cert.pem", key: keys + "/key.pem")) {
            _, server, provider in
            #expect(server.url.hasPrefix("https://"))
            await expectCode(.io) { try await provider.children(of: .root) }
            var configuration = WebDAVConfiguration(location: try WebDAVLocation(server.url))
            configuration.caFile = keys + "/cert.pem"
            let trusting = WebDAVProvider(configuration: configuration)
            #expect(try await trusting.children(of: .root).count == 3)
            let item = try await trusting.item(for: ItemIdentifier("big.bin"))
            let stream = try await trusting.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 100..<200)
            #expect(try await readAll(stream) == Array(Self.big[100..<200]))
        }
    }

    @Test func aServerThatIsGoneIsUnreachable() async throws {
        try await withServer { _, server, provider in
            let item = try await provider.item(for: ItemIdentifier("big.bin"))
            server.stop()
            await expectCode(.unreachable) { try await provider.item(for: item.identifier) }
            await expectCode(.unreachable) {
                try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: 0..<10)
            }
            // Back on the same port: the same provider works again.
            try server.start(samePort: true)
            #expect(try await provider.item(for: item.identifier).contentVersion == item.contentVersion)
        }
    }

    /// Requests reuse connections (D-415): without the handle pool each would open its own.
    @Test(arguments: DAVServer.allCases) func requestsReuseConnections(on server: DAVServer) async throws {
        try await withServer(kind: server.kind) { _, _, provider in
            for _ in 0..<30 { _ = try await provider.item(for: ItemIdentifier("hello.txt")) }
            let item = try await provider.item(for: ItemIdentifier("big.bin"))
            for start in stride(from: Int64(0), to: 1 << 20, by: 1 << 18) {
                let stream = try await provider.fetchContents(
                    of: item.identifier, version: item.contentVersion, range: start..<start + 1000)
                #expect(try await readAll(stream).count == 1000)
            }
            #expect(provider.connectionsOpened <= 2, "\(provider.connectionsOpened) connections for 35 requests")
        }
    }

    /// The server killed while a GET is under way: the bytes that came are delivered, then the
    /// stream fails with `.io` (EIO at the mount); once the server is back a new fetch succeeds.
    @Test func aServerKilledMidDownloadFailsTheStreamAndARetrySucceeds() async throws {
        try await withServer { served, server, provider in
            // 64 MiB: far more than the stream's queue (8 MiB) and the sockets' buffers hold.
            #expect(try shellOutput("head -c \(64 << 20) /dev/urandom > '\(served)/huge.bin' && echo ok") == "ok\n")
            let item = try await provider.item(for: ItemIdentifier("huge.bin"))
            let stream = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            var received = try await stream.next(maximumLength: 1 << 20)?.count ?? 0
            #expect(received > 0)
            server.kill()
            var failure: (any Error)?
            do {
                while let chunk = try await stream.next(maximumLength: 1 << 20) { received += chunk.count }
            } catch {
                failure = error
            }
            stream.close()
            #expect((failure as? ProviderError)?.code == .io, "\(String(describing: failure))")
            #expect(received < Int(item.size))
            try server.start(samePort: true)
            let again = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<item.size)
            #expect(try await readAll(again, chunk: 1 << 20) == (try read(served + "/huge.bin")))
        }
    }

    /// Python's http.server ignores Range and sends no ETag: the provider skips to the offset and
    /// uses the last-modified time and size as the version (D-416).
    @Test func aServerThatIgnoresRangeStillGivesExactBytes() async throws {
        try await withServer(kind: .pythonStatic) { served, _, provider in
            var info = stat()
            #expect(stat(served + "/big.bin", &info) == 0)
            let version = ContentVersion("lm:\(info.st_mtim.tv_sec);s\(info.st_size)")
            let range: Range<Int64> = 1_234_567..<1_334_567
            let stream = try await provider.fetchContents(of: ItemIdentifier("big.bin"), version: version, range: range)
            #expect(try await readAll(stream) == Array(Self.big[1_234_567..<1_334_567]))
            await expectCode(.versionChanged) {
                try await provider.fetchContents(
                    of: ItemIdentifier("big.bin"), version: ContentVersion("lm:\(info.st_mtim.tv_sec);s1"), range: range
                )
            }
        }
    }

    /// A server that accepts connections and never answers: every request ends at its deadline.
    @Test func aServerThatNeverAnswersTimesOut() async throws {
        let (fd, port) = silentServer()
        defer { close(fd) }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation("http://127.0.0.1:\(port)/"))
        configuration.requestTimeout = .milliseconds(400)
        configuration.stallTimeout = .milliseconds(1500)
        let provider = WebDAVProvider(configuration: configuration)
        let clock = ContinuousClock()
        let started = clock.now
        await expectCode(.timedOut) { try await provider.item(for: ItemIdentifier("x")) }
        let metadata = clock.now - started
        await expectCode(.timedOut) {
            try await provider.fetchContents(of: ItemIdentifier("x"), version: ContentVersion("\"v\""), range: 0..<10)
        }
        let transfer = clock.now - started - metadata
        // Each ended at its own deadline, not another one: the transfer's (stall) is the longer.
        #expect(metadata < .seconds(5) && transfer < .seconds(10))
        #expect(transfer > metadata)
    }

    /// A fetch whose caller is cancelled while the server has not answered (an interrupted read)
    /// ends at once with CancellationError, long before its stall deadline (it waited for the
    /// answer in a loop whose wait returned at once once cancelled: a spin until the deadline).
    @Test func aFetchCancelledBeforeTheAnswerEndsAtOnce() async throws {
        let (fd, port) = silentServer()
        defer { close(fd) }
        var configuration = WebDAVConfiguration(location: try WebDAVLocation("http://127.0.0.1:\(port)/"))
        configuration.stallTimeout = .seconds(30)
        let provider = WebDAVProvider(configuration: configuration)
        let fetch = Task(executorPreference: BlockingTestExecutor.unbounded) {
            try await provider.fetchContents(of: ItemIdentifier("x"), version: ContentVersion("\"v\""), range: 0..<10)
        }
        try await Task.sleep(for: .milliseconds(300))
        let clock = ContinuousClock()
        let cancelled = clock.now
        fetch.cancel()
        let result = await fetch.result
        let ended = clock.now - cancelled
        if case .success(let stream) = result { stream.close() }
        #expect(throws: CancellationError.self) { try result.get() }
        // Far from the 30 s deadline (a ratio of it, whatever the load).
        #expect(ended < .seconds(30) / 4, "\(ended)")
    }
}

// MARK: Helpers

/// A socket on 127.0.0.1 that accepts connections (the kernel's backlog) and never answers: its
/// descriptor (the caller closes it) and port.
func silentServer() -> (descriptor: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #expect(fd >= 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    _ = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    #expect(listen(fd, 16) == 0)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    let port = UInt16(bigEndian: address.sin_port)
    return (fd, port)
}

/// The WebDAV servers the behaviour-alike tests run against.
enum DAVServer: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case rclone
    case apache

    var kind: WebDAVTestServer.Kind {
        switch self {
        case .rclone: .rclone(user: nil, password: nil)
        case .apache: .apache
        }
    }

    var testDescription: String { rawValue }
}

func expectCode<T>(
    _ code: ProviderError.Code, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> T
) async {
    do {
        _ = try await body()
        Issue.record("expected \(code), got success", sourceLocation: sourceLocation)
    } catch let error as ProviderError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected \(code), got \(error)", sourceLocation: sourceLocation)
    }
}

func readAll(_ stream: any ContentStream, chunk: Int = 65536) async throws -> [UInt8] {
    defer { stream.close() }
    var bytes: [UInt8] = []
    while let next = try await stream.next(maximumLength: chunk) {
        #expect(next.count <= chunk)
        bytes += next
    }
    return bytes
}

func pattern(count: Int, seed: UInt64) -> [UInt8] {
    var state = seed | 1
    return (0..<count).map { _ in
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return UInt8(truncatingIfNeeded: state)
    }
}

func write(_ path: String, _ bytes: [UInt8]) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw SystemCallError("open \(path)") }
    defer { close(fd) }
    if case .failure(let error) = bytes.withUnsafeBytes({
        writeFully(fd, from: $0.baseAddress!, count: $0.count, at: 0)
    }) {
        throw error
    }
}

func read(_ path: String) throws -> [UInt8] {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw SystemCallError("open \(path)") }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard count >= 0 else { throw SystemCallError("read \(path)") }
        if count == 0 { return bytes }
        bytes += buffer[0..<count]
    }
}

func isDirectory(_ path: String) -> Bool {
    var info = stat()
    return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
}

func shellOutput(_ script: String) throws -> String {
    try ChildProcess.run("/bin/sh", ["-c", script]).output
}
