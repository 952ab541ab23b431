// PROPFIND, streamed (D-478): the 207 body is parsed as it arrives (`MultiStatusStream`), each
// response handed over as it closes, and a Depth 1 listing hands its children to the cache in
// batches (D-470) while the rest is on the wire. A small answer is parsed on the transfer's own
// pool thread once it has arrived whole; one that outgrows `parsedAlongside` gets a parsing thread
// of its own, fed through a bounded pipe (the transfer waits while it is full). A collection
// listed with a `getctag` is asked again with a Depth 0 first, and an unchanged ctag answers
// with the kept listing (D-518), or not asked at all when its parent's listing just gave it that
// ctag (D-525, ListedState.swift).

import Dispatch
import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

extension WebDAVProvider {
    /// A Depth 1 listing's batches (D-470): two small ones first (a reader answers once it has
    /// two), then larger ones.
    static let firstListingBatch = 256
    static let listingBatch = 4096

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await listing(of: identifier, batch: nil)
    }

    /// `children(of:)` handing the children over in batches as the PROPFIND answer is parsed;
    /// no token (a WebDAV listing is not tracked).
    public func trackedChildren(
        of directory: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        (try await listing(of: directory, batch: batch), nil)
    }

    /// Both forms of the listing: a PROPFIND Depth 1 of the collection, or, when its last one
    /// carried a `getctag`, its kept children: when its parent's listing just gave it the same
    /// ctag (D-525), or when a Depth 0 of it does (D-518).
    func listing(
        of identifier: ItemIdentifier, batch: (@Sendable ([ProviderItem]) -> Void)?
    ) async throws -> [ProviderItem] {
        try checkIdentifier(identifier)
        let asked = ContinuousClock.now
        let parent = identifier == .root ? nil : parent(of: identifier)
        let answer = ctagListings.withLock {
            $0.answer(for: identifier, parent: parent, now: asked, lifetime: configuration.childCtagLifetime)
        }
        var current: (CtagListings.Listing, at: ContinuousClock.Instant)?
        switch answer {
        case .current(let listing, let at):
            current = (listing, at)
        case .ask(let listing):
            let entry: MultiStatusEntry?
            do {
                entry = try await propfindItem(identifier, collection: true)
            } catch {
                ctagListings.withLock { $0.forget(identifier) }
                throw error
            }
            if let entry, entry.status == nil, entry.isCollection, entry.ctag == listing.ctag {
                current = (listing, asked)
            }
        case .changed, .list:
            break
        }
        if let (listing, at) = current {
            ctagListings.withLock { $0.confirmed(identifier, at: at, subtree: configuration.ctagCoversSubtree) }
            if let batch, !listing.children.isEmpty { batch(listing.children) }
            return listing.children
        }
        let collector = ListingCollector(directory: identifier, provider: self, batch: batch)
        do {
            try await propfind(location.url(of: identifier, collection: true), depth: 1, what: "\(identifier)") {
                try collector.add($0)
            }
        } catch let error as ProviderError where (error.code == .noSuchItem || error.code == .io) && identifier != .root
        {
            // "file/" is not found at some servers, a bad request (400) at Apache's mod_dav:
            // say what the item really is.
            ctagListings.withLock { $0.forget(identifier) }
            let item = try await item(for: identifier)
            guard item.kind == .directory else {
                throw ProviderError(.wrongKind, "\(identifier) is not a directory", errno: ENOTDIR)
            }
            throw error
        } catch {
            ctagListings.withLock { $0.forget(identifier) }
            throw error
        }
        let (children, ctag, childCtags): ([ProviderItem], String?, [ItemIdentifier: String])
        do {
            (children, ctag, childCtags) = try collector.finish()
        } catch {
            ctagListings.withLock { $0.forget(identifier) }
            throw error
        }
        ctagListings.withLock {
            $0.keep(identifier, ctag: ctag, children: children, childCtags: childCtags, at: asked)
        }
        return children
    }

    /// PROPFIND of `url` at `depth` (0 or 1, never infinity), each response handed to `entry`
    /// as it is parsed, while the body arrives. `entry` throwing stops the request, and is what
    /// this throws. Asked again (D-452) only while no response was handed over.
    func propfind(
        _ url: String, depth: Int, what: String, entry: @escaping @Sendable (MultiStatusEntry) throws -> Void
    ) async throws {
        let request = HTTPRequest(
            method: "PROPFIND", url: url,
            headers: ["Depth: \(depth)", "Content-Type: application/xml; charset=utf-8"], body: Self.propfindBody,
            followRedirects: true)
        let handedOver = Locked(false)
        try await transport.retrying("PROPFIND") { () -> (Result<Void, any Error>, HTTPRetry.Outcome) in
            let context = TransferContext(stallTimeout: configuration.stallTimeout)
            let reader = PropfindReader(what: what, context: context) { response in
                handedOver.withLock { $0 = true }
                try entry(response)
            }
            context.onBody = { reader.received($0) }
            do {
                try await transport.run(request, context: context) { try reader.finish($0) }
                return (.success(()), .other)
            } catch {
                let outcome = handedOver.withLock { $0 } || error is CancellationError ? .other : reader.outcome
                return (.failure(error), outcome)
            }
        }
    }

    /// The one item PROPFIND Depth 0 names: its response whose href is the item's. `collection`:
    /// asked at the collection URL (trailing `/`), as listings are.
    func propfindItem(_ identifier: ItemIdentifier, collection: Bool = false) async throws -> MultiStatusEntry? {
        let found = Locked<MultiStatusEntry?>(nil)
        let url = location.url(of: identifier, collection: collection)
        try await propfind(url, depth: 0, what: "\(identifier)") { [location] entry in
            // One naming another place (outside the collection, `..`, an encoded "/") is never
            // taken for it (D-466).
            if location.identifier(forHref: entry.href) == identifier { found.withLock { $0 = $0 ?? entry } }
        }
        return found.withLock { $0 }
    }
}

/// One attempt of a streamed PROPFIND: judges the answer's status at its first body byte, feeds a
/// 207 body to its `MultiStatusStream`, and at the end says what the request came to (see the
/// file's header).
final class PropfindReader: @unchecked Sendable {
    // Safe: `discarded`, `checked`, `parsing` and `stoppedByReader` are only touched by the
    // transfer's thread (the body callback, then `finish` on the same pool thread); `consumerError`
    // and `parsed` are written by the parsing thread before `done` is signalled.
    let what: String
    let context: TransferContext
    private let stream: MultiStatusStream
    private let consumerError: Locked<(any Error)?>
    private var parsed: Result<Void, MultiStatusError>?
    private var parsing: Thread?
    private let done = DispatchSemaphore(value: 0)
    private var discarded = 0
    private var checked = false
    private var stoppedByReader = false
    /// How the attempt ended, as `HTTPRetry` reads it.
    private(set) var outcome: HTTPRetry.Outcome = .other

    /// A 207 body parsed on the transfer's thread once it has ended, while it is no longer than
    /// this; a longer one is parsed alongside the transfer by a thread of its own.
    static let parsedAlongside = 64 << 10
    /// Bytes of a body that is not a 207 read before the transfer is stopped (it is not used).
    static let discardedAtMost = 1 << 20

    init(what: String, context: TransferContext, entry: @escaping @Sendable (MultiStatusEntry) throws -> Void) {
        self.what = what
        self.context = context
        let consumerError = Locked<(any Error)?>(nil)
        self.consumerError = consumerError
        stream = MultiStatusStream { response in
            do {
                try entry(response)
                return true
            } catch {
                consumerError.withLock { $0 = error }
                return false
            }
        }
    }

    /// The body callback (transfer thread). False stops the transfer.
    func received(_ chunk: UnsafeRawBufferPointer) -> Bool {
        guard context.status == 207 else {
            // An error page, or a 2xx that is not a Multi-Status: its status says it all.
            discarded += chunk.count
            if discarded > Self.discardedAtMost { context.stoppedOnPurpose = true }
            return !context.stoppedOnPurpose
        }
        if !checked {
            checked = true
            // libcurl reads "12abc" as 12: no byte of such an answer is parsed (D-466).
            if let length = context.headers["content-length"], !HTTPTransport.isDecimal(length) {
                context.abortReason = ProviderError(
                    .io, "PROPFIND \(what): the server sent Content-Length '\(length.prefix(40))'", errno: EIO)
                return false
            }
        }
        if parsing == nil, stream.bytesFed + chunk.count > Self.parsedAlongside {
            let thread = Thread { [self] in
                parsed = Result { () throws(MultiStatusError) in try stream.parse() }
                done.signal()
            }
            thread.name = "webdav-propfind"
            parsing = thread
            thread.start()
        }
        if stream.feed(chunk) { return true }
        // Refused (too large, a DTD) or stopped by its reader: `finish` says which.
        stoppedByReader = true
        context.abortReason = ProviderError(.io, "PROPFIND \(what): the answer was refused", errno: EIO)
        return false
    }

    /// After the transfer (its failure, or nil), on the same thread: waits for the parse and
    /// throws what the request came to.
    func finish(_ failure: (any Error)?) throws {
        let status = context.status
        if parsing != nil || (status == 207 && (failure == nil || stoppedByReader)) {
            stream.finish(complete: failure == nil)
            if parsing != nil {
                done.wait()
            } else {
                parsed = Result { () throws(MultiStatusError) in try stream.parse() }
            }
        }
        if let error = consumerError.withLock({ $0 }) { throw error }
        if let failure, !stoppedByReader {
            outcome = context.abortReason == nil ? HTTPTransport.outcome(context.code) : .other
            throw failure
        }
        guard status == 207 else {
            outcome = .status(status, retryAfter: context.headers["retry-after"])
            // A 2xx that is not a Multi-Status (an HTML page from a proxy or a login portal) says
            // what it was (D-466).
            if (200..<300).contains(status) {
                let type = context.headers["content-type"] ?? "no Content-Type"
                throw ProviderError(
                    .io, "PROPFIND \(what): the server answered \(status) (\(type)), not a 207 Multi-Status",
                    errno: EIO)
            }
            throw WebDAVProvider.statusError(status, "PROPFIND \(what)", conflict: .noSuchItem)
        }
        if case .failure(let refusal) = parsed {
            throw ProviderError(.io, "PROPFIND \(what): \(refusal)", errno: EIO)
        }
    }
}

/// A Depth 1 listing's children as its responses are parsed: the collection's own response
/// checked, each direct child made an item, and the batches handed over once the collection has
/// named itself (an answer that never does is not this collection's, D-466: nothing of it is
/// handed over).
final class ListingCollector: Sendable {
    private struct State {
        var children: [ProviderItem] = []
        var handedOver = 0
        var namesItself = false
        /// The collection's own `getctag`, taken before any child was (D-518).
        var ctag: String?
        /// The child collections' own (D-525).
        var childCtags: [ItemIdentifier: String] = [:]
    }
    private let state = Locked(State())
    let directory: ItemIdentifier
    let provider: WebDAVProvider
    let batch: (@Sendable ([ProviderItem]) -> Void)?

    init(directory: ItemIdentifier, provider: WebDAVProvider, batch: (@Sendable ([ProviderItem]) -> Void)?) {
        self.directory = directory
        self.provider = provider
        self.batch = batch
    }

    /// One response, in document order.
    func add(_ entry: MultiStatusEntry) throws {
        // Hrefs outside the collection, with "." or "..", an encoded "/" or another host: ignored.
        guard let child = provider.location.identifier(forHref: entry.href) else { return }
        var item: ProviderItem?
        if child == directory {
            guard entry.isCollection else {
                throw ProviderError(.wrongKind, "\(directory) is not a directory", errno: ENOTDIR)
            }
            // Only a ctag taken before any child vouches for them all (a change while the answer
            // is made changes it after); a second response for the collection is not taken.
            state.withLock { state in
                if !state.namesItself, state.children.isEmpty { state.ctag = entry.ctag }
            }
        } else {
            // Only direct children, found, and never an upload's staging file.
            guard entry.status == nil, provider.parent(of: child) == directory,
                !WebDAVProvider.isTemporaryName(provider.name(of: child))
            else { return }
            item = provider.makeItem(child, entry)
        }
        let due = state.withLock { state -> [ProviderItem]? in
            if let item {
                state.children.append(item)
                if item.kind == .directory, let ctag = entry.ctag { state.childCtags[child] = ctag }
            } else {
                state.namesItself = true
            }
            guard batch != nil, state.namesItself else { return nil }
            let size =
                state.handedOver < 2 * WebDAVProvider.firstListingBatch
                ? WebDAVProvider.firstListingBatch : WebDAVProvider.listingBatch
            guard state.children.count - state.handedOver >= size else { return nil }
            defer { state.handedOver = state.children.count }
            return Array(state.children[state.handedOver...])
        }
        if let due { batch?(due) }
    }

    /// The children, after the last response, the collection's `getctag` and its child
    /// collections'; the rest handed over.
    func finish() throws -> (children: [ProviderItem], ctag: String?, childCtags: [ItemIdentifier: String]) {
        let (children, rest, ctag, childCtags) = try state.withLock {
            state throws -> ([ProviderItem], [ProviderItem], String?, [ItemIdentifier: String]) in
            // Every server answers a Depth 1 PROPFIND with the collection itself first. Without it
            // the hrefs are not this collection's (a proxy that rewrites paths): an empty listing
            // would delete every child from the catalog (D-466).
            guard state.namesItself else {
                throw ProviderError(.io, "PROPFIND \(directory): the answer does not name the collection", errno: EIO)
            }
            defer { state.handedOver = state.children.count }
            return (state.children, Array(state.children[state.handedOver...]), state.ctag, state.childCtags)
        }
        if let batch, !rest.isEmpty { batch(rest) }
        return (children, ctag, childCtags)
    }
}
