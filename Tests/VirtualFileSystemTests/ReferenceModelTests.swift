// Reference-model test of VirtualFileSystem + ProviderCache without FUSE (mountpoint-s3 reftests):
// seeded random sequences of lookups, readdirs, getattrs, opens, reads at random offsets and
// closes, interleaved with remote changes to the source (add, remove, modify, transient faults).
// The provider's namespace is the model: after a remote change the clock passes every TTL, so
// from then on the file system must show exactly the provider's state. Reads through handles
// opened before a change must return the bytes of the version they pinned (when they are local),
// or exactly the errno SEMANTICS names: ESTALE when the item has another version now, EIO when it
// was deleted — never bytes of another version. Only an item changed and then deleted while the
// handle was open may give either (whichever of the two the cache learned of first).
//
// Replay: PROVIDERFS_TEST_SEED=<seed> swift test --filter ReferenceModelTests
// Size:   PROVIDERFS_MODEL_SEQUENCES (default 12), PROVIDERFS_MODEL_OPERATIONS (default 80).

import ProviderCache
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

@Suite("Reference model")
struct ReferenceModelTests {
    @Test("random operations and remote changes agree with the provider's namespace")
    func randomSequences() async throws {
        let baseSeed = SeededRandom.seedFromEnvironment()
        let sequences = environmentInteger("PROVIDERFS_MODEL_SEQUENCES", default: 12)
        let operations = environmentInteger("PROVIDERFS_MODEL_OPERATIONS", default: 80)
        for index in 0..<sequences {
            let seed = baseSeed &+ UInt64(index)
            var run = try ModelRun(seed: seed)
            let failure = await run.execute(operations: operations)
            await run.finish()
            if let failure {
                Issue.record(
                    """
                    reference model mismatch: \(failure)
                    seed \(seed) (replay with PROVIDERFS_TEST_SEED=\(seed) PROVIDERFS_MODEL_SEQUENCES=1)
                    operations:
                    \(run.log.enumerated().map { "  \($0.offset): \($0.element)" }.joined(separator: "\n"))
                    """)
                return
            }
        }
    }
}

/// One open handle and what it must read.
private struct OpenHandle {
    var path: String
    var inode: InodeNumber
    var handle: FileHandleID
    var content: InMemoryContent
    var version: ContentVersion
    /// The item got another version while the handle was open (before any deletion).
    var changedWhileOpen = false
}

private struct ModelRun {
    let fixture: VFSFixture
    let fileSystem: ProviderFileSystem
    var random: SeededRandom
    var log: [String] = []
    var handles: [OpenHandle] = []
    var nextName = 0
    var nextSeed: UInt64 = 1000

    init(seed: UInt64) throws {
        var options = VFSFixture.defaultOptions()
        options.cache.chunkSize = 16 << 10
        options.cache.firstChunkSize = 16 << 10
        options.cache.readAheadWindow = 64 << 10
        options.cache.stallTimeout = .seconds(3600)
        options.cache.maximumAttempts = 3
        fixture = try VFSFixture(options: options)
        fileSystem = try fixture.makeFileSystem()
        // Revalidation at open is answered at once, as a local directory's is.
        fixture.provider.answersImmediately = true
        random = SeededRandom(seed: seed)
        // A starting tree.
        fixture.provider.addDirectory("d0")
        fixture.provider.addDirectory("d0/d1")
        fixture.provider.putFile("f0", .ramp(seed: 1, size: 100_000))
        fixture.provider.putFile("d0/f1", .ramp(seed: 2, size: 5000))
        fixture.provider.putFile("d0/d1/f2", .ramp(seed: 3, size: 0))
    }

    // MARK: The model: the provider's namespace

    var items: [ProviderItem] { fixture.provider.allItems.filter { $0.identifier != .root } }
    var files: [ProviderItem] { items.filter { $0.kind == .file }.sorted { $0.identifier < $1.identifier } }
    var directories: [ProviderItem] {
        [ProviderItem.rootPlaceholder] + items.filter { $0.kind == .directory }.sorted { $0.identifier < $1.identifier }
    }

    func children(of directory: ItemIdentifier) -> [String] {
        items.filter { $0.parent == directory }.map(\.name).sorted()
    }

    mutating func pick<T>(_ values: [T]) -> T? {
        values.isEmpty ? nil : values[Int.random(in: 0..<values.count, using: &random)]
    }

    // MARK: Driving

    mutating func execute(operations: Int) async -> String? {
        for _ in 0..<operations {
            let choice = Int.random(in: 0..<100, using: &random)
            let failure: String?
            switch choice {
            case 0..<15: failure = await lookupExisting()
            case 15..<20: failure = await lookupMissing()
            case 20..<32: failure = await readDirectory()
            case 32..<40: failure = await getAttributes()
            case 40..<50: failure = await openFile()
            case 50..<72: failure = await readHandle()
            case 72..<78: failure = await closeHandle()
            case 78..<84: failure = remoteAdd()
            case 84..<89: failure = remoteModify()
            case 89..<93: failure = remoteRemove()
            case 93..<96: failure = remoteAddDirectory()
            default: failure = transientFault()
            }
            if let failure { return failure }
        }
        // Every handle still reads correctly or fails as allowed, then closes.
        while !handles.isEmpty {
            if let failure = await readHandle() { return failure }
            if let failure = await closeHandle() { return failure }
        }
        return nil
    }

    func finish() async {
        await fileSystem.shutdown()
    }

    /// Walks `path` with lookups from the root, as the kernel and the adapter would: the fast
    /// path first, the async lookup when it declines.
    func resolvePath(_ path: String) async throws(FileSystemError) -> Entry? {
        var inode = InodeNumber.root
        var entry: Entry?
        for component in path.split(separator: "/") {
            if let now = fileSystem.lookupNow(parent: inode, name: String(component), context: .kernel) {
                entry = try now.get()
            } else {
                entry = try await fileSystem.lookup(parent: inode, name: String(component), context: .kernel)
            }
            inode = entry!.inode
        }
        return entry
    }

    static func describe(_ item: ProviderItem) -> String { item.identifier.rawValue }

    func check(_ entry: Entry, against item: ProviderItem) -> String? {
        let type: NodeType = item.kind == .directory ? .directory : .regular
        if entry.attributes.type != type {
            return "\(item.identifier): type \(entry.attributes.type), expected \(type)"
        }
        if item.kind == .file && entry.attributes.size != item.size {
            return "\(item.identifier): size \(entry.attributes.size), expected \(item.size)"
        }
        if entry.attributes.modificationTime.seconds != item.modificationTime.seconds {
            return "\(item.identifier): mtime differs"
        }
        return nil
    }

    mutating func lookupExisting() async -> String? {
        guard let item = pick(items) else { return nil }
        log.append("lookup \(item.identifier)")
        do {
            guard let entry = try await resolvePath(item.identifier.rawValue) else { return "no entry" }
            return check(entry, against: item)
        } catch {
            return "lookup \(item.identifier) failed: \(error)"
        }
    }

    mutating func lookupMissing() async -> String? {
        guard let directory = pick(directories) else { return nil }
        let name = "missing\(Int.random(in: 0..<5, using: &random))"
        if children(of: directory.identifier).contains(name) { return nil }
        let path = directory.identifier == .root ? name : directory.identifier.rawValue + "/" + name
        log.append("lookup-missing \(path)")
        do {
            _ = try await resolvePath(path)
            return "lookup of missing \(path) succeeded"
        } catch {
            return error.errno == .noSuchFileOrDirectory ? nil : "lookup of missing \(path): \(error)"
        }
    }

    mutating func readDirectory() async -> String? {
        guard let directory = pick(directories) else { return nil }
        let limit = Int.random(in: 1...6, using: &random)
        log.append("readdir \(directory.identifier.description) limit \(limit)")
        do {
            let inode = try await resolvePath(directory.identifier.rawValue)?.inode ?? .root
            let names = try await listAll(fileSystem, inode, limit: limit).map(\.name)
            let expected = [".", ".."] + children(of: directory.identifier)
            return names == expected ? nil : "readdir \(directory.identifier): \(names), expected \(expected)"
        } catch {
            return "readdir \(directory.identifier) failed: \(error)"
        }
    }

    mutating func getAttributes() async -> String? {
        guard let item = pick(items) else { return nil }
        log.append("getattr \(item.identifier)")
        do {
            guard let entry = try await resolvePath(item.identifier.rawValue) else { return nil }
            let attributes =
                if let now = fileSystem.getAttributesNow(entry.inode, context: .kernel) {
                    try now.get()
                } else {
                    try await fileSystem.getAttributes(entry.inode, context: .kernel)
                }
            return check(
                Entry(attributes: attributes, generation: 0, attributeTimeout: .zero, entryTimeout: .zero),
                against: item)
        } catch {
            return "getattr \(item.identifier) failed: \(error)"
        }
    }

    mutating func openFile() async -> String? {
        guard let item = pick(files), let (content, version) = fixture.provider.content(of: item.identifier.rawValue)
        else { return nil }
        log.append("open \(item.identifier)")
        do {
            guard let entry = try await resolvePath(item.identifier.rawValue) else { return "no entry" }
            // Two opens in three go the adapter's way: the fast path first (D-229), the async
            // open when it declines; the third goes straight to the async open.
            let flags = OpenFlags(rawValue: O_RDONLY)
            let opened =
                if random.next() % 3 != 0, let now = fileSystem.openNow(entry.inode, flags: flags, context: .kernel) {
                    try { () throws(FileSystemError) -> OpenedFile in
                        log[log.count - 1] += " (answered now)"
                        return try now.get()
                    }()
                } else {
                    try await fileSystem.open(entry.inode, flags: flags, context: .kernel)
                }
            handles.append(
                OpenHandle(
                    path: item.identifier.rawValue, inode: entry.inode, handle: opened.handle, content: content,
                    version: version))
            return nil
        } catch {
            return "open \(item.identifier) failed: \(error)"
        }
    }

    mutating func readHandle() async -> String? {
        guard !handles.isEmpty else { return nil }
        let handle = handles[Int.random(in: 0..<handles.count, using: &random)]
        let size = handle.content.size
        let offset = Int64.random(in: 0...(size + 100), using: &random)
        let count = Int.random(in: 0...40_000, using: &random)
        log.append("read \(handle.path) \(handle.handle) @\(offset) +\(count)")
        let current = fixture.provider.content(of: handle.path)?.1
        let unchanged = current == handle.version
        // What SEMANTICS' errno contract allows for a read that needs bytes it does not have.
        let allowed: [Errno]
        if unchanged {
            allowed = []
        } else if current != nil {
            allowed = [.stale]
        } else if handle.changedWhileOpen {
            allowed = [.stale, .ioError]
        } else {
            allowed = [.ioError]
        }
        let end = min(size, offset + Int64(count))
        let expected = offset < end ? handle.content.slice(offset..<end) : []
        do {
            let data =
                if let now = fileSystem.readNow(
                    handle.inode, handle: handle.handle, offset: offset, count: count, context: .kernel)
                {
                    try now.get()
                } else {
                    // Never a hang: a read that neither answers nor fails is a failure of the run.
                    try await withDeadline(.seconds(30), "read \(handle.path) @\(offset) +\(count)") {
                        [fileSystem] in
                        try await fileSystem.read(
                            handle.inode, handle: handle.handle, offset: offset, count: count, context: .kernel)
                    }
                }
            return byteDifference(data.bytes, expected).map {
                "read \(handle.path) @\(offset) +\(count): not the pinned version's bytes: \($0)"
            }
        } catch let error as FileSystemError {
            if allowed.contains(error.errno) { return nil }
            let expected = allowed.isEmpty ? "success" : allowed.map(\.name).joined(separator: " or ")
            return "read \(handle.path) @\(offset) +\(count) failed: \(error), expected \(expected) "
                + "(version unchanged: \(unchanged), item exists: \(current != nil))"
        } catch {
            return "\(error)"
        }
    }

    mutating func closeHandle() async -> String? {
        guard !handles.isEmpty else { return nil }
        let handle = handles.remove(at: Int.random(in: 0..<handles.count, using: &random))
        log.append("close \(handle.path) \(handle.handle)")
        if random.next() % 2 == 0 {
            _ = fileSystem.releaseNow(handle.inode, handle: handle.handle)
        } else {
            await fileSystem.release(handle.inode, handle: handle.handle)
        }
        return nil
    }

    // MARK: Remote changes

    /// After a remote change every TTL passes, so later operations must see it.
    func passTTLs() {
        fixture.clock.advance(by: .seconds(6))
    }

    mutating func newContent() -> InMemoryContent {
        nextSeed += 1
        let size = Int64.random(in: 0...150_000, using: &random)
        return .ramp(seed: nextSeed, size: size)
    }

    mutating func remoteAdd() -> String? {
        guard let directory = pick(directories) else { return nil }
        nextName += 1
        let name = Bool.random(using: &random) ? "n\(nextName)" : "n \(nextName) é"
        let path = directory.identifier == .root ? name : directory.identifier.rawValue + "/" + name
        let content = newContent()
        log.append("remote-add \(path) (\(content.size) bytes)")
        fixture.provider.putFile(path, content)
        passTTLs()
        return nil
    }

    mutating func remoteAddDirectory() -> String? {
        guard let directory = pick(directories), directories.count < 8 else { return nil }
        nextName += 1
        let path = directory.identifier == .root ? "d\(nextName)" : directory.identifier.rawValue + "/d\(nextName)"
        log.append("remote-mkdir \(path)")
        fixture.provider.addDirectory(path)
        passTTLs()
        return nil
    }

    mutating func remoteModify() -> String? {
        guard let item = pick(files) else { return nil }
        let content = newContent()
        log.append("remote-modify \(item.identifier) (\(content.size) bytes)")
        fixture.provider.putFile(item.identifier.rawValue, content)
        for index in handles.indices where handles[index].path == item.identifier.rawValue {
            handles[index].changedWhileOpen = true
        }
        passTTLs()
        return nil
    }

    mutating func remoteRemove() -> String? {
        guard let item = pick(items) else { return nil }
        log.append("remote-remove \(item.identifier)")
        fixture.provider.remove(item.identifier.rawValue)
        passTTLs()
        return nil
    }

    mutating func transientFault() -> String? {
        // One pending fault per item: more in a row than the retry budget would rightly fail.
        guard let item = pick(files), item.size > 0,
            !fixture.faults.all.contains(where: { $0.identifier == item.identifier })
        else { return nil }
        let offset = Int64.random(in: 0..<item.size, using: &random)
        log.append("fault-once \(item.identifier) fail-after \(offset)")
        fixture.faults.add(
            FaultRule(identifier: item.identifier, fault: .failAfter(offset: offset, errno: EIO), times: .fetches(1)))
        return nil
    }
}

extension ProviderItem {
    fileprivate static let rootPlaceholder = ProviderItem(
        identifier: .root, parent: .root, name: "", kind: .directory, size: 0, modificationTime: ItemTime(seconds: 0),
        contentVersion: ContentVersion("root"))
}
