// Where the app keeps its things: one directory in the XDG data directory holding the records
// database, the library of imported documents (named by UUID) and the staging area.

public import Foundation
import SystemSupport

/// The app's data directory and what lives in it.
public struct LibraryLocation: Sendable, Equatable {
    /// `$XDG_DATA_HOME/reading-list`, else `$HOME/.local/share/reading-list`, unless given.
    public let root: String

    public init(root: String) {
        var trimmed = root
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
        self.root = trimmed
    }

    /// The XDG location for `environment` (the XDG Base Directory rules: an XDG_DATA_HOME that is
    /// empty or relative is ignored).
    public static func standard(
        environment: [String: String] = ProcessInfo.processInfo.environment
    )
        throws(ReadingListError) -> LibraryLocation
    {
        if let data = environment["XDG_DATA_HOME"], data.hasPrefix("/") {
            return LibraryLocation(root: data + "/reading-list")
        }
        guard let home = environment["HOME"], home.hasPrefix("/") else {
            throw ReadingListError("neither XDG_DATA_HOME nor HOME is an absolute path; use --data-dir")
        }
        return LibraryLocation(root: home + "/.local/share/reading-list")
    }

    /// The records (SQLite).
    public var database: String { root + "/records.sqlite" }
    /// The app's own copies, `<UUID>.pdf`.
    public var library: String { root + "/library" }
    /// Copies in progress, `<UUID>.partial`, each locked by the import writing it.
    public var staging: String { root + "/staging" }

    /// The library file of document `id`.
    public func documentPath(_ id: String) -> String { library + "/" + id + ".pdf" }

    /// Creates the directories (mode 0700: the documents are the user's).
    public func prepare() throws(ReadingListError) {
        for directory in [root, library, staging] {
            do {
                try makeDirectories(directory, mode: 0o700)
            } catch {
                throw ReadingListError("cannot create \(directory): \(error)")
            }
        }
    }
}

/// A failure of the app outside an import (opening the records, a bad argument, …).
public struct ReadingListError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
