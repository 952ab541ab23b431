// A source file rewritten in place, with the same size, between a read and the version check that
// follows it. The read's bytes may be a mix of the two versions (a rewrite racing the read), so
// they must never be delivered: the stream fails with .versionChanged. The race is made certain
// with the stream's test hook, which runs between each read (or copy step) and its check; the
// rewrite is done on the read that reaches the end of the range, where no later check would catch
// it. Before the stream is opened the file's mtime is set far into the past, so the rewrite
// changes the version whatever the file system's timestamp granularity. (A rewrite that also
// restores the mtime keeps size, mtime and inode, the whole version: nothing on the stream can
// tell it apart, and no test here pretends otherwise.)

import LocalProvider
import ProviderModel
import SystemSupport
import TestSupport
import Testing

@testable import LocalProvider

#if canImport(Glibc)
import Glibc
#endif

@Suite("LocalDirectoryProvider: a same-size rewrite between a read and its check", .timeLimit(.minutes(3)))
struct SameSizeRewriteTests {
    struct Source {
        let root: TemporaryDirectory
        let path: String
        let provider: LocalDirectoryProvider
        let item: ProviderItem
        let original: [UInt8]
        let rewritten: [UInt8]
    }

    /// A file of `size` bytes whose mtime lies in 2001, and the bytes a same-size rewrite puts in.
    func source(size: Int) async throws -> Source {
        let root = try TemporaryDirectory()
        let original = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        let rewritten = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        try root.write("f", original)
        let path = root.path + "/f"
        var past = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, path, &past, 0) == 0)
        let provider = LocalDirectoryProvider(root: root.path)
        let item = try await provider.item(for: ItemIdentifier("f"))
        return Source(
            root: root, path: path, provider: provider, item: item, original: original, rewritten: rewritten)
    }

    /// Rewrites the file in place (same inode, same size), once.
    static func rewriteOnce(_ path: String, _ bytes: [UInt8], done: Locked<Bool>) -> @Sendable () -> Void {
        {
            guard
                !done.withLock({ done in
                    defer { done = true }; return done
                })
            else { return }
            let fd = open(path, O_WRONLY)
            precondition(fd >= 0, "open \(path): \(Errno.current)")
            let written = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
            precondition(written == bytes.count, "rewrite of \(path) was short")
            close(fd)
        }
    }

    func openStream(_ source: Source) async throws -> LocalContentStream {
        let stream = try await source.provider.fetchContents(
            of: source.item.identifier, version: source.item.contentVersion, range: 0..<source.item.size)
        return try #require(stream as? LocalContentStream)
    }

    @Test("next: the read that a same-size rewrite follows is refused as a version change")
    func nextRefusesTheRead() async throws {
        let source = try await source(size: 100_000)
        defer { source.root.remove() }
        let stream = try await openStream(source)
        defer { stream.close() }
        let rewritten = Locked(false)
        stream.setAfterReadBeforeCheck(Self.rewriteOnce(source.path, source.rewritten, done: rewritten))
        do {
            let chunk = try await stream.next(maximumLength: 100_000)
            Issue.record("a read followed by a rewrite was delivered: \(chunk?.count ?? 0) bytes")
        } catch let error as ProviderError {
            #expect(error.code == .versionChanged, "\(error)")
        }
        #expect(rewritten.value, "the hook ran")
        // Nothing more of the old version either.
        await #expect(throws: ProviderError.self) { _ = try await stream.next(maximumLength: 100_000) }
        #expect(
            try await source.provider.item(for: source.item.identifier).contentVersion != source.item.contentVersion)
    }

    @Test(
        "transfer: the copy step that a same-size rewrite follows is refused as a version change, nothing delivered",
        arguments: [100_000, 1 << 20])
    func transferRefusesTheStep(size: Int) async throws {
        // 100,000 bytes are copied through the stream's buffer, 1 MiB from a mapping of the source.
        let source = try await source(size: size)
        defer { source.root.remove() }
        let destination = open(source.root.path + "/copy", O_RDWR | O_CREAT, 0o600)
        defer { close(destination) }
        let stream = try await openStream(source)
        defer { stream.close() }
        let rewritten = Locked(false)
        stream.setAfterReadBeforeCheck(Self.rewriteOnce(source.path, source.rewritten, done: rewritten))
        let delivered = Locked(0)
        do {
            let placed = try await stream.transfer(
                to: destination, at: 0, firstStep: size, step: size, maximumLength: size,
                delivered: { count in
                    delivered.withLock { $0 += count }
                    return true
                })
            Issue.record("a copy followed by a rewrite was used: \(placed ?? 0) bytes placed")
        } catch let error as ProviderError {
            #expect(error.code == .versionChanged, "\(error)")
        }
        #expect(rewritten.value, "the hook ran")
        #expect(delivered.value == 0, "no byte of the copy was delivered")
    }
}
