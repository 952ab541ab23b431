// What the provider keeps from PROPFIND answers beyond the items it returns: a collection's
// listing under its `getctag`, so a listing asked for again is one Depth 0 PROPFIND while the
// ctag stays the same (D-518), and a file's `oc:checksums` under its version, so a whole-file GET
// that states no checksum is verified against the listed one (D-519). Both are bounded; what
// does not fit is not kept, and then the server is asked as without them.

import ProviderModel

/// Depth 1 listings of collections whose answer carried a `getctag`, by collection (D-518).
struct CtagListings {
    /// Children kept in all: past this, other listings are dropped (they are listed in full
    /// next time), and a listing larger than this alone is not kept.
    static let maximumChildren = 100_000

    private var kept: [ItemIdentifier: (ctag: String, children: [ProviderItem])] = [:]
    private var children = 0

    func listing(of directory: ItemIdentifier) -> (ctag: String, children: [ProviderItem])? { kept[directory] }

    /// Keeps `children` as `directory`'s listing under `ctag`; nil forgets any (a server without
    /// getctag keeps nothing).
    mutating func keep(_ directory: ItemIdentifier, ctag: String?, children listed: [ProviderItem]) {
        forget(directory)
        guard let ctag, listed.count <= Self.maximumChildren else { return }
        while children + listed.count > Self.maximumChildren, let other = kept.keys.first { forget(other) }
        kept[directory] = (ctag, listed)
        children += listed.count
    }

    mutating func forget(_ directory: ItemIdentifier) {
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

    /// The checksums listed for `identifier` at the same content as `version` (weak ETags
    /// compared weakly, D-510); none for another version.
    func checksums(of identifier: ItemIdentifier, at version: ContentVersion) -> [ContentChecksum] {
        guard let found = kept[identifier], WebDAVProvider.sameVersion(found.version, version) else { return [] }
        return found.checksums
    }
}
