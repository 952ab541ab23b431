// tokens.db (D-335, D-336): a change writes its own rows; a cut at any byte of the WAL (a kill -9
// or a crash mid-write) opens as the state after some whole change; tokens.json of the earlier
// version migrates; a damaged database is set aside and the authority starts anyway.

import Foundation
import SQLiteStore
import SystemSupport
import TestSupport
import Testing

@testable import AccessTokens

#if canImport(Glibc)
import Glibc
#endif

/// Log lines of an authority, for assertions.
final class LogLines: Sendable {
    private let lines = Locked<[String]>([])
    var all: [String] { lines.value }
    var sink: @Sendable (String) -> Void { { line in self.lines.withLock { $0.append(line) } } }
}

@Suite("Token store")
struct TokenStoreTests {
    static func size(_ path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_size) : 0
    }

    static func mode(_ path: String) -> mode_t {
        var info = stat()
        return stat(path, &info) == 0 ? info.st_mode & 0o777 : 0
    }

    static func names(_ directory: String) -> [String] {
        (try? FileManager.default.contentsOfDirectory(atPath: directory).sorted()) ?? []
    }

    /// What a restart must show of a token: its state and uses left.
    static func states(_ authority: TokenAuthority) -> [String: String] {
        Dictionary(
            uniqueKeysWithValues: authority.list(includeEnded: true).map {
                ($0.id, "\($0.state.rawValue) \($0.usesLeft.map(String.init) ?? "-")")
            })
    }

    /// An authority over `directory` on the fixture's wall clock and processes, logging into `log`.
    static func authority(
        _ directory: String, wall: ManualWallClock, processes: FakeProcesses = FakeProcesses(),
        log: LogLines = LogLines(), clock: ManualClock = ManualClock()
    ) -> TokenAuthority {
        TokenAuthority(
            storeDirectory: directory, clock: clock, wallClock: wall.read, processStartTime: processes.read,
            log: log.sink)
    }

    /// A new directory on tmpfs (/dev/shm) when there is one, else in /tmp. For the tests that
    /// grant 10,000 tokens one by one: they count rows, and an fsync per grant on a shared disk
    /// (about 4 ms here) would make them take 40 s.
    static func memoryBackedDirectory() throws -> String {
        var info = stat()
        let base = stat("/dev/shm", &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR ? "/dev/shm" : "/tmp"
        var template = Array("\(base)/providerfs-tokens-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw TestSupportError("mkdtemp in \(base): errno \(errno)")
        }
        return String(cString: made)
    }

    // MARK: One row per change

    @Test(
        "with 10,000 tokens a grant, a counted use, a revoke and an expiry each write one row; a check compares one hash"
    )
    func oneRowPerChange() throws {
        let directory = try Self.memoryBackedDirectory()
        defer { removeTree(directory) }
        let fixture = TokenFixture(directory: directory)
        let authority = fixture.authority
        var granted: [IssuedToken] = []
        var costs: [Duration] = []
        let clock = ContinuousClock()
        for index in 0..<10_000 {
            let start = clock.now
            granted.append(try authority.grant(scope: scope, mode: .read, ttl: .seconds(Int64(600 + index)), uses: 5))
            costs.append(clock.now - start)
        }
        // Timing, for the record (the proof is the row count below): the median grant among the
        // first 200 and among the last 200.
        let early = costs[0..<200].sorted()[100]
        let late = costs[9_800..<10_000].sorted()[100]
        print("token store (\(directory)): median grant with 0–200 tokens \(early), with 9,800–10,000 \(late)")
        #expect(late < early * 4, "a grant with 10,000 tokens cost \(late), with few \(early)")
        let tokens = granted.map(\.token)
        // Each grant wrote its row and nothing else (the first write was the tag and salt alone).
        #expect(authority.storeRowsWritten == 10_000)
        var before = authority.storeRowsWritten ?? 0
        func written() -> Int {
            defer { before = authority.storeRowsWritten ?? 0 }
            return (authority.storeRowsWritten ?? 0) - before
        }
        let issued = try authority.grant(scope: scope, mode: .read, ttl: .seconds(5), uses: 2)
        #expect(written() == 1)
        #expect(authority.recordUse(issued.token, caller: me).grant != nil)
        #expect(written() == 1)
        #expect(authority.check(issued.token, caller: me).grant != nil)
        #expect(authority.check("pfs_nonsense!", caller: me).denialReason == .malformed)
        #expect(written() == 0, "checks and denials write no token row")
        try authority.revoke(id: try authority.grant(scope: scope, mode: .read).id)
        #expect(written() == 2)
        try authority.expire(id: granted[17].id)
        #expect(written() == 1)
        fixture.clock.advance(by: .seconds(5))
        #expect(authority.check(issued.token, caller: me) == .denied(.expired))
        #expect(written() == 1, "the noticed expiry is saved, alone")

        // The lookup: every token's hash prefix selects a bucket of one, an unknown token's none,
        // so a check is one hash, one dictionary lookup and one constant-time comparison.
        let candidates = tokens.map { authority.lookupCandidates($0) }
        #expect(candidates.allSatisfy { $0 == 1 })
        var random = SeededRandom(seed: 12)
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")
        let unknown = (0..<10_000).map { _ in
            "pfs_\(authority.mountTag)_" + String((0..<32).map { _ in alphabet[Int(random.next() % 32)] })
        }
        #expect(unknown.map { authority.lookupCandidates($0) }.allSatisfy { $0 == 0 })

        // All of it is on disk: a restart has every token with its uses.
        let restartStart = clock.now
        let restarted = fixture.restarted(directory: directory)
        print("token store: a restart with 10,001 tokens took \(clock.now - restartStart)")
        #expect(restarted.authority.list().count == 9_999)
        #expect(restarted.authority.info(id: granted[17].id)?.state == .expired)
        #expect(restarted.authority.check(tokens[9_999], caller: me).grant != nil)
        #expect(restarted.authority.info(id: issued.id)?.state == .expired)
    }

    // MARK: Kill at any point

    @Test("a kill -9 at any point: the WAL cut at any byte opens as the state after a whole change, never a mix")
    func cutAnywhere() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let processes = FakeProcesses()
        processes.set(777, startedAt: 5)
        let fixture = TokenFixture(directory: directory.path, processes: processes)
        let authority = fixture.authority
        let database = directory.path + "/tokens.db"
        let mainAtStart = try readFile(database)
        // After each change: the WAL's size and what a restart must show.
        var marks: [(wal: Int, states: [String: String])] = [
            (Self.size(database + "-wal"), Self.states(authority))
        ]
        var issued: [String: String] = [:]
        func mark() { marks.append((Self.size(database + "-wal"), Self.states(authority))) }
        for index in 0..<9 {
            let token = try authority.grant(
                scope: TokenScope(identifier: "item-\(index)", path: "docs/\(index).txt"),
                mode: index % 2 == 0 ? .read : .readWrite, ttl: index % 3 == 0 ? .seconds(5) : nil,
                pid: index == 4 ? 777 : nil, uses: index % 3 == 1 ? 2 : nil)
            issued[token.id] = token.token
            mark()
        }
        for (id, token) in issued.sorted(by: { $0.key < $1.key }) where authority.info(id: id)?.usesLeft != nil {
            #expect(authority.recordUse(token, caller: TokenCaller(pid: 777, uid: 1000)).grant != nil)
            mark()
        }
        let ids = issued.keys.sorted()
        try authority.revoke(id: ids[0])
        mark()
        try authority.expire(id: ids[1])
        mark()
        fixture.clock.advance(by: .seconds(6))
        _ = authority.list()  // notices the TTLs that ran out, and saves them
        mark()
        let wal = try readFile(database + "-wal")
        try #require(try readFile(database) == mainAtStart, "a checkpoint ran: the WAL no longer holds every change")
        try #require(marks.last?.wal == wal.count)
        try #require(marks.map(\.wal) == marks.map(\.wal).sorted())

        var offsets: Set<Int> = [0, 31, 32, wal.count]
        for (size, _) in marks {
            offsets.formUnion([size - 1, size, size + 1].filter { (0...wal.count).contains($0) })
        }
        var random = SeededRandom(seed: SeededRandom.seedFromEnvironment())
        let seed = random.state
        for _ in 0..<40 { offsets.insert(Int(random.next() % UInt64(wal.count + 1))) }
        for offset in offsets.sorted() {
            let copy = try TemporaryDirectory()
            defer { copy.remove() }
            try copy.write("tokens.db", mainAtStart)
            try copy.write("tokens.db-wal", Array(wal[0..<offset]))
            let expected = marks.last { $0.wal <= offset }?.states ?? [:]
            let restarted = Self.authority(copy.path, wall: fixture.wall, processes: processes)
            #expect(Self.states(restarted) == expected, "WAL cut at \(offset) of \(wal.count) (seed \(seed))")
            for (id, token) in issued {
                let answer = restarted.check(token, caller: TokenCaller(pid: 777, uid: 1000))
                if expected[id]?.hasPrefix("live") == true {
                    #expect(answer.grant?.id == id, "cut at \(offset): \(id) \(answer)")
                } else {
                    #expect(answer.grant == nil, "cut at \(offset): \(id) allowed")
                }
            }
        }
    }

    @Test("a grant is on disk before the token is returned, a counted use before the open is answered")
    func durableBeforeReturn() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        // What a kill -9 right after the call would leave: the files as they are, copied.
        var copies: [TemporaryDirectory] = []
        defer { for copy in copies { copy.remove() } }
        func crashCopy() throws -> TokenAuthority {
            let copy = try TemporaryDirectory()
            copies.append(copy)
            for name in ["tokens.db", "tokens.db-wal"] where Self.size(directory.path + "/" + name) > 0 {
                try copy.write(name, try readFile(directory.path + "/" + name))
            }
            return Self.authority(copy.path, wall: fixture.wall)
        }
        let issued = try fixture.authority.grant(scope: scope, mode: .read, uses: 2)
        #expect(try crashCopy().check(issued.token, caller: me).grant?.id == issued.id)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        #expect(try crashCopy().info(id: issued.id)?.usesLeft == 1)
        #expect(fixture.authority.recordUse(issued.token, caller: me).grant != nil)
        #expect(try crashCopy().check(issued.token, caller: me) == .denied(.usedUp))
    }

    // MARK: Files

    @Test("tokens.db, its WAL and the audit log are 0600 and hold no token")
    func filesArePrivateAndSecretFree() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let fixture = TokenFixture(directory: directory.path)
        var secrets: [String] = []
        for _ in 0..<20 {
            let issued = try fixture.authority.grant(scope: scope, mode: .read, uses: 3)
            _ = fixture.authority.recordUse(issued.token, caller: me)
            secrets.append(String(issued.token.suffix(32)))
        }
        let names = Self.names(directory.path)
        #expect(Set(["tokens.db", "tokens.db-wal", "tokens.db-shm", "tokens-audit.jsonl"]).isSubset(of: Set(names)))
        for name in names {
            let path = directory.path + "/" + name
            #expect(Self.mode(path) == 0o600, "\(name)")
            let text = String(decoding: try readFile(path), as: UTF8.self)
            for secret in secrets { #expect(!text.contains(secret), "\(name) holds a token") }
        }
    }

    // MARK: Migration

    /// tokens.json and tokens-audit.jsonl as the previous version wrote them (a TokenFixture at
    /// wall clock 1,800,000,000: a 3-use token used once with a 600 s TTL, a folder read-write
    /// token, one bound to pid 777 started at 12345, one revoked, one used up, one whose 5 s TTL
    /// ran out; saved 10 s later).
    static let legacyTokens = """
        {"mountTag":"4eg5z7hu","salt":"e124e4c4d7e4a5a27ef0a21fc12981f0aedf5590d2606e5acf2b1d05cb7e118e","tokens":[\
        {"grantedAt":1800000000,"hash":"f17af05e1faa9fd88bf7e1e02c8e066401135029cf0dde980a7489a8def8d402",\
        "id":"449865409587","identifier":"item-7","lastUse":1800000000,"mode":"read","path":"Documents\\/report.pdf",\
        "remainingNanoseconds":590000000000,"state":"live","usesLeft":2,"wallDeadline":1800000600},\
        {"grantedAt":1800000000,"hash":"8988ebca9643d9f17f649d83ccc9c3daa857fc1c53fc114d397a9c32aba0aa85",\
        "id":"456ad7d4f607","identifier":"dir-1","mode":"readWrite","path":"Projects","state":"live"},\
        {"boundPID":777,"boundStartTime":12345,"grantedAt":1800000000,\
        "hash":"bc02cf0b83c3017dbaea54becba7714f01471c73349bf890f90e4a1c94e773ed","id":"5dd265fcbee2",\
        "identifier":"item-7","mode":"read","path":"Documents\\/report.pdf","state":"live"},\
        {"endedAt":1800000000,"grantedAt":1800000000,\
        "hash":"8d4b76404f6feb2a173a7ed6281eb2d77f0bde47bbc6d2d7b848036c5e707bde","id":"a0af8d609bc7",\
        "identifier":"item-7","mode":"read","path":"Documents\\/report.pdf","state":"revoked"},\
        {"endedAt":1800000005,"grantedAt":1800000000,\
        "hash":"80a9aae6f8328093a6dd3314fb5f8a7dfefb356085476cf2f31ea27cf0eaad1c","id":"a3b4974208e4",\
        "identifier":"item-7","mode":"read","path":"Documents\\/report.pdf","remainingNanoseconds":0,\
        "state":"expired","wallDeadline":1800000010},\
        {"endedAt":1800000000,"grantedAt":1800000000,\
        "hash":"7993eb51f059700320b1534e0c7f4d55b724bf8c372aafd46a606ed02f97a864","id":"e6802f6704a7",\
        "identifier":"item-7","lastUse":1800000000,"mode":"read","path":"Documents\\/report.pdf","state":"usedUp",\
        "usesLeft":0}],"version":1}

        """

    static let legacyAudit = """
        {"detail":"Documents\\/report.pdf (item-7): read, ttl 600.0 seconds, 3 uses","event":"grant","sequence":1,"time":1800000000,"tokenID":"449865409587"}

        """

    /// The tokens of `legacyTokens`, by what they are.
    static let legacy = (
        counted: ("pfs_4eg5z7hu_f2yuhpc4jhsvhldxw55gzg6wacsroibk", "449865409587"),
        folder: ("pfs_4eg5z7hu_smurqjbqxkuuqefotdwlhae73taolchz", "456ad7d4f607"),
        bound: ("pfs_4eg5z7hu_5xhq5guqcxl6zlvqznlpbzfoflkfogkl", "5dd265fcbee2"),
        revoked: ("pfs_4eg5z7hu_xxf7mekymbjvi66xtmgvpmhi5otugyiq", "a0af8d609bc7"),
        usedUp: ("pfs_4eg5z7hu_xkdw66r4cfzbynzofwdju6fxlaxdqrtz", "e6802f6704a7"),
        expired: ("pfs_4eg5z7hu_k6k6rci5fsfpdtbjxiwdamz4cagvakzk", "a3b4974208e4")
    )

    /// Every legacy token answers as it did before the upgrade; the counted one has `uses` left.
    static func expectLegacyTokens(_ authority: TokenAuthority, usesLeft: Int, timeLeft: Duration) {
        let pid777 = TokenCaller(pid: 777, uid: 1000)
        #expect(authority.mountTag == "4eg5z7hu")
        #expect(authority.check(legacy.counted.0, caller: me).grant?.id == legacy.counted.1)
        let counted = authority.info(id: legacy.counted.1)
        #expect(counted?.usesLeft == usesLeft && counted?.timeLeft == timeLeft, "\(String(describing: counted))")
        #expect(authority.check(legacy.folder.0, caller: me).grant?.mode == .readWrite)
        #expect(authority.info(id: legacy.folder.1)?.timeLeft == nil)
        #expect(authority.check(legacy.bound.0, caller: pid777).grant?.id == legacy.bound.1)
        #expect(authority.check(legacy.bound.0, caller: me) == .denied(.wrongProcess))
        #expect(authority.check(legacy.revoked.0, caller: me) == .denied(.revoked))
        #expect(authority.check(legacy.usedUp.0, caller: me) == .denied(.usedUp))
        #expect(authority.check(legacy.expired.0, caller: me) == .denied(.expired))
    }

    @Test("tokens.json of the previous version migrates: every token, use, end, pid binding and the audit log")
    func migration() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try directory.write("tokens.json", Array(Self.legacyTokens.utf8))
        try directory.write("tokens-audit.jsonl", Array(Self.legacyAudit.utf8))
        let processes = FakeProcesses()
        processes.set(777, startedAt: 12345)
        // Saved at 1,800,000,010 with 590 s left; down 30 s: 560 s left.
        let wall = ManualWallClock()
        wall.jump(by: 40)
        let log = LogLines()
        var upgraded: TokenAuthority? = Self.authority(directory.path, wall: wall, processes: processes, log: log)
        Self.expectLegacyTokens(upgraded!, usesLeft: 2, timeLeft: .seconds(560))
        #expect(upgraded!.recordUse(Self.legacy.counted.0, caller: me).grant != nil)
        #expect(upgraded!.auditLog().first?.sequence == 1)
        let names = Self.names(directory.path)
        #expect(!names.contains("tokens.json"), "\(names)")
        #expect(names.contains { $0.hasPrefix("tokens.json.migrated-") }, "\(names)")
        #expect(Self.mode(directory.path + "/tokens.db") == 0o600)
        #expect(log.all.contains { $0.contains("6 tokens are now in tokens.db") }, "\(log.all)")
        upgraded = nil  // closed: the WAL is folded into tokens.db

        // A restart reads tokens.db alone; the use taken after the upgrade is there.
        let again = Self.authority(directory.path, wall: wall, processes: processes)
        Self.expectLegacyTokens(again, usesLeft: 1, timeLeft: .seconds(560))
        #expect(again.auditLog().first?.sequence == 1)
    }

    @Test("a migration cut short runs again; a tokens.json left after a finished one is never read")
    func migrationCutShort() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let processes = FakeProcesses()
        processes.set(777, startedAt: 12345)
        let wall = ManualWallClock()
        wall.jump(by: 40)
        // Killed after tokens.db was created, before the migration's transaction committed.
        do { _ = try DatabaseQueue(path: directory.path + "/tokens.db", migrator: TokenStore.migrator) }
        try directory.write("tokens.json", Array(Self.legacyTokens.utf8))
        var upgraded: TokenAuthority? = Self.authority(directory.path, wall: wall, processes: processes)
        Self.expectLegacyTokens(upgraded!, usesLeft: 2, timeLeft: .seconds(560))
        try upgraded!.revoke(id: Self.legacy.counted.1)
        upgraded = nil

        // Killed after the migration committed, before tokens.json was renamed: it is stale (the
        // revocation above is not in it) and must not bring the token back.
        try directory.write("tokens.json", Array(Self.legacyTokens.utf8))
        let log = LogLines()
        let again = Self.authority(directory.path, wall: wall, processes: processes, log: log)
        #expect(again.check(Self.legacy.counted.0, caller: me) == .denied(.revoked))
        #expect(again.check(Self.legacy.folder.0, caller: me).grant != nil)
        #expect(!Self.names(directory.path).contains("tokens.json"))
        #expect(log.all.contains { $0.contains("migrated to") && $0.contains("already") }, "\(log.all)")
    }

    // MARK: Damage

    @Test("a damaged tokens.json is set aside and logged, never a crash; the mount starts with no tokens")
    func damagedLegacyFile() throws {
        for damage in [
            "", "{", "[1,2,3]", "{\"version\": 99, \"mountTag\": \"x\", \"salt\": \"\", \"tokens\": []}",
            Self.legacyTokens.replacingOccurrences(of: "\"hash\":\"", with: "\"hash\":\"zz"),
        ] {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            try directory.write("tokens.json", Array(damage.utf8))
            let log = LogLines()
            let authority = Self.authority(directory.path, wall: ManualWallClock(), log: log)
            #expect(authority.check(Self.legacy.folder.0, caller: me) == .denied(.foreignMount))
            #expect(authority.list().isEmpty)
            #expect(
                authority.auditLog().contains { $0.event == .storeProblem && $0.detail?.contains("kept as") == true })
            #expect(log.all.contains { $0.contains("tokens.json is unreadable") }, "\(log.all)")
            #expect(Self.names(directory.path).contains { $0.hasPrefix("tokens.json.bad-") })
            // A fresh store works.
            let issued = try authority.grant(scope: scope, mode: .read)
            let restarted = Self.authority(directory.path, wall: ManualWallClock())
            #expect(restarted.check(issued.token, caller: me).grant != nil, "\(damage.prefix(40))")
        }
    }

    @Test("a damaged tokens.db is set aside with its WAL and logged, never a crash; the mount starts with no tokens")
    func damagedDatabase() throws {
        let damages: [(String, (String) throws -> Void)] = [
            ("garbage", { path in try writeFile(path, Array(String(repeating: "not a database ", count: 400).utf8)) }),
            ("cut short", { path in try writeFile(path, Array(try readFile(path).prefix(5000))) }),
            ("first page only", { path in try writeFile(path, Array(try readFile(path).prefix(4096))) }),
            (
                "a row not JSON",
                { path in try Self.sql(path, "UPDATE tokens SET record = '{' WHERE id = (SELECT min(id) FROM tokens)") }
            ),
            (
                "an unknown state",
                { path in try Self.sql(path, "UPDATE tokens SET record = replace(record, 'live', 'lively')") }
            ),
            ("a bad salt", { path in try Self.sql(path, "UPDATE authority SET salt = 'zz'") }),
            ("a bad tag", { path in try Self.sql(path, "UPDATE authority SET mount_tag = 'UPPER!!!'") }),
            ("no tag and salt", { path in try Self.sql(path, "DELETE FROM authority") }),
            (
                "a newer schema",
                { path in try Self.sql(path, "INSERT INTO schema_migrations (name, applied_at) VALUES ('tokens v9', 0)")
                }
            ),
            (
                "a foreign database",
                { path in
                    unlink(path)
                    do {
                        let other = try DatabaseQueue(path: path + ".tmp")
                        try other.write { db in
                            try db.execute("CREATE TABLE items (id INTEGER)")
                            try db.execute("DROP TABLE schema_migrations")
                        }
                    }
                    rename(path + ".tmp", path)
                }
            ),
        ]
        for (name, damage) in damages {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            var first: TokenAuthority? = Self.authority(directory.path, wall: ManualWallClock())
            var issued: [IssuedToken] = []
            for index in 0..<40 {
                issued.append(try first!.grant(scope: TokenScope(identifier: "i\(index)", path: "p"), mode: .read))
            }
            first = nil  // closed, the WAL folded in
            try damage(directory.path + "/tokens.db")
            let log = LogLines()
            let authority = Self.authority(directory.path, wall: ManualWallClock(), log: log)
            #expect(authority.check(issued[0].token, caller: me).grant == nil, "\(name)")
            #expect(authority.list().isEmpty, "\(name)")
            #expect(
                authority.auditLog().contains { $0.event == .storeProblem && $0.detail?.contains("kept as") == true },
                "\(name)")
            #expect(log.all.contains { $0.contains("tokens.db is unreadable") }, "\(name): \(log.all)")
            #expect(Self.names(directory.path).contains { $0.hasPrefix("tokens.db.bad-") }, "\(name)")
            // The new store works and keeps what it is given.
            let fresh = try authority.grant(scope: scope, mode: .read)
            let restarted = Self.authority(directory.path, wall: ManualWallClock())
            #expect(restarted.check(fresh.token, caller: me).grant != nil, "\(name)")
            #expect(restarted.mountTag == authority.mountTag, "\(name)")
        }
    }

    /// One SQL statement on the database at `path`, through SQLiteStore (no migrations).
    static func sql(_ path: String, _ statement: String) throws {
        let queue = try DatabaseQueue(path: path, migrator: TokenStore.migrator)
        try queue.write { db in try db.execute(statement) }
    }
}
