// `providerfs token` on a real `--source` mount: a grant prints an access path under
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
struct TokenMountTests {
    let scratch: String
    let source: String
    let runtime: String
    let cache: String

    init() throws {
        scratch = try makeTemporaryDirectory(prefix: "token-mount")
        source = scratch + "/source"
        runtime = scratch + "/run"
        cache = scratch + "/cache"
        mkdir(source, 0o755)
        mkdir(source + "/docs", 0o755)
        writeTestFile(source + "/docs/report.txt", Array("quarterly".utf8))
    }

    func cleanup() { removeTreeWithinFileSystem(scratch) }

    func mount() throws -> MountedFileSystem {
        try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache], environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
    }

    func jsonLines(_ text: String) -> [[String: Any]] {
        text.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    @Test func grantListRevokeLogAndARemount() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        var first: MountedFileSystem? = try mount()
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
        #expect(!mounted.child.standardError.contains(token) && !mounted.child.standardOutput.contains(token))

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
        let second = try mount()
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
