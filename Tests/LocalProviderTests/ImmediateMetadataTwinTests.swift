// The fast-path twin of `item(for:)`: `itemNow(for:)` (D-229) may decline (nil), but whatever it
// answers, an item or an error, must be exactly what `item(for:)` answers on the same state. The
// same for `childNow(named:of:)` against `child(named:of:)` (D-380), with every identifier split
// into its directory and last name. Checked
// over a varied tree and a sequence of changes, for the local provider and for the fault wrapper
// over it, on every identifier of interest at every step.

import LocalProvider
import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// An answer of either path, comparable: the item, or the error it threw.
private enum Answer: Equatable, CustomStringConvertible {
    case item(ProviderItem)
    case absent
    case failure(ProviderError)

    var description: String {
        switch self {
        case .absent: "absent"
        case .item(let item): "item \(item.identifier) \(item.kind) \(item.size) \(item.contentVersion)"
        case .failure(let error): "error \(error)"
        }
    }
}

/// Every identifier the tree below can reach or name, and some it cannot.
private let identifiers = [
    "", "top.txt", "a", "a/b.txt", "a/sub", "a/sub/deep.txt", "a/link-file", "a/link-dir", "a/dangling",
    "a/escape", "a/escape/secret", "a/fifo", "a/missing", "a/renamed.txt", "a/b.txt/under-a-file", "w",
    "w/inside.txt", "w/secret", "unwatched", "unwatched/u.txt", "a/..", "a/../top.txt", "../secret", "a//b.txt",
    "a/./b.txt", "missing-dir/x",
].map { ItemIdentifier($0) }

/// Compares every immediate answer with the slow one, for each identifier; returns how many items
/// and errors were answered at once (so a test can tell the check was not vacuous).
@discardableResult
private func checkTwins(_ provider: any Provider, _ step: String) async -> (items: Int, errors: Int) {
    var answered = (items: 0, errors: 0)
    for identifier in identifiers {
        let now: Answer
        do {
            guard let item = try provider.itemNow(for: identifier) else { continue }
            now = .item(item)
        } catch {
            now = .failure(ProviderError.from(error))
        }
        if case .item = now { answered.items += 1 } else { answered.errors += 1 }
        let slow: Answer
        do {
            slow = .item(try await provider.item(for: identifier))
        } catch {
            slow = .failure(ProviderError.from(error))
        }
        #expect(now == slow, "\(step): itemNow(\(identifier)) answered \(now), item(for:) \(slow)")
    }
    for identifier in identifiers where !identifier.rawValue.isEmpty {
        let raw = identifier.rawValue
        let (directory, name) =
            raw.lastIndex(of: "/").map { (ItemIdentifier(String(raw[..<$0])), String(raw[raw.index(after: $0)...])) }
            ?? (.root, raw)
        let now: Answer
        do {
            switch try provider.childNow(named: name, of: directory) {
            case .declined: continue
            case .absent: now = .absent
            case .found(let item): now = .item(item)
            }
        } catch {
            now = .failure(ProviderError.from(error))
        }
        if case .failure = now { answered.errors += 1 } else { answered.items += 1 }
        let slow: Answer
        do {
            slow = try await provider.child(named: name, of: directory).map { .item($0) } ?? .absent
        } catch {
            slow = .failure(ProviderError.from(error))
        }
        #expect(now == slow, "\(step): childNow('\(name)' of \(directory)) answered \(now), child(named:of:) \(slow)")
    }
    return answered
}

@Suite("LocalDirectoryProvider: itemNow is the twin of item(for:)")
struct ImmediateMetadataTwinTests {
    /// Builds the tree, lists (and so watches) some directories, then changes the tree step by
    /// step, checking every identifier against `provider(local, plan)` after each step.
    private func run(_ makeProvider: (LocalDirectoryProvider, FaultPlan) -> any Provider) async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        let rootPath = parent.path + "/root"
        try writeFile(parent.path + "/secret", Array("outside".utf8))
        try writeFile(rootPath + "/top.txt", Array("top".utf8))
        try writeFile(rootPath + "/a/b.txt", Array("hello".utf8))
        try writeFile(rootPath + "/a/sub/deep.txt", Array("deep".utf8))
        try writeFile(rootPath + "/w/inside.txt", Array("inside".utf8))
        try writeFile(rootPath + "/unwatched/u.txt", Array("u".utf8))
        symlink("b.txt", rootPath + "/a/link-file")
        symlink("sub", rootPath + "/a/link-dir")
        symlink("nowhere", rootPath + "/a/dangling")
        symlink(parent.path, rootPath + "/a/escape")
        mkfifo(rootPath + "/a/fifo", 0o600)

        let local = LocalDirectoryProvider(root: rootPath)
        let plan = FaultPlan()
        let provider = makeProvider(local, plan)
        #expect(await checkTwins(provider, "nothing listed") == (0, 0))
        for directory in ["", "a", "a/sub", "w"] {
            _ = try await provider.trackedChildren(of: ItemIdentifier(directory))
        }
        let listed = await checkTwins(provider, "listed")
        #expect(listed.items >= 10 && listed.errors >= 3, "\(listed)")

        try writeFile(rootPath + "/a/b.txt", Array("rewritten, longer".utf8))
        await checkTwins(provider, "rewritten")
        #expect(rename(rootPath + "/a/b.txt", rootPath + "/a/renamed.txt") == 0)
        await checkTwins(provider, "renamed away")
        try writeFile(rootPath + "/a/b.txt", Array("new file under the old name".utf8))
        await checkTwins(provider, "recreated")
        unlink(rootPath + "/a/link-file")
        #expect(symlink("renamed.txt", rootPath + "/a/link-file") == 0)
        await checkTwins(provider, "symbolic link retargeted")
        unlink(rootPath + "/a/sub/deep.txt")
        #expect(rmdir(rootPath + "/a/sub") == 0)
        await checkTwins(provider, "watched directory removed")
        // A watched directory replaced by a symbolic link that leads out of the root.
        #expect(rename(rootPath + "/w", parent.path + "/w-moved") == 0)
        #expect(symlink(parent.path, rootPath + "/w") == 0)
        await checkTwins(provider, "watched directory replaced by an escaping link")
        chmod(rootPath + "/top.txt", 0o600)
        await checkTwins(provider, "permissions changed")
        // The root itself goes away (unreachable), then comes back.
        #expect(rename(rootPath, parent.path + "/root-moved") == 0)
        await checkTwins(provider, "root gone")
        #expect(rename(parent.path + "/root-moved", rootPath) == 0)
        await checkTwins(provider, "root back")

        // Offline faults (for the wrapper): immediate answers must not bypass them.
        plan.add(FaultRule(identifier: ItemIdentifier("a/b.txt"), fault: .offline))
        await checkTwins(provider, "one item offline")
        plan.add(FaultRule(identifier: .root, fault: .offline))
        await checkTwins(provider, "everything offline")
        plan.clear()
        #expect(await checkTwins(provider, "back online").items >= 5)
    }

    @Test("local directory: every immediate answer equals item(for:) over files, links, renames and escapes")
    func local() async throws {
        try await run { local, _ in local }
    }

    @Test("fault wrapper over a local directory: the same, offline faults included")
    func faultWrapper() async throws {
        try await run { local, plan in FaultInjectingProvider(wrapping: local, plan: plan) }
    }
}
