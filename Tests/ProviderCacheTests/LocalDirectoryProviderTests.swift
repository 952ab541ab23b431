import ProviderModel
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
