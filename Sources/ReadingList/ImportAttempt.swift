// One import attempt as the report shows it: where the file came from, what it was, and the
// result and duration of each stage.

public import Foundation

/// The stages of an import, in order (README of the app: docs/READING-LIST.md).
public enum ImportStage: String, Sendable, Codable, CaseIterable {
    /// Scoped access started (and, at the end, stopped).
    case access
    /// The coordinated read: the claim, the mount's download of missing bytes, and the copy.
    case read
    /// The copy of the bytes into the staging file (inside `read`; a failure here fails `read`).
    case copy
    /// The staged file: size, then libqpdf.
    case validate
    /// A pending record, then the staged file moved into the library.
    case store
    /// The record made available.
    case record
}

/// How one stage went.
public struct StageResult: Sendable, Equatable, Codable {
    public enum Outcome: String, Sendable, Codable {
        case ok
        case failed
        case cancelled
        /// Not reached (an earlier stage failed) or not needed (no scope to start).
        case skipped
    }

    public var stage: ImportStage
    public var outcome: Outcome
    public var milliseconds: Double
    /// What happened, in words (bytes copied, pages, the error).
    public var detail: String?

    public init(stage: ImportStage, outcome: Outcome, milliseconds: Double, detail: String? = nil) {
        self.stage = stage
        self.outcome = outcome
        self.milliseconds = milliseconds
        self.detail = detail
    }
}

/// The versions a failure report needs.
public struct Versions: Sendable, Equatable, Codable {
    /// The kernel and the distribution, e.g. "Linux 6.1.0-18-amd64; Debian GNU/Linux 12 (bookworm)".
    public var system: String
    /// For a file in a ProviderFS mount: the file system and the item's content version
    /// (`user.providerfs.version`); nil for a local file.
    public var provider: String?
    /// reading-list and the libraries it decides with (libqpdf).
    public var app: String

    public init(system: String, provider: String?, app: String) {
        self.system = system
        self.provider = provider
        self.app = app
    }
}

/// One import attempt.
public struct ImportAttempt: Sendable, Equatable, Codable {
    public enum Result: String, Sendable, Codable {
        case running
        case imported
        case failed
        case cancelled
        /// Found `running` with its process gone (killed): reconcile sets this.
        case interrupted
    }

    public var id: String
    public var startedAt: Date
    public var sourcePath: String
    public var sourceCategory: SourceCategory
    /// What the first bytes say: "pdf", "empty", "zip", "text", "unknown", or "unreadable".
    public var fileType: String
    public var result: Result
    public var failedStage: ImportStage?
    public var error: String?
    /// The document made, when imported.
    public var documentID: String?
    public var stages: [StageResult]
    public var versions: Versions
    /// The importing process while `running`.
    public var ownerPID: Int32?
    public var ownerStartTime: UInt64?

    public init(
        id: String, startedAt: Date, sourcePath: String, sourceCategory: SourceCategory, fileType: String,
        result: Result, failedStage: ImportStage?, error: String?, documentID: String?, stages: [StageResult],
        versions: Versions, ownerPID: Int32?, ownerStartTime: UInt64?
    ) {
        self.id = id
        self.startedAt = startedAt
        self.sourcePath = sourcePath
        self.sourceCategory = sourceCategory
        self.fileType = fileType
        self.result = result
        self.failedStage = failedStage
        self.error = error
        self.documentID = documentID
        self.stages = stages
        self.versions = versions
        self.ownerPID = ownerPID
        self.ownerStartTime = ownerStartTime
    }
}

/// Why an import did not happen: the stage and a sentence.
public struct ImportFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public var stage: ImportStage
    public var message: String
    /// The user cancelled (SIGINT, SIGTERM, `ImportCancellation.cancel()`).
    public var cancelled: Bool

    public init(_ stage: ImportStage, _ message: String, cancelled: Bool = false) {
        self.stage = stage
        self.message = message
        self.cancelled = cancelled
    }

    public var description: String { "\(stage.rawValue): \(message)" }
}
