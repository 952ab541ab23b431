// LocalDirectoryProvider's write calls (issue 14, ProviderModel/ProviderWriting.swift). Every call
// works relative to a descriptor of the parent directory, opened O_NOFOLLOW and then checked: the
// kernel's path of that descriptor lies inside the root's real path (`openCheckedDirectory`,
// D-425): a symbolic link is never followed out of the source, and the name itself is one checked
// component.
//
// Uploads are staged in a hidden temporary file in the destination directory
// (`.providerfs-upload-<random>`, never listed, never looked up, never reported as a change) and
// published with one rename: readers of the source see the old content or the new, never a part
// (docs/SEMANTICS.md, "Writing to a local directory source"; D-351, D-352).

import Foundation
public import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension LocalDirectoryProvider {
    /// The prefix of upload staging files (D-351). Names with it are hidden from listings,
    /// lookups and pushed changes, and refused as names of new items.
    public static let temporaryNamePrefix = ".providerfs-upload-"

    /// Whether `name` is an upload staging file's name.
    static func isTemporaryName(_ name: some StringProtocol) -> Bool {
        name.utf8.starts(with: temporaryNamePrefix.utf8)
    }

    // MARK: Write calls

    public func createDirectory(
        named name: String, in parent: ItemIdentifier, permissions: UInt16
    ) async throws -> ProviderItem {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run {
            try Self.checkNewName(name)
            try self.checkPathFits(name, in: parent)
            let directory = try self.openDirectory(parent)
            defer { SystemCalls.close(directory.fd) }
            // Under the directory's entry lock, as every change of its entries (D-408).
            guard
                self.entries.withLock(parent, { SystemCalls.mkdirat(directory.fd, name, mode_t(permissions & 0o7777)) })
                    == 0
            else {
                throw Self.writeError(errno, "mkdir \(name) in \(Self.describe(parent))")
            }
            // mkdir applies the umask: the permissions asked are the ones stored, plus the
            // setgid a directory made in a setgid directory inherits (D-397).
            var made = stat()
            let inherited =
                SystemCalls.fstatat(directory.fd, name, &made, AT_SYMLINK_NOFOLLOW) == 0
                ? UInt16(made.st_mode & 0o2000) : 0
            _ = SystemCalls.fchmodat(
                directory.fd, name, mode_t((permissions & 0o7777) | inherited), AT_SYMLINK_NOFOLLOW)
            return try self.itemAt(directory, name: name)
        }
    }

    public func createSymbolicLink(
        named name: String, in parent: ItemIdentifier, target: String
    ) async throws -> ProviderItem {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run {
            try Self.checkNewName(name)
            try self.checkPathFits(name, in: parent)
            guard !target.isEmpty, !target.utf8.contains(0) else {
                throw ProviderError(.invalidName, "'\(target)' is not a symbolic link target", errno: EINVAL)
            }
            let directory = try self.openDirectory(parent)
            defer { SystemCalls.close(directory.fd) }
            guard self.entries.withLock(parent, { SystemCalls.symlinkat(target, directory.fd, name) }) == 0 else {
                throw Self.writeError(errno, "symlink \(name) in \(Self.describe(parent))")
            }
            return try self.itemAt(directory, name: name)
        }
    }

    public func upload(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?
    ) async throws -> ProviderItem {
        try Task.checkCancellation()
        let cancelled = Locked(false)
        return try await withTaskCancellationHandler {
            try await LocalIO.run {
                try self.uploadSync(
                    from: localFile, to: target, permissions: permissions, modificationTime: modificationTime,
                    cancelled: { cancelled.withLock { $0 } })
            }
        } onCancel: {
            cancelled.withLock { $0 = true }
        }
    }

    /// link(2) at the source: `linkat` of the item's name in its directory to `name` in
    /// `parent`, both opened as every write call opens them (D-396). A symbolic link is linked
    /// itself, never followed, as link(2) does; a directory is refused (EPERM).
    public func link(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String
    ) async throws -> ProviderItem {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run {
            try Self.checkNewName(name)
            try self.checkPathFits(name, in: parent)
            let (sourceParent, sourceName) = try Self.split(identifier)
            let source = try self.openDirectory(sourceParent)
            defer { SystemCalls.close(source.fd) }
            var info = stat()
            guard SystemCalls.fstatat(source.fd, sourceName, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
                throw Self.writeError(errno, "lstat \(identifier.rawValue)")
            }
            guard info.st_mode & S_IFMT != S_IFDIR else {
                throw ProviderError(.wrongKind, "\(identifier.rawValue) is a directory", errno: EPERM)
            }
            let directory = try self.openDirectory(parent)
            defer { SystemCalls.close(directory.fd) }
            guard
                self.entries.withLock(parent, { SystemCalls.linkat(source.fd, sourceName, directory.fd, name, 0) }) == 0
            else {
                throw Self.writeError(errno, "link \(identifier.rawValue) as \(name) in \(Self.describe(parent))")
            }
            return try self.itemAt(directory, name: name)
        }
    }

    public func delete(_ identifier: ItemIdentifier, kind: ItemKind) async throws {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run {
            let (parent, name) = try Self.split(identifier)
            let directory = try self.openDirectory(parent)
            defer { SystemCalls.close(directory.fd) }
            var info = stat()
            guard SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
                throw Self.writeError(errno, "lstat \(identifier.rawValue)")
            }
            let actual = Self.kind(of: info)
            if actual != kind {
                let code: Int32? =
                    actual == .directory ? EISDIR : kind == .directory ? ENOTDIR : nil
                throw ProviderError(
                    .wrongKind,
                    "\(identifier.rawValue) is a \(actual.map { "\($0)" } ?? "special file"), not a \(kind)",
                    errno: code)
            }
            let removed = self.entries.withLock(parent) {
                SystemCalls.unlinkat(directory.fd, name, kind == .directory ? AT_REMOVEDIR : 0)
            }
            guard removed == 0 else {
                let code = errno
                if kind == .directory && (code == ENOTEMPTY || code == EEXIST) {
                    throw ProviderError(.notEmpty, "\(identifier.rawValue) is not empty", errno: ENOTEMPTY)
                }
                throw Self.writeError(code, "delete \(identifier.rawValue)")
            }
        }
    }

    public func move(
        _ identifier: ItemIdentifier, to parent: ItemIdentifier, named name: String, mode: MoveMode
    ) async throws -> ProviderItem {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run {
            let (sourceParent, sourceName) = try Self.split(identifier)
            try Self.checkNewName(name)
            try self.checkPathFits(name, in: parent)
            let source = try self.openDirectory(sourceParent)
            defer { SystemCalls.close(source.fd) }
            let destination = try self.openDirectory(parent)
            defer { SystemCalls.close(destination.fd) }
            let flags: UInt32 =
                switch mode {
                case .replacing: 0
                case .noReplace: RenameFlags.noReplace
                case .exchange: RenameFlags.exchange
                }
            let renamed = self.entries.withLocks([sourceParent, parent]) {
                SystemCalls.renameat2(source.fd, sourceName, destination.fd, name, flags: flags)
            }
            guard renamed == 0 else {
                let code = errno
                let what = "move \(identifier.rawValue) to \(Self.describe(parent))/\(name)"
                if code == EINVAL && flags == 0 {
                    throw ProviderError(.invalidName, "\(what): a directory cannot move into itself", errno: code)
                }
                if code == EINVAL {
                    // The file system has no renameat2 flags (or a directory into itself).
                    var info = stat()
                    if SystemCalls.fstatat(source.fd, sourceName, &info, AT_SYMLINK_NOFOLLOW) == 0,
                        info.st_mode & S_IFMT == S_IFDIR,
                        Self.isInside(parent, identifier)
                    {
                        throw ProviderError(.invalidName, "\(what): a directory cannot move into itself", errno: code)
                    }
                    throw ProviderError(.notSupported, "\(what): the file system refuses \(mode)", errno: EOPNOTSUPP)
                }
                if code == ENOTEMPTY || (code == EEXIST && mode == .replacing) {
                    throw ProviderError(
                        .notEmpty, "\(what): the destination is a directory that is not empty", errno: ENOTEMPTY)
                }
                throw Self.writeError(code, what)
            }
            return try self.itemAt(destination, name: name)
        }
    }

    public func setAttributes(
        _ identifier: ItemIdentifier, _ changes: ItemAttributeChanges
    ) async throws -> ProviderItem {
        // Nothing has happened yet: a cancelled caller changes nothing.
        try Task.checkCancellation()
        return try await LocalIO.run { try self.setAttributesSync(identifier, changes) }
    }

    /// `setAttributes` on the calling thread for an item whose directory is watched (a local
    /// file system, as `itemNow`: nothing here waits on a network, D-426); nil for anything else.
    public func setAttributesNow(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem?
    {
        guard identifier != .root, let (parent, _) = try? Self.split(identifier), self.changes.isWatched(parent) else {
            return nil
        }
        return try setAttributesSync(identifier, changes)
    }

    /// chmod, chown, utimens of `identifier` (its parent opened as every write call opens it).
    func setAttributesSync(_ identifier: ItemIdentifier, _ changes: ItemAttributeChanges) throws -> ProviderItem {
        if identifier == .root {
            let path = try self.checkedPath(.root)
            if changes.uid != nil || changes.gid != nil,
                SystemCalls.lchown(path, changes.uid ?? UInt32.max, changes.gid ?? UInt32.max) != 0
            {
                throw Self.writeError(errno, "chown of the source directory")
            }
            if let permissions = changes.permissions, SystemCalls.chmod(path, mode_t(permissions & 0o7777)) != 0 {
                throw Self.writeError(errno, "chmod of the source directory")
            }
            if changes.modificationTime != nil || changes.accessTime != nil {
                var times = Self.times(modification: changes.modificationTime, access: changes.accessTime)
                guard SystemCalls.utimensat(AT_FDCWD, path, &times, 0) == 0 else {
                    throw Self.writeError(errno, "utimens of the source directory")
                }
            }
            return try self.itemSync(.root)
        }
        let (parent, name) = try Self.split(identifier)
        let directory = try self.openDirectory(parent)
        defer { SystemCalls.close(directory.fd) }
        var info = stat()
        guard SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            throw Self.writeError(errno, "lstat \(identifier.rawValue)")
        }
        // The owner first: Linux's chown clears setuid and setgid, the permissions asked
        // come after (D-397).
        if changes.uid != nil || changes.gid != nil {
            guard
                SystemCalls.fchownat(
                    directory.fd, name, changes.uid ?? UInt32.max, changes.gid ?? UInt32.max,
                    AT_SYMLINK_NOFOLLOW) == 0
            else { throw Self.writeError(errno, "chown \(identifier.rawValue)") }
        }
        // Linux has no permissions for a symbolic link: they are left alone.
        if let permissions = changes.permissions, info.st_mode & S_IFMT != S_IFLNK {
            guard SystemCalls.fchmodat(directory.fd, name, mode_t(permissions & 0o7777), AT_SYMLINK_NOFOLLOW) == 0
            else {
                throw Self.writeError(errno, "chmod \(identifier.rawValue)")
            }
        }
        if changes.modificationTime != nil || changes.accessTime != nil {
            var times = Self.times(modification: changes.modificationTime, access: changes.accessTime)
            // A directory's own times under its entry lock: an upload into it that puts its
            // times back does so before or after, never over this (D-408).
            let set = self.entries.withLock(identifier) {
                let set = SystemCalls.utimensat(directory.fd, name, &times, AT_SYMLINK_NOFOLLOW)
                // What an upload that read them outside the lock puts back now (D-521).
                var now = stat()
                if set == 0, self.entries.keepsTimes(of: identifier),
                    SystemCalls.fstatat(directory.fd, name, &now, AT_SYMLINK_NOFOLLOW) == 0
                {
                    self.entries.timesSet(of: identifier, [now.st_atim, now.st_mtim])
                }
                return set
            }
            guard set == 0 else {
                throw Self.writeError(errno, "utimens \(identifier.rawValue)")
            }
        }
        return try self.itemAt(directory, name: name)
    }

    /// A create through the mount made now, uploaded later (D-386): the name checked free, the
    /// directory's mtime moved as the create moves it (under the directory's entry lock, so an
    /// upload's restore of the directory's times cannot undo it), the identifier noted, so that
    /// the `.create` upload keeps the directory's times then. Only in a watched directory (a
    /// local file system: nothing here waits on a network).
    ///
    /// While the root is missing (its last look found it so; no system call here), the create is
    /// deferred too, with nothing checked at the source or moved there: the upload, queued until
    /// the root is back, is then an ordinary exclusive create, and a name taken there meanwhile
    /// is a conflict as for any deferred create (D-434).
    public func deferCreateNow(named name: String, in parent: ItemIdentifier) throws -> DeferredCreate? {
        if rootMissing.withLock({ $0 }) {
            try Self.checkNewName(name)
            try checkPathFits(name, in: parent)
            return DeferredCreate(identifier: Self.identifier(of: name, in: parent), directory: nil)
        }
        guard changes.isWatched(parent) else { return nil }
        try Self.checkNewName(name)
        try checkPathFits(name, in: parent)
        let directory = try openDirectory(parent)
        defer { SystemCalls.close(directory.fd) }
        var info = stat()
        if SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 {
            throw ProviderError(.alreadyExists, "\(name) exists in \(Self.describe(parent))", errno: EEXIST)
        }
        guard errno == ENOENT else { throw Self.writeError(errno, "lstat \(name) in \(Self.describe(parent))") }
        let identifier = Self.identifier(of: name, in: parent)
        var after = stat()
        let touched = entries.withLock(parent) { () -> Bool in
            var times = [timespec(tv_sec: 0, tv_nsec: utimeOmit), timespec(tv_sec: 0, tv_nsec: utimeNow)]
            return SystemCalls.futimens(directory.fd, &times) == 0 && SystemCalls.fstat(directory.fd, &after) == 0
        }
        // Not allowed to set the directory's times (not its owner): created at once instead.
        guard touched else { return nil }
        entries.deferred(identifier)
        guard parent != .root, let (grandparent, directoryName) = try? Self.split(parent) else {
            return DeferredCreate(identifier: identifier, directory: nil)
        }
        let item = Self.makeItem(
            identifier: parent, parent: grandparent, name: directoryName, path: { directory.path }, info: after)
        return DeferredCreate(identifier: identifier, directory: item)
    }

    /// The deferred file is gone before it was born (unlinked, or its create(2) failed): its
    /// directory's mtime moves now, as an unlink's would have moved it at the source, under the
    /// directory's entry lock (D-408).
    public func forgetDeferredCreate(_ identifier: ItemIdentifier) {
        guard entries.isDeferred(identifier) else { return }
        entries.created(identifier)
        guard let (parent, _) = try? Self.split(identifier), let directory = try? openDirectory(parent) else { return }
        defer { SystemCalls.close(directory.fd) }
        entries.withLock(parent) {
            var times = [timespec(tv_sec: 0, tv_nsec: utimeOmit), timespec(tv_sec: 0, tv_nsec: utimeNow)]
            _ = SystemCalls.futimens(directory.fd, &times)
        }
    }

    // MARK: Upload

    /// Copies `localFile` into a staging file next to the destination, then publishes it with
    /// one rename (see the file's header). `cancelled` is looked at between copy steps and right
    /// before the rename, the point of no return.
    func uploadSync(
        from localFile: String, to target: UploadTarget, permissions: UInt16?, modificationTime: ItemTime?,
        cancelled: () -> Bool
    ) throws -> ProviderItem {
        let (parent, name): (ItemIdentifier, String)
        var existing: stat?
        switch target {
        case .create(let newName, let directory):
            try Self.checkNewName(newName)
            try checkPathFits(newName, in: directory)
            (parent, name) = (directory, newName)
        case .replace(let identifier, _):
            (parent, name) = try Self.split(identifier)
        }
        let directory = try openDirectory(parent)
        defer { SystemCalls.close(directory.fd) }
        if case .replace(let identifier, _) = target {
            var info = stat()
            guard SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
                throw Self.writeError(errno, "lstat \(identifier.rawValue)")
            }
            guard info.st_mode & S_IFMT == S_IFREG else {
                throw ProviderError(
                    .wrongKind, "\(identifier.rawValue) is not a file",
                    errno: info.st_mode & S_IFMT == S_IFDIR ? EISDIR : EINVAL)
            }
            existing = info
        }
        let source = SystemCalls.open(localFile, O_RDONLY | O_CLOEXEC)
        guard source >= 0 else {
            let code = errno
            throw ProviderError(.io, "open \(localFile): \(String(cString: strerror(code)))", errno: code)
        }
        defer { SystemCalls.close(source) }
        // A file with other names: its bytes are written in place, so every name keeps them (D-396).
        if case .replace(let identifier, let baseVersion) = target, let existing, existing.st_nlink > 1 {
            return try replaceInPlace(
                identifier, named: name, in: directory, parent: parent, from: source, baseVersion: baseVersion,
                permissions: permissions, modificationTime: modificationTime, cancelled: cancelled)
        }
        // A create `deferCreateNow` handed out already moved the directory's mtime (D-386).
        var deferred: ItemIdentifier?
        if case .create = target, entries.isDeferred(Self.identifier(of: name, in: parent)) {
            deferred = Self.identifier(of: name, in: parent)
        }
        if case .create = target, deferred == nil {
            var sourceInfo = stat()
            if SystemCalls.fstat(source, &sourceInfo) == 0, sourceInfo.st_size == 0 {
                return try createEmpty(
                    name, in: directory, parent: parent, permissions: permissions, modificationTime: modificationTime)
            }
        }
        if uploadHooks?.namedTemporary != true,
            let published = try uploadUnnamed(
                source, to: target, name: name, in: directory, parent: parent, existing: existing,
                keepingDirectoryTimes: deferred != nil || { if case .replace = target { true } else { false } }(),
                permissions: permissions, modificationTime: modificationTime, cancelled: cancelled)
        {
            if let deferred { entries.created(deferred) }
            return published
        }

        // A replace changes a file's bytes, not the directory's entries: the directory's times are
        // put back afterwards, so that `tar x`'s or `rsync -a`'s directory mtimes survive the
        // write-back of the files inside (the temporary file and the swap change them). So does a
        // deferred create (D-386).
        // Read under the directory's lock and kept there: a utimens of the directory through the
        // mount (which does not wait for the uploads into it, D-521) replaces them.
        var keepsTimes = deferred != nil
        if case .replace = target { keepsTimes = true }
        let kept = keepsTimes ? entries.keepTimes(of: parent, directory.fd) : nil
        defer { if let kept { entries.forgetTimes(kept, of: parent) } }  // (a failure puts nothing back)
        let temporary = Self.temporaryNamePrefix + String(UInt64.random(in: .min ... .max), radix: 16)
        let staged = SystemCalls.openat(
            directory.fd, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard staged >= 0 else { throw Self.writeError(errno, "create a staging file in \(Self.describe(parent))") }
        defer { SystemCalls.close(staged) }
        var removeTemporary = true
        defer { if removeTemporary { SystemCalls.unlinkat(directory.fd, temporary, 0) } }

        try fill(
            staged, from: source, name: name, existing: existing, permissions: permissions,
            modificationTime: modificationTime, cancelled: cancelled)

        switch target {
        case .create:
            try Self.publishExclusively(directory.fd, temporary, as: name)
            removeTemporary = false
        case .replace(let identifier, let baseVersion):
            removeTemporary = false  // `replace` sees to it
            try Self.replace(identifier, named: name, with: temporary, in: directory.fd, baseVersion: baseVersion)
        }
        if let kept {
            // A change made by someone else in the directory meanwhile loses its mtime to this one
            // (docs/SEMANTICS.md, LocalDirectoryProvider).
            entries.putTimesBack(kept, of: parent, directory.fd)
        }
        if let deferred { entries.created(deferred) }
        // The rename is durable once the directory is (the staging file's bytes already are).
        return try Self.durableItem(staged, named: name, in: directory, parent: parent)
    }

    /// The upload through an unnamed temporary file (O_TMPFILE, D-386): filled, chmod-ed, timed and
    /// synced without touching the directory; then, under the directory's entry lock, linked in
    /// (a create: under its name, exclusively; a replace: under a temporary name swapped with the
    /// file by RENAME_EXCHANGE, the version checked, the old file unlinked) and the directory's
    /// times put back when `keepingDirectoryTimes`. The directory's times are read right before
    /// the link, inside the lock: a create `deferCreateNow` made meanwhile in the directory keeps
    /// its mtime. Nil when the file system has no O_TMPFILE (the caller uses a named temporary).
    private func uploadUnnamed(
        _ source: Int32, to target: UploadTarget, name: String, in directory: OpenDirectory, parent: ItemIdentifier,
        existing: stat?, keepingDirectoryTimes: Bool, permissions: UInt16?, modificationTime: ItemTime?,
        cancelled: () -> Bool
    ) throws -> ProviderItem? {
        // linkat(2) of an unnamed file goes through /proc/self/fd: without /proc, a named file.
        guard Self.hasProcFileDescriptors else { return nil }
        let staged = SystemCalls.openat(directory.fd, ".", openUnnamedTemporary | O_WRONLY | O_CLOEXEC, 0o600)
        guard staged >= 0 else {
            let code = errno
            if code == EOPNOTSUPP || code == EISDIR || code == EINVAL || code == ENOENT { return nil }
            throw Self.writeError(code, "create a staging file in \(Self.describe(parent))")
        }
        defer { SystemCalls.close(staged) }
        try fill(
            staged, from: source, name: name, existing: existing, permissions: permissions,
            modificationTime: modificationTime, cancelled: cancelled)
        let unnamed = "/proc/self/fd/\(staged)"
        try entries.withLock(parent) { () throws -> Void in
            var directoryTimes = stat()
            let keep = keepingDirectoryTimes && SystemCalls.fstat(directory.fd, &directoryTimes) == 0
            defer {
                if keep {
                    var times = [directoryTimes.st_atim, directoryTimes.st_mtim]
                    _ = SystemCalls.futimens(directory.fd, &times)
                }
            }
            uploadHooks?.insideEntryLock()
            switch target {
            case .create:
                guard SystemCalls.linkat(AT_FDCWD, unnamed, directory.fd, name, AT_SYMLINK_FOLLOW) == 0 else {
                    throw Self.writeError(errno, "create \(name)")
                }
            case .replace(let identifier, let baseVersion):
                let temporary = Self.temporaryNamePrefix + String(UInt64.random(in: .min ... .max), radix: 16)
                guard SystemCalls.linkat(AT_FDCWD, unnamed, directory.fd, temporary, AT_SYMLINK_FOLLOW) == 0 else {
                    throw Self.writeError(errno, "link the staging file of \(name)")
                }
                try Self.replace(identifier, named: name, with: temporary, in: directory.fd, baseVersion: baseVersion)
            }
        }
        // The link is durable once the directory is (the file's bytes already are).
        return try Self.durableItem(staged, named: name, in: directory, parent: parent)
    }

    /// Fills the staging file `staged` with `source`'s bytes, gives it its mode (`permissions`, else
    /// the replaced file's, else 0644) and mtime, and syncs it: all before it gets a name.
    private func fill(
        _ staged: Int32, from source: Int32, name: String, existing: stat?, permissions: UInt16?,
        modificationTime: ItemTime?, cancelled: () -> Bool
    ) throws {
        try copyContents(from: source, to: staged, what: name, cancelled: cancelled)
        // A new version keeps the file's owner (D-397), set before the mode: chown clears setuid.
        if Self.storesOwners, let existing, SystemCalls.fchown(staged, existing.st_uid, existing.st_gid) != 0 {
            throw Self.writeError(errno, "chown of \(name)'s staging file")
        }
        let mode = permissions.map { $0 & 0o7777 } ?? existing.map { UInt16($0.st_mode & 0o7777) } ?? 0o644
        guard SystemCalls.fchmod(staged, mode_t(mode)) == 0 else {
            throw Self.writeError(errno, "chmod of \(name)'s staging file")
        }
        if let modificationTime {
            var times = Self.times(modification: modificationTime)
            guard SystemCalls.futimens(staged, &times) == 0 else {
                throw Self.writeError(errno, "utimens of \(name)'s staging file")
            }
        }
        guard SystemCalls.fsync(staged) == 0 else { throw Self.writeError(errno, "fsync of \(name)'s staging file") }
        uploadHooks?.beforePublish()
        if cancelled() { throw CancellationError() }
    }

    /// Puts the staged file `temporary` in `directory` in the place of `name`, which must still be
    /// the file the upload's base version names (D-372): RENAME_EXCHANGE, so that a move or delete
    /// since the caller's check is ENOENT (a plain rename would make a new file under the old
    /// name), and the version swapped out is checked, else swapped back. On a file system without
    /// RENAME_EXCHANGE: check, then rename; a writer that replaces the file between the two calls
    /// is overwritten, and a move between them leaves the upload under the old name
    /// (docs/SEMANTICS.md). `temporary` is gone afterwards, thrown or not, except after a failed
    /// swap back: then it names the other writer's version, which is never unlinked.
    private static func replace(
        _ identifier: ItemIdentifier, named name: String, with temporary: String, in directory: Int32,
        baseVersion: ContentVersion?
    ) throws {
        var removeTemporary = true
        defer { if removeTemporary { SystemCalls.unlinkat(directory, temporary, 0) } }
        if SystemCalls.renameat2(directory, temporary, directory, name, flags: RenameFlags.exchange) == 0 {
            // `temporary` names the replaced file now (unlinked by the defer).
            var info = stat()
            if let baseVersion, SystemCalls.fstatat(directory, temporary, &info, AT_SYMLINK_NOFOLLOW) == 0 {
                let replaced = version(of: info)
                if replaced != baseVersion {
                    removeTemporary =
                        SystemCalls.renameat2(directory, temporary, directory, name, flags: RenameFlags.exchange) == 0
                    throw ProviderError(
                        .versionChanged, "\(identifier.rawValue) changed: \(baseVersion) is now \(replaced)")
                }
            }
            return
        }
        let code = errno
        if code == ENOENT { throw writeError(code, "replace \(identifier.rawValue): it is gone") }
        guard code == EINVAL || code == ENOSYS else { throw writeError(code, "replace \(identifier.rawValue)") }
        if let baseVersion {
            var info = stat()
            guard SystemCalls.fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
                throw writeError(errno, "lstat \(identifier.rawValue)")
            }
            let current = version(of: info)
            guard current == baseVersion else {
                throw ProviderError(
                    .versionChanged, "\(identifier.rawValue) changed: \(baseVersion) is now \(current)")
            }
        }
        guard SystemCalls.renameat(directory, temporary, directory, name) == 0 else {
            throw writeError(errno, "replace \(identifier.rawValue)")
        }
        removeTemporary = false
    }

    /// The upload of a file with more than one name (D-396): a rename would give this name a new
    /// file and leave the other names the old one, so the bytes go into the file itself:
    /// version checked, truncated, copied, mode and mtime set, synced. Not atomic: a reader of
    /// the source meanwhile sees a part, and a crash mid-copy leaves one (docs/SEMANTICS.md). A
    /// file without write permission is opened after a chmod u+w, its mode put back after.
    private func replaceInPlace(
        _ identifier: ItemIdentifier, named name: String, in directory: OpenDirectory, parent: ItemIdentifier,
        from source: Int32, baseVersion: ContentVersion?, permissions: UInt16?, modificationTime: ItemTime?,
        cancelled: () -> Bool
    ) throws -> ProviderItem {
        var fd = SystemCalls.openat(directory.fd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
        var restoreMode: mode_t?
        if fd < 0, errno == EACCES {
            var info = stat()
            if SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0,
                SystemCalls.fchmodat(directory.fd, name, (info.st_mode & 0o7777) | 0o200, 0) == 0
            {
                restoreMode = info.st_mode & 0o7777
                fd = SystemCalls.openat(directory.fd, name, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
            }
        }
        guard fd >= 0 else {
            let code = errno
            if let restoreMode { _ = SystemCalls.fchmodat(directory.fd, name, restoreMode, 0) }
            throw Self.writeError(code, "open \(identifier.rawValue) to write it in place")
        }
        defer { SystemCalls.close(fd) }
        defer { if let restoreMode { _ = SystemCalls.fchmod(fd, restoreMode) } }
        var info = stat()
        guard SystemCalls.fstat(fd, &info) == 0 else { throw Self.writeError(errno, "fstat \(identifier.rawValue)") }
        if let baseVersion, Self.version(of: info) != baseVersion {
            throw ProviderError(
                .versionChanged, "\(identifier.rawValue) changed: \(baseVersion) is now \(Self.version(of: info))")
        }
        uploadHooks?.beforePublish()
        if cancelled() { throw CancellationError() }
        guard SystemCalls.ftruncate(fd, 0) == 0 else { throw Self.writeError(errno, "truncate \(identifier.rawValue)") }
        // Past the point of no return: the copy runs to its end.
        try copyContents(from: source, to: fd, what: name, cancelled: { false })
        let mode = permissions.map { mode_t($0 & 0o7777) } ?? restoreMode
        restoreMode = nil
        if let mode, SystemCalls.fchmod(fd, mode) != 0 { throw Self.writeError(errno, "chmod of \(name)") }
        if let modificationTime {
            var times = Self.times(modification: modificationTime)
            guard SystemCalls.futimens(fd, &times) == 0 else { throw Self.writeError(errno, "utimens of \(name)") }
        }
        guard SystemCalls.fsync(fd) == 0 else { throw Self.writeError(errno, "fsync of \(name)") }
        return try Self.durableItem(fd, named: name, in: directory, parent: parent)
    }

    /// Whether /proc/self/fd exists (an unnamed file is linked in through it).
    static let hasProcFileDescriptors = SystemCalls.access("/proc/self/fd", F_OK) == 0

    /// The file `fd` just published as `name` in `directory`, as an item, once the directory
    /// (its new entry) is synced.
    private static func durableItem(
        _ fd: Int32, named name: String, in directory: OpenDirectory, parent: ItemIdentifier
    ) throws -> ProviderItem {
        _ = SystemCalls.fsync(directory.fd)
        var info = stat()
        guard SystemCalls.fstat(fd, &info) == 0 else { throw writeError(errno, "fstat \(name)") }
        let published = identifier(of: name, in: parent)
        guard
            let item = makeItem(
                identifier: published, parent: parent, name: name, path: { directory.path + "/" + name }, info: info)
        else { throw ProviderError(.io, "\(published.rawValue) is not a file after the upload") }
        return item
    }

    /// An empty `.create` (a `create(2)` through the mount, D-361): made under its name at once,
    /// exclusively (O_EXCL), with its mode and mtime, then synced with its directory. No
    /// temporary file and no rename: an empty file has no partial state for anyone to see (a
    /// failure after the open removes it again), and on ext4 without a journal (this project's
    /// CI) every inode allocated and freed makes the next allocations slower (D-380).
    private func createEmpty(
        _ name: String, in directory: OpenDirectory, parent: ItemIdentifier, permissions: UInt16?,
        modificationTime: ItemTime?
    ) throws -> ProviderItem {
        let created = SystemCalls.openat(
            directory.fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard created >= 0 else { throw Self.writeError(errno, "create \(name)") }
        defer { SystemCalls.close(created) }
        var made = stat()
        let known = SystemCalls.fstat(created, &made) == 0
        var kept = false
        defer {
            // Removed only while the name is still the file this made.
            var now = stat()
            if !kept, known, SystemCalls.fstatat(directory.fd, name, &now, AT_SYMLINK_NOFOLLOW) == 0,
                now.st_ino == made.st_ino,
                now.st_dev == made.st_dev
            {
                SystemCalls.unlinkat(directory.fd, name, 0)
            }
        }
        let mode = permissions.map { $0 & 0o7777 } ?? 0o644
        guard SystemCalls.fchmod(created, mode_t(mode)) == 0 else { throw Self.writeError(errno, "chmod of \(name)") }
        if let modificationTime {
            var times = Self.times(modification: modificationTime)
            guard SystemCalls.futimens(created, &times) == 0 else { throw Self.writeError(errno, "utimens of \(name)") }
        }
        guard SystemCalls.fsync(created) == 0 else { throw Self.writeError(errno, "fsync of \(name)") }
        let item = try Self.durableItem(created, named: name, in: directory, parent: parent)
        kept = true
        return item
    }

    /// Publishes `temporary` as `name` only when `name` is free: RENAME_NOREPLACE, or (a file
    /// system without it) link(2) + unlink(2), which is exclusive too (D-352).
    private static func publishExclusively(_ directory: Int32, _ temporary: String, as name: String) throws {
        if SystemCalls.renameat2(directory, temporary, directory, name, flags: RenameFlags.noReplace) == 0 { return }
        let code = errno
        guard code == EINVAL || code == ENOSYS else { throw writeError(code, "create \(name)") }
        guard SystemCalls.linkat(directory, temporary, directory, name, 0) == 0 else {
            throw writeError(errno, "create \(name)")
        }
        SystemCalls.unlinkat(directory, temporary, 0)
    }

    /// Copies all of `source` into `destination` (both at offset 0): copy_file_range in steps
    /// (the kernel copies, reflinks where the file system can), read/write where it cannot.
    private func copyContents(from source: Int32, to destination: Int32, what: String, cancelled: () -> Bool) throws {
        let step = 8 << 20
        var useCopyRange = true
        var buffer: [UInt8] = []
        var offset: off_t = 0
        while true {
            if cancelled() { throw CancellationError() }
            var count = 0
            if useCopyRange {
                count = SystemCalls.copyFileRange(from: source, to: destination, count: step)
                if count < 0 {
                    let code = errno
                    if code == EINTR { continue }
                    if code == EXDEV || code == ENOSYS || code == EINVAL || code == EOPNOTSUPP || code == EBADF {
                        useCopyRange = false
                        continue
                    }
                    throw Self.writeError(code, "copy to \(what)")
                }
            } else {
                if buffer.isEmpty { buffer = [UInt8](repeating: 0, count: 1 << 20) }
                let got = buffer.withUnsafeMutableBytes { raw in
                    SystemCalls.pread(source, raw.baseAddress, raw.count, offset)
                }
                if got < 0 { throw Self.writeError(errno, "read \(what)'s local copy") }
                if got > 0 {
                    let written = buffer.withUnsafeBytes {
                        writeFully(destination, from: $0.baseAddress!, count: got, at: Int64(offset))
                    }
                    if case .failure(let error) = written { throw Self.writeError(error.rawValue, "copy to \(what)") }
                    // Keep the descriptors' offsets in step, should copy_file_range be tried again.
                    _ = SystemCalls.lseek(destination, offset + off_t(got), SEEK_SET)
                    _ = SystemCalls.lseek(source, offset + off_t(got), SEEK_SET)
                }
                count = got
            }
            if count == 0 { return }
            offset += off_t(count)
            uploadHooks?.afterCopyStep(Int64(offset))
        }
    }

    // MARK: Helpers

    /// A parent directory opened for *at calls, and its path (for messages and readlink).
    struct OpenDirectory {
        var fd: Int32
        var path: String
        var identifier: ItemIdentifier
    }

    /// Opens `identifier` as a directory: its path checked (`openCheckedDirectory`: the real path
    /// of what was opened lies inside the root), the last component not followed (a directory
    /// replaced by a symbolic link is refused).
    func openDirectory(_ identifier: ItemIdentifier) throws -> OpenDirectory {
        if identifier != .root, let last = identifier.rawValue.split(separator: "/").last, Self.isTemporaryName(last) {
            _ = try checkedPath(identifier)
            throw ProviderError(.noSuchItem, "\(identifier.rawValue) is gone")
        }
        let (fd, path, code) = try openCheckedDirectory(identifier)
        guard fd >= 0 else {
            if code == ENOENT { throw ProviderError(.noSuchItem, "\(Self.describe(identifier)) is gone", errno: code) }
            if code == ENOTDIR || code == ELOOP {
                throw ProviderError(.wrongKind, "\(Self.describe(identifier)) is not a directory", errno: ENOTDIR)
            }
            throw Self.writeError(code, "open \(Self.describe(identifier))")
        }
        return OpenDirectory(fd: fd, path: path, identifier: identifier)
    }

    /// The item `name` in an open directory, as `item(for:)` reports it.
    func itemAt(_ directory: OpenDirectory, name: String) throws -> ProviderItem {
        var info = stat()
        guard SystemCalls.fstatat(directory.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            throw Self.writeError(errno, "lstat \(name) in \(Self.describe(directory.identifier))")
        }
        let identifier = Self.identifier(of: name, in: directory.identifier)
        guard
            let item = Self.makeItem(
                identifier: identifier, parent: directory.identifier, name: name,
                path: { directory.path + "/" + name }, info: info)
        else { throw ProviderError(.noSuchItem, "\(identifier.rawValue) is not a file, directory or symbolic link") }
        return item
    }

    /// Refuses a name a new item cannot have: empty, ".", "..", with "/" or NUL, longer than 255
    /// bytes (ENAMETOOLONG), or an upload staging file's name.
    /// A new item's whole path at the source must fit PATH_MAX: the provider works with paths
    /// below its root. Checked where the item is made (a deferred create included), so that an
    /// item the source could never hold is refused at once with ENAMETOOLONG, as bindfs refuses
    /// it, instead of living in the mount with an upload that can never go (D-393).
    func checkPathFits(_ name: String, in parent: ItemIdentifier) throws {
        let length = root.utf8.count + 1 + (parent == .root ? 0 : parent.rawValue.utf8.count + 1) + name.utf8.count
        guard length < Int(PATH_MAX) else {
            throw ProviderError(
                .invalidName, "the source path of '\(name)' would be \(length) bytes, PATH_MAX is \(PATH_MAX)",
                errno: ENAMETOOLONG)
        }
    }

    static func checkNewName(_ name: String) throws {
        guard isNameComponent(name), !name.utf8.contains(UInt8(ascii: "/")) else {
            throw ProviderError(.invalidName, "'\(name)' is not a file name", errno: EINVAL)
        }
        guard name.utf8.count <= 255 else {
            throw ProviderError(.invalidName, "a name of \(name.utf8.count) bytes is too long", errno: ENAMETOOLONG)
        }
        guard !isTemporaryName(name) else {
            throw ProviderError(.invalidName, "'\(name)' is reserved for upload staging files", errno: EINVAL)
        }
    }

    /// An existing item's parent and name (the root has neither).
    static func split(_ identifier: ItemIdentifier) throws -> (ItemIdentifier, String) {
        guard identifier != .root else {
            throw ProviderError(.invalidName, "the source directory itself cannot be changed this way", errno: EBUSY)
        }
        let raw = identifier.rawValue
        // Every component checked here (as `checkedPath` does): "/etc" must not read as "etc".
        guard raw.split(separator: "/", omittingEmptySubsequences: false).allSatisfy(isNameComponent) else {
            throw ProviderError(.invalidName, "identifier '\(raw)' is not a path inside the source")
        }
        guard let slash = raw.lastIndex(of: "/") else {
            if isTemporaryName(raw) { throw ProviderError(.noSuchItem, "\(raw) is gone") }
            return (.root, raw)
        }
        let name = String(raw[raw.index(after: slash)...])
        if isTemporaryName(name) { throw ProviderError(.noSuchItem, "\(raw) is gone") }
        return (ItemIdentifier(String(raw[..<slash])), name)
    }

    static func identifier(of name: String, in parent: ItemIdentifier) -> ItemIdentifier {
        ItemIdentifier(parent == .root ? name : parent.rawValue + "/" + name)
    }

    /// Whether `identifier` is `ancestor` or inside it.
    static func isInside(_ identifier: ItemIdentifier, _ ancestor: ItemIdentifier) -> Bool {
        ancestor == .root || identifier == ancestor || identifier.rawValue.hasPrefix(ancestor.rawValue + "/")
    }

    static func describe(_ identifier: ItemIdentifier) -> String {
        identifier == .root ? "the source directory" : identifier.rawValue
    }

    static func kind(of info: stat) -> ItemKind? {
        switch info.st_mode & S_IFMT {
        case S_IFREG: .file
        case S_IFDIR: .directory
        case S_IFLNK: .symbolicLink
        default: nil
        }
    }

    /// utimensat's pair: the access time left alone, the modification time set.
    static func times(modification time: ItemTime) -> [timespec] {
        times(modification: time, access: nil)
    }

    /// utimensat's pair: each time set when given, left alone (UTIME_OMIT) when nil.
    static func times(modification: ItemTime?, access: ItemTime?) -> [timespec] {
        [access, modification].map { time in
            time.map { timespec(tv_sec: time_t($0.seconds), tv_nsec: Int($0.nanoseconds)) }
                ?? timespec(tv_sec: 0, tv_nsec: utimeOmit)
        }
    }

    /// A failed system call of a write, as the `ProviderError` that says what happened.
    static func writeError(_ code: Int32, _ what: String) -> ProviderError {
        let message = "\(what): \(String(cString: strerror(code)))"
        switch code {
        case EACCES, EPERM, EROFS: return ProviderError(.accessDenied, message, errno: code)
        case ENOSPC, EDQUOT: return ProviderError(.noSpace, message, errno: code)
        case EFBIG: return ProviderError(.tooLarge, message, errno: code)
        case ENAMETOOLONG: return ProviderError(.invalidName, message, errno: code)
        case EEXIST: return ProviderError(.alreadyExists, message, errno: code)
        case ENOTEMPTY: return ProviderError(.notEmpty, message, errno: code)
        case ENOENT: return ProviderError(.noSuchItem, message, errno: code)
        case EISDIR, ENOTDIR: return ProviderError(.wrongKind, message, errno: code)
        case ELOOP: return ProviderError(.invalidName, message, errno: code)
        default: return ProviderError(.io, message, errno: code)
        }
    }
}

/// Test hooks of uploads (LocalDirectoryWritingTests): called on the provider's I/O thread after
/// each copy step (with the bytes copied so far) and right before the publishing rename;
/// `namedTemporary` takes the path of a file system without O_TMPFILE (or of a system without
/// /proc) where O_TMPFILE works.
final class UploadHooks: Sendable {
    let afterCopyStep: @Sendable (Int64) -> Void
    let beforePublish: @Sendable () -> Void
    /// Inside the directory's entry lock, after its times were read (D-408).
    let insideEntryLock: @Sendable () -> Void
    let namedTemporary: Bool
    init(
        afterCopyStep: @escaping @Sendable (Int64) -> Void = { _ in },
        beforePublish: @escaping @Sendable () -> Void = {}, insideEntryLock: @escaping @Sendable () -> Void = {},
        namedTemporary: Bool = false
    ) {
        self.afterCopyStep = afterCopyStep
        self.beforePublish = beforePublish
        self.insideEntryLock = insideEntryLock
        self.namedTemporary = namedTemporary
    }
}

/// Per-directory locks around the entry changes that put a directory's times back, and around
/// `deferCreateNow`'s touch of a directory, so that one never undoes the other (D-386); and the
/// creates `deferCreateNow` handed out whose `.create` upload has not happened (in memory: after
/// a restart such an upload moves the directory's mtime, as an ordinary create does).
final class DirectoryEntries: Sendable {
    private let stripes = (0..<64).map { _ in Lock() }
    private let pending = Locked<Set<ItemIdentifier>>([])

    func withLock<T, E: Error>(_ directory: ItemIdentifier, _ body: () throws(E) -> T) throws(E) -> T {
        try stripes[stripe(of: directory)].withLock(body)
    }

    /// Both directories' locks (a rename between two), taken in stripe order so that two callers
    /// never wait for each other; one lock when both fall on one stripe.
    func withLocks<T>(_ directories: [ItemIdentifier], _ body: () -> T) -> T {
        let order = Set(directories.map(stripe(of:))).sorted()
        func locked(_ index: Int) -> T {
            guard index < order.count else { return body() }
            return stripes[order[index]].withLock { locked(index + 1) }
        }
        return locked(0)
    }

    private func stripe(of directory: ItemIdentifier) -> Int {
        var hasher = Hasher()
        hasher.combine(directory)
        return Int(UInt(bitPattern: hasher.finalize()) % UInt(stripes.count))
    }

    /// The times of directories that uploads read outside the lock and put back after (a file
    /// system without O_TMPFILE), by upload: a utimens of the directory meanwhile replaces them
    /// (`timesSet`), so that the upload puts back the times set (D-521).
    private let keptTimes = Locked<(next: UInt64, times: [ItemIdentifier: [UInt64: [timespec]]])>((0, [:]))

    /// Reads `directory`'s times (`fd`) under its lock and keeps them; nil when fstat fails.
    func keepTimes(of directory: ItemIdentifier, _ fd: Int32) -> UInt64? {
        withLock(directory) { () -> UInt64? in
            var info = stat()
            guard SystemCalls.fstat(fd, &info) == 0 else { return nil }
            return keptTimes.withLock { kept in
                kept.next &+= 1
                kept.times[directory, default: [:]][kept.next] = [info.st_atim, info.st_mtim]
                return kept.next
            }
        }
    }

    /// Puts the times kept as `token` back on `directory` (`fd`), under its lock.
    func putTimesBack(_ token: UInt64, of directory: ItemIdentifier, _ fd: Int32) {
        withLock(directory) {
            guard var times = forgetTimes(token, of: directory) else { return }
            _ = SystemCalls.futimens(fd, &times)
        }
    }

    @discardableResult
    func forgetTimes(_ token: UInt64, of directory: ItemIdentifier) -> [timespec]? {
        keptTimes.withLock { kept -> [timespec]? in
            defer { if kept.times[directory]?.isEmpty == true { kept.times[directory] = nil } }
            return kept.times[directory]?.removeValue(forKey: token)
        }
    }

    func keepsTimes(of directory: ItemIdentifier) -> Bool { keptTimes.withLock { $0.times[directory] != nil } }

    /// `directory`'s times were set (under its lock) to `times`: what its uploads put back.
    func timesSet(of directory: ItemIdentifier, _ times: [timespec]) {
        keptTimes.withLock { kept in
            for token in kept.times[directory]?.keys.map({ $0 }) ?? [] { kept.times[directory]![token] = times }
        }
    }

    func deferred(_ identifier: ItemIdentifier) { _ = pending.withLock { $0.insert(identifier) } }
    func isDeferred(_ identifier: ItemIdentifier) -> Bool { pending.withLock { $0.contains(identifier) } }
    func created(_ identifier: ItemIdentifier) { _ = pending.withLock { $0.remove(identifier) } }
}
