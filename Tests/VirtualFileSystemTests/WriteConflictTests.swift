// Conflicts and rebases of the write-back over a real local directory, through the file system's
// operations without the kernel (seconds, where the mount tests and scenarios take half a minute):
// an edit whose source file changes meanwhile is kept as a conflict copy beside the source's
// version (SEMANTICS "Conflicts", D-362); the mount's own utimens during an edit is no conflict
// (D-375: the queued upload's base, and an open edit's, follow the version it made).

import Foundation
import ProviderCache
import ProviderFSCommands
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A writable file system over `source` (LocalDirectoryProvider, as `providerfs mount` composes
/// it) with upload faults from `faults` and the write-back's retries on `clock`.
private func localFileSystem(
    _ source: TemporaryDirectory, _ cache: TemporaryDirectory, faults: FaultPlan, clock: ManualClock
) throws -> ProviderFileSystem {
    var options = FileSystemOptions()
    options.writable = true
    return try MountComposition.makeFileSystem(
        source: source.path, cacheDirectory: cache.path, options: options, faults: faults, clock: clock)
}

/// Opens `name` in the root with `flags`, writes `bytes` at `offset`, flushes and releases (a
/// `close(2)` that publishes).
private func edit(
    _ fileSystem: ProviderFileSystem, _ name: String, flags: Int32, _ bytes: String, at offset: Int64 = 0
) async throws {
    let inode = try await fileSystem.lookup(parent: .root, name: name, context: .kernel).inode
    let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: flags), context: .kernel)
    _ = try await fileSystem.write(
        inode, handle: opened.handle, offset: offset, data: Array(bytes.utf8), context: .kernel)
    try await fileSystem.flush(inode, handle: opened.handle, context: .kernel)
    await fileSystem.release(inode, handle: opened.handle)
}

/// The source's file `name` as text (nil: missing).
private func sourceText(_ source: TemporaryDirectory, _ name: String) -> String? {
    (try? Data(contentsOf: URL(fileURLWithPath: source.path + "/" + name))).map { String(decoding: $0, as: UTF8.self) }
}

/// Names in the source directory that are conflict copies.
private func conflictCopies(_ source: TemporaryDirectory) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: source.path)) ?? []).filter { $0.contains("(conflict ") }
        .sorted()
}

/// Waits (real time, bounded) until `identifier` has nothing left to upload, moving the manual
/// clock on so that retries come due.
private func uploaded(_ fileSystem: ProviderFileSystem, _ identifier: ItemIdentifier, clock: ManualClock) async -> Bool
{
    let deadline = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < deadline {
        if fileSystem.cache.writes.uploadRecord(of: identifier)?.isPending == false { return true }
        clock.advance(by: .seconds(1))
        try? await Task.sleep(for: .milliseconds(2))
    }
    return false
}

private func readText(_ fileSystem: ProviderFileSystem, _ name: String) async throws -> String {
    let inode = try await fileSystem.lookup(parent: .root, name: name, context: .kernel).inode
    return String(decoding: try await readAll(fileSystem, inode), as: UTF8.self)
}

@Suite("Write-back conflicts and rebases over a local directory", .timeLimit(.minutes(3)))
struct WriteConflictTests {
    /// An edit open while the source file is rewritten: its upload carries the version it started
    /// from, the local provider refuses it, and both are kept — the source's bytes under the
    /// name, the edit as "notes (conflict …).txt", named by `user.providerfs.conflict`. An upload
    /// sent without its base version replaces the source's bytes instead.
    @Test func anEditWhoseSourceChangedIsKeptAsAConflictCopy() async throws {
        let source = try TemporaryDirectory(prefix: "providerfs-conflict-source")
        let cache = try TemporaryDirectory(prefix: "providerfs-conflict-cache")
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("notes.txt", Array("base\n".utf8))
        let clock = ManualClock()
        let fileSystem = try localFileSystem(source, cache, faults: FaultPlan(), clock: clock)
        let notes = try await fileSystem.lookup(parent: .root, name: "notes.txt", context: .kernel).inode
        let writer = try await fileSystem.open(
            notes, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
        // Someone else rewrites the source while the edit is open.
        try source.write("notes.txt", Array("theirs, longer\n".utf8))
        _ = try await fileSystem.write(
            notes, handle: writer.handle, offset: 0, data: Array("ours\n".utf8), context: .kernel)
        try await fileSystem.flush(notes, handle: writer.handle, context: .kernel)
        await fileSystem.release(notes, handle: writer.handle)
        let identifier = ItemIdentifier("notes.txt")
        #expect(await uploaded(fileSystem, identifier, clock: clock))
        let record = fileSystem.cache.writes.uploadRecord(of: identifier)
        #expect(sourceText(source, "notes.txt") == "theirs, longer\n", "the source's version stays under the name")
        let copies = conflictCopies(source)
        #expect(copies.count == 1, "\(copies)")
        let copy = try #require(copies.first)
        #expect(copy.hasPrefix("notes (conflict ") && copy.hasSuffix(").txt"), "\(copy)")
        #expect(sourceText(source, copy) == "ours\n")
        #expect(record?.conflictName == copy)
        // Through the file system: the name serves the source's version, the copy the edit.
        #expect(try await readText(fileSystem, "notes.txt") == "theirs, longer\n")
        #expect(try await readText(fileSystem, copy) == "ours\n")
        #expect(try await xattr(fileSystem, notes, "user.providerfs.conflict") == copy)
        await fileSystem.shutdown()
    }

    /// D-375: utimens through the mount moves the local provider's version (it includes the
    /// mtime). A queued upload (its first attempt failed; it waits for its retry) and an edit
    /// open with nothing written yet both started from the version before; the utimens rebases
    /// them, so each uploads without a conflict copy, carrying the time that was set.
    @Test func utimensRebasesTheQueuedUploadAndAnOpenEdit() async throws {
        let source = try TemporaryDirectory(prefix: "providerfs-rebase-source")
        let cache = try TemporaryDirectory(prefix: "providerfs-rebase-cache")
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("queued", Array("old\n".utf8))
        try source.write("open", Array("old\n".utf8))
        let clock = ManualClock()
        let faults = FaultPlan()
        let fileSystem = try localFileSystem(source, cache, faults: faults, clock: clock)
        let time = Timestamp(seconds: 1_000_000_500, nanoseconds: 0)

        // The queued upload: published at close, its upload failing until the rule is cleared.
        faults.add(
            FaultRule(identifier: ItemIdentifier("queued"), fault: .failAfter(offset: 0, errno: EIO), on: .upload))
        try await edit(fileSystem, "queued", flags: O_WRONLY | O_TRUNC, "edit\n")
        let deadline = ContinuousClock.now + .seconds(10)
        while fileSystem.cache.writes.uploadRecord(of: ItemIdentifier("queued"))?.phase != .error,
            ContinuousClock.now < deadline
        {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(fileSystem.cache.writes.uploadRecord(of: ItemIdentifier("queued"))?.phase == .error)
        let queued = try await fileSystem.lookup(parent: .root, name: "queued", context: .kernel).inode
        _ = try await fileSystem.setAttributes(
            queued, changes: AttributeChanges(modificationTime: time), handle: nil, context: .kernel)
        #expect(sourceText(source, "queued") == "old\n", "the utimens reached the source, not the edit")

        // The open edit: open with nothing written (so the utimens is not held by it, D-385 but
        // goes to the provider), then written and closed after the utimens.
        let open = try await fileSystem.lookup(parent: .root, name: "open", context: .kernel).inode
        let writer = try await fileSystem.open(open, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.setAttributes(
            open, changes: AttributeChanges(modificationTime: time), handle: nil, context: .kernel)
        _ = try await fileSystem.write(
            open, handle: writer.handle, offset: 4, data: Array("more\n".utf8), context: .kernel)
        try await fileSystem.flush(open, handle: writer.handle, context: .kernel)
        await fileSystem.release(open, handle: writer.handle)

        _ = faults.clear()
        #expect(await uploaded(fileSystem, ItemIdentifier("queued"), clock: clock))
        #expect(await uploaded(fileSystem, ItemIdentifier("open"), clock: clock))
        #expect(conflictCopies(source).isEmpty, "\(conflictCopies(source))")
        #expect(sourceText(source, "queued") == "edit\n")
        #expect(sourceText(source, "open") == "old\nmore\n")
        for name in ["queued", "open"] {
            #expect(fileSystem.cache.writes.uploadRecord(of: ItemIdentifier(name))?.conflictName == nil, "\(name)")
        }
        // The queued upload carries the mtime the utimens set (D-375), not its publish's.
        let modified = try FileManager.default.attributesOfItem(atPath: source.path + "/queued")[.modificationDate]
        #expect((modified as? Date)?.timeIntervalSince1970 == 1_000_000_500)
        await fileSystem.shutdown()
    }
}
