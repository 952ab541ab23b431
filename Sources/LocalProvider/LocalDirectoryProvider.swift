// A local directory acting as the remote. Reads never modify it (files are opened O_RDONLY, nothing
// is created, atime is not relied upon). Identifiers are paths relative to the root.

import Dispatch
import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A provider over a local directory tree.
///
/// - Identifier: the path relative to `root` ("" is the root). Every component is checked: empty,
///   ".", ".." and NUL are refused (`.invalidName`), and the real path of the parent must stay
///   inside the root, so a symbolic link cannot lead a fetch outside it.
/// - Content version: `s<size>-m<mtime ns>-i<inode>` from `lstat`. A rewrite, truncation, append
///   or replace-by-rename changes it. (Not detected: a same-size rewrite that also restores the
///   old mtime in place; see docs/SEMANTICS.md.)
/// - Symbolic links are items of kind `.symbolicLink`; they are never followed.
/// - The root missing or not a directory reads as `.unreachable` (the "server" is gone), which
///   the cache answers with what it has locally.
public struct LocalDirectoryProvider: Provider {
    /// The directory served, as given.
    public let root: String
    /// Everything `Provider` can offer: one-name lookups, immediate metadata (`itemNow`), listing
    /// change tokens and pushed changes (inotify), and writing (LocalDirectoryProvider+Writing).
    /// Ownership (`.storesOwnership`, D-397) only when this process may chown (root or
    /// CAP_CHOWN): the source's owners are shown and chown is applied there.
    public let capabilities = ProviderCapabilities([
        .namedChildLookup, .immediateMetadata, .listingChangeTracking, .changeNotifying,
        .writing, .symbolicLinks, .exchangingMoves, .storesAttributes, .hardLinks,
    ]).union(LocalDirectoryProvider.storesOwners ? .storesOwnership : [])
    /// Whether this process may give a file to any user (root or CAP_CHOWN), read once.
    static let storesOwners: Bool = geteuid() == 0 || hasCapability(0)  // CAP_CHOWN

    /// Whether the effective capability set (/proc/self/status `CapEff`) has bit `number`.
    static func hasCapability(_ number: Int) -> Bool {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return false }
        for line in status.split(separator: "\n") where line.hasPrefix("CapEff:") {
            let hex = line.dropFirst("CapEff:".count).trimmingCharacters(in: .whitespaces)
            guard let mask = UInt64(hex, radix: 16) else { return false }
            return mask & (1 << UInt64(number)) != 0
        }
        return false
    }
    /// inotify watches of the listed directories (D-224).
    let changes = DirectoryChangeWatcher()
    /// Test hooks of uploads; nil outside tests.
    var uploadHooks: UploadHooks?
    /// Per-directory locks around entry changes that restore the directory's times, and the
    /// creates handed out by `deferCreateNow` (LocalDirectoryProvider+Writing.swift, D-386).
    let entries = DirectoryEntries()
    /// A descriptor of the root kept open, whose kernel path is the root's real path (D-425).
    let rootAnchor = RootAnchor()
    /// Whether the last look at the root found it missing (`checkRoot`): while it is, creates are
    /// deferred without a system call (`deferCreateNow`, an offline start, D-434).
    let rootMissing = Locked(false)

    public init(root: String) {
        var trimmed = root
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
        self.root = trimmed
    }

    public func item(for identifier: ItemIdentifier) async throws -> ProviderItem {
        try await LocalIO.run { try self.itemSync(identifier) }
    }

    /// `item(for:)` on the calling thread, for items whose directory is watched (D-224): the
    /// watch was only made after its device was found to be a local file system, so the lstat
    /// cannot wait on a network. Nil for anything else (the root, a directory never listed, a
    /// network source). A file bind-mounted from a network file system into a watched directory
    /// is the one case this does not see.
    public func itemNow(for identifier: ItemIdentifier) throws -> ProviderItem? {
        guard identifier != .root else { return nil }
        let raw = identifier.rawValue
        let parent = raw.lastIndex(of: "/").map { ItemIdentifier(String(raw[..<$0])) } ?? .root
        guard changes.isWatched(parent) else { return nil }
        return try itemSync(identifier)
    }

    /// `child(named:of:)` on the calling thread, for a directory that is watched (as `itemNow`):
    /// a LOOKUP in a directory whose listing a change made stale is answered without a task or a
    /// thread hop (D-380). Declined for anything else.
    public func childNow(named name: String, of directory: ItemIdentifier) throws -> ImmediateChild {
        guard changes.isWatched(directory) else { return .declined }
        return try childSync(named: name, of: directory).map { .found($0) } ?? .absent
    }

    public func children(of identifier: ItemIdentifier) async throws -> [ProviderItem] {
        try await LocalIO.run { try self.childrenSync(identifier) }
    }

    /// `children(of:)` with a change token, taken before the listing (nil on a file system that is
    /// not local, or when inotify refuses a watch).
    public func trackedChildren(
        of identifier: ItemIdentifier
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        try await trackedListing(of: identifier, batch: nil)
    }

    /// `trackedChildren(of:)` handing the children over as they are stat'ed: the names are read
    /// first (cheap), then the first `firstListingBatch` children are stat'ed and handed over, then
    /// the rest `listingBatch` at a time (D-470).
    public func trackedChildren(
        of identifier: ItemIdentifier, batch: @escaping @Sendable ([ProviderItem]) -> Void
    ) async throws -> (
        children: [ProviderItem], token: ListingChangeToken?
    ) {
        try await trackedListing(of: identifier, batch: batch)
    }

    /// Both forms of `trackedChildren`: the token taken before the listing.
    private func trackedListing(
        of identifier: ItemIdentifier, batch: (@Sendable ([ProviderItem]) -> Void)?
    ) async throws -> (children: [ProviderItem], token: ListingChangeToken?) {
        try await LocalIO.run {
            let path = try self.checkedPath(identifier)
            let info = try Self.directoryInfo(identifier, at: path)
            let token = self.changes.token(for: identifier, path: path, device: UInt64(info.st_dev))
            return (try self.listing(of: identifier, at: path, batch: batch), token)
        }
    }

    public func hasChanges(since token: ListingChangeToken) -> Bool {
        changes.hasChanges(since: token)
    }

    public func observeChanges(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        changes.observe(observer)
    }

    public func child(named name: String, of directory: ItemIdentifier) async throws -> ProviderItem? {
        try await LocalIO.run { try self.childSync(named: name, of: directory) }
    }

    public func fetchContents(
        of identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>
    ) async throws -> any ContentStream {
        try await LocalIO.run { () throws -> LocalContentStream in
            let path = try self.checkedPath(identifier)
            let fd = SystemCalls.open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else {
                let code = errno
                if code == ENOENT || code == ENOTDIR { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
                if code == ELOOP { throw ProviderError(.wrongKind, "\(identifier) is a symbolic link") }
                throw ProviderError(.io, "open \(identifier): \(String(cString: strerror(code)))", errno: code)
            }
            let stream = LocalContentStream(fd: fd, identifier: identifier, version: version, range: range)
            do {
                try stream.checkVersion()
            } catch {
                stream.close()
                throw error
            }
            return stream
        }
    }

    // MARK: Synchronous parts (run on LocalIO's threads, never on the cooperative pool)

    /// The root's stat (a link as the root is followed); `.unreachable` when it is missing or not a
    /// directory.
    @discardableResult
    func checkRoot() throws -> stat {
        var info = stat()
        guard SystemCalls.stat(root, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            let code = errno
            rootMissing.withLock { $0 = true }
            throw ProviderError(.unreachable, "source directory \(root) is not available", errno: code)
        }
        rootMissing.withLock { $0 = false }
        return info
    }

    /// A path component an identifier may have: not empty, not "." or "..", no NUL.
    static func isNameComponent(_ component: some StringProtocol) -> Bool {
        !component.isEmpty && component != "." && component != ".." && !component.utf8.contains(0)
    }

    /// `identifier`'s components, each checked (`.invalidName` for a bad one).
    static func checkedComponents(_ identifier: ItemIdentifier) throws -> [Substring] {
        let components = identifier.rawValue.split(separator: "/", omittingEmptySubsequences: false)
        for component in components {
            guard isNameComponent(component) else {
                throw ProviderError(.invalidName, "identifier '\(identifier.rawValue)' is not a path inside the source")
            }
        }
        return components
    }

    /// The absolute path of `identifier`, after checking every component and that its parent's
    /// real path lies inside the root's real path (D-425: the kernel's path of a descriptor of
    /// the parent, not realpath(3)).
    func checkedPath(_ identifier: ItemIdentifier) throws -> String {
        let rootInfo = try checkRoot()
        if identifier == .root { return root }
        let components = try Self.checkedComponents(identifier)
        if components.count > 1 {
            let parent = root + "/" + components.dropLast().joined(separator: "/")
            try checkInside(parent, of: identifier, rootInfo: rootInfo, strictly: false)
        }
        return root + "/" + identifier.rawValue
    }

    /// Refuses `path` (what `identifier` needs resolved) unless its real path is the root's real
    /// path (only when not `strictly`) or lies below it; `.noSuchItem` when it does not resolve.
    /// With /proc: the path is opened (O_PATH, following links as realpath does) and the
    /// kernel's name of that descriptor is compared, three system calls at any depth; realpath(3)
    /// made a readlink for every component of the path and of the root's (D-425).
    private func checkInside(_ path: String, of identifier: ItemIdentifier, rootInfo: stat, strictly: Bool) throws {
        let real: [UInt8]?
        if Self.hasProcFileDescriptors {
            let fd = SystemCalls.open(path, openPathOnly | O_CLOEXEC)
            real = fd < 0 ? nil : Self.descriptorPath(fd)
            if fd >= 0 { SystemCalls.close(fd) }
        } else {
            real = Self.realPath(path).map { Array($0.utf8) }
        }
        guard let real else { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
        try checkInsideRoot(real, of: identifier, rootInfo: rootInfo, strictly: strictly)
    }

    /// Refuses the real path `real` unless it lies below the root's real path (or is it, when not
    /// `strictly`). Compared as bytes: two names that differ only in bytes that are not UTF-8
    /// must not look alike.
    private func checkInsideRoot(_ real: [UInt8], of identifier: ItemIdentifier, rootInfo: stat, strictly: Bool) throws
    {
        guard let realRoot = rootAnchor.realPath(of: root, info: rootInfo) else {
            throw ProviderError(.unreachable, "source directory \(root) is not available")
        }
        let inside =
            real.starts(with: realRoot)
            && (real.count == realRoot.count
                ? !strictly : realRoot == [UInt8(ascii: "/")] || real[realRoot.count] == UInt8(ascii: "/"))
        guard inside else {
            throw ProviderError(.invalidName, "'\(identifier.rawValue)' leads outside the source directory")
        }
    }

    /// Opens the directory `identifier` (O_RDONLY | O_DIRECTORY, the last component not followed
    /// unless it is the root) with the guarantee of `checkedPath`, and more: the real path of the
    /// directory opened, read from its descriptor, lies inside the root's, so no race with a
    /// link planted meanwhile leads outside (D-425). The descriptor and the path; or, when the
    /// open failed, -1 and its errno (after `checkedPath`'s own refusals, which come first).
    func openCheckedDirectory(_ identifier: ItemIdentifier) throws -> (fd: Int32, path: String, failure: Int32) {
        let rootInfo = try checkRoot()
        if identifier == .root {
            let fd = SystemCalls.open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            return (fd, root, fd < 0 ? errno : 0)
        }
        guard Self.hasProcFileDescriptors else {
            let path = try checkedPath(identifier)
            let fd = SystemCalls.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            return (fd, path, fd < 0 ? errno : 0)
        }
        _ = try Self.checkedComponents(identifier)
        let path = root + "/" + identifier.rawValue
        let fd = SystemCalls.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            // The parent's check decides what a failure is, as before (an escape, a gone parent).
            _ = try checkedPath(identifier)
            return (-1, path, code)
        }
        do {
            guard let real = Self.descriptorPath(fd) else {
                throw ProviderError(.noSuchItem, "\(identifier) is gone")
            }
            try checkInsideRoot(real, of: identifier, rootInfo: rootInfo, strictly: true)
        } catch {
            SystemCalls.close(fd)
            throw error
        }
        return (fd, path, 0)
    }

    /// The kernel's path of an open descriptor (readlink of /proc/self/fd/N), as bytes; nil when
    /// it cannot be read or does not fit PATH_MAX.
    static func descriptorPath(_ fd: Int32) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = buffer.withUnsafeMutableBytes { raw in
            SystemCalls.readlink("/proc/self/fd/\(fd)", raw.baseAddress!.assumingMemoryBound(to: CChar.self), raw.count)
        }
        guard count > 0, count < buffer.count, buffer[0] == UInt8(ascii: "/") else { return nil }
        return Array(buffer[..<count])
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    func itemSync(_ identifier: ItemIdentifier) throws -> ProviderItem {
        let path = try checkedPath(identifier)
        // Upload staging files are not items (D-351).
        if let last = identifier.rawValue.split(separator: "/").last, Self.isTemporaryName(last) {
            throw ProviderError(.noSuchItem, "\(identifier) is gone")
        }
        var info = stat()
        guard SystemCalls.lstat(path, &info) == 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
            throw ProviderError(.io, "lstat \(identifier): \(String(cString: strerror(code)))", errno: code)
        }
        guard let item = Self.makeItem(identifier: identifier, path: path, info: info) else {
            throw ProviderError(.noSuchItem, "\(identifier) is not a file, directory or symbolic link")
        }
        return item
    }

    /// One name in a directory: the directory is opened O_NOFOLLOW (a directory replaced
    /// by a symbolic link is not followed out of the source), the name stat'ed without following.
    func childSync(named name: String, of directory: ItemIdentifier) throws -> ProviderItem? {
        guard Self.isNameComponent(name), name.utf8.count <= 255, !name.utf8.contains(UInt8(ascii: "/")) else {
            throw ProviderError(.invalidName, "'\(name)' is not a file name")
        }
        if Self.isTemporaryName(name) {
            _ = try checkedPath(directory)
            return nil
        }
        let (fd, path, code) = try openCheckedDirectory(directory)
        guard fd >= 0 else {
            if code == ENOENT { throw ProviderError(.noSuchItem, "\(directory) is gone") }
            if code == ENOTDIR || code == ELOOP {
                throw ProviderError(.wrongKind, "\(directory) is not a directory")
            }
            throw ProviderError(.io, "open \(directory): \(String(cString: strerror(code)))", errno: code)
        }
        defer { SystemCalls.close(fd) }
        var info = stat()
        guard SystemCalls.fstatat(fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            let code = errno
            if code == ENOENT { return nil }
            throw ProviderError(.io, "lstat \(name) in \(directory): \(String(cString: strerror(code)))", errno: code)
        }
        let identifier = ItemIdentifier(directory == .root ? name : directory.rawValue + "/" + name)
        return Self.makeItem(
            identifier: identifier, parent: directory, name: name, path: { path + "/" + name }, info: info)
    }

    func childrenSync(_ identifier: ItemIdentifier) throws -> [ProviderItem] {
        let path = try checkedPath(identifier)
        _ = try Self.directoryInfo(identifier, at: path)
        return try listing(of: identifier, at: path)
    }

    /// lstat of a directory to be listed; `.noSuchItem` / `.wrongKind` when it is not one.
    private static func directoryInfo(_ identifier: ItemIdentifier, at path: String) throws -> stat {
        var info = stat()
        guard SystemCalls.lstat(path, &info) == 0 else { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw ProviderError(.wrongKind, "\(identifier) is not a directory")
        }
        return info
    }

    /// The children of the directory at `path` (checked, and known to be a directory), handed to
    /// `batch` as they are stat'ed when given.
    private func listing(
        of identifier: ItemIdentifier, at path: String, batch: (@Sendable ([ProviderItem]) -> Void)? = nil
    ) throws -> [ProviderItem] {
        guard let directory = opendir(path) else {
            let code = errno
            if code == ENOENT { throw ProviderError(.noSuchItem, "\(identifier) is gone") }
            throw ProviderError(.io, "opendir \(identifier): \(String(cString: strerror(code)))", errno: code)
        }
        defer { closedir(directory) }
        let descriptor = dirfd(directory)
        // Names first (readdir is cheap), then one fstatat per child on the directory's descriptor
        // (no path resolution per child): those calls are the cost of a listing, so a large
        // directory spreads them over a few threads (a lookup that re-lists waits for all of them).
        // A name that is not valid UTF-8 keeps its bytes for fstatat (its String has U+FFFD).
        var found: [(name: String, bytes: [CChar]?)] = []
        while let entry = readdir(directory) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) { tuple in
                tuple.withMemoryRebound(to: CChar.self, capacity: 256) { cName -> (String, [CChar]?)? in
                    if cName[0] == 0x2E && (cName[1] == 0 || (cName[1] == 0x2E && cName[2] == 0)) { return nil }
                    // Upload staging files are not listed (D-351).
                    if cName[0] == 0x2E
                        && strncmp(cName, Self.temporaryNamePrefix, Self.temporaryNamePrefix.utf8.count) == 0
                    {
                        return nil
                    }
                    if let valid = String(validatingCString: cName) { return (valid, nil) }
                    return (String(cString: cName), Array(UnsafeBufferPointer(start: cName, count: strlen(cName) + 1)))
                }
            }
            if let name { found.append(name) }
        }
        let names = found
        let prefix = identifier == .root ? "" : identifier.rawValue + "/"
        let slots = ListingSlots(count: names.count)
        // Stat'ed in parts when someone takes batches: the first one small (the first entries
        // reach the caller soon), then larger ones; without, all at once.
        var start = 0
        var delivered = 0
        while start < names.count {
            let end =
                batch == nil
                ? names.count : min(names.count, start + (start == 0 ? Self.firstListingBatch : Self.listingBatch))
            let first = start
            let count = end - first
            let workers = count >= Self.parallelListingThreshold ? Self.listingThreads : 1
            DispatchQueue.concurrentPerform(iterations: workers) { worker in
                var index = first + worker
                while index < end {
                    let (name, bytes) = names[index]
                    var childInfo = stat()
                    // Gone between readdir and fstatat: it simply is not listed.
                    let statted =
                        if let bytes {
                            SystemCalls.fstatat(descriptor, bytes, &childInfo, AT_SYMLINK_NOFOLLOW) == 0
                        } else {
                            SystemCalls.fstatat(descriptor, name, &childInfo, AT_SYMLINK_NOFOLLOW) == 0
                        }
                    if statted {
                        slots.set(
                            index,
                            Self.makeItem(
                                identifier: ItemIdentifier(prefix + name), parent: identifier, name: name,
                                path: { path + "/" + name }, info: childInfo))
                    }
                    index += workers
                }
            }
            if let batch {
                let part = slots.items(in: delivered..<end)
                delivered = end
                if !part.isEmpty { batch(part) }
            }
            start = end
        }
        return slots.items()
    }

    /// How many children the first batch of a listing has, and each one after it (D-470).
    public static let firstListingBatch = 256
    public static let listingBatch = 4096

    /// Listings of at least this many children stat them on `listingThreads` threads.
    public static let parallelListingThreshold = 256
    static let listingThreads = max(1, min(4, ProcessInfo.processInfo.activeProcessorCount))

    /// Result slots filled by the listing threads, each thread its own indices (index % threads),
    /// through a raw buffer (no Swift access to a shared property while they run), read only after
    /// `concurrentPerform` returned (which orders the writes before the read).
    private final class ListingSlots: @unchecked Sendable {
        private let slots: UnsafeMutableBufferPointer<ProviderItem?>
        init(count: Int) {
            slots = .allocate(capacity: count)
            slots.initialize(repeating: nil)
        }
        deinit {
            slots.deinitialize()
            slots.deallocate()
        }
        func set(_ index: Int, _ item: ProviderItem?) { slots[index] = item }
        func items() -> [ProviderItem] { slots.compactMap { $0 } }
        func items(in range: Range<Int>) -> [ProviderItem] { slots[range].compactMap { $0 } }
    }

    /// The inode of the item's version (`i<inode>`): it survives a rename or a move within the
    /// source's file system, and two existing files never share it. A file replaced by another
    /// (an editor's save by rename) has another inode: not found again by fingerprint.
    public func fingerprint(of item: ProviderItem) -> String? {
        let version = item.contentVersion.rawValue
        guard let marker = version.range(of: "-i", options: .backwards) else { return nil }
        let inode = version[marker.upperBound...]
        guard !inode.isEmpty, inode.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else {
            return nil
        }
        return "i" + inode
    }

    static func version(of info: stat) -> ContentVersion {
        // "s<size>-m<mtime ns>-i<inode>", formatted by hand: a listing makes one per child, and
        // string interpolation cost more than the fstatat. An mtime too far from 1970 for
        // nanoseconds in 64 bits (beyond the years 1677–2262) is written "m<seconds>.<ns>".
        let (scaled, overflowed) = Int64(info.st_mtim.tv_sec).multipliedReportingOverflow(by: 1_000_000_000)
        let (nanoseconds, overflowedSum) = scaled.addingReportingOverflow(Int64(info.st_mtim.tv_nsec))
        let wide = overflowed || overflowedSum
        let text = String(unsafeUninitializedCapacity: 80) { buffer in
            var count = 0
            func put(_ byte: UInt8) {
                buffer[count] = byte
                count += 1
            }
            func put(_ value: UInt64) {
                var rest = value
                let start = count
                repeat {
                    put(UInt8(ascii: "0") + UInt8(rest % 10))
                    rest /= 10
                } while rest > 0
                buffer[start..<count].reverse()
            }
            func put(_ value: Int64) {
                if value < 0 { put(UInt8(ascii: "-")) }
                put(value.magnitude)
            }
            put(UInt8(ascii: "s"))
            put(Int64(info.st_size))
            put(UInt8(ascii: "-"))
            put(UInt8(ascii: "m"))
            if wide {
                put(Int64(info.st_mtim.tv_sec))
                put(UInt8(ascii: "."))
                put(Int64(info.st_mtim.tv_nsec))
            } else {
                put(nanoseconds)
            }
            put(UInt8(ascii: "-"))
            put(UInt8(ascii: "i"))
            put(UInt64(info.st_ino))
            return count
        }
        return ContentVersion(text)
    }

    static func makeItem(identifier: ItemIdentifier, path: String, info: stat) -> ProviderItem? {
        let components = identifier.rawValue.split(separator: "/")
        let parent =
            components.count <= 1 ? ItemIdentifier.root : ItemIdentifier(components.dropLast().joined(separator: "/"))
        return makeItem(
            identifier: identifier, parent: parent, name: components.last.map(String.init) ?? "", path: { path },
            info: info)
    }

    static func makeItem(
        identifier: ItemIdentifier, parent: ItemIdentifier, name: String, path: () -> String, info: stat
    ) -> ProviderItem? {
        let kind: ItemKind
        var target: String?
        switch info.st_mode & S_IFMT {
        case S_IFREG: kind = .file
        case S_IFDIR: kind = .directory
        case S_IFLNK:
            kind = .symbolicLink
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = SystemCalls.readlink(path(), &buffer, Int(PATH_MAX))
            guard count >= 0 else { return nil }
            target = String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        default: return nil
        }
        var item = ProviderItem(
            identifier: identifier, parent: parent, name: name,
            kind: kind, size: Int64(info.st_size),
            modificationTime: ItemTime(seconds: Int64(info.st_mtim.tv_sec), nanoseconds: Int32(info.st_mtim.tv_nsec)),
            contentVersion: version(of: info), permissions: UInt16(info.st_mode & 0o7777), symbolicLinkTarget: target,
            hardLinkIdentity: kind != .directory && info.st_nlink > 1 ? hardLinkIdentity(of: info) : nil,
            owner: storesOwners ? ItemOwner(uid: info.st_uid, gid: info.st_gid) : nil)
        item.accessTime = ItemTime(seconds: Int64(info.st_atim.tv_sec), nanoseconds: Int32(info.st_atim.tv_nsec))
        item.changeTime = ItemTime(seconds: Int64(info.st_ctim.tv_sec), nanoseconds: Int32(info.st_ctim.tv_nsec))
        return item
    }

    /// What every name of a file with several names shares (D-396): its device and inode.
    static func hardLinkIdentity(of info: stat) -> String { "d\(info.st_dev)-i\(info.st_ino)" }
}

/// A file opened for one fetch. Each `next` re-checks the version with `fstat`, so a file that is
/// rewritten, truncated or appended to in place mid-fetch fails with `.versionChanged` instead of
/// delivering bytes of two versions.
final class LocalContentStream: ContentStream, @unchecked Sendable {
    // Safe: the mutable `fd`, `position`, `buffer`, `window` and the two refusal flags are only
    // touched while `lock` is held.
    private let lock = Lock()
    /// Jobs running on the pool, and whether `close` was asked meanwhile: `close` never waits for
    /// a job (a source read can block for as long as the source hangs, and the cache calls
    /// `close` once its deadline has passed); the last job closes the descriptor instead.
    private let jobs = Locked<(running: Int, closeRequested: Bool)>((0, false))
    private var fd: Int32
    private var position: Int64
    /// The copy buffer of `transfer` when the source cannot be mapped (allocated once).
    private var buffer: [UInt8] = []
    /// The mapped part of the source `transfer` copies from (see `copy`).
    private var window: (base: UnsafeMutableRawPointer, start: Int64, length: Int)?
    private var mappingRefused = false
    private var populateRefused = false
    private let end: Int64
    private let identifier: ItemIdentifier
    private let version: ContentVersion
    /// Test hook (SameSizeRewriteTests): runs after each read of `next` and each copy step of
    /// `transfer`, before the version check that follows it, with `lock` held. Always nil outside
    /// tests.
    private var afterReadBeforeCheck: (@Sendable () -> Void)?

    init(fd: Int32, identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>) {
        self.fd = fd
        self.position = range.lowerBound
        self.end = range.upperBound
        self.identifier = identifier
        self.version = version
    }

    /// `transfer` is the stream's own (mapping + pwrite, D-219).
    var capabilities: ContentStreamCapabilities { .directTransfer }

    deinit { close() }

    func checkVersion() throws {
        try lock.withLock { try checkVersionLocked() }
    }

    /// Sets the test hook `afterReadBeforeCheck`.
    func setAfterReadBeforeCheck(_ hook: (@Sendable () -> Void)?) {
        lock.withLock { afterReadBeforeCheck = hook }
    }

    private func checkVersionLocked() throws {
        guard fd >= 0 else { return }
        var info = stat()
        guard SystemCalls.fstat(fd, &info) == 0 else { throw ProviderError(.io, "fstat failed", errno: errno) }
        let current = LocalDirectoryProvider.version(of: info)
        guard current == version else {
            throw ProviderError(.versionChanged, "\(identifier) changed: \(version) is now \(current)")
        }
    }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        try Task.checkCancellation()
        return try await runJob { () throws -> [UInt8]? in
            try self.lock.withLock { () throws -> [UInt8]? in
                guard self.fd >= 0, self.position < self.end else { return nil }
                try self.checkVersionLocked()
                let count = Int(min(Int64(maximumLength), self.end - self.position))
                var bytes = [UInt8](repeating: 0, count: count)
                let got = bytes.withUnsafeMutableBytes { buffer -> Int in
                    while true {
                        let result = SystemCalls.pread(self.fd, buffer.baseAddress, count, off_t(self.position))
                        if result < 0 && errno == EINTR { continue }
                        return result
                    }
                }
                if got < 0 {
                    let code = errno
                    throw ProviderError(.io, "read \(self.identifier): \(String(cString: strerror(code)))", errno: code)
                }
                if got == 0 { return nil }
                self.afterReadBeforeCheck?()
                // A read that raced with a rewrite must not be delivered: check again after it.
                try self.checkVersionLocked()
                self.position += Int64(got)
                return got == count ? bytes : Array(bytes[0..<got])
            }
        }
    }

    /// Copies from the source into `descriptor` (pwrite from a mapping of the source, or through
    /// one reused buffer; see `copy`); holes of the source are skipped where the destination
    /// already reads zeros. Version checked before the transfer
    /// and after each step, as in `next`.
    func transfer(
        to descriptor: Int32, at offset: Int64, firstStep: Int, step: Int, maximumLength: Int,
        delivered: @escaping @Sendable (Int) -> Bool
    ) async throws -> Int? {
        try Task.checkCancellation()
        return try await runJob { () throws -> Int? in
            try self.lock.withLock { () throws -> Int? in
                guard self.fd >= 0, self.position < self.end else { return nil }
                try self.checkVersionLocked()
                let started = ContinuousClock.now
                var total = 0
                while total < maximumLength, self.position < self.end {
                    var length = min(total == 0 ? firstStep : step, maximumLength - total)
                    if total > 0, step > 0 {
                        // Later steps end on multiples of `step` in the destination: a write that
                        // covers only part of a new large page-cache folio has the kernel zero the
                        // rest first (measured: a quarter of the copy's time with a 128 KiB first
                        // step and 1 MiB steps after it).
                        let misalignment = Int((offset + Int64(total)) % Int64(step))
                        if misalignment != 0 { length = min(length, step - misalignment) }
                    }
                    let placed = try self.transferStep(
                        maximumLength: max(1, length), to: descriptor, at: offset + Int64(total))
                    if placed == 0 { break }  // shorter than its version says: the caller sees it
                    self.afterReadBeforeCheck?()
                    // A copy that raced with a rewrite must not be used: check again after it.
                    try self.checkVersionLocked()
                    self.position += Int64(placed)
                    total += placed
                    if !delivered(placed) || ContinuousClock.now - started > .milliseconds(500) { break }
                }
                return total
            }
        }
    }

    /// One step: a hole of the source up to its next data, or data up to its next hole.
    private func transferStep(maximumLength: Int, to descriptor: Int32, at offset: Int64) throws -> Int {
        let limit = position + min(Int64(maximumLength), end - position)
        let data = nextData(in: fd, at: position)
        if data.map({ $0 > position }) ?? true {
            let length = Int(min(data ?? limit, limit) - position)
            try zeroData(in: descriptor, from: offset, to: offset + Int64(length))
            return length
        }
        let length = Int(min(nextHole(in: fd, at: position), limit) - position)
        return try copy(count: length, to: descriptor, at: offset)
    }

    /// Copies up to 1 MiB of data. The source is mapped (a window of `mappingWindow` bytes) and
    /// written from the mapping with one pwrite: one copy, page cache to page cache, instead of
    /// pread + pwrite through a buffer. Only the kernel touches the mapping (inside pwrite), so a
    /// source truncated under it makes pwrite fail with EFAULT, never a SIGBUS in the daemon;
    /// that is reported as the version change it is. A source that cannot be mapped is copied
    /// through the stream's one buffer. (copy_file_range copies in the kernel too, but its
    /// page-by-page writes leave the cache file's pages as small folios, and every later read of
    /// them — passthrough included — ran 10–15 % slower than over pages written 1 MiB at a time:
    /// D-219.)
    private func copy(count: Int, to descriptor: Int32, at offset: Int64) throws -> Int {
        let length = min(count, 1 << 20)
        // A small source (or the small rest of one) is read: mapping it costs an mmap, a munmap
        // and its TLB shootdown, more than the copy it saves.
        let small = end - position < Self.smallSource && window == nil
        if !small, let source = mapped(at: position, count: length) {
            // Map the step's pages first: pwrite copies with page faults disabled, and a copy that
            // meets an unmapped source page comes up short, has the kernel zero the destination
            // folio's new blocks, fault the page in and copy again.
            populate(source, count: length)
            let written = writeFully(descriptor, from: source, count: length, at: offset)
            if case .failure(let error) = written {
                if error.rawValue == EFAULT { try checkVersionLocked() }
                throw transferError(error)
            }
            return length
        }
        // Sized to what the stream can still need (up to 1 MiB): a 100-byte file does not
        // allocate and zero a 1 MiB buffer.
        if buffer.count < length {
            buffer = [UInt8](repeating: 0, count: Int(min(1 << 20, max(Int64(length), end - position))))
        }
        let got = buffer.withUnsafeMutableBytes { raw in
            SystemCalls.pread(fd, raw.baseAddress, length, off_t(position))
        }
        if got < 0 { throw transferError(Errno.current) }
        try write(buffer, count: got, to: descriptor, at: offset)
        return got
    }

    /// How much of the source one mapping covers.
    static let mappingWindow: Int64 = 64 << 20
    /// Sources with less than this left to copy are read through the buffer, not mapped.
    static let smallSource: Int64 = 256 << 10

    /// The source bytes `at..<at+count` in the current mapping window (mapped anew when they
    /// are outside it), or nil when the source cannot be mapped.
    private func mapped(at: Int64, count: Int) -> UnsafeRawPointer? {
        if let window, at >= window.start, at + Int64(count) <= window.start + Int64(window.length) {
            return UnsafeRawPointer(window.base + Int(at - window.start))
        }
        unmapWindow()
        guard !mappingRefused else { return nil }
        let page = Int64(sysconf(Int32(_SC_PAGESIZE)))
        let start = at - at % page
        let length = Int(max(min(Self.mappingWindow, end - start), at + Int64(count) - start))
        guard let base = mmap(nil, length, PROT_READ, MAP_SHARED, fd, off_t(start)), base != MAP_FAILED else {
            mappingRefused = true
            return nil
        }
        _ = madvise(base, length, MADV_SEQUENTIAL)
        window = (base, start, length)
        return UnsafeRawPointer(base + Int(at - start))
    }

    /// MADV_POPULATE_READ over the pages of `start..<start+count` (Linux 5.14+; older kernels
    /// refuse it and the copy faults its pages in as before). A failure here (the source shrank)
    /// is found by the copy itself.
    private func populate(_ start: UnsafeRawPointer, count: Int) {
        guard !populateRefused, let window else { return }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let offset = start - UnsafeRawPointer(window.base)
        let first = offset - offset % page
        let length = min(window.length, offset + count) - first
        if madvise(window.base + first, length, Self.populateRead) != 0, errno == EINVAL { populateRefused = true }
    }

    /// MADV_POPULATE_READ (not in every libc's headers).
    private static let populateRead: Int32 = 22

    private func unmapWindow() {
        if let window { munmap(window.base, window.length) }
        window = nil
    }

    /// Makes `start..<end` of `descriptor` read as zeros, writing zeros only over its data
    /// extents (its holes already read as zeros and stay holes).
    private func zeroData(in descriptor: Int32, from start: Int64, to end: Int64) throws {
        var at = start
        while at < end, let data = nextData(in: descriptor, at: at), data < end {
            let dataEnd = min(nextHole(in: descriptor, at: data), end)
            try writeZeros(to: descriptor, at: data, count: Int(dataEnd - data))
            at = dataEnd
        }
    }

    private func writeZeros(to descriptor: Int32, at offset: Int64, count: Int) throws {
        let zeros = [UInt8](repeating: 0, count: min(count, 1 << 20))
        var done = 0
        while done < count {
            let length = min(zeros.count, count - done)
            try write(zeros, count: length, to: descriptor, at: offset + Int64(done))
            done += length
        }
    }

    private func write(_ bytes: [UInt8], count: Int, to descriptor: Int32, at offset: Int64) throws {
        let written = bytes.withUnsafeBytes { writeFully(descriptor, from: $0.baseAddress!, count: count, at: offset) }
        if case .failure(let error) = written { throw transferError(error) }
    }

    /// The failure of a copy, with its errno (ENOSPC from the destination is told apart by it).
    private func transferError(_ error: Errno) -> ProviderError {
        ProviderError(.io, "copy of \(identifier) failed: \(error.message)", errno: error.rawValue)
    }

    /// Runs `body` on the provider's pool as a job of this stream (nil once the stream is closed).
    private func runJob<T: Sendable>(_ body: @escaping @Sendable () throws -> T?) async throws -> T? {
        try await LocalIO.run { () throws -> T? in
            let open = self.jobs.withLock { jobs -> Bool in
                if jobs.closeRequested { return false }
                jobs.running += 1
                return true
            }
            guard open else { return nil }
            defer {
                let closeNow = self.jobs.withLock { jobs -> Bool in
                    jobs.running -= 1
                    return jobs.running == 0 && jobs.closeRequested
                }
                if closeNow { self.closeDescriptor() }
            }
            return try body()
        }
    }

    /// Stops the stream at once: the descriptor is closed now, or by the job still running when
    /// that job ends (its result is then not used).
    func close() {
        let closeNow = jobs.withLock { jobs -> Bool in
            jobs.closeRequested = true
            return jobs.running == 0
        }
        if closeNow { closeDescriptor() }
    }

    private func closeDescriptor() {
        lock.withLock {
            unmapWindow()
            if fd >= 0 {
                Glibc.close(fd)
                fd = -1
            }
        }
    }
}

/// Runs the provider's blocking system calls off the Swift cooperative pool, on threads of the
/// provider's own `BlockingIOPool` (not `.shared`: a source that stalls, say a disk that hangs,
/// must not hold up the cache's own file I/O).
enum LocalIO {
    static let pool = BlockingIOPool(threadCount: 4)

    static func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await pool.run(body)
    }
}

/// A descriptor of a provider's root kept open (O_PATH), so that the root's real path costs one
/// readlink of /proc/self/fd (D-425). Opened again when the root's path names another directory
/// (its device and inode differ); the kernel's path of the descriptor follows the directory
/// wherever it is moved, so it is always the real path of the directory served.
final class RootAnchor: Sendable {
    private let held = Locked<(fd: Int32, device: UInt64, inode: UInt64)?>(nil)

    /// The real path of `root`, whose stat is `info`, as bytes; nil when it cannot be had.
    func realPath(of root: String, info: stat) -> [UInt8]? {
        guard LocalDirectoryProvider.hasProcFileDescriptors else {
            return LocalDirectoryProvider.realPath(root).map { Array($0.utf8) }
        }
        return held.withLock { held -> [UInt8]? in
            if let current = held, current.device == UInt64(info.st_dev), current.inode == UInt64(info.st_ino) {
                return LocalDirectoryProvider.descriptorPath(current.fd)
            }
            if let current = held { SystemCalls.close(current.fd) }
            held = nil
            let fd = SystemCalls.open(root, openPathOnly | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { return nil }
            var opened = stat()
            guard SystemCalls.fstat(fd, &opened) == 0 else {
                SystemCalls.close(fd)
                return nil
            }
            held = (fd, UInt64(opened.st_dev), UInt64(opened.st_ino))
            return LocalDirectoryProvider.descriptorPath(fd)
        }
    }

    deinit {
        if let current = held.withLock({ $0 }) { SystemCalls.close(current.fd) }
    }
}
