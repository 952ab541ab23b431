// The vocabulary of injected faults: what goes wrong (`Fault`), for which item and how often
// (`FaultRule`). The same vocabulary serves unit tests (Swift) and `providerfs fault` (the CLI and
// the control socket build `FaultRule`s; the mount stores them, `FaultPlan`).

public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One injected fault. Offsets are absolute positions in the item's content, so a fault "at 50%"
/// hits every fetch that crosses that point, whatever range it started at. Every fault is
/// deterministic: the same fault over the same bytes gives the same outcome every run.
public enum Fault: Sendable, Hashable, CustomStringConvertible {
    /// The stream throws when it reaches `offset` (bytes before it are delivered): `errno` decides
    /// the `ProviderError` code (`Fault.error(errno:)`: EACCES is `.accessDenied`, ENETUNREACH and
    /// ECONNREFUSED `.unreachable`, ETIMEDOUT `.timedOut`, anything else `.io` with that errno).
    case failAfter(offset: Int64, errno: Int32)
    /// The stream stops delivering at `offset`: for `duration` on the wrapper's clock, then it goes
    /// on; without a duration until the consumer gives up (cancels), like a dead connection.
    case stall(offset: Int64, duration: Duration? = nil)
    /// The stream ends cleanly at `offset`, short of the requested range (a lying server).
    case truncate(offset: Int64)
    /// The stream throws `.versionChanged` at `offset` (the item changed on the server).
    case changeVersion(offset: Int64)
    /// Bytes `offset..<offset + corruptLength` arrive flipped (XOR 0xFF); the stream is
    /// `.checksummed`, its checksum the SHA-256 of the bytes it would have sent unmodified, so a
    /// cache that verifies checksums sees the mismatch.
    case corrupt(offset: Int64)
    /// Delivery is paced to `bytesPerSecond` on the wrapper's clock, in chunks of at most a tenth
    /// of a second's worth (a slow stream never looks stalled).
    case slow(bytesPerSecond: Int64)
    /// Every call about the item (for a directory: about everything inside it; for the root:
    /// every call) throws `.unreachable`.
    case offline

    /// How many bytes `.corrupt` flips.
    public static let corruptLength: Int64 = 4096

    /// The byte where the fault strikes (nil: it has none).
    public var offset: Int64? {
        switch self {
        case .failAfter(let offset, _), .stall(let offset, _), .truncate(let offset), .changeVersion(let offset),
            .corrupt(let offset):
            offset
        case .slow, .offline: nil
        }
    }

    /// Whether the fault can also strike metadata calls (`FaultRule.metadata`): failures, stalls
    /// and offline (always). Truncation, corruption, version changes and pacing concern content.
    public var appliesToMetadata: Bool {
        switch self {
        case .failAfter, .stall, .offline: true
        case .truncate, .changeVersion, .corrupt, .slow: false
        }
    }

    public var description: String {
        switch self {
        case .failAfter(let offset, let errno): "fail at \(offset) with \(Errno(errno).name)"
        case .stall(let offset, let duration):
            "stall at \(offset)" + (duration.map { " for \($0.humanReadable)" } ?? " until cancelled")
        case .truncate(let offset): "truncate at \(offset)"
        case .changeVersion(let offset): "change version at \(offset)"
        case .corrupt(let offset): "corrupt \(Fault.corruptLength) bytes at \(offset)"
        case .slow(let rate): "slow, \(rate) bytes/s"
        case .offline: "offline"
        }
    }

    /// Whether the fault can strike uploads (`FaultRule.on == .upload`): failures, stalls and
    /// offline. The others describe a stream of bytes coming in.
    public var appliesToUploads: Bool {
        switch self {
        case .failAfter, .stall, .offline: true
        case .truncate, .changeVersion, .corrupt, .slow: false
        }
    }

    /// The error an upload's `failAfter` with `errno` throws: a full disk or quota (ENOSPC,
    /// EDQUOT) is `.noSpace`, EFBIG `.tooLarge`, the rest as `error(errno:_:)`.
    public static func uploadError(errno: Int32, _ message: String) -> ProviderError {
        switch errno {
        case ENOSPC, EDQUOT: ProviderError(.noSpace, message, errno: errno)
        case EFBIG: ProviderError(.tooLarge, message, errno: errno)
        default: error(errno: errno, message)
        }
    }

    /// The error a `failAfter` with `errno` throws (see `failAfter`).
    public static func error(errno: Int32, _ message: String) -> ProviderError {
        switch errno {
        case EACCES, EPERM: ProviderError(.accessDenied, message, errno: errno)
        case ENETUNREACH, ECONNREFUSED, EHOSTUNREACH: ProviderError(.unreachable, message, errno: errno)
        case ETIMEDOUT: ProviderError(.timedOut, message, errno: errno)
        case ESTALE: ProviderError(.versionChanged, message, errno: errno)
        default: ProviderError(.io, message, errno: errno)
        }
    }
}

/// Which calls a rule strikes (`providerfs fault add … --on`).
public enum FaultCall: String, Sendable, Hashable, CaseIterable {
    /// Content fetches, and metadata calls too with `FaultRule.metadata` (the default). An
    /// offline rule also strikes every write call.
    case download
    /// Uploads (`Provider.upload`): a failure or a stall before the base is asked, so nothing is
    /// published. An offline rule strikes every write call (uploads, creates, deletes, moves,
    /// attribute changes) and nothing else. `times` counts the calls struck.
    case upload
}

/// How long a rule holds.
public enum FaultTimes: Sendable, Hashable, CustomStringConvertible {
    /// The next N downloads of the item that the fault strikes (N ≥ 1). A download is what the
    /// cache tells the provider about through `Provider.downloadEnded`: its first fetch, its own
    /// retries, until it ends. Every fetch of a download the rule caught is faulted; a download
    /// that ended without the fault striking (it stopped before the fault's byte) gives its use
    /// back. The rule goes once its downloads are used up and none of them runs any more.
    /// (`providerfs fault add … --times N`.)
    case downloads(Int)
    /// The next N fetches (`fetchContents` calls) of the item, whatever download they belong to:
    /// for unit tests of retry logic ("the first attempt fails, the retry succeeds").
    case fetches(Int)
    /// Every download, until the rule is cleared (`--times 0`).
    case untilCleared

    public var description: String {
        switch self {
        case .downloads(let count): "\(count) download\(count == 1 ? "" : "s")"
        case .fetches(let count): "\(count) fetch\(count == 1 ? "" : "es")"
        case .untilCleared: "until cleared"
        }
    }
}

/// A fault on one item, or on everything inside a directory (the root: everything).
///
/// - `identifier`: the item the rule is about. A rule matches calls about the item and about
///   anything inside it (the wrapper learns parents from the items it passes on).
/// - `path`: the item's path relative to the mount root, when known (`providerfs fault`): shown by
///   `fault list`, and the key of `fault clear PATH`. Unit tests may leave it nil.
/// - `times`: default `.untilCleared` (the CLI's default is one download).
/// - `metadata`: the fault also strikes `item`, `children`, `child`, `trackedChildren` (and
///   `itemNow` declines) for the item and everything inside it — only for faults whose
///   `appliesToMetadata` is true (offline always strikes metadata).
/// - `on`: `.download` (the default) or `.upload` (`FaultCall`; only faults whose
///   `appliesToUploads` is true, never with `metadata`). For an upload rule `times` counts the
///   write calls it struck (`.downloads(N)` and `.fetches(N)` alike).
public struct FaultRule: Sendable, Hashable {
    public var identifier: ItemIdentifier
    public var path: String?
    public var fault: Fault
    public var times: FaultTimes
    public var metadata: Bool
    public var on: FaultCall

    public init(
        identifier: ItemIdentifier, path: String? = nil, fault: Fault, times: FaultTimes = .untilCleared,
        metadata: Bool = false, on: FaultCall = .download
    ) {
        self.identifier = identifier
        self.path = path
        self.fault = fault
        self.times = times
        self.metadata = metadata
        self.on = on
    }

    /// Whether metadata calls meet this rule.
    var strikesMetadata: Bool { on == .download && (fault == .offline || (metadata && fault.appliesToMetadata)) }

    /// Whether content fetches meet this rule.
    var strikesFetches: Bool { on == .download }

    /// Whether write calls meet this rule (offline rules, and every upload rule).
    var strikesWrites: Bool { on == .upload || fault == .offline }
}

/// A rule as a `FaultPlan` holds it: with what it has used of its `times`.
public struct FaultRuleState: Sendable, Hashable {
    public var rule: FaultRule
    /// Downloads (or fetches) the rule has struck so far.
    public var used: Int
    /// Downloads of it still running (they go on being faulted until they end).
    public var running: Int

    public init(rule: FaultRule, used: Int, running: Int) {
        self.rule = rule
        self.used = used
        self.running = running
    }

    /// Downloads or fetches still to come; nil: until cleared.
    public var remaining: Int? {
        switch rule.times {
        case .downloads(let count), .fetches(let count): max(0, count - used)
        case .untilCleared: nil
        }
    }
}
