// Processes that must not download (issue 27, D-433): an open for reading of a file not all here
// asks the policy; a refused caller gets EDEADLK and nothing is fetched; stat works for it, and
// once the file is downloaded (by anyone) it opens for it too. The fast open asks the policy as
// the async one does (D-523).

import Foundation
import ProviderCache
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// Refuses the thread `refused`.
struct RefusingThread: DownloadPolicy {
    let refused: Int32
    func refusal(_ context: RequestContext) -> String? {
        context.threadID == refused ? "indexer (pid \(refused)) is a process that must not download" : nil
    }
}

@Suite struct DownloadPolicyTests {
    @Test("a refused caller: EDEADLK for a placeholder, nothing fetched, stat works; a downloaded file opens for it")
    func refusedCaller() async throws {
        var options = VFSFixture.defaultOptions()
        options.downloads = RefusingThread(refused: 4242)
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("doc.pdf", .ramp(seed: 3, size: 100_000))
        fixture.provider.answersImmediately = true  // the open's revalidation, at once (D-229)
        let fileSystem = try fixture.makeFileSystem()
        let indexer = RequestContext(threadID: 4242, uid: getuid(), gid: getgid())
        let user = RequestContext(threadID: 1, uid: getuid(), gid: getgid())
        let entry = try await fileSystem.lookup(parent: .root, name: "doc.pdf", context: indexer)
        #expect(try await fileSystem.getAttributes(entry.inode, context: indexer).size == 100_000)
        let flags = OpenFlags(rawValue: O_RDONLY)
        // The fast open refuses it as the async one does (D-523).
        guard case .failure(let refusedNow)? = fileSystem.openNow(entry.inode, flags: flags, context: indexer) else {
            Issue.record("the fast open did not refuse the indexer")
            return
        }
        #expect(refusedNow.errno == .deadlock)
        var message = ""
        do {
            _ = try await fileSystem.open(entry.inode, flags: flags, context: indexer)
        } catch {
            #expect(error.errno == .deadlock)
            message = error.message
        }
        #expect(message.contains("indexer (pid 4242)"), "\(message)")
        #expect(fixture.provider.counters.fetchCalls == 0, "nothing fetched")

        let opened = try await fileSystem.open(entry.inode, flags: flags, context: user)
        let data = try await fileSystem.read(
            entry.inode, handle: opened.handle, offset: 0, count: 100_000, context: user)
        #expect(data.count == 100_000)
        await fileSystem.release(entry.inode, handle: opened.handle)
        let cached = try await fixture.cacheEntryMaterialized(fileSystem, "doc.pdf")
        #expect(cached)
        let again = try await fileSystem.open(entry.inode, flags: flags, context: indexer)
        await fileSystem.release(entry.inode, handle: again.handle)
        await fileSystem.shutdown()
    }

    @Test("the fast open of a placeholder asks the policy and opens for a caller it lets through (D-523)")
    func fastOpenOfPlaceholderWithPolicy() async throws {
        var options = VFSFixture.defaultOptions()
        options.downloads = RefusingThread(refused: 4242)
        let fixture = try VFSFixture(options: options)
        fixture.provider.putFile("doc.pdf", .ramp(seed: 5, size: 10_000))
        fixture.provider.answersImmediately = true  // the open's revalidation, at once (D-229)
        let fileSystem = try fixture.makeFileSystem()
        let user = RequestContext(threadID: 1, uid: getuid(), gid: getgid())
        let entry = try await fileSystem.lookup(parent: .root, name: "doc.pdf", context: user)
        // On the FUSE thread: no task, no second claim or revalidation in the async open.
        guard
            case .success(let opened)? = fileSystem.openNow(
                entry.inode, flags: OpenFlags(rawValue: O_RDONLY), context: user)
        else {
            Issue.record("the fast open left a placeholder's open to the async one")
            return
        }
        let data = try await fileSystem.read(
            entry.inode, handle: opened.handle, offset: 0, count: 10_000, context: user)
        #expect(data.count == 10_000)
        #expect(fixture.provider.counters.fetchCalls == 1)
        await fileSystem.release(entry.inode, handle: opened.handle)
        await fileSystem.shutdown()
    }
}

extension VFSFixture {
    /// Waits (bounded) until every byte of `name` is in the cache.
    func cacheEntryMaterialized(_ fileSystem: ProviderFileSystem, _ name: String) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if fileSystem.cache.status(of: ItemIdentifier(name))?.state == .materialized { return true }
            try await Task.sleep(for: .milliseconds(2))
        }
        return false
    }
}
