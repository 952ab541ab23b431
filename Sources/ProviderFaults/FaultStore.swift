// A fault plan's file: `{"version": 1, "faults": [ … ]}`, one object per rule with what it has
// used of its times. Written atomically (temporary file, fsync, rename, fsync of the directory);
// a file that cannot be read is moved aside, never trusted and never fatal.

import Foundation
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

final class FaultStore: @unchecked Sendable {
    // Safe: `written` is only touched while `lock` is held; the rest is immutable.
    let path: String
    private let log: @Sendable (String) -> Void
    private let lock = Lock()
    private var written: UInt64 = 0

    static let formatVersion = 1

    init(path: String, log: @escaping @Sendable (String) -> Void) {
        self.path = path
        self.log = log
    }

    enum Loaded {
        case loaded([(FaultRule, Int)])
        case missing
        case malformed
    }

    struct File: Codable {
        var version: Int
        var faults: [StoredRule]
    }

    /// One rule on disk. Durations in nanoseconds, errno by name.
    struct StoredRule: Codable {
        var path: String?
        var identifier: String
        var fault: String
        var at: Int64?
        var errno: String?
        var durationNanoseconds: Int64?
        var bytesPerSecond: Int64?
        /// "downloads", "fetches" or "untilCleared".
        var count: String
        var times: Int?
        var used: Int
        var metadata: Bool
        /// "upload" for an upload rule; absent for a download rule (files written before upload
        /// rules existed read the same).
        var on: String?
    }

    func load() -> Loaded {
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            if access(path, F_OK) != 0 && Errno.current == .noSuchFileOrDirectory { return .missing }
            return setAside("cannot read it: \(error.localizedDescription)")
        }
        do {
            let file = try JSONDecoder().decode(File.self, from: data)
            guard file.version == Self.formatVersion else {
                return setAside("format version \(file.version) is not \(Self.formatVersion)")
            }
            var rules: [(FaultRule, Int)] = []
            for (index, stored) in file.faults.enumerated() {
                guard let rule = Self.rule(stored) else { return setAside("fault \(index + 1) is not valid") }
                rules.append((rule, stored.used))
            }
            return .loaded(rules)
        } catch {
            return setAside("it is not a fault store (\(error))")
        }
    }

    /// Logs, moves the bad file aside (kept for a person to look at) and reports it malformed.
    private func setAside(_ reason: String) -> Loaded {
        let aside = path + ".bad-\(time(nil))"
        if rename(path, aside) == 0 {
            log("the fault store \(path) is unreadable (\(reason)); kept as \(aside), starting with no faults")
        } else {
            log("the fault store \(path) is unreadable (\(reason)) and cannot be moved aside; starting with no faults")
        }
        return .malformed
    }

    /// Writes `entries` unless a newer generation was written already. Failures are logged (the
    /// plan in memory still holds).
    func save(_ entries: [(FaultRule, Int)], generation: UInt64) {
        lock.withLock {
            guard generation > written || generation == 0 else { return }
            let file = File(version: Self.formatVersion, faults: entries.map { Self.stored($0.0, used: $0.1) })
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            guard let data = try? encoder.encode(file) else { return }
            if let failure = Self.writeAtomically(Array(data) + [0x0A], to: path) {
                log("cannot write the fault store \(path): \(failure)")
                return
            }
            written = generation
        }
    }

    /// Temporary file beside `path`, fsync, rename over `path`, fsync of the directory. Returns
    /// why it failed, or nil.
    static func writeAtomically(_ bytes: [UInt8], to path: String) -> String? {
        replaceFileAtomically(path, with: bytes)
    }

    // MARK: Rules ⇄ stored form

    static func stored(_ rule: FaultRule, used: Int) -> StoredRule {
        var stored = StoredRule(
            path: rule.path, identifier: rule.identifier.rawValue, fault: "", count: "untilCleared", used: used,
            metadata: rule.metadata, on: rule.on == .download ? nil : rule.on.rawValue)
        switch rule.times {
        case .downloads(let count):
            stored.count = "downloads"
            stored.times = count
        case .fetches(let count):
            stored.count = "fetches"
            stored.times = count
        case .untilCleared:
            break
        }
        switch rule.fault {
        case .failAfter(let offset, let errno):
            stored.fault = "failAt"
            stored.at = offset
            stored.errno = Errno(errno).name
        case .stall(let offset, let duration):
            stored.fault = "stall"
            stored.at = offset
            stored.durationNanoseconds = duration.map(nanoseconds)
        case .truncate(let offset):
            stored.fault = "truncate"
            stored.at = offset
        case .changeVersion(let offset):
            stored.fault = "changeVersion"
            stored.at = offset
        case .corrupt(let offset):
            stored.fault = "corrupt"
            stored.at = offset
        case .slow(let rate):
            stored.fault = "slow"
            stored.bytesPerSecond = rate
        case .offline:
            stored.fault = "offline"
        }
        return stored
    }

    static func rule(_ stored: StoredRule) -> FaultRule? {
        guard stored.used >= 0 else { return nil }
        let offset = stored.at ?? 0
        guard offset >= 0 else { return nil }
        let fault: Fault
        switch stored.fault {
        case "failAt":
            guard let name = stored.errno, let errno = Errno(parsing: name) else { return nil }
            fault = .failAfter(offset: offset, errno: errno.rawValue)
        case "stall":
            if let duration = stored.durationNanoseconds, duration < 0 { return nil }
            fault = .stall(offset: offset, duration: stored.durationNanoseconds.map { .nanoseconds($0) })
        case "truncate": fault = .truncate(offset: offset)
        case "changeVersion": fault = .changeVersion(offset: offset)
        case "corrupt": fault = .corrupt(offset: offset)
        case "slow":
            guard let rate = stored.bytesPerSecond, rate > 0 else { return nil }
            fault = .slow(bytesPerSecond: rate)
        case "offline": fault = .offline
        default: return nil
        }
        let times: FaultTimes
        switch (stored.count, stored.times) {
        case ("downloads", let count?) where count > 0: times = .downloads(count)
        case ("fetches", let count?) where count > 0: times = .fetches(count)
        case ("untilCleared", nil): times = .untilCleared
        default: return nil
        }
        let on: FaultCall
        switch stored.on {
        case nil: on = .download
        case let name?:
            guard let call = FaultCall(rawValue: name),
                !(call == .upload && (stored.metadata || !fault.appliesToUploads))
            else { return nil }
            on = call
        }
        return FaultRule(
            identifier: ItemIdentifier(stored.identifier), path: stored.path, fault: fault, times: times,
            metadata: stored.metadata, on: on)
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000
    }
}
