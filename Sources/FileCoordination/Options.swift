public import Foundation
import SystemSupport

// Options, intents and errors of the coordination API: the vocabulary shared by the arbiter, the
// wire protocol and the public `FileCoordinator`. Raw values match Apple's (reference
// apple-coordination-spec.md §1.2) so code and logs read the same on both platforms.

/// How a coordinated read behaves (Apple's `NSFileCoordinator.ReadingOptions`).
public struct ReadingOptions: OptionSet, Sendable, Hashable {
    /// The option bits (Apple's raw values).
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Presenters are asked to relinquish but not to save first (rule 18).
    public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
    /// A symbolic link is resolved: the claim and the accessor URL are the link's target (rule 47).
    public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
    /// Grant without waiting for content (a provider item is not downloaded, rule 50). Outside a
    /// provider mount this changes nothing; the flag is carried to the arbiter for the mount.
    public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
    /// The accessor gets a snapshot copy, removed when it returns; a directory becomes one tar
    /// archive file. The claim on the original is released once the snapshot exists (rules 48–49).
    public static let forUploading = ReadingOptions(rawValue: 1 << 3)
    /// Set by `FileCoordinator.prepare(…)` on its batch claim (rule 33); not for direct use.
    package static let preparing = ReadingOptions(rawValue: 1 << 8)
    /// Every bit a peer may send (wire protocol version 2).
    package static let known = ReadingOptions(rawValue: 0x10f)
}

/// How a coordinated write behaves (Apple's `NSFileCoordinator.WritingOptions`). At most one
/// option may be given (Apple: "You must specify only one constant at a time").
public struct WritingOptions: OptionSet, Sendable, Hashable {
    /// The option bits (Apple's raw values).
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// The write deletes the item: waits for claims inside a directory (rule 12), presenters get
    /// accommodatePresentedItemDeletion (rule 22).
    public static let forDeleting = WritingOptions(rawValue: 1 << 0)
    /// The write moves the item: waits for claims inside a directory (rules 12, 15).
    public static let forMoving = WritingOptions(rawValue: 1 << 1)
    /// Presenters are also asked to save first (rule 24).
    public static let forMerging = WritingOptions(rawValue: 1 << 2)
    /// Like forDeleting, but the claim does not follow a move of the item (rules 12, 40).
    public static let forReplacing = WritingOptions(rawValue: 1 << 3)
    /// A metadata-only write; coordinates like a plain write (rule 11).
    public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)
    /// The write evicts the item's local content (a ProviderFS addition; rule 34): presenters of the
    /// item and of everything inside it get accommodatePresentedItemEviction and must remove
    /// themselves; a presenter that does not implement it, or answers with an error, fails the claim.
    public static let forEvicting = WritingOptions(rawValue: 1 << 5)
    /// Set by `FileCoordinator.prepare(…)` on its batch claim (rule 33); not for direct use.
    package static let preparing = WritingOptions(rawValue: 1 << 8)
    /// Every bit a peer may send (wire protocol version 2).
    package static let known = WritingOptions(rawValue: 0x13f)

    /// Options whose claim on a directory covers everything inside it (rules 12–13).
    public static let subtreeOptions: WritingOptions = [.forDeleting, .forMoving, .forReplacing, .forEvicting]
    /// Options that delete the item (rule 22).
    public static let deletingOptions: WritingOptions = [.forDeleting, .forReplacing]
}

/// Read or write.
public enum AccessKind: UInt8, Sendable, Hashable, CustomStringConvertible {
    case read = 0
    case write = 1
    public var description: String { self == .read ? "read" : "write" }
}

/// One item a batch coordination wants to access (Apple's `NSFileAccessIntent`). `url` is
/// updated when the item moves while the claim waits (rule 39), except for `.forReplacing`.
public final class FileAccessIntent: Sendable {
    /// Read or write.
    public let kind: AccessKind
    /// Options of a reading intent (empty for a writing one).
    public let readingOptions: ReadingOptions
    /// Options of a writing intent (empty for a reading one).
    public let writingOptions: WritingOptions
    private let storedURL: Locked<URL>

    private init(kind: AccessKind, url: URL, reading: ReadingOptions, writing: WritingOptions) {
        self.kind = kind
        self.storedURL = Locked(url)
        self.readingOptions = reading
        self.writingOptions = writing
    }

    /// A reading intent for `url`.
    public static func readingIntent(with url: URL, options: ReadingOptions = []) -> FileAccessIntent {
        FileAccessIntent(kind: .read, url: url, reading: options, writing: [])
    }

    /// A writing intent for `url`.
    public static func writingIntent(with url: URL, options: WritingOptions = []) -> FileAccessIntent {
        FileAccessIntent(kind: .write, url: url, reading: [], writing: options)
    }

    /// The URL to use inside the accessor: the requested one, or where the item moved to.
    public var url: URL {
        get { storedURL.withLock { $0 } }
        set { storedURL.withLock { $0 = newValue } }
    }
}

/// Why a coordination did not happen. `description` is one sentence meant for a person.
public struct CoordinationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kind of failure; stable across versions (the wire protocol carries its raw value).
    public enum Code: UInt16, Sendable, Equatable {
        /// `cancel()` was called (Apple's NSUserCancelledError, rule 53).
        case cancelled = 1
        /// The claim was not granted before its deadline.
        case timedOut = 2
        /// Waiting would deadlock with a claim the same caller already holds.
        case wouldDeadlock = 3
        /// A presenter answered relinquish/save/accommodate with an error (rule 25).
        case presenterFailed = 4
        /// The URL is not usable: not a file URL, relative, NUL byte, name too long.
        case invalidURL = 5
        /// The options or intents are inconsistent (several writing options, an empty batch…).
        case invalidRequest = 6
        /// The coordination server could not be reached or started.
        case serverUnavailable = 7
        /// The connection to the coordination server broke while the claim was pending or held.
        case connectionLost = 8
        /// A message could not be decoded, or the peer speaks another protocol version.
        case protocolError = 9
        /// A file operation (snapshot, symlink resolution) failed.
        case fileOperationFailed = 10
        /// `purposeIdentifier` misuse (rule 7).
        case invalidPurposeIdentifier = 11
        /// A coordinated read of an item in a ProviderFS mount could not get the item's content
        /// from its provider; the accessor did not run (rule 51).
        case downloadFailed = 12
        /// A claim that was granted could not be re-established after the coordination server
        /// restarted: another claim took its place, or no server came back in time (D-402). The
        /// accessor was running without exclusion from then on; `FileCoordinator.claimLostHandler`
        /// hears of it.
        case claimLost = 13
    }

    /// The kind of failure.
    public var code: Code
    /// One sentence saying what happened.
    public var message: String

    /// An error of kind `code` explained by `message`.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
