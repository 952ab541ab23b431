// What the provider keeps from PROPFIND answers beyond the items it returns: a collection's
// listing under its `getctag`, so a listing asked for again is one Depth 0 PROPFIND while the
// ctag stays the same (D-518) — or none, when its parent's listing just gave it that ctag
// (D-525) —, and a file's `oc:checksums` under its version, so a whole-file GET
// that states no checksum is verified against the listed one (D-519). Both are bounded; what
// does not fit is not kept, and then the server is asked as without them.

import ProviderModel

/// Depth 1 listings of collections whose answer carried a `getctag`, by collection (D-518), and
/// what a collection's listing said of its child collections' ctags (D-525).
struct CtagListings {
    /// Children kept in all: past this, other listings are dropped (they are listed in full
    /// next time), and a listing larger than this alone is not kept.
    static let maximumChildren = 100_000

    struct Listing {
        var ctag: String
        var children: [ProviderItem]
        /// The `getctag` each child collection had in the answer.
        var childCtags: [ItemIdentifier: String]
    }

    /// How a listing of a collection is answered.
    enum Answer {
        /// Its parent's listing, at `at`, gave it the ctag of its kept listing: that is current.
        case current(Listing, at: ContinuousClock.Instant)
        /// Its parent's listing gave it another ctag: list it (Depth 1) without asking first.
        case changed
        /// A kept listing nothing vouches for: a Depth 0 of the collection first (D-518).
        case ask(Listing)
        /// Nothing kept: list it.
        case list
    }

    private var kept: [ItemIdentifier: Listing] = [:]
    private var children = 0
    /// By parent: the ctags its last listing vouched for, per child collection, and when. Only
    /// parents with a kept listing vouch, so these are bounded by `maximumChildren` too.
    private var vouched: [ItemIdentifier: (at: ContinuousClock.Instant, ctags: [ItemIdentifier: String])] = [:]

    /// How to answer a listing of `directory` (child of `parent`; nil for the root) at `now`: a
    /// vouch of the parent taken within `lifetime` decides, and is used up.
    mutating func answer(
        for directory: ItemIdentifier, parent: ItemIdentifier?, now: ContinuousClock.Instant, lifetime: Duration
    ) -> Answer {
        let listing = kept[directory]
        if let parent, let vouch = vouched[parent], let ctag = vouched[parent]?.ctags.removeValue(forKey: directory),
            now - vouch.at <= lifetime
        {
            guard let listing else { return .list }
            return listing.ctag == ctag ? .current(listing, at: vouch.at) : .changed
        }
        return listing.map { .ask($0) } ?? .list
    }

    /// Keeps `children` as `directory`'s listing under `ctag`, taken at `at`, and the ctags it
    /// gave its child collections, which vouch for them from now on; nil forgets any (a server
    /// without getctag keeps nothing).
    mutating func keep(
        _ directory: ItemIdentifier, ctag: String?, children listed: [ProviderItem],
        childCtags: [ItemIdentifier: String], at: ContinuousClock.Instant
    ) {
        forget(directory)
        guard let ctag, listed.count <= Self.maximumChildren else { return }
        while children + listed.count > Self.maximumChildren, let other = kept.keys.first { forget(other) }
        kept[directory] = Listing(ctag: ctag, children: listed, childCtags: childCtags)
        children += listed.count
        vouched[directory] = (at, childCtags)
    }

    /// `directory`'s kept listing was found current at `at`. When the server's ctag covers the
    /// subtree, the ctags that listing gave its child collections are current as well and vouch
    /// for them; otherwise nothing vouches for them (an earlier vouch is replaced by none).
    mutating func confirmed(_ directory: ItemIdentifier, at: ContinuousClock.Instant, subtree: Bool) {
        guard subtree, let listing = kept[directory] else {
            vouched[directory] = nil
            return
        }
        vouched[directory] = (at, listing.childCtags)
    }

    mutating func forget(_ directory: ItemIdentifier) {
        vouched[directory] = nil
        guard let old = kept.removeValue(forKey: directory) else { return }
        children -= old.children.count
    }
}

/// Files' `oc:checksums` from listings and lookups, with the version they were listed at (D-519).
struct ListedChecksums {
    /// Files kept: past this, others are dropped (their GETs are verified by headers only).
    static let maximumFiles = 100_000

    private var kept: [ItemIdentifier: (version: ContentVersion, checksums: [ContentChecksum])] = [:]

    /// What an answer said of `identifier` at `version`: its checksums, or none (forgets any).
    mutating func record(_ identifier: ItemIdentifier, _ version: ContentVersion, _ checksums: [ContentChecksum]) {
        guard !checksums.isEmpty else {
            kept[identifier] = nil
            return
        }
        if kept[identifier] == nil, kept.count >= Self.maximumFiles, let other = kept.keys.first {
            kept[other] = nil
        }
        kept[identifier] = (version, checksums)
    }

    /// What a store kept of `identifier` from before a restart (D-526): taken unless an answer
    /// of this run already said something of it, and only while there is room.
    mutating func restore(_ identifier: ItemIdentifier, _ version: ContentVersion, _ checksums: [ContentChecksum]) {
        guard kept[identifier] == nil, !checksums.isEmpty, kept.count < Self.maximumFiles else { return }
        kept[identifier] = (version, checksums)
    }

    /// The checksums listed for `identifier` at the same content as `version` (weak ETags
    /// compared weakly, D-510); none for another version.
    func checksums(of identifier: ItemIdentifier, at version: ContentVersion) -> [ContentChecksum] {
        guard let found = kept[identifier], WebDAVProvider.sameVersion(found.version, version) else { return [] }
        return found.checksums
    }
}
