// `providerfs token grant | list | revoke | expire | log`: scoped access tokens of a running mount,
// through its control socket (docs/CONTROL.md, docs/TOKENS.md). The token itself is made by the
// daemon and printed once, by `grant`, on stdout: it is never an argument of any process, never
// logged, and `list` and `log` show ids only.

import AccessTokens
import ControlWire
import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

struct TokenCommand: CLICommand {
    static let name = "token"
    static let summary = "grant, list, revoke and expire a mount's scoped access tokens; show their audit log"
    static let usage = """
        providerfs token grant PATH [--write] [--ttl DURATION] [--pid PID] [--uses N] [--json]
               providerfs token list [MOUNTPOINT] [--all] [--json]
               providerfs token revoke ID [MOUNTPOINT] [--json]
               providerfs token expire ID [MOUNTPOINT] [--json]
               providerfs token log [MOUNTPOINT] [--json]
        """

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        guard let action = arguments.positional() else {
            throw UsageError("providerfs token: missing action: grant, list, revoke, expire or log.")
        }
        switch action {
        case "grant": return try await grant(&arguments, io: io)
        case "list": return try await list(&arguments, io: io)
        case "revoke", "expire": return try await end(action, &arguments, io: io)
        case "log": return try await log(&arguments, io: io)
        default:
            throw UsageError("providerfs token: unknown action '\(action)': use grant, list, revoke, expire or log.")
        }
    }

    // MARK: grant

    /// The flags of `token grant` (everything but PATH), checked as the daemon checks them.
    static func parseGrant(_ arguments: inout ArgumentList) throws(UsageError) -> TokenGrantRequest {
        let command = arguments.commandName + " grant"
        let write = try arguments.flag("--write")
        let ttlText = try arguments.option("--ttl")
        let pidText = try arguments.option("--pid")
        let usesText = try arguments.option("--uses")
        var request = TokenGrantRequest(path: "", write: write)
        if let ttlText {
            let ttl: Duration
            do { ttl = try parseDuration(ttlText) } catch { throw UsageError("\(command): --ttl: \(error).") }
            // Whole milliseconds, as the request carries them (a fraction of one is dropped).
            let (seconds, attoseconds) = ttl.components
            let milliseconds = seconds * 1000 + attoseconds / 1_000_000_000_000_000
            if let problem = TokenGrantRequest.ttlProblem(ttl) { throw UsageError("\(command): --ttl: \(problem).") }
            guard milliseconds > 0 else {
                throw UsageError("\(command): --ttl: a TTL is at least 1ms (got \(ttl.humanReadable)).")
            }
            request.ttlMilliseconds = milliseconds
        }
        if let pidText {
            guard let pid = Int32(pidText), pid > 0 else {
                throw UsageError("\(command): --pid: '\(pidText)' is not a process id.")
            }
            request.pid = pid
        }
        if let usesText {
            guard let uses = Int64(usesText), uses >= 1, uses <= TokenGrantRequest.maximumUses else {
                throw UsageError(
                    "\(command): --uses: '\(usesText)' is not a count from 1 to \(TokenGrantRequest.maximumUses).")
            }
            request.uses = Int(uses)
        }
        return request
    }

    static func grant(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        var request = try parseGrant(&arguments)
        let path = try arguments.requiredPositional("PATH")
        try arguments.finish()
        let (client, relative) = try ControlClient.forMount(containing: path)
        request.path = relative
        let granted = try await send(client, .tokenGrant(request), as: ControlTokenGrant.self)
        let access = accessPath(mountpoint: client.mountpoint, token: granted.token, granted: granted)
        if io.json {
            io.emit(GrantOutput(accessPath: access, id: granted.info.id, expiry: granted.info.expiresAt))
        } else {
            io.line(access)
            var terms = ["id \(granted.info.id)", granted.info.mode == "readWrite" ? "read-write" : "read-only"]
            terms.append(expiry(granted.info, now: Date()))
            io.line(terms.joined(separator: ", "))
        }
        return ExitStatus.success
    }

    /// The path an app opens to use a grant: `MOUNTPOINT/.scoped/<token>/` followed by the item's
    /// name for a file, and the token's directory itself for a directory (its contents appear
    /// inside it). The one place that knows the access-path layout on the command side: if
    /// enforcement lays access paths out differently, change it here (and docs/TOKENS.md).
    static func accessPath(mountpoint: String, token: String, granted: ControlTokenGrant) -> String {
        let base = (mountpoint.hasSuffix("/") ? mountpoint : mountpoint + "/") + ".scoped/" + token
        return granted.isDirectory || granted.name.isEmpty ? base : base + "/" + granted.name
    }

    /// `token grant --json`: one object.
    struct GrantOutput: Encodable {
        var accessPath: String
        var id: String
        var expiry: Date?

        enum Keys: String, CodingKey { case accessPath, id, expiry }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(accessPath, forKey: .accessPath)
            try container.encode(id, forKey: .id)
            try container.encode(expiry, forKey: .expiry)  // null when it never expires
        }
    }

    // MARK: list

    static func list(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let all = try arguments.flag("--all")
        let mountpoint = arguments.positional()
        try arguments.finish()
        let client = try self.client(mountpoint)
        let reply = try await send(client, .tokenList(includeEnded: all), as: ControlTokenList.self)
        if io.json {
            io.emitLines(reply.tokens.map { OnMount(mountpoint: client.mountpoint, value: $0) })
        } else if reply.tokens.isEmpty {
            io.line(all ? "No tokens." : "No live tokens.")
        } else {
            let now = Date()
            let text = reply.tokens.map { describe($0, now: now) }.joined(separator: "\n")
            io.line(text)
        }
        return ExitStatus.success
    }

    /// One line of `token list`: id, scope, mode, expiry, uses, last use, bound pid.
    static func describe(_ token: ControlToken, now: Date) -> String {
        var terms = [
            token.id, token.path.isEmpty ? "/" : token.path, token.mode == "readWrite" ? "read-write" : "read",
            expiry(token, now: now),
        ]
        var uses = token.usesLeft.map { "\($0) use\($0 == 1 ? "" : "s") left" } ?? "unlimited uses"
        if let open = token.openUses, open > 0, token.state == "live" { uses += " (\(open) open)" }
        terms.append(uses)
        terms.append(token.lastUse.map { "last use \(clockTime($0, now: now))" } ?? "never used")
        terms.append(token.boundPID.map { "pid \($0)" } ?? "any process")
        if let parent = token.parentID { terms.append("derived from \(parent)") }
        return terms.joined(separator: "  ")
    }

    /// "expires 14:03:10 (in 4m 10s)", "no expiry", or how and when it ended ("revoked 14:02:55").
    /// The wall-clock time is now + the daemon's monotonic time left, so after a clock jump it
    /// moves with the clock while "in …" does not (docs/TOKENS.md).
    static func expiry(_ token: ControlToken, now: Date) -> String {
        if token.state != "live" {
            let what = token.state == "usedUp" ? "used up" : token.state
            return what + (token.endedAt.map { " " + clockTime($0, now: now) } ?? "")
        }
        guard let left = token.timeLeftMilliseconds else { return "no expiry" }
        let at = token.expiresAt ?? now.addingTimeInterval(Double(left) / 1000)
        return "expires \(clockTime(at, now: now)) (in \(timeLeft(milliseconds: left)))"
    }

    /// "850ms", "42s", "4m 10s", "2h 5m", "3d 4h".
    static func timeLeft(milliseconds: Int64) -> String {
        if milliseconds < 1000 { return "\(max(milliseconds, 0))ms" }
        let seconds = (milliseconds + 999) / 1000
        if seconds < 60 { return "\(seconds)s" }
        if seconds < 3600 { return "\(seconds / 60)m \(seconds % 60)s" }
        if seconds < 86_400 { return "\(seconds / 3600)h \(seconds % 3600 / 60)m" }
        return "\(seconds / 86_400)d \(seconds % 86_400 / 3600)h"
    }

    /// Local "14:03:10", with the date when it is not today. Through the C library's local time
    /// (the TZ Foundation's `TimeZone.current` reads too): `Calendar` took 20 µs a call, most of
    /// the time of listing 10,000 tokens (D-338).
    static func clockTime(_ date: Date, now: Date) -> String {
        let time = localTime(date)
        let today = localTime(now)
        let clock = twoDigits(time.tm_hour) + ":" + twoDigits(time.tm_min) + ":" + twoDigits(time.tm_sec)
        if time.tm_year == today.tm_year && time.tm_yday == today.tm_yday { return clock }
        let year = String(time.tm_year + 1900)
        return String(repeating: "0", count: max(0, 4 - year.count)) + year + "-" + twoDigits(time.tm_mon + 1) + "-"
            + twoDigits(time.tm_mday) + " " + clock
    }

    private static func localTime(_ date: Date) -> tm {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var broken = tm()
        localtime_r(&seconds, &broken)
        return broken
    }

    private static func twoDigits(_ value: Int32) -> String {
        value < 10 && value >= 0 ? "0" + String(value) : String(value)
    }

    // MARK: revoke, expire

    static func end(_ action: String, _ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let command = "\(arguments.commandName) \(action)"
        let text = try arguments.requiredPositional("ID (as token list shows it)")
        let mountpoint = arguments.positional()
        try arguments.finish()
        guard let id = TokenGrantRequest.tokenID(text) else {
            throw UsageError("\(command): '\(text.prefix(80))' is not a token id (hex digits, as token list shows).")
        }
        let client = try self.client(mountpoint)
        let ended = try await send(
            client,
            action == "revoke" ? .tokenRevoke(id: id) : .tokenExpire(id: id), as: ControlToken.self)
        if io.json {
            io.emit(OnMount(mountpoint: client.mountpoint, value: ended))
        } else {
            io.line(
                "Token \(ended.id) (\(ended.path.isEmpty ? "/" : ended.path)) \(action == "revoke" ? "revoked" : "expired")."
            )
        }
        return ExitStatus.success
    }

    // MARK: log

    static func log(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        let mountpoint = arguments.positional()
        try arguments.finish()
        let client = try self.client(mountpoint)
        let reply = try await send(client, .tokenLog(after: 0), as: ControlTokenLog.self)
        if io.json {
            io.emitLines(reply.entries)
        } else if reply.entries.isEmpty {
            io.line("No token events.")
        } else {
            let now = Date()
            io.line(reply.entries.map { describe($0, now: now) }.joined(separator: "\n"))
        }
        return ExitStatus.success
    }

    /// "14:03:10  #12  denial  3f2a9c0d1e4b  expired  uid 1000 pid 4242  …".
    static func describe(_ entry: TokenAuditEntry, now: Date) -> String {
        var terms = [clockTime(entry.time, now: now), "#\(entry.sequence)", entry.event.rawValue]
        if let id = entry.tokenID { terms.append(id) }
        if let reason = entry.reason { terms.append("\(reason.rawValue): \(reason.explanation)") }
        if let count = entry.count { terms.append("\(count) refused") }
        if let uid = entry.uid { terms.append("uid \(uid)" + (entry.pid.map { " pid \($0)" } ?? "")) }
        if let detail = entry.detail { terms.append(detail) }
        return terms.joined(separator: "  ")
    }

    // MARK: Helpers

    /// `client.send`, with the daemon's refusals (an unknown id, a token already ended, an item
    /// not in the mount, a pid not running) as the daemon's own sentence and the mount.
    static func send<Reply: Decodable & Sendable>(
        _ client: ControlClient, _ request: ControlRequest, as type: Reply.Type
    ) async throws(CommandFailure) -> Reply {
        do {
            return try await client.exchange(ControlProtocol.requestFrame(id: 1, request), as: Reply.self)
        } catch {
            switch error {
            case .control(let error):
                switch error.code {
                case .invalidArguments, .notFound, .notAFile, .failed:
                    throw CommandFailure("\(error.message) (the mount at \(client.mountpoint))")
                default:
                    throw client.sentence(for: error)
                }
            case .unreadable(let why):
                throw client.unreadable(why)
            }
        }
    }

    /// The mount containing `mountpoint`, or the single running ProviderFS mount of this user.
    static func client(_ mountpoint: String?) throws -> ControlClient {
        if let mountpoint { return try ControlClient.forMount(containing: mountpoint).client }
        let running = try FaultCommand.clients(nil)
        guard running.count == 1, let only = running.first else {
            if running.isEmpty {
                throw CommandFailure("no ProviderFS mount of this user is running: mount one, or name its MOUNTPOINT")
            }
            throw UsageError(
                "providerfs token: \(running.count) ProviderFS mounts are running ("
                    + running.map(\.mountpoint).sorted().joined(separator: ", ") + "): name the MOUNTPOINT.")
        }
        return only
    }
}
