import Dispatch
import LocalProvider
import ProviderFaults
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Reads a whole stream.
func drain(_ stream: any ContentStream) async throws -> [UInt8] {
    var result: [UInt8] = []
    while let chunk = try await stream.next(maximumLength: 4096) { result += chunk }
    stream.close()
    return result
}

@Suite("LocalDirectoryProvider")
struct LocalDirectoryProviderTests {
    @Test("items, children and content ranges of a local tree")
    func basics() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/b.txt", Array("hello world".utf8))
        symlink("b.txt", root.path + "/a/link")
        mkfifo(root.path + "/a/fifo", 0o600)
        let provider = LocalDirectoryProvider(root: root.path + "/")
        let rootItem = try await provider.item(for: .root)
        #expect(rootItem.kind == .directory)
        let children = try await provider.children(of: ItemIdentifier("a")).sorted { $0.name < $1.name }
        // The FIFO is neither file, directory nor link: not listed.
        #expect(children.map(\.name) == ["b.txt", "link"])
        #expect(children[0].identifier == ItemIdentifier("a/b.txt"))
        #expect(children[0].parent == ItemIdentifier("a"))
        #expect(children[0].size == 11)
        #expect(children[1].kind == .symbolicLink)
        #expect(children[1].symbolicLinkTarget == "b.txt")
        let stream = try await provider.fetchContents(
            of: children[0].identifier, version: children[0].contentVersion, range: 6..<11)
        #expect(try await drain(stream) == Array("world".utf8))
    }

    @Test("a large directory (listed on several threads) lists every child once, each as item(for:) sees it")
    func largeListing() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let count = LocalDirectoryProvider.parallelListingThreshold * 2 + 7
        for index in 0..<count { try root.write("big/f\(index)", Array(repeating: UInt8(index % 251), count: index)) }
        try root.write("big/sub/inner", [1])
        symlink("f1", root.path + "/big/link")
        mkfifo(root.path + "/big/fifo", 0o600)
        let provider = LocalDirectoryProvider(root: root.path)
        let children = try await provider.children(of: ItemIdentifier("big"))
        #expect(children.count == count + 2)
        #expect(Set(children.map(\.identifier)).count == children.count)
        for child in children {
            // Same metadata (version string included) as a single lstat gives.
            #expect(try await provider.item(for: child.identifier) == child)
            #expect(child.parent == ItemIdentifier("big"))
        }
        let file = try #require(children.first { $0.name == "f300" })
        var info = stat()
        #expect(lstat(root.path + "/big/f300", &info) == 0)
        let nanoseconds = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
        #expect(file.contentVersion.rawValue == "s300-m\(nanoseconds)-i\(info.st_ino)")
        #expect(children.first { $0.name == "sub" }?.kind == .directory)
        #expect(children.first { $0.name == "link" }?.symbolicLinkTarget == "f1")
    }

    @Test("names that are not UTF-8 and mtimes far from 1970 are listed, never dropped or fatal")
    func oddNamesAndTimes() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("d/future", [1])
        // Year 2300: nanoseconds since 1970 do not fit in 64 bits (ext4 stores up to 2446).
        var times = [timespec(tv_sec: 10_413_792_000, tv_nsec: 5), timespec(tv_sec: 10_413_792_000, tv_nsec: 5)]
        #expect(utimensat(AT_FDCWD, root.path + "/d/future", &times, AT_SYMLINK_NOFOLLOW) == 0)
        // A name with a byte that is not UTF-8.
        let bad: [CChar] = Array("d/bad".utf8CString.dropLast()) + [CChar(bitPattern: 0xFF), 0]
        let created = (root.path + "/").withCString { prefix -> Int32 in
            let full = Array(UnsafeBufferPointer(start: prefix, count: strlen(prefix))) + bad
            return open(full, O_WRONLY | O_CREAT, 0o600)
        }
        #expect(created >= 0)
        close(created)
        let provider = LocalDirectoryProvider(root: root.path)
        let children = try await provider.children(of: ItemIdentifier("d")).sorted { $0.name < $1.name }
        #expect(children.map(\.name) == ["bad\u{FFFD}", "future"])
        let future = try #require(children.first { $0.name == "future" })
        #expect(future.contentVersion.rawValue.contains("-m10413792000.5-"))
        #expect(try await provider.item(for: future.identifier) == future)
    }

    @Test("one name looked up in a directory: found as a listing shows it, nil when missing, bad names refused")
    func childNamed() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("d/f.txt", Array("x".utf8))
        symlink("f.txt", root.path + "/d/link")
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        try outside.write("secret", [1])
        symlink(outside.path, root.path + "/escape")
        let provider = LocalDirectoryProvider(root: root.path)
        let listed = try await provider.children(of: ItemIdentifier("d")).sorted { $0.name < $1.name }
        #expect(
            try await provider.child(named: "f.txt", of: ItemIdentifier("d")) == listed.first { $0.name == "f.txt" })
        #expect(try await provider.child(named: "link", of: ItemIdentifier("d"))?.kind == .symbolicLink)
        #expect(try await provider.child(named: "d", of: .root)?.kind == .directory)
        #expect(try await provider.child(named: "nope", of: ItemIdentifier("d")) == nil)
        for bad in ["", ".", "..", "a/b", String(repeating: "n", count: 256)] {
            await #expect(throws: ProviderError.self, "'\(bad)'") {
                _ = try await provider.child(named: bad, of: ItemIdentifier("d"))
            }
        }
        // A directory that is a symbolic link (here, out of the source) is not followed.
        do {
            _ = try await provider.child(named: "secret", of: ItemIdentifier("escape"))
            Issue.record("a lookup followed a symbolic link out of the source")
        } catch let error as ProviderError {
            #expect(error.code == .wrongKind)
        }
        do {
            _ = try await provider.child(named: "x", of: ItemIdentifier("gone"))
            Issue.record("a lookup in a missing directory succeeded")
        } catch let error as ProviderError {
            #expect(error.code == .noSuchItem)
        }
    }

    @Test("immediate metadata (D-229) answers only inside watched directories, as item(for:) would")
    func immediateMetadata() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/b.txt", Array("hello".utf8))
        try root.write("top.txt", Array("x".utf8))
        let provider = LocalDirectoryProvider(root: root.path)
        // Nothing listed with a token yet: no directory is known to be local, so no answer.
        #expect(try provider.itemNow(for: ItemIdentifier("a/b.txt")) == nil)
        #expect(try provider.itemNow(for: ItemIdentifier("top.txt")) == nil)
        #expect(try provider.itemNow(for: .root) == nil)

        _ = try await provider.trackedChildren(of: ItemIdentifier("a"))
        let now = try #require(try provider.itemNow(for: ItemIdentifier("a/b.txt")))
        #expect(now == (try await provider.item(for: ItemIdentifier("a/b.txt"))))
        // Only the watched directory's children: the root is still not watched.
        #expect(try provider.itemNow(for: ItemIdentifier("top.txt")) == nil)

        try writeFile(root.path + "/a/b.txt", Array("hello again".utf8))
        let changed = try #require(try provider.itemNow(for: ItemIdentifier("a/b.txt")))
        #expect(changed.size == 11 && changed.contentVersion != now.contentVersion)

        unlink(root.path + "/a/b.txt")
        #expect(throws: ProviderError.self) { try provider.itemNow(for: ItemIdentifier("a/b.txt")) }
        // The same checks as item(for:): no way out of the root, and a parent that is not a
        // watched directory is not answered at all.
        #expect(throws: ProviderError.self) { try provider.itemNow(for: ItemIdentifier("a/..")) }
        #expect(try provider.itemNow(for: ItemIdentifier("a/../../etc")) == nil)
    }

    @Test("with faults, a local directory keeps tracking and immediate answers; offline faults win")
    func faultWrapperKeepsTracking() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/b.txt", Array("hello".utf8))
        let plan = FaultPlan()
        let tracking = FaultInjectingProvider(wrapping: LocalDirectoryProvider(root: root.path), plan: plan)
        // Owners only where this process may chown (D-397).
        #expect(
            tracking.capabilities
                == ProviderCapabilities([
                    .namedChildLookup, .immediateMetadata, .listingChangeTracking, .changeNotifying,
                    .writing, .symbolicLinks, .exchangingMoves, .storesAttributes, .hardLinks,
                ]).union(geteuid() == 0 ? .storesOwnership : []))
        let (children, token) = try await tracking.trackedChildren(of: ItemIdentifier("a"))
        #expect(children.map(\.name) == ["b.txt"])
        let listed = try #require(token)
        #expect(!tracking.hasChanges(since: listed))
        #expect(try tracking.itemNow(for: ItemIdentifier("a/b.txt"))?.size == 5)
        #expect(try await tracking.child(named: "b.txt", of: ItemIdentifier("a"))?.size == 5)

        plan.add(FaultRule(identifier: ItemIdentifier("a/b.txt"), fault: .offline))
        // Offline: not answered at once, and no listing counts as unchanged, so the cache asks.
        #expect(try tracking.itemNow(for: ItemIdentifier("a/b.txt")) == nil)
        #expect(tracking.hasChanges(since: listed))
        await #expect(throws: ProviderError.self) { _ = try await tracking.item(for: ItemIdentifier("a/b.txt")) }
        plan.add(FaultRule(identifier: .root, fault: .offline))
        await #expect(throws: ProviderError.self) { _ = try await tracking.trackedChildren(of: ItemIdentifier("a")) }
        await #expect(throws: ProviderError.self) {
            _ = try await tracking.child(named: "b.txt", of: ItemIdentifier("a"))
        }
        plan.clear()
        #expect(!tracking.hasChanges(since: listed))

        // Over a provider with fewer capabilities the wrapper has just those (here immediate
        // metadata), and no immediate answers unless its base gives them.
        let memory = InMemoryProvider(capabilities: .immediateMetadata)
        memory.putFile("f", .bytes([1]))
        let plain = FaultInjectingProvider(wrapping: memory, plan: plan)
        #expect(plain.capabilities == .immediateMetadata)
        #expect(try plain.itemNow(for: ItemIdentifier("f")) == nil)
        memory.answersImmediately = true
        #expect(try plain.itemNow(for: ItemIdentifier("f"))?.size == 1)
        plan.add(FaultRule(identifier: ItemIdentifier("f"), fault: .offline))
        #expect(try plain.itemNow(for: ItemIdentifier("f")) == nil)
    }

    @Test("identifiers that escape the root are refused")
    func traversal() async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        try writeFile(parent.path + "/secret", Array("secret".utf8))
        try writeFile(parent.path + "/root/inside", Array("ok".utf8))
        symlink(parent.path, parent.path + "/root/escape")
        let provider = LocalDirectoryProvider(root: parent.path + "/root")
        for bad in ["../secret", "a/../../secret", "./inside", "", "x//y", "escape/secret"] where !bad.isEmpty {
            do {
                _ = try await provider.item(for: ItemIdentifier(bad))
                Issue.record("\(bad) was accepted")
            } catch let error as ProviderError {
                #expect(error.code == .invalidName || error.code == .noSuchItem, "\(bad): \(error)")
            }
        }
        // The link itself is an item (never followed), and its content cannot be fetched.
        let link = try await provider.item(for: ItemIdentifier("escape"))
        #expect(link.kind == .symbolicLink)
        await #expect(throws: ProviderError.self) {
            _ = try await provider.fetchContents(
                of: ItemIdentifier("escape/secret"), version: link.contentVersion, range: 0..<6)
        }
    }

    @Test("a changed file is detected: a new version, and the old one is refused mid-stream")
    func versionDetection() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", [UInt8](repeating: 1, count: 100_000))
        let provider = LocalDirectoryProvider(root: root.path)
        let before = try await provider.item(for: ItemIdentifier("f"))
        let stream = try await provider.fetchContents(
            of: before.identifier, version: before.contentVersion, range: 0..<100_000)
        let first = try await stream.next(maximumLength: 1000)
        #expect(first?.count == 1000)
        // Rewrite in place (same inode), with a different size.
        let fd = open(root.path + "/f", O_WRONLY | O_TRUNC)
        _ = [UInt8](repeating: 2, count: 50).withUnsafeBytes { write(fd, $0.baseAddress, 50) }
        close(fd)
        do {
            _ = try await stream.next(maximumLength: 1000)
            Issue.record("bytes of a rewritten file were delivered")
        } catch let error as ProviderError {
            #expect(error.code == .versionChanged)
        }
        stream.close()
        let after = try await provider.item(for: ItemIdentifier("f"))
        #expect(after.contentVersion != before.contentVersion)
        do {
            _ = try await provider.fetchContents(of: before.identifier, version: before.contentVersion, range: 0..<10)
            Issue.record("an old version was served")
        } catch let error as ProviderError {
            #expect(error.code == .versionChanged)
        }
    }

    @Test("a missing root reads as unreachable; a missing item as noSuchItem")
    func unreachable() async throws {
        let root = try TemporaryDirectory()
        let provider = LocalDirectoryProvider(root: root.path)
        do {
            _ = try await provider.item(for: ItemIdentifier("nope"))
            Issue.record("expected noSuchItem")
        } catch let error as ProviderError {
            #expect(error.code == .noSuchItem)
        }
        root.remove()
        do {
            _ = try await provider.children(of: .root)
            Issue.record("expected unreachable")
        } catch let error as ProviderError {
            #expect(error.code == .unreachable)
        }
    }
}

@Suite("LocalDirectoryProvider: direct transfer into a file", .timeLimit(.minutes(3)))
struct LocalDirectTransferTests {
    /// Transfers `range` of `identifier` into `descriptor` at the same offsets, `chunk` at a time.
    func transferAll(
        _ provider: LocalDirectoryProvider, _ item: ProviderItem, _ range: Range<Int64>, into descriptor: Int32,
        chunk: Int
    ) async throws -> Int64 {
        let stream = try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: range)
        defer { stream.close() }
        try #require(stream.capabilities.contains(.directTransfer))
        let direct = stream
        var position = range.lowerBound
        let steps = Locked<[Int]>([])
        while let placed = try await direct.transfer(
            to: descriptor, at: position, firstStep: chunk / 2, step: chunk, maximumLength: 3 * chunk,
            delivered: { count in
                steps.withLock { $0.append(count) }
                return true
            })
        {
            if placed == 0 { break }
            #expect(placed <= 3 * chunk)
            position += Int64(placed)
        }
        let delivered = steps.value
        #expect(delivered.reduce(0, +) == Int(position - range.lowerBound), "every placed byte was delivered")
        #expect(delivered.allSatisfy { $0 > 0 && $0 <= chunk })
        return position
    }

    @Test("bytes land at their offsets; holes of the source stay holes; data under a hole is zeroed")
    func sparseCopy() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        // 4 MiB: data in the first and third MiB, holes elsewhere.
        let size: Int64 = 4 << 20
        let source = open(root.path + "/sparse", O_RDWR | O_CREAT, 0o600)
        #expect(ftruncate(source, off_t(size)) == 0)
        let first = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let third = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 1) }
        _ = first.withUnsafeBytes { pwrite(source, $0.baseAddress, $0.count, 0) }
        _ = third.withUnsafeBytes { pwrite(source, $0.baseAddress, $0.count, 2 << 20) }
        close(source)
        let provider = LocalDirectoryProvider(root: root.path)
        let item = try await provider.item(for: ItemIdentifier("sparse"))

        let destination = open(root.path + "/copy", O_RDWR | O_CREAT, 0o600)
        defer { close(destination) }
        #expect(ftruncate(destination, off_t(size)) == 0)
        // Garbage where the source has a hole: a transfer must not leave it there.
        let garbage = [UInt8](repeating: 0xEE, count: 4096)
        _ = garbage.withUnsafeBytes { pwrite(destination, $0.baseAddress, $0.count, off_t(3 << 20)) }

        let end = try await transferAll(provider, item, 0..<size, into: destination, chunk: 3 << 19)
        #expect(end == size)
        var copied = [UInt8](repeating: 0xFF, count: Int(size))
        _ = copied.withUnsafeMutableBytes { pread(destination, $0.baseAddress, $0.count, 0) }
        #expect(byteDifference(copied[0..<(1 << 20)], first) == nil)
        #expect(copied[(1 << 20)..<(2 << 20)].allSatisfy { $0 == 0 })
        #expect(byteDifference(copied[(2 << 20)..<(3 << 20)], third) == nil)
        #expect(copied[(3 << 20)...].allSatisfy { $0 == 0 }, "garbage under a source hole was zeroed")
        var info = stat()
        fstat(destination, &info)
        // The two data MiB, plus the zeroed garbage (one block, maybe its extent's rounding).
        #expect(
            info.st_blocks * 512 <= (2 << 20) + 65536, "holes stayed holes: \(info.st_blocks * 512) bytes used")
    }

    @Test("a range in the middle, and a file rewritten mid-transfer is refused")
    func rangeAndVersion() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let bytes = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try root.write("f", bytes)
        let provider = LocalDirectoryProvider(root: root.path)
        let item = try await provider.item(for: ItemIdentifier("f"))
        let destination = open(root.path + "/copy", O_RDWR | O_CREAT, 0o600)
        defer { close(destination) }
        let end = try await transferAll(provider, item, 1000..<250_000, into: destination, chunk: 65536)
        #expect(end == 250_000)
        var copied = [UInt8](repeating: 0, count: 249_000)
        _ = copied.withUnsafeMutableBytes { pread(destination, $0.baseAddress, $0.count, 1000) }
        #expect(byteDifference(copied, bytes[1000..<250_000]) == nil)

        let stream = try await provider.fetchContents(
            of: item.identifier, version: item.contentVersion, range: 0..<300_000)
        defer { stream.close() }
        try #require(stream.capabilities.contains(.directTransfer))
        let direct = stream
        let delivered = Locked(0)
        let first = try await direct.transfer(
            to: destination, at: 0, firstStep: 4096, step: 4096, maximumLength: 4096,
            delivered: { count in
                delivered.withLock { $0 += count }
                return true
            })
        #expect(first == 4096 && delivered.value == 4096)
        let fd = open(root.path + "/f", O_WRONLY | O_APPEND)
        _ = [UInt8](repeating: 9, count: 10).withUnsafeBytes { write(fd, $0.baseAddress, 10) }
        close(fd)
        do {
            _ = try await direct.transfer(
                to: destination, at: 4096, firstStep: 4096, step: 4096, maximumLength: 4096,
                delivered: { _ in
                    delivered.withLock { $0 += 1_000_000 }
                    return true
                })
            Issue.record("a transfer of a changed file succeeded")
        } catch let error as ProviderError {
            #expect(error.code == .versionChanged)
        }
        #expect(delivered.value == 4096, "no byte of the changed file was delivered")
    }

    @Test("a stop asked by the receiver ends the transfer after that step")
    func receiverStops() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", [UInt8](repeating: 3, count: 100_000))
        let provider = LocalDirectoryProvider(root: root.path)
        let item = try await provider.item(for: ItemIdentifier("f"))
        let destination = open(root.path + "/copy", O_RDWR | O_CREAT, 0o600)
        defer { close(destination) }
        let stream = try await provider.fetchContents(
            of: item.identifier, version: item.contentVersion, range: 0..<100_000)
        defer { stream.close() }
        try #require(stream.capabilities.contains(.directTransfer))
        let direct = stream
        let calls = Locked(0)
        let placed = try await direct.transfer(
            to: destination, at: 0, firstStep: 1000, step: 10_000, maximumLength: 100_000,
            delivered: { _ in
                calls.withLock { $0 += 1 }
                return calls.value < 2
            })
        // The second step ends on a multiple of `step` (whole page-cache folios): 1,000 + 9,000.
        #expect(placed == 10_000 && calls.value == 2)
        // The stream goes on from where it stopped.
        let rest = try await direct.transfer(
            to: destination, at: 10_000, firstStep: 100_000, step: 100_000, maximumLength: 100_000,
            delivered: { _ in true })
        #expect(rest == 90_000)
    }

    @Test("a source truncated while it is copied from its mapping fails as a version change, never a crash")
    func truncatedUnderTheMapping() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let size = 8 << 20
        let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        for round in 0..<12 {
            try root.write("f", bytes)
            let provider = LocalDirectoryProvider(root: root.path)
            let item = try await provider.item(for: ItemIdentifier("f"))
            let destination = open(root.path + "/copy", O_RDWR | O_CREAT | O_TRUNC, 0o600)
            defer { close(destination) }
            let stream = try await provider.fetchContents(
                of: item.identifier, version: item.contentVersion, range: 0..<Int64(size))
            defer { stream.close() }
            try #require(stream.capabilities.contains(.directTransfer))
            let direct = stream
            // From the second step on, another thread shrinks the source at some point: before a
            // step, between its hole probe and its copy, or during the copy (EFAULT in pwrite).
            let shrink = Int64(round % 3 == 0 ? 0 : (round * 300_007) % size)
            let started = Locked(false)
            let delivered = Locked(0)
            let truncated = DispatchGroup()
            do {
                let placed = try await direct.transfer(
                    to: destination, at: 0, firstStep: 256 << 10, step: 256 << 10, maximumLength: size,
                    delivered: { count in
                        delivered.withLock { $0 += count }
                        if !started.withLock({ $0 }) {
                            started.withLock { $0 = true }
                            let path = root.path + "/f"
                            DispatchQueue.global().async(group: truncated) { _ = truncate(path, off_t(shrink)) }
                        }
                        return true
                    })
                // Finished before the truncation landed: every byte is the source's.
                #expect(placed == size)
            } catch let error as ProviderError {
                #expect(error.code == .versionChanged, "round \(round): \(error)")
            }
            // The truncation must land in this round: late, it would shrink the next round's source.
            await withCheckedContinuation { done in truncated.notify(queue: .global()) { done.resume() } }
            // Whatever was delivered is exactly the source's bytes.
            let count = delivered.value
            var copied = [UInt8](repeating: 0, count: count)
            _ = copied.withUnsafeMutableBytes { pread(destination, $0.baseAddress, count, 0) }
            #expect(byteDifference(copied, bytes[0..<count]) == nil, "round \(round)")
        }
    }

    @Test("a destination that refuses writes fails with its errno")
    func destinationErrors() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", [UInt8](repeating: 5, count: 10_000))
        let provider = LocalDirectoryProvider(root: root.path)
        let item = try await provider.item(for: ItemIdentifier("f"))
        let readOnly = open(root.path + "/f", O_RDONLY)
        defer { close(readOnly) }
        let stream = try await provider.fetchContents(
            of: item.identifier, version: item.contentVersion, range: 0..<10_000)
        defer { stream.close() }
        try #require(stream.capabilities.contains(.directTransfer))
        let direct = stream
        do {
            _ = try await direct.transfer(
                to: readOnly, at: 0, firstStep: 4096, step: 4096, maximumLength: 4096, delivered: { _ in true })
            Issue.record("a transfer into a read-only descriptor succeeded")
        } catch let error as ProviderError {
            #expect(error.errno == EBADF)
        }
    }
}

// Off the cooperative pool: thousands of synchronous mkdir, listing and inotify calls per test
// held CI's two pool threads for 17 s and starved other suites' awaits.
@Suite("LocalDirectoryProvider: change tracking (inotify)", .blockingThreads)
struct LocalChangeTrackingTests {
    /// Each change, made after a listing of `dir` (and of `dir/sub`), must void the listing's token.
    static let changes: [(String, @Sendable (String) -> Void)] = [
        ("create a file", { _ = try? writeFile($0 + "/dir/new", [1]) }),
        ("delete a file", { unlink($0 + "/dir/f") }),
        ("rename within", { rename($0 + "/dir/f", $0 + "/dir/g") }),
        ("rename out", { rename($0 + "/dir/f", $0 + "/elsewhere") }),
        ("rename in", { rename($0 + "/outside", $0 + "/dir/in") }),
        (
            "append to a file",
            {
                let fd = open($0 + "/dir/f", O_WRONLY | O_APPEND)
                _ = write(fd, "x", 1)
                close(fd)
            }
        ),
        ("truncate a file", { truncate($0 + "/dir/f", 1) }),
        ("chmod a file", { chmod($0 + "/dir/f", 0o600) }),
        (
            "set a file's mtime",
            {
                var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000, tv_nsec: 0)]
                utimensat(AT_FDCWD, $0 + "/dir/f", &times, 0)
            }
        ),
        ("create inside a listed subdirectory (its mtime changes)", { _ = try? writeFile($0 + "/dir/sub/x", [1]) }),
        ("chmod the directory itself", { chmod($0 + "/dir", 0o700) }),
        (
            "replace the directory",
            {
                removeTree($0 + "/dir")
                mkdir($0 + "/dir", 0o755)
            }
        ),
    ]

    @Test(
        "a token stays valid while nothing changes (reads included) and is void after any change",
        arguments: 0..<changes.count)
    func tokensSeeChanges(index: Int) async throws {
        let (what, change) = Self.changes[index]
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("dir/f", [1, 2, 3])
        try root.write("dir/sub/s", [4])
        try root.write("outside", [5])
        let provider = LocalDirectoryProvider(root: root.path)
        let listed = try await provider.trackedChildren(of: ItemIdentifier("dir"))
        _ = try await provider.trackedChildren(of: ItemIdentifier("dir/sub"))
        #expect(listed.children.count == 2)
        let token = try #require(listed.token, "a directory on a local file system is tracked")
        // Reading content and metadata changes nothing a listing shows.
        _ = try readFile(root.path + "/dir/f")
        _ = try await provider.item(for: ItemIdentifier("dir/f"))
        _ = try await provider.children(of: ItemIdentifier("dir"))
        #expect(!provider.hasChanges(since: token), "\(what): before the change")
        change(root.path)
        #expect(provider.hasChanges(since: token), "\(what): after the change")
        // A new listing gets a new, valid token.
        if let again = try? await provider.trackedChildren(of: ItemIdentifier("dir")), let fresh = again.token {
            #expect(!provider.hasChanges(since: fresh), "\(what): a token taken after the change")
        }
    }

    @Test("at most maximumWatches directories are watched; the rest are listed without a token")
    func watchBudgetIsBounded() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let count = 4097
        for index in 0..<count { mkdir(root.path + "/d\(index)", 0o755) }
        let provider = LocalDirectoryProvider(root: root.path)
        var tracked = 0
        for index in 0..<count where try await provider.trackedChildren(of: ItemIdentifier("d\(index)")).token != nil {
            tracked += 1
        }
        #expect(tracked == 4096)
        #expect(
            try await provider.trackedChildren(of: ItemIdentifier("d0")).token != nil, "a watched one stays tracked")
        #expect(try await provider.trackedChildren(of: ItemIdentifier("d\(count - 1)")).token == nil)
    }

    @Test("lost events (queue overflow) void every token, also of directories nobody touched")
    func overflowVoidsEveryToken() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        mkdir(root.path + "/busy", 0o755)
        mkdir(root.path + "/quiet", 0o755)
        let provider = LocalDirectoryProvider(root: root.path)
        let quiet = try #require(try await provider.trackedChildren(of: ItemIdentifier("quiet")).token)
        _ = try await provider.trackedChildren(of: ItemIdentifier("busy"))
        // More events than the kernel queues (fs.inotify.max_queued_events), none read meanwhile.
        let text = String(decoding: try readFile("/proc/sys/fs/inotify/max_queued_events"), as: UTF8.self)
        let limit = try #require(Int(text.filter(\.isNumber)))
        for index in 0...(limit / 2 + 1) {
            let path = root.path + "/busy/\(index)"
            close(open(path, O_CREAT | O_WRONLY, 0o600))
            unlink(path)
        }
        #expect(provider.hasChanges(since: quiet), "events were lost: nothing can be vouched for")
    }
}

@Suite("LocalDirectoryProvider pushes changes")
struct LocalDirectoryPushTests {
    /// Waits (up to 5 s) until the changes seen so far contain `expected`.
    func waitFor(_ expected: ProviderChange, in seen: Locked<[ProviderChange]?>) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if seen.value?.contains(expected) == true { return true }
            try await Task.sleep(for: .milliseconds(2))
        }
        // A task starved past the deadline looks once more before it reports a miss.
        if seen.value?.contains(expected) == true { return true }
        print("waitFor: \(expected) timed out; seen = \(String(describing: seen.value))")
        return false
    }

    @Test("each kind of change of a tracked directory is reported, as it happens, with the entry it concerns")
    func changesAreReported() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("dir/f", [1, 2, 3])
        try root.write("dir/sub/s", [4])
        let provider = LocalDirectoryProvider(root: root.path)
        let seen = Locked<[ProviderChange]?>([])
        provider.observeChanges { changes in
            seen.withLock { seen in
                if let changes { seen? += changes } else { seen = nil }
            }
        }
        defer { provider.observeChanges(nil) }
        _ = try await provider.trackedChildren(of: .root)
        _ = try await provider.trackedChildren(of: ItemIdentifier("dir"))
        _ = try await provider.trackedChildren(of: ItemIdentifier("dir/sub"))
        let dir = ItemIdentifier("dir")
        // Reads change nothing.
        _ = try readFile(root.path + "/dir/f")
        _ = try await provider.children(of: dir)

        let f = root.path + "/dir/f"
        let fd = open(f, O_WRONLY | O_APPEND)
        #expect(write(fd, [9], 1) == 1)
        close(fd)
        #expect(try await waitFor(.entry(directory: dir, name: "f"), in: seen), "written")
        #expect(seen.value?.contains(.membership(directory: dir, name: "f")) == false, "a write is not membership")

        chmod(root.path + "/dir/sub", 0o700)
        let subSeen = try await waitFor(.entry(directory: dir, name: "sub"), in: seen)
        if !subSeen {
            _ = try await provider.trackedChildren(of: dir)
            try await Task.sleep(for: .seconds(1))
            print("changesAreReported: after a forced drain, seen = \(String(describing: seen.value))")
        }
        #expect(subSeen, "a subdirectory's metadata")

        try root.write("dir/new", [5])
        #expect(try await waitFor(.membership(directory: dir, name: "new"), in: seen), "created")
        #expect(try await waitFor(.entry(directory: .root, name: "dir"), in: seen), "the directory's own mtime")

        rename(root.path + "/dir/new", root.path + "/dir/renamed")
        #expect(try await waitFor(.membership(directory: dir, name: "new"), in: seen), "renamed from")
        #expect(try await waitFor(.membership(directory: dir, name: "renamed"), in: seen), "renamed to")

        unlink(root.path + "/dir/sub/s")
        #expect(try await waitFor(.membership(directory: ItemIdentifier("dir/sub"), name: "s"), in: seen), "deleted")

        // A name that is not UTF-8 names no entry the cache has: all entries of the directory.
        let bad = root.path + "/dir/" + String(decoding: [0x66], as: UTF8.self)
        var badPath = Array(bad.utf8)
        badPath.removeLast()
        badPath += [0xFF, 0]
        close(open(badPath.map { CChar(bitPattern: $0) }, O_CREAT | O_WRONLY, 0o600))
        #expect(try await waitFor(.entries(directory: dir), in: seen), "a name that is not UTF-8")

        // Stopped: nothing more.
        provider.observeChanges(nil)
        seen.withLock { $0 = [] }
        try root.write("dir/after", [6])
        _ = try await provider.trackedChildren(of: dir)  // reads the queue
        try await Task.sleep(for: .milliseconds(50))
        #expect(seen.value == [])
    }
}
