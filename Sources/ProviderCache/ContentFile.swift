// One sparse cache file. Blocking calls run on the BlockingIOPool, never on the cooperative pool.

import ProviderModel
public import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How a cache file's written bytes are made durable: a content file's before its range map is
/// saved, a staging file's before a publish renames it into the content store, a file published
/// unsynced at fsync (D-381). Given the file's descriptor, nil when they are, else the error.
/// `fileDataSync` (fdatasync) in production; tests inject one to record the sync points or to
/// fail them (`ProviderCache.init(fileSync:)`). Called on a `BlockingIOPool` thread.
public typealias FileSync = @Sendable (_ descriptor: Int32) -> Errno?

/// fdatasync, retried on EINTR.
public let fileDataSync: FileSync = { descriptor in
    SystemCalls.fdatasync(descriptor) == 0 ? nil : Errno.current
}

/// Bytes free for an unprivileged writer on the file system of a descriptor (fstatvfs: blocks
/// available times the fragment size); nil when it cannot be told. `fileSystemFreeSpace` in
/// production; tests inject one to make the cache's disk full without filling one
/// (`ProviderCache.init(freeSpace:)`). Called on the thread that writes a staging file.
public typealias FreeSpace = @Sendable (_ descriptor: Int32) -> Int64?

/// fstatvfs(2): `f_bavail * f_frsize`.
public let fileSystemFreeSpace: FreeSpace = { descriptor in
    var space = statvfs()
    guard fstatvfs(descriptor, &space) == 0 else { return nil }
    return Int64(space.f_bavail) * Int64(space.f_frsize)
}

/// A sparse file holding (some of) the bytes of one content version, at their own offsets.
final class ContentFile: MappedFileRanges {
    let path: String
    let fd: Int32
    /// The file's length (set at open: a placeholder's file is sparse up to it).
    let size: Int64
    let pool: BlockingIOPool
    /// Makes the written bytes durable (`sync()`).
    let syncData: FileSync

    /// Opens (creating if needed) the file and sets its length to `size`, so unfetched parts are
    /// holes that use no disk space.
    init(path: String, size: Int64, pool: BlockingIOPool, sync: @escaping FileSync = fileDataSync) throws(CacheError) {
        let fd = SystemCalls.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw CacheError(.io, "cannot open cache file \(path): \(Errno.current.message)")
        }
        var info = stat()
        if SystemCalls.fstat(fd, &info) == 0, info.st_size != size, SystemCalls.ftruncate(fd, off_t(size)) != 0 {
            let error = Errno.current
            SystemCalls.close(fd)
            throw CacheError(error == .noSpace ? .noSpace : .io, "cannot size cache file \(path): \(error.message)")
        }
        self.path = path
        self.fd = fd
        self.size = size
        self.pool = pool
        self.syncData = sync
    }

    /// The whole file mapped read-only (address bits; 0: not mapped yet), made at the first
    /// `mappedBytes` and kept until the file is closed. `mapFailed` once mmap refused.
    private let mapping = Locked<(address: UInt, length: Int, mapFailed: Bool)>((0, 0, false))

    deinit {
        let (address, length, _) = mapping.withLock { $0 }
        if address != 0 { munmap(UnsafeMutableRawPointer(bitPattern: address), length) }
        SystemCalls.close(fd)
    }

    /// Writes all of `bytes` at `offset`. Returns once `pwrite` has returned for every byte.
    /// A chunk of zeros over a region that is still a hole is not written (the hole already reads
    /// as zeros and uses no disk), so a sparse source such as the demo's 1 GiB file stays sparse.
    func write(_ bytes: [UInt8], at offset: Int64) async throws(CacheError) {
        let fd = self.fd
        let path = self.path
        try await pool.run { () throws(CacheError) -> Void in
            if bytes.count >= 4096, bytes.allSatisfy({ $0 == 0 }),
                (nextData(in: fd, at: offset) ?? .max) >= offset + Int64(bytes.count)
            {
                return
            }
            let written = bytes.withUnsafeBytes { writeFully(fd, from: $0.baseAddress!, count: $0.count, at: offset) }
            if case .failure(let error) = written {
                throw CacheError(
                    error == .noSpace ? .noSpace : .io, "cannot write cache file \(path): \(error.message)")
            }
        }
    }

    /// `count` bytes at `offset`, to be copied (or spliced) from the file by whoever sends them;
    /// the value keeps this file open. Only for ranges that are present (they never change).
    func range(at offset: Int64, count: Int) -> ReadData {
        ReadData(descriptor: fd, offset: offset, count: count, owner: self)
    }

    /// The present bytes of `offset..<offset+count` as mapped memory (see `MappedFileRanges`).
    func mappedBytes(at offset: Int64, count: Int) -> UnsafeRawPointer? {
        guard offset >= 0, count >= 0 else { return nil }
        let fd = self.fd
        let size = Int(self.size)
        let (address, length) = mapping.withLock { mapping -> (UInt, Int) in
            if mapping.address == 0 && !mapping.mapFailed {
                if size > 0, let base = mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0), base != MAP_FAILED {
                    mapping.address = UInt(bitPattern: base)
                    mapping.length = size
                } else {
                    mapping.mapFailed = true
                }
            }
            return (mapping.address, mapping.length)
        }
        guard address != 0, offset + Int64(count) <= Int64(length) else { return nil }
        return UnsafeRawPointer(bitPattern: address + UInt(offset))
    }

    /// How a failed direct transfer into this file reads: a full disk or quota is ours (ENOSPC,
    /// never retried as a provider fault); anything else is the provider's.
    func transferFailure(_ error: any Error) -> CacheError {
        if let failure = error as? ProviderError, let code = failure.errno, code == ENOSPC || code == EDQUOT {
            return CacheError(.noSpace, "cannot write cache file \(path): \(Errno(code).message)")
        }
        return CacheError.from(error)
    }

    /// `fdatasync` (through `syncData`): the bytes written so far survive a power cut (run before
    /// persisting ranges).
    func sync() async throws(CacheError) {
        let fd = self.fd
        let path = self.path
        let syncData = self.syncData
        try await pool.run { () throws(CacheError) -> Void in
            if let error = syncData(fd) {
                throw CacheError(.io, "cannot sync cache file \(path): \(error.message)")
            }
        }
    }

    /// Disk space actually used (for `st_blocks`), in 512-byte blocks.
    var allocatedBlocks: Int64 {
        var info = stat()
        guard SystemCalls.fstat(fd, &info) == 0 else { return 0 }
        return Int64(info.st_blocks)
    }
}

/// The shared state of one `withDeadline` race: whoever finishes first resumes the caller.
final class DeadlineRace<T: Sendable>: @unchecked Sendable {
    // Safe: every field is only touched while `lock` is held.
    let lock = Lock()
    var continuation: CheckedContinuation<Void, Never>?
    var tasks: [Task<Void, Never>] = []
    /// The winner's result. Handed over under `lock` rather than through the continuation, so
    /// ThreadSanitizer sees the happens-before (see BlockingIOPool.run).
    var result: Result<T, any Error>?

    func finish(_ result: Result<T, any Error>) {
        let (continuation, tasks) = lock.withLock { () -> (CheckedContinuation<Void, Never>?, [Task<Void, Never>]) in
            guard self.result == nil else { return (nil, []) }
            self.result = result
            let pending = (self.continuation, self.tasks)
            self.continuation = nil
            self.tasks = []
            return pending
        }
        for task in tasks { task.cancel() }
        continuation?.resume()
    }

    var outcome: Result<T, any Error> { lock.withLock { result! } }
}

/// Races `operation` against a deadline on the cache's timeline. The loser is cancelled; a
/// result is returned without waiting for an operation that ignores cancellation (a hung
/// provider call cannot hold the downloader past its deadline).
func withDeadline<T: Sendable>(
    _ timeout: Duration, on timeline: Timeline, _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let race = DeadlineRace<T>()
    await withTaskCancellationHandler {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let alreadyFinished = race.lock.withLock { () -> Bool in
                if race.result != nil { return true }
                race.continuation = continuation
                return false
            }
            if alreadyFinished {
                continuation.resume()
                return
            }
            let work = Task {
                do { race.finish(.success(try await operation())) } catch { race.finish(.failure(error)) }
            }
            let timer = Task {
                do {
                    try await timeline.sleep(for: timeout)
                    race.finish(
                        .failure(CacheError(.timedOut, "no data from the provider for \(timeout.humanReadable)")))
                } catch {}
            }
            let finished = race.lock.withLock { () -> Bool in
                if race.result != nil { return true }
                race.tasks = [work, timer]
                return false
            }
            if finished {
                work.cancel()
                timer.cancel()
            }
        }
    } onCancel: {
        race.finish(.failure(CancellationError()))
    }
    return try race.outcome.get()
}
