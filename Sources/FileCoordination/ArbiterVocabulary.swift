// The arbiter's vocabulary: claims, intents, presenters, messages, actions and snapshots. Plain
// values; `Arbiter` decides, `ArbiterHost` and the servers carry them.

/// A claim, named by the owner (a connection or an in-process domain) and the owner's own number,
/// so no mapping is needed between a client's request and the arbiter's table.
package struct ClaimID: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The owner: a connection of the server, or an in-process domain.
    package var owner: UInt64
    /// The owner's number for this claim.
    package var local: UInt64
    /// The claim `local` of `owner`.
    package init(owner: UInt64, local: UInt64) {
        self.owner = owner
        self.local = local
    }
    /// Orders by owner, then by the owner's number.
    package static func < (a: ClaimID, b: ClaimID) -> Bool { (a.owner, a.local) < (b.owner, b.local) }
    /// "owner.local", as shown in dumps and events.
    package var description: String { "\(owner).\(local)" }
}

/// A registered presenter, named like a claim.
package struct PresenterID: Hashable, Sendable, CustomStringConvertible {
    /// The owner that registered the presenter.
    package var owner: UInt64
    /// The owner's number for this presenter.
    package var local: UInt64
    /// The presenter `local` of `owner`.
    package init(owner: UInt64, local: UInt64) {
        self.owner = owner
        self.local = local
    }
    package var description: String { "\(owner).\(local)" }
}

/// A connection that held claims under a server that died (D-402): that server's pid and the
/// connection's owner number there. A new server awaits the holders its predecessor listed.
package struct ClaimHolder: Hashable, Sendable, CustomStringConvertible {
    /// The pid of the server the claims were granted by.
    package var server: Int32
    /// The connection's owner number in that server.
    package var owner: UInt64
    /// Connection `owner` of server `server`.
    package init(server: Int32, owner: UInt64) {
        self.server = server
        self.owner = owner
    }
    package var description: String { "\(owner)@\(server)" }
}

/// Device and inode: an item's identity while it exists, stable across renames.
package struct ItemIdentity: Hashable, Sendable {
    /// `st_dev`.
    package var device: UInt64
    /// `st_ino`.
    package var inode: UInt64
    /// The identity (device, inode).
    package init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }
}

/// One item of a claim, resolved by the client: canonical path, identity, and package membership.
package struct ClaimIntent: Sendable, Hashable {
    /// Read or write.
    package var kind: AccessKind
    /// Options of a read.
    package var readingOptions: ReadingOptions
    /// Options of a write.
    package var writingOptions: WritingOptions
    /// Canonical absolute path (parent directories' symlinks resolved, no `.` or `..`).
    package var path: String
    /// Device and inode when the item exists.
    package var identity: ItemIdentity?
    /// Whether the item is a directory.
    package var isDirectory: Bool
    /// The outermost file package containing the item (or the item itself), if any: the whole
    /// package then counts as one item (rules 8–9).
    package var packageRoot: String?

    /// An intent on `path`; `identity`, `isDirectory` and `packageRoot` describe the item.
    package init(
        kind: AccessKind, path: String, readingOptions: ReadingOptions = [], writingOptions: WritingOptions = [],
        identity: ItemIdentity? = nil, isDirectory: Bool = false, packageRoot: String? = nil
    ) {
        self.kind = kind
        self.path = path
        self.readingOptions = readingOptions
        self.writingOptions = writingOptions
        self.identity = identity
        self.isDirectory = isDirectory
        self.packageRoot = packageRoot
    }

    /// The path used for conflicts: the package root for anything inside a package.
    var conflictPath: String { packageRoot ?? path }

    /// A `prepare(…)` intent (rule 33): it messages presenters without relinquishing.
    var isPreparing: Bool {
        kind == .read ? readingOptions.contains(.preparing) : writingOptions.contains(.preparing)
    }

    /// A write whose claim on a directory covers everything inside it (rule 12).
    var coversSubtree: Bool { kind == .write && !writingOptions.isDisjoint(with: .subtreeOptions) }

    /// "read", "write", "write(deleting)": for dumps and logs.
    package var kindDescription: String {
        switch kind {
        case .read:
            var parts: [String] = []
            if readingOptions.contains(.withoutChanges) { parts.append("withoutChanges") }
            if readingOptions.contains(.resolvesSymbolicLink) { parts.append("resolvesSymbolicLink") }
            if readingOptions.contains(.immediatelyAvailableMetadataOnly) { parts.append("metadataOnly") }
            if readingOptions.contains(.forUploading) { parts.append("forUploading") }
            if readingOptions.contains(.preparing) { parts.append("preparing") }
            return parts.isEmpty ? "read" : "read(\(parts.joined(separator: ",")))"
        case .write:
            let names: [(WritingOptions, String)] = [
                (.forDeleting, "deleting"), (.forMoving, "moving"), (.forMerging, "merging"),
                (.forReplacing, "replacing"), (.contentIndependentMetadataOnly, "metadataOnly"),
                (.forEvicting, "evicting"), (.preparing, "preparing"),
            ]
            let parts = names.filter { writingOptions.contains($0.0) }.map(\.1)
            return parts.isEmpty ? "write" : "write(\(parts.joined(separator: ",")))"
        }
    }
}

/// Everything the arbiter needs to know about one claim request.
package struct ClaimRequest: Sendable {
    /// Whether any intent is a write.
    var hasWrite: Bool { intents.contains { $0.kind == .write } }

    /// The claim's name.
    package var id: ClaimID
    /// The process the claim is for (SO_PEERCRED for remote clients; the kernel caller for the mount).
    package var pid: Int32
    /// Claims with the same purpose never wait for each other (rules 4–6).
    package var purpose: String
    /// The items, granted together or not at all.
    package var intents: [ClaimIntent]
    /// Claims the caller already holds (nested coordination). A nested claim waits only for granted
    /// claims, never for queued ones, and fails at once if it would wait for one of these.
    package var heldByCaller: [ClaimID]
    /// For claims taken on behalf of a kernel caller: granted claims of these processes (the caller
    /// and its ancestors) do not block this claim — the coordinator never coordinates with itself.
    package var actingForPids: [Int32]
    /// When waiting ends with `.timedOut` (monotonic nanoseconds).
    package var waitDeadline: UInt64
    /// How long a presenter may take to answer one message before it counts as answered.
    package var presenterTimeout: UInt64

    /// A request; see the properties for the meaning of each argument.
    package init(
        id: ClaimID, pid: Int32, purpose: String, intents: [ClaimIntent], heldByCaller: [ClaimID] = [],
        actingForPids: [Int32] = [], waitDeadline: UInt64, presenterTimeout: UInt64
    ) {
        self.id = id
        self.pid = pid
        self.purpose = purpose
        self.intents = intents
        self.heldByCaller = heldByCaller
        self.actingForPids = actingForPids
        self.waitDeadline = waitDeadline
        self.presenterTimeout = presenterTimeout
    }
}

/// Which optional presenter methods a presenter implements; messages for the others are skipped
/// (rule 32) and package presenters without subitem methods get `didChange` instead (rule 37).
public struct PresenterMethods: OptionSet, Sendable, Hashable {
    /// The bits, as sent in `addPresenter`.
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// `relinquishPresentedItem(toReader:)`.
    public static let relinquishToReader = PresenterMethods(rawValue: 1 << 0)
    /// `relinquishPresentedItem(toWriter:)`.
    public static let relinquishToWriter = PresenterMethods(rawValue: 1 << 1)
    /// `savePresentedItemChanges(completionHandler:)`.
    public static let savePresentedItemChanges = PresenterMethods(rawValue: 1 << 2)
    /// `accommodatePresentedItemDeletion(completionHandler:)`.
    public static let accommodateDeletion = PresenterMethods(rawValue: 1 << 3)
    /// `accommodatePresentedSubitemDeletion(at:completionHandler:)`.
    public static let accommodateSubitemDeletion = PresenterMethods(rawValue: 1 << 4)
    /// `presentedItemDidChange()`.
    public static let didChange = PresenterMethods(rawValue: 1 << 5)
    /// `presentedItemDidMove(to:)`.
    public static let didMove = PresenterMethods(rawValue: 1 << 6)
    /// `presentedSubitemDidChange(at:)`.
    public static let subitemDidChange = PresenterMethods(rawValue: 1 << 7)
    /// `presentedSubitem(at:didMoveTo:)`.
    public static let subitemDidMove = PresenterMethods(rawValue: 1 << 8)
    /// The version hooks (gain, lose, resolve; item and subitem forms).
    public static let versionEvents = PresenterMethods(rawValue: 1 << 9)
    /// `accommodatePresentedItemEviction(completionHandler:)` (rule 34). Not in `.all`: a presenter
    /// that implements it says so explicitly, because one that does not vetoes every eviction.
    public static let accommodateEviction = PresenterMethods(rawValue: 1 << 10)
    /// Every method except `accommodateEviction` (the default of `implementedPresenterMethods`).
    public static let all = PresenterMethods(rawValue: (1 << 10) - 1)
    /// Every bit a peer may send (wire protocol version 2).
    package static let known = PresenterMethods(rawValue: (1 << 11) - 1)
}

/// A presenter as the arbiter sees it.
package struct PresenterRegistration: Sendable, Hashable {
    /// The presenter's name.
    package var id: PresenterID
    /// The process presenting.
    package var pid: Int32
    /// The purpose of coordinators created with this presenter: their claims do not message it.
    package var purpose: String
    /// Canonical path of the presented item.
    package var path: String
    /// Device and inode when the item exists.
    package var identity: ItemIdentity?
    /// Whether the presented item is a directory.
    package var isDirectory: Bool
    /// Outermost package containing (or being) the presented item.
    package var packageRoot: String?
    /// Implemented optional methods.
    package var methods: PresenterMethods

    /// A registration; see the properties.
    package init(
        id: PresenterID, pid: Int32, purpose: String, path: String, identity: ItemIdentity? = nil,
        isDirectory: Bool = false, packageRoot: String? = nil, methods: PresenterMethods = .all
    ) {
        self.id = id
        self.pid = pid
        self.purpose = purpose
        self.path = path
        self.identity = identity
        self.isDirectory = isDirectory
        self.packageRoot = packageRoot
        self.methods = methods
    }
}

/// A message to a presenter. Those that need an answer carry a message number in the action.
package enum PresenterMessage: Sendable, Hashable {
    /// `relinquishPresentedItem(toReader:)`.
    case relinquishToReader
    /// `relinquishPresentedItem(toWriter:)`.
    case relinquishToWriter
    /// `savePresentedItemChanges(completionHandler:)`.
    case savePresentedItemChanges
    /// `accommodatePresentedItemDeletion(completionHandler:)`.
    case accommodateDeletion
    /// `accommodatePresentedSubitemDeletion(at:completionHandler:)`.
    case accommodateSubitemDeletion(at: String)
    /// The claim the presenter relinquished to has ended: run the reacquirer (rule 31).
    case reacquire
    /// `presentedItemDidChange()`.
    case didChange
    /// `presentedSubitemDidChange(at:)`.
    case subitemDidChange(at: String)
    /// `presentedItemDidMove(to:)`.
    case didMove(to: String)
    /// `presentedSubitem(at:didMoveTo:)`.
    case subitemDidMove(from: String, to: String)
    /// A version of `item` was gained, lost or resolved; `item` is the presented item itself or
    /// an item inside the presented directory (then the subitem hook is called).
    case versionChanged(change: VersionChange, item: String, version: String, versionName: String)
    /// `accommodatePresentedItemEviction(completionHandler:)` (rule 34): the presenter must remove
    /// itself before answering, or answer with an error to veto the eviction.
    case accommodateEviction

    /// Whether the sender waits for an answer.
    package var needsAnswer: Bool {
        switch self {
        case .relinquishToReader, .relinquishToWriter, .savePresentedItemChanges, .accommodateDeletion,
            .accommodateSubitemDeletion, .accommodateEviction:
            return true
        default: return false
        }
    }

    /// The method this message calls.
    package var method: PresenterMethods {
        switch self {
        case .relinquishToReader: .relinquishToReader
        case .relinquishToWriter: .relinquishToWriter
        case .savePresentedItemChanges: .savePresentedItemChanges
        case .accommodateDeletion: .accommodateDeletion
        case .accommodateSubitemDeletion: .accommodateSubitemDeletion
        case .reacquire: []
        case .didChange: .didChange
        case .subitemDidChange: .subitemDidChange
        case .didMove: .didMove
        case .subitemDidMove: .subitemDidMove
        case .versionChanged: .versionEvents
        case .accommodateEviction: .accommodateEviction
        }
    }

    /// The presenter method's name, for events and dumps.
    package var name: String {
        switch self {
        case .relinquishToReader: "relinquishPresentedItem(toReader:)"
        case .relinquishToWriter: "relinquishPresentedItem(toWriter:)"
        case .savePresentedItemChanges: "savePresentedItemChanges"
        case .accommodateDeletion: "accommodatePresentedItemDeletion"
        case .accommodateSubitemDeletion: "accommodatePresentedSubitemDeletion(at:)"
        case .reacquire: "reacquirer"
        case .didChange: "presentedItemDidChange"
        case .subitemDidChange: "presentedSubitemDidChange(at:)"
        case .didMove: "presentedItemDidMove(to:)"
        case .subitemDidMove: "presentedSubitem(at:didMoveTo:)"
        case .versionChanged(let change, _, _, _): "version \(change)"
        case .accommodateEviction: "accommodatePresentedItemEviction"
        }
    }
}

/// What happened to a version of an item (the presenter version hooks).
public enum VersionChange: UInt8, Sendable, Hashable, CustomStringConvertible {
    /// A version was added.
    case gained = 0
    /// A version was removed.
    case lost = 1
    /// A conflict version was resolved.
    case resolved = 2
    /// "gained", "lost", "resolved".
    public var description: String {
        switch self {
        case .gained: "gained"
        case .lost: "lost"
        case .resolved: "resolved"
        }
    }
}

/// What the arbiter's caller must do after dropping its lock.
package enum ArbiterAction: Sendable, Equatable {
    /// Run the claim's accessor; `paths` are the intents' current paths (moved items rewritten).
    case grant(ClaimID, paths: [String])
    /// The claim will never be granted.
    case fail(ClaimID, CoordinationError)
    /// Send `message` to a presenter. `messageID` is non-zero when an answer is awaited; `claim`
    /// is the claim that caused it (the reacquirer is keyed by it).
    case deliver(PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?)
}

/// A line of the claim dump's event log (e.g. a presenter that missed its deadline).
package struct ArbiterEvent: Sendable, Hashable {
    /// Monotonic nanoseconds.
    package var time: UInt64
    /// The claim concerned, if any.
    package var claim: ClaimID?
    /// What happened, as a sentence.
    package var text: String
}

/// The state of one claim as shown by `providerfs claims`.
package struct ClaimSnapshot: Sendable, Hashable {
    /// "held", "waiting" (queued behind another claim) or "messaging" (waiting for presenters).
    package var state: String
    /// The claim.
    package var id: ClaimID
    /// The process the claim is for.
    package var pid: Int32
    /// The claim's purpose identifier.
    package var purpose: String
    /// Its items.
    package var intents: [ClaimIntent]
    /// Nanoseconds since the claim was requested.
    package var age: UInt64
    /// Events of this claim (missed presenter deadlines…).
    package var events: [String]
}

/// A presenter as shown by `providerfs claims`.
package struct PresenterSnapshot: Sendable, Hashable {
    /// The presenter.
    package var id: PresenterID
    /// The presenting process.
    package var pid: Int32
    /// Canonical path of the presented item (after moves).
    package var path: String
}
