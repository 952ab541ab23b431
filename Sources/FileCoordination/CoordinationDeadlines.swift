// How long coordination waits (public: `FileCoordinator.deadlines`).

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How long coordination waits. Every wait has a deadline (a ProviderFS requirement; Apple waits
/// forever, spec §2.4). Defaults: 60 s for a claim, 10 s for each presenter answer; the
/// environment variables `PROVIDERFS_CLAIM_TIMEOUT` and `PROVIDERFS_PRESENTER_TIMEOUT` (e.g.
/// "500ms", "2s") change the defaults of a process.
public struct CoordinationDeadlines: Sendable, Hashable {
    /// How long a claim may wait for conflicting claims and presenters before failing `.timedOut`.
    public var claimWait: Duration { didSet { claimWaitNanoseconds = claimWait.nanosecondCount } }
    /// How long one presenter may take to answer one message before it counts as answered.
    public var presenterAnswer: Duration {
        didSet { presenterAnswerNanoseconds = presenterAnswer.nanosecondCount }
    }
    /// The same in nanoseconds, converted once (every claim carries them).
    private(set) var claimWaitNanoseconds: UInt64
    private(set) var presenterAnswerNanoseconds: UInt64

    /// Deadlines; see the properties.
    public init(claimWait: Duration = .seconds(60), presenterAnswer: Duration = .seconds(10)) {
        self.claimWait = claimWait
        self.presenterAnswer = presenterAnswer
        claimWaitNanoseconds = claimWait.nanosecondCount
        presenterAnswerNanoseconds = presenterAnswer.nanosecondCount
    }

    /// The process default: 60 s / 10 s unless the environment says otherwise.
    public static let `default`: CoordinationDeadlines = {
        var deadlines = CoordinationDeadlines()
        let environment = ProcessInfo.processInfo.environment
        if let text = environment["PROVIDERFS_CLAIM_TIMEOUT"], let value = try? parseDuration(text) {
            deadlines.claimWait = value
        }
        if let text = environment["PROVIDERFS_PRESENTER_TIMEOUT"], let value = try? parseDuration(text) {
            deadlines.presenterAnswer = value
        }
        return deadlines
    }()
}

extension Duration {
    var nanosecondCount: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        let (product, overflow) = UInt64(seconds).multipliedReportingOverflow(by: 1_000_000_000)
        return overflow ? .max : product &+ UInt64(attoseconds / 1_000_000_000)
    }
}
