// Staging copies and their atomic publish (issue 14, docs/SEMANTICS.md "Writes"). A staging file
// is a private copy in `<cache>/staging/` that every write handle of one item writes; a publish
// makes it a new, complete content entry of a version the provider never mints ("local:…"). A
// complete content file is never written again: a publish renames the staging file into the
// content store, and a change through a write handle still open after that (a flush or fsync that
// is not the last close) first copies it to a new staging file (D-379).

import Diagnostics
public import ProviderModel
public import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What writes into staging files leave free on the cache's file system (D-390).
struct StagingSpace: Sendable {
    /// Bytes to leave free (`CacheOptions.reservedSpace`).
    var reserve: Int64
    var free: FreeSpace

    /// Nil when `need` new bytes fit above the reserve (or the free space cannot be told), else
    /// the ENOSPC to give.
    func refusal(_ need: Int64, fd: Int32, _ what: String, _ path: String) -> CacheError? {
        guard need > 0, let free = free(fd), free - need < reserve else { return nil }
        return CacheError(
            .noSpace,
            "cannot \(what) the staging file \(path): \(need) bytes more would leave \(max(0, free - need)) of the "
                + "\(free) free on the cache's file system, under the \(reserve) kept free (D-390)")
    }
}

/// The staging file of one item: shared by its write handles, written at any offset.
public final class StagingFile: Sendable {
    /// The item it stages; a rename through the mount moves it (D-371).
    public var identifier: ItemIdentifier { currentIdentifier.withLock { $0 } }
    private let currentIdentifier: Locked<ItemIdentifier>
    /// Whose private copy it is: nil for the item's shared one (plain paths), else the id of the
    /// token whose access path opened it (its writes are dropped if the token ends).
    public let owner: String?
    let pool: BlockingIOPool
    let space: StagingSpace

    /// The file the handles write, and its length as written (kept here: every write and
    /// truncate goes through this object). Every use of the descriptor holds the lock, so a
    /// publish that renames the file away and a change that copies it back never meet a write.
    private struct Storage {
        var fd: Int32
        var path: String
        var length: Int64
        /// Where a publish moved the file (a content file now, never written again): the next
        /// change copies it to a new staging file first (D-379). Nil: `path` is the staging file.
        var publishedAs: String?
        /// Dropped unpublished: a copy made after this is not kept under `staging/`.
        var discarded = false
        /// Copies made after publishes (their names: the first path with "-N").
        var copies = 0
        let firstPath: String
        /// Ranges that have blocks (written, copied or fallocated): writing there again needs no
        /// new space; anywhere else it does, and is checked against the reserve (D-390).
        var backed: ByteRanges
    }
    private let storage: Locked<Storage>
    /// `storage.length` as of its last change, readable without waiting for I/O that holds
    /// `storage` (a restage copy, a publish's fdatasync): stat and getattr read it while other
    /// locks are held (a leaf, set with `storage` held).
    private let lengthNow: Locked<Int64>
    /// When the bytes or the length last changed (wall clock), nil when not since it was made or
    /// since an explicit mtime was set (`setModified(nil)`): st_mtime while it is open, and the
    /// published version's mtime.
    private let lastChange = Locked<ItemTime?>(nil)
    /// Permission bits a chmod set while a publish was to come (D-385): the next publish takes
    /// them; until then stat shows them, also through a handle whose item was deleted.
    private let heldPermissions = Locked<UInt16?>(nil)

    init(
        identifier: ItemIdentifier, owner: String? = nil, path: String, fd: Int32, size: Int64, pool: BlockingIOPool,
        space: StagingSpace
    ) {
        self.currentIdentifier = Locked(identifier)
        self.owner = owner
        self.pool = pool
        self.space = space
        self.storage = Locked(
            Storage(fd: fd, path: path, length: size, firstPath: path, backed: ByteRanges(size > 0 ? [0..<size] : [])))
        self.lengthNow = Locked(size)
    }

    deinit { storage.withLock { if $0.fd >= 0 { _ = SystemCalls.close($0.fd) } } }

    /// Its last write handle closed (published or dropped): the descriptor is closed now, so that
    /// a dropped file's blocks are free at once (D-390), whoever still holds this object.
    fileprivate func retire() {
        storage.withLock { storage in
            if storage.fd >= 0 { SystemCalls.close(storage.fd) }
            storage.fd = -1
        }
    }

    /// The staging file's path now (a publish and a later change move it).
    var path: String { storage.withLock { $0.path } }

    /// The staged length.
    public var size: Int64 { lengthNow.withLock { $0 } }

    /// When the bytes or the length last changed; nil when they did not since the copy was made
    /// or since `setModified(nil)`.
    public var modified: ItemTime? { lastChange.withLock { $0 } }

    /// Sets `modified`: now at a change, nil when an explicit mtime replaced it (utimens).
    public func setModified(_ time: ItemTime?) { lastChange.withLock { $0 = time } }

    /// Permission bits held for the next publish (D-385), nil: none.
    public var permissions: UInt16? { heldPermissions.withLock { $0 } }

    func holdPermissions(_ permissions: UInt16) { heldPermissions.withLock { $0 = permissions } }

    /// The held permission bits, for a publish, which clears them.
    func takePermissions() -> UInt16? {
        heldPermissions.withLock { value in
            defer { value = nil }; return value
        }
    }

    /// The item now has `identifier` (a rename at a provider whose identifiers are paths).
    func rename(to identifier: ItemIdentifier) { currentIdentifier.withLock { $0 = identifier } }

    private static func failure(_ error: Errno, _ what: String, _ path: String) -> CacheError {
        // EFBIG: past the cache file system's largest file (truncate(2) and write(2) say so, D-391).
        let code: CacheError.Code =
            error == .noSpace || error.rawValue == EDQUOT ? .noSpace : error == .fileTooLarge ? .tooLarge : .io
        return CacheError(code, "cannot \(what) the staging file \(path): \(error.message)")
    }

    /// Runs `body` with the file to change: when a publish moved the staging file into the
    /// content store, a copy of it becomes the staging file first (on the pool; lock held).
    private func changing<T>(
        _ body: (inout Storage) throws(CacheError) -> T
    ) throws(CacheError) -> T {
        try storage.withLock { (storage: inout Storage) throws(CacheError) -> T in
            try Self.restage(&storage, space: space)
            defer { lengthNow.withLock { [length = storage.length] in $0 = length } }
            return try body(&storage)
        }
    }

    /// A published (moved) staging file is copied back to a new staging file, which the handles
    /// write from now on.
    private static func restage(_ storage: inout Storage, space: StagingSpace) throws(CacheError) {
        guard storage.publishedAs != nil else { return }
        storage.copies += 1
        let path = "\(storage.firstPath)-\(storage.copies)"
        if let refusal = space.refusal(storage.length, fd: storage.fd, "copy the published version into", path) {
            throw refusal
        }
        let fd = SystemCalls.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure(Errno.current, "create", path) }
        if storage.length > 0, let error = copyFile(from: storage.fd, to: fd, size: storage.length) {
            SystemCalls.close(fd)
            SystemCalls.unlink(path)
            throw failure(error, "copy the published version into", path)
        }
        SystemCalls.close(storage.fd)
        storage.fd = fd
        storage.path = path
        storage.publishedAs = nil
        storage.backed = ByteRanges(storage.length > 0 ? [0..<storage.length] : [])
        if storage.discarded { SystemCalls.unlink(path) }
    }

    /// Writes all of `bytes` at `offset`, or none of them: a write that needs new blocks and would
    /// leave less than the reserve free fails with ENOSPC before it writes anything (D-390); an
    /// ENOSPC from the file system itself (someone else filled it) takes back the length it
    /// added. Either way what was written before stays, and nothing published is touched.
    public func write(_ bytes: [UInt8], at offset: Int64) async throws(CacheError) {
        try await pool.run { () throws(CacheError) -> Void in
            try self.changing { (storage: inout Storage) throws(CacheError) -> Void in
                try Self.write(bytes, at: offset, into: &storage, space: self.space)
            }
        }
    }

    /// `write`'s body, with the lock held.
    private static func write(
        _ bytes: [UInt8], at offset: Int64, into storage: inout Storage, space: StagingSpace
    ) throws(CacheError) {
        guard !bytes.isEmpty else { return }
        let range = offset..<(offset + Int64(bytes.count))
        let need = storage.backed.missing(in: range).reduce(Int64(0)) { $0 + Int64($1.count) }
        if let refusal = space.refusal(need, fd: storage.fd, "write", storage.path) { throw refusal }
        let written = bytes.withUnsafeBytes { raw -> Result<Void, Errno> in
            writeFully(storage.fd, from: raw.baseAddress!, count: raw.count, at: offset)
        }
        if case .failure(let error) = written {
            // Bytes that landed past the old end before the failure are not the file's.
            if range.upperBound > storage.length { _ = SystemCalls.ftruncate(storage.fd, off_t(storage.length)) }
            throw failure(error, "write", storage.path)
        }
        storage.backed.insert(range)
        storage.length = max(storage.length, range.upperBound)
    }

    /// `write` on the calling thread (D-387): when the file needs no copy first (not published
    /// since its last change), nobody holds it now (a publish, a write on the pool), and the
    /// bytes end within `limit` (a small file's writes: page-cache I/O, never much dirty data on
    /// a FUSE thread). Nil otherwise, for `write`.
    public func writeNow(_ bytes: [UInt8], at offset: Int64, limit: Int64) -> Result<Void, CacheError>? {
        guard offset >= 0, offset + Int64(bytes.count) <= limit else { return nil }
        let outcome = storage.withLockIfAvailable { storage -> Result<Void, CacheError>? in
            guard storage.publishedAs == nil else { return nil }
            do throws(CacheError) {
                try Self.write(bytes, at: offset, into: &storage, space: space)
            } catch {
                return .failure(error)
            }
            lengthNow.withLock { [length = storage.length] in $0 = length }
            return .success(())
        }
        return outcome ?? nil
    }

    /// Sets the length (zeros past the old end).
    public func truncate(to size: Int64) async throws(CacheError) {
        try await pool.run { () throws(CacheError) -> Void in
            try self.changing { (storage: inout Storage) throws(CacheError) -> Void in
                // (Growing makes a hole: no blocks, nothing to check.)
                guard SystemCalls.ftruncate(storage.fd, off_t(size)) == 0 else {
                    throw Self.failure(Errno.current, "truncate", storage.path)
                }
                storage.length = size
                storage.backed.remove(size..<Int64.max)
            }
        }
    }

    /// fallocate(2) of the staging file: the space for `offset..<offset+length` reserved, so that
    /// writes there cannot fail with ENOSPC; the length grows to its end unless `keepSize`. A
    /// cache file system without fallocate gets the length only (ftruncate).
    public func allocate(offset: Int64, length: Int64, keepSize: Bool) async throws(CacheError) {
        let end = offset + length
        try await pool.run { () throws(CacheError) -> Void in
            try self.changing { (storage: inout Storage) throws(CacheError) -> Void in
                let (fd, path) = (storage.fd, storage.path)
                let grows = !keepSize && end > storage.length
                let need = storage.backed.missing(in: offset..<end).reduce(Int64(0)) { $0 + Int64($1.count) }
                if let refusal = self.space.refusal(need, fd: fd, "allocate space in", path) { throw refusal }
                if SystemCalls.fallocate(fd, keepSize: keepSize, offset: offset, length: length) != 0 {
                    let error = Errno.current
                    guard error.rawValue == EOPNOTSUPP || error.rawValue == ENOSYS else {
                        throw Self.failure(error, "allocate space in", path)
                    }
                    if grows, SystemCalls.ftruncate(fd, off_t(end)) != 0 {
                        throw Self.failure(Errno.current, "extend", path)
                    }
                } else {
                    // Reserved: writes there cannot fail for want of space, nor are they refused.
                    storage.backed.insert(offset..<end)
                }
                if grows { storage.length = max(storage.length, end) }
            }
        }
    }

    /// Up to `count` bytes at `offset` (fewer at the end).
    public func read(offset: Int64, count: Int) async throws(CacheError) -> ReadData {
        let end = min(size, offset + Int64(count))
        guard offset < end else { return ReadData(buffer: AlignedBuffer(capacity: 0), count: 0) }
        let wanted = Int(end - offset)
        return try await pool.run { () throws(CacheError) -> ReadData in
            let buffer = AlignedBuffer(capacity: wanted)
            let outcome = self.storage.withLock { storage in
                buffer.withUnsafeMutableBytes { raw -> Result<Int, CacheError> in
                    var done = 0
                    while done < wanted {
                        let got = SystemCalls.pread(
                            storage.fd, raw.baseAddress! + done, wanted - done, off_t(offset + Int64(done)))
                        if got < 0, errno == EINTR { continue }
                        guard got >= 0 else { return .failure(Self.failure(Errno.current, "read", storage.path)) }
                        if got == 0 { break }
                        done += got
                    }
                    return .success(done)
                }
            }
            return ReadData(buffer: buffer, count: try outcome.get())
        }
    }

    /// Publishes the file: synced through `sync` (nil: not synced, D-381), then renamed to
    /// `target` (a content file from now on; the next change copies it back first). Returns its
    /// length. On the pool.
    fileprivate func moveOut(to target: String, sync: FileSync?) throws(CacheError) -> Int64 {
        try storage.withLock { (storage: inout Storage) throws(CacheError) -> Int64 in
            // Published already and marked changed again by a write that finished before that
            // publish: the same bytes, published again from a copy.
            try Self.restage(&storage, space: space)
            if let sync, let error = sync(storage.fd) { throw Self.failure(error, "sync", storage.path) }
            guard SystemCalls.rename(storage.path, target) == 0 else {
                throw CacheError(.io, "cannot publish \(storage.path): \(Errno.current.message)")
            }
            storage.publishedAs = target
            return storage.length
        }
    }

    /// Undoes `moveOut(to: target)` when its record could not be saved: the file is the staging
    /// file again (or, when a change copied it since, the moved file is deleted).
    fileprivate func moveBack(from target: String) {
        storage.withLock { storage in
            if storage.publishedAs == target, SystemCalls.rename(target, storage.path) == 0 {
                storage.publishedAs = nil
            } else {
                SystemCalls.unlink(target)
            }
        }
    }

    /// Dropped unpublished: the staging file is deleted (its handles keep the descriptor); a
    /// file a publish moved into the content store is not touched.
    fileprivate func discard() {
        storage.withLock { storage in
            storage.discarded = true
            if storage.publishedAs == nil { SystemCalls.unlink(storage.path) }
        }
    }
}

extension ContentStore {
    private var stagingDirectory: String { directory + "/staging" }

    /// An empty file to upload as an empty one (a create made at the provider at once, D-361; an
    /// unborn file's birth, D-386). Made once: a restart's cleanup of staging/ removes it, and a
    /// hop to the pool per create was a measurable part of `tar x`.
    func emptyFile() async throws(CacheError) -> String {
        let directory = stagingDirectory
        let empty = directory + "/empty"
        var info = stat()
        if SystemCalls.stat(empty, &info) == 0 && info.st_size == 0 { return empty }
        try await environment.pool.run { () throws(CacheError) -> Void in
            _ = SystemCalls.mkdir(directory, 0o700)
            let fd = SystemCalls.open(empty, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw CacheError(.io, "cannot create \(empty): \(Errno.current.message)") }
            SystemCalls.close(fd)
        }
        return empty
    }

    /// A new staging file for `identifier`: a copy of `source`'s bytes (every one present: the
    /// caller made sure), or empty when `source` is nil.
    func makeStaging(
        _ identifier: ItemIdentifier, copying source: ContentEntry?, owner: String? = nil
    ) async throws(CacheError) -> StagingFile {
        let number = reserveFileNumber()
        let path = "\(stagingDirectory)/\(number)"
        let directory = stagingDirectory
        let sourceFD = source?.file.fd
        let size = source?.size ?? 0
        let space = StagingSpace(reserve: environment.options.reservedSpace, free: environment.freeSpace)
        let fd = try await environment.pool.run { () throws(CacheError) -> Int32 in
            // (the staging directory is made on first use)
            _ = SystemCalls.mkdir(directory, 0o700)
            if let sourceFD, let refusal = space.refusal(size, fd: sourceFD, "copy into", path) { throw refusal }
            let fd = SystemCalls.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else {
                throw CacheError(.io, "cannot create the staging file \(path): \(Errno.current.message)")
            }
            if let sourceFD, size > 0, let error = copyFile(from: sourceFD, to: fd, size: size) {
                SystemCalls.close(fd)
                SystemCalls.unlink(path)
                throw CacheError(
                    error == .noSpace || error.rawValue == EDQUOT ? .noSpace : .io,
                    "cannot copy into the staging file \(path): \(error.message)")
            }
            return fd
        }
        return StagingFile(
            identifier: identifier, owner: owner, path: path, fd: fd, size: size, pool: environment.pool, space: space)
    }

    /// Deletes a staging file that is not published (its handle keeps the descriptor).
    func discardStaging(_ staging: StagingFile) {
        staging.discard()
    }

    /// The last write handle of `staging` closed: its descriptor is closed now (D-390).
    func retireStaging(_ staging: StagingFile) {
        staging.retire()
    }

    /// Makes the staging file's bytes a complete content record of `version`, durable (synced
    /// unless not `syncing`, D-381; then saved) before it returns, by renaming the staging file into the content store (a
    /// handle that changes it afterwards copies it back first, D-379). The record is stored, not
    /// opened; the catalog then makes it the item's version. On failure nothing is published and
    /// the staging file is as it was.
    func publish(
        _ staging: StagingFile, as version: ContentVersion, syncing: Bool = true
    ) async throws(CacheError) -> ContentRecord {
        let number = reserveFileNumber()
        let target = "\(directory)/content/\(number)"
        // Synced through the cache's seam (`CacheEnvironment.fileSync`), as downloads are.
        let sync = syncing ? environment.fileSync : nil
        let size = try await environment.pool.run { () throws(CacheError) -> Int64 in
            try staging.moveOut(to: target, sync: sync)
        }
        var present = ByteRanges()
        if size > 0 { present.insert(0..<size) }
        let record = ContentRecord(
            identifier: staging.identifier, version: version, size: size, fileNumber: number, present: present)
        if !syncing { unsynced.withLock { _ = $0.insert(number) } }
        do {
            try environment.store.saveContent(record)
        } catch {
            // Not durable: nothing is published.
            staging.moveBack(from: target)
            // A full disk is ENOSPC to the writer whose fsync or close this was, not EIO (D-390).
            let full = (error as? CacheError)?.code == .noSpace
            throw CacheError(
                full ? .noSpace : .io, "cannot save the published version of \(staging.identifier): \(error)")
        }
        addRecord(record)
        return record
    }

    /// fsync(2) through the mount: the content file of (`identifier`, `version`) forced to disk
    /// if a publish left it unsynced (D-381). On the pool.
    func syncIfUnsynced(_ identifier: ItemIdentifier, _ version: ContentVersion) async throws(CacheError) {
        guard let number = fileNumber(of: identifier, version), unsynced.withLock({ $0.contains(number) }) else {
            return
        }
        let path = "\(directory)/content/\(number)"
        let sync = environment.fileSync
        try await environment.pool.run { () throws(CacheError) -> Void in
            let fd = SystemCalls.open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw CacheError(.io, "cannot open \(path) to sync it: \(Errno.current.message)") }
            defer { SystemCalls.close(fd) }
            if let error = sync(fd) { throw CacheError(.io, "cannot sync \(path): \(error.message)") }
        }
        unsynced.withLock { _ = $0.remove(number) }
    }

    /// Whether the content file of (`identifier`, `version`) was published without being synced
    /// and not synced since.
    func isUnsynced(_ identifier: ItemIdentifier, _ version: ContentVersion) -> Bool {
        guard let number = fileNumber(of: identifier, version) else { return false }
        return unsynced.withLock { $0.contains(number) }
    }

    /// The path of the content file of (`identifier`, `version`), if the store has it.
    func contentFilePath(_ identifier: ItemIdentifier, _ version: ContentVersion) -> String? {
        fileNumber(of: identifier, version).map { "\(directory)/content/\($0)" }
    }

    /// Removes staging files left by a crash (nothing was published from them).
    func removeStagingLeftovers() {
        guard let handle = opendir(stagingDirectory) else { return }
        var names: [String] = []
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != ".", name != ".." { names.append(name) }
        }
        closedir(handle)
        for name in names { SystemCalls.unlink(stagingDirectory + "/" + name) }
    }
}

/// Copies `size` bytes from the start of `source` to the start of `target` (pread/pwrite in 1 MiB
/// steps). Nil when done.
func copyFile(from source: Int32, to target: Int32, size: Int64) -> Errno? {
    copyByReading(from: source, to: target, from: 0, size: size)
}

private func copyByReading(from source: Int32, to target: Int32, from start: Int64, size: Int64) -> Errno? {
    let chunk = Int(min(Int64(1 << 20), max(size - start, 1)))
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: chunk, alignment: 4096)
    defer { buffer.deallocate() }
    var position = start
    while position < size {
        let got = SystemCalls.pread(source, buffer, min(chunk, Int(size - position)), off_t(position))
        if got < 0, errno == EINTR { continue }
        if got < 0 { return Errno.current }
        if got == 0 { break }
        if case .failure(let error) = writeFully(target, from: UnsafeRawPointer(buffer), count: got, at: position) {
            return error
        }
        position += Int64(got)
    }
    return nil
}
