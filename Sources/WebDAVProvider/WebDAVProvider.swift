// A WebDAV server as the remote (issue 26; docs/WEBDAV.md). Identifiers are paths relative to
// the base collection, decoded, as a local directory's are. Listings are PROPFIND Depth 1 (never
// infinity), streamed (WebDAVProvider+Listing.swift), one item PROPFIND Depth 0, content a ranged
// GET (a large fetch several at once, D-513). The content version is the ETag; a server that
// sends none gets `lm:<getlastmodified seconds>;s<size>` (D-416). Writes are in
// WebDAVProvider+Writing.swift.

import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// How to reach a WebDAV server. `description` never shows the password.
public struct WebDAVConfiguration: Sendable, CustomStringConvertible {
    public var location: WebDAVLocation
    public var user: String?
    /// From `--password-file` or `PROVIDERFS_WEBDAV_PASSWORD` only (D-418).
    public var password: String?
    /// Connecting may take this long.
    public var connectTimeout: Duration = .seconds(10)
    /// A metadata request (PROPFIND, MKCOL, MOVE, DELETE) may take this long in all.
    public var requestTimeout: Duration = .seconds(30)
    /// A content transfer (GET, PUT) may move no byte for this long.
    public var stallTimeout: Duration = .seconds(30)
    /// CA certificates (PEM) to trust for https instead of the system's.
    public var caFile: String?
    /// When a request is asked again: a busy server, a refused connection (D-452).
    public var retry = HTTPRetry()
    /// A fetch of at most this many bytes asks for the server's checksums and, when the answer
    /// states one covering exactly its bytes, is verified before any of them is served (D-495);
    /// a longer one is neither: its first byte never waits for its last. 0: never verified.
    public var checksumLimit: Int64 = 4 << 20
    /// A fetch longer than one part (and than `checksumLimit`) is that many ranged GETs of
    /// consecutive parts at once, handed over in order (D-513). 1: one GET per fetch.
    public var parallelRanges = 4
    /// The bytes of one such part: large, since each GET costs the server an open and a seek
    /// (8 MiB parts took rclone 1.6× the CPU of one GET, measured); a part ahead waits in its
    /// stream's bounded queue until the reader comes.
    public var rangePartSize: Int64 = 32 << 20
    /// The server promises that a collection's `getctag` changes whenever anything below it does,
    /// at any depth (CalendarServer's ctag speaks of the collection's own members only): then a collection
    /// found unchanged stands for its whole subtree, and a poll of an unchanged tree is one
    /// PROPFIND Depth 0 of the root (D-525). Off: each collection's own ctag decides for it.
    public var ctagCoversSubtree = false
    /// How long the ctag a collection's listing gave a child collection stands for the child's
    /// own Depth 0 (D-525): a poll lists a child right after its parent; a later listing asks.
    public var childCtagLifetime: Duration = .seconds(5)

    public init(location: WebDAVLocation, user: String? = nil, password: String? = nil) {
        self.location = location
        self.user = user
        self.password = password
    }

    public var description: String {
        "\(location)" + (user.map { " as \($0)" } ?? "") + (password == nil ? "" : " (password set)")
    }
}

/// A provider over a WebDAV collection (see the file's header).
public final class WebDAVProvider: Provider {
    public let configuration: WebDAVConfiguration
    var location: WebDAVLocation { configuration.location }
    let transport: HTTPTransport
    /// Set once the server refused MOVE for an upload (405, 501): later uploads PUT in place.
    let putsInPlace = Locked(false)
    /// The WebDAV locks this provider holds, by item: their tokens (WebDAVProvider+Locking.swift).
    let heldLocks = Locked<[ItemIdentifier: String]>([:])
    /// Listings kept under their collection's `getctag` (D-518; ListedState.swift).
    let ctagListings = Locked(CtagListings())
    /// Files' `oc:checksums` from PROPFIND answers, by version (D-519).
    let listedChecksums = Locked(ListedChecksums())

    /// What a WebDAV server honours: one-name lookups (PROPFIND Depth 0) and writing. Not yet:
    /// change tracking (needs polling), stored attributes (PROPPATCH), links, exchanges.
    public let capabilities: ProviderCapabilities = [.namedChildLookup, .writing]

    public init(configuration: WebDAVConfiguration) {
        self.configuration = configuration
        transport = HTTPTransport(
            settings: HTTPSettings(
                user: configuration.user, password: configuration.password,
                connectTimeout: configuration.connectTimeout, requestTimeout: configuration.requestTimeout,
                stallTimeout: configuration.stallTimeout, caFile: configuration.caFile), retry: configuration.retry)
    }

    /// Requests asked again after a busy answer or a refused connection (D-452).
    public var requestsRetried: Int { transport.retries.withLock { $0 } }

    /// How many connections to the server were opened so far (requests reuse them, D-415).
    public var connectionsOpened: Int { transport.connectionsOpened.withLock { $0 } }

    /// Upload staging names (`.providerfs-upload-<random>`): never listed, never looked up, refused
    /// as names of new items (as the local provider's, D-351).
    public static let temporaryNamePrefix = ".providerfs-upload-"

    static func isTemporaryName(_ name: some StringProtocol) -> Bool {
        name.utf8.starts(with: temporaryNamePrefix.utf8)
    }

    // MARK: Reading

    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try checkIdentifier(identifier)
        if let last = identifier.rawValue.split(separator: "/").last, Self.isTemporaryName(last) {
            throw ProviderError(.noSuchItem, "\(identifier) is gone", errno: ENOENT)
        }
        guard let entry = try await propfindItem(identifier) else {
            throw ProviderError(.io, "PROPFIND \(identifier): the answer does not name the item", errno: EIO)
        }
        if let status = entry.status {
            throw Self.statusError(status, "PROPFIND \(identifier)", conflict: .noSuchItem)
        }
        return makeItem(identifier, entry)
    }

    /// One PROPFIND Depth 0 of the name; a miss checks that the directory itself still exists.
    public func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        guard WebDAVLocation.isName(name) else { throw ProviderError(.invalidName, "'\(name)' is not a file name") }
        if Self.isTemporaryName(name) { return nil }
        do {
            return try await item(for: WebDAVLocation.identifier(of: name, in: directory))
        } catch let error as ProviderError where error.code == .noSuchItem || error.code == .wrongKind {
            let parent = try await item(for: directory)
            guard parent.kind == .directory else {
                throw ProviderError(.wrongKind, "\(directory) is not a directory", errno: ENOTDIR)
            }
            return nil
        }
    }

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try checkIdentifier(identifier)
        guard !range.isEmpty else { return WebDAVContentStream.empty(identifier, version, range) }
        let length = Int64(range.count)
        let part = max(1, configuration.rangePartSize)
        // A fetch that may be verified (D-495) stays one GET: a checksum covers one answer's bytes.
        guard configuration.parallelRanges > 1, length > part, length > configuration.checksumLimit else {
            return try await openGet(
                identifier, version, range, checksumLimit: configuration.checksumLimit,
                listed: listedChecksums.withLock { $0.checksums(of: identifier, at: version) }
            ) { _ in true }
        }
        let parts = stride(from: range.lowerBound, to: range.upperBound, by: Int(part)).map {
            $0..<min($0 + part, range.upperBound)
        }
        let first = try await openGet(identifier, version, parts[0], whole: range, checksumLimit: 0) { _ in true }
        // A server that ignores Range sends the whole file for the first part: that one answer is
        // the fetch (docs/WEBDAV.md).
        if first.ignoredRange { return first }
        return ParallelRangeStream(first: first, parts: parts, width: configuration.parallelRanges) { part in
            try await self.openGet(identifier, version, part.range, checksumLimit: 0, adopt: part.adopt)
        }
    }

    /// One GET of `range` (asked again as `transport.retrying` says), returned once its status is
    /// known. `whole`: what a 200 delivers (see `WebDAVContentStream`). `listed`: the file's
    /// checksums from its listing, for a whole-file answer that states none (D-519). `adopt` takes each
    /// attempt's stream before it starts (false: give up, the caller closed it).
    func openGet(
        _ identifier: ItemIdentifier, _ version: ContentVersion, _ range: Range<Int64>, whole: Range<Int64>? = nil,
        checksumLimit: Int64, listed: [ContentChecksum] = [], adopt: @escaping (WebDAVContentStream) -> Bool
    ) async throws -> WebDAVContentStream {
        var headers: [String] = []
        // A strong ETag makes the server refuse (412) a file that changed; a weak one cannot be
        // used in If-Match, and the response's ETag is compared instead (as it is for every GET).
        if Self.isETag(version.rawValue), !version.rawValue.hasPrefix("W/") {
            headers.append("If-Match: \(version.rawValue)")
        }
        // Checksums are asked for only where they can be used (D-495): a digest of these bytes,
        // and the whole file's when the range starts at 0 (it may be all of it).
        let verifiable = Int64(range.count) <= checksumLimit
        if verifiable { headers.append("Want-Content-Digest: sha-256=10, sha-512=9") }
        if verifiable, range.lowerBound == 0 { headers.append("Want-Repr-Digest: sha-256=10, sha-512=9") }
        let request = HTTPRequest(
            method: "GET", url: location.url(of: identifier), headers: headers, range: range, followRedirects: true,
            totalDeadline: false)
        // Asked again, before any byte was taken, when the server is busy or the connection
        // failed (D-452).
        return try await transport.retrying("GET") {
            let stream = WebDAVContentStream(
                identifier: identifier, version: version, range: range, stallTimeout: configuration.stallTimeout,
                checksumLimit: checksumLimit, listedChecksums: listed, whole: whole)
            guard adopt(stream) else { return (.failure(CancellationError()), .other) }
            do {
                try await stream.start(request, transport: transport)
                return (.success(stream), .other)
            } catch {
                return (.failure(error), error is CancellationError ? .other : stream.failureOutcome)
            }
        }
    }

    // MARK: Protocol helpers

    /// The properties every PROPFIND asks for; a server that lacks `getctag` or `oc:checksums`
    /// answers them in a 404 propstat, which is ignored (D-518, D-519).
    static let propfindBody = Array(
        """
        <?xml version="1.0" encoding="utf-8"?>
        <D:propfind xmlns:D="DAV:" xmlns:CS="http://calendarserver.org/ns/" xmlns:OC="http://owncloud.org/ns">\
        <D:prop><D:resourcetype/><D:getcontentlength/><D:getlastmodified/><D:getetag/><CS:getctag/>\
        <OC:checksums/></D:prop></D:propfind>
        """.utf8)

    func makeItem(_ identifier: ItemIdentifier, _ entry: MultiStatusEntry) -> ProviderItem {
        let directory = entry.isCollection
        let size = directory ? 0 : entry.contentLength ?? 0
        let modified = entry.lastModified ?? 0
        let version = entry.etag.map { ContentVersion($0) } ?? Self.fallbackVersion(lastModified: modified, size: size)
        // What the server says of a file now replaces what it said before: checksums or none.
        if !directory { listedChecksums.withLock { $0.record(identifier, version, entry.checksums) } }
        var item = ProviderItem(
            identifier: identifier, parent: parent(of: identifier), name: name(of: identifier),
            kind: directory ? .directory : .file, size: size, modificationTime: ItemTime(seconds: modified),
            contentVersion: version, permissions: directory ? 0o755 : 0o644)
        // The catalog stores them with the item, and hands them back after a restart (D-526).
        if !directory, !entry.checksums.isEmpty {
            item.statedChecksums = StatedChecksums(version: version, checksums: entry.checksums)
        }
        return item
    }

    /// Checksums the catalog stored from listings before a restart (D-526): kept as if just
    /// listed, each with its own version, unless this run's answers already said something.
    public func restoreStatedChecksums(of items: [ProviderItem]) {
        listedChecksums.withLock { kept in
            for item in items {
                guard let stated = item.statedChecksums else { continue }
                kept.restore(item.identifier, stated.version, stated.checksums)
            }
        }
    }

    /// The version of an item whose server sends no ETag (D-416): its last-modified time (whole
    /// seconds, as HTTP dates are) and size. A rewrite of the same size within one second is not
    /// seen (docs/WEBDAV.md).
    static func fallbackVersion(lastModified: Int64, size: Int64) -> ContentVersion {
        ContentVersion("lm:\(lastModified);s\(size)")
    }

    /// Whether a version is an ETag (`"…"` or `W/"…"`), not the fallback.
    static func isETag(_ version: String) -> Bool { version.hasPrefix("\"") || version.hasPrefix("W/\"") }

    /// `sameVersion`: the catalog keeps a weak ETag's version when the tag turns strong (D-510).
    public func isSameContent(_ version: ContentVersion, as other: ContentVersion) -> Bool {
        Self.sameVersion(version, other)
    }

    /// Whether two versions name the same content: ETags by the weak comparison (Apache sends
    /// `W/"x"` for a file changed within the last second and `"x"` after it, D-422), others as
    /// they are.
    static func sameVersion(_ one: ContentVersion, _ other: ContentVersion) -> Bool {
        guard isETag(one.rawValue), isETag(other.rawValue) else { return one == other }
        return opaqueTag(one.rawValue) == opaqueTag(other.rawValue)
    }

    /// An ETag without its weakness marker (the weak comparison of RFC 9110 §8.8.3.2).
    static func opaqueTag(_ tag: String) -> Substring {
        let trimmed = Substring(tag.trimmingCharacters(in: .whitespaces))
        return trimmed.hasPrefix("W/") ? trimmed.dropFirst(2) : trimmed
    }

    func parent(of identifier: ItemIdentifier) -> ItemIdentifier {
        guard let slash = identifier.rawValue.lastIndex(of: "/") else { return .root }
        return ItemIdentifier(String(identifier.rawValue[..<slash]))
    }

    func name(of identifier: ItemIdentifier) -> String {
        identifier.rawValue.split(separator: "/").last.map(String.init) ?? ""
    }

    func checkIdentifier(_ identifier: ItemIdentifier) throws {
        guard identifier != .root else { return }
        for component in identifier.rawValue.split(separator: "/", omittingEmptySubsequences: false) {
            guard WebDAVLocation.isName(component) else {
                throw ProviderError(
                    .invalidName, "identifier '\(identifier.rawValue)' is not a path inside the collection")
            }
        }
    }

    /// An HTTP status that is not the success asked for, as the cache reads it (docs/WEBDAV.md):
    /// 401/403 EACCES, 404/410 not found (and `conflict` for 409, which names a missing parent
    /// for PUT and MKCOL), 412 a changed version, 413 EFBIG, 423 EBUSY (another client's lock, D-451),
    /// 507 ENOSPC, 502/503/504 unreachable
    /// (cached items stay readable), anything else EIO.
    static func statusError(_ status: Int, _ what: String, conflict: ProviderError.Code) -> ProviderError {
        let message = "\(what): the server answered \(status)"
        switch status {
        case 401, 403: return ProviderError(.accessDenied, message, errno: EACCES)
        case 404, 410: return ProviderError(.noSuchItem, message, errno: ENOENT)
        case 409: return ProviderError(conflict, message, errno: conflict == .noSuchItem ? ENOENT : nil)
        case 412: return ProviderError(.versionChanged, message)
        case 413: return ProviderError(.tooLarge, message, errno: EFBIG)
        case 423: return ProviderError(.io, message + " (locked by another client)", errno: EBUSY)
        case 507: return ProviderError(.noSpace, message, errno: ENOSPC)
        case 502, 503, 504: return ProviderError(.unreachable, message, errno: ENETUNREACH)
        default: return ProviderError(.io, message, errno: EIO)
        }
    }
}
