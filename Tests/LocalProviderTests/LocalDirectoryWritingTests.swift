// LocalDirectoryProvider's write calls (issue 14): each call's effect read back from disk, each
// refusal with its code and errno, and the atomicity of uploads (no partial file seen, nothing
// left behind by a failure or a cancellation).

import Dispatch
import Foundation
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing

@testable import LocalProvider

#if canImport(Glibc)
import Glibc
#endif

/// The error a call threw, as a ProviderError (nil when it did not throw).
private func failure(_ body: () async throws -> Void) async -> ProviderError? {
    do {
        try await body()
        return nil
    } catch {
        return ProviderError.from(error)
    }
}

/// Every name in a directory, hidden ones included (a staging file left behind shows here).
private func entries(_ path: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: path).sorted()
}

private func lstatInfo(_ path: String) -> stat? {
    var info = stat()
    return lstat(path, &info) == 0 ? info : nil
}

/// A local file with `bytes`, to upload from (in its own directory, outside the source).
private func localFile(
    _ bytes: [UInt8], in directory: TemporaryDirectory, named name: String = "upload"
) throws
    -> String
{
    try directory.write(name, bytes)
    return directory.path + "/" + name
}

@Suite("LocalDirectoryProvider writing")
struct LocalDirectoryWritingTests {
    @Test("the provider reports every write capability")
    func capabilities() {
        let provider = LocalDirectoryProvider(root: "/nonexistent")
        #expect(
            provider.capabilities.isSuperset(of: [
                .writing, .symbolicLinks, .exchangingMoves, .storesAttributes, .hardLinks,
            ]))
    }

    @Test("a root missing at start: unreachable everywhere, creates deferred; served once it appears (D-434)")
    func rootAppearsLater() async throws {
        let parent = try TemporaryDirectory()
        let scratch = try TemporaryDirectory()
        defer {
            parent.remove()
            scratch.remove()
        }
        let path = parent.path + "/disk"
        let provider = LocalDirectoryProvider(root: path)
        #expect(await failure { _ = try await provider.item(for: .root) }?.code == .unreachable)
        #expect(await failure { _ = try await provider.children(of: .root) }?.code == .unreachable)
        #expect(await failure { _ = try await provider.trackedChildren(of: .root) }?.code == .unreachable)
        #expect(await failure { _ = try await provider.child(named: "a", of: .root) }?.code == .unreachable)
        let fetch = await failure {
            _ = try await provider.fetchContents(of: ItemIdentifier("a"), version: ContentVersion("v"), range: 0..<1)
        }
        #expect(fetch?.code == .unreachable)
        let upload = await failure {
            _ = try await provider.upload(
                from: try localFile(Array("new".utf8), in: scratch), to: .create(name: "new", in: .root),
                permissions: 0o644, modificationTime: nil)
        }
        #expect(upload?.code == .unreachable)
        // While missing, a create is deferred without touching the source; a bad name still refused.
        let deferred = try provider.deferCreateNow(named: "new", in: ItemIdentifier("d"))
        #expect(deferred?.identifier == ItemIdentifier("d/new") && deferred?.directory == nil)
        #expect(throws: ProviderError.self) { _ = try provider.deferCreateNow(named: "..", in: .root) }

        // The disk is plugged in: the same provider serves it, no restart.
        try writeFile(path + "/d/a", Array("here".utf8))
        let children = try await provider.children(of: ItemIdentifier("d"))
        #expect(children.map(\.name) == ["a"])
        let item = try await provider.item(for: ItemIdentifier("d/a"))
        let stream = try await provider.fetchContents(of: item.identifier, version: item.contentVersion, range: 0..<4)
        #expect(try await drain(stream) == Array("here".utf8))
        let created = try await provider.upload(
            from: try localFile(Array("new".utf8), in: scratch), to: .create(name: "new", in: ItemIdentifier("d")),
            permissions: 0o644, modificationTime: nil)
        #expect(created.identifier == ItemIdentifier("d/new"))
        #expect(try String(contentsOfFile: path + "/d/new", encoding: .utf8) == "new")
        // Back: no more offline deferral outside watched directories.
        #expect(try provider.deferCreateNow(named: "other", in: .root) == nil)
    }

    @Test("link makes a second name (EEXIST, a directory refused); an upload to a file with two names writes in place")
    func hardLinks() async throws {
        let root = try TemporaryDirectory()
        let scratch = try TemporaryDirectory()
        defer {
            root.remove()
            scratch.remove()
        }
        try root.write("a", Array("one".utf8))
        try root.write("d/taken", [])
        let provider = LocalDirectoryProvider(root: root.path)
        #expect(try await provider.item(for: ItemIdentifier("a")).hardLinkIdentity == nil, "one name: no identity")
        let linked = try await provider.link(ItemIdentifier("a"), to: ItemIdentifier("d"), named: "b")
        #expect(linked.identifier == ItemIdentifier("d/b"))
        let a = try await provider.item(for: ItemIdentifier("a"))
        #expect(a.hardLinkIdentity != nil && a.hardLinkIdentity == linked.hardLinkIdentity)
        #expect(a.contentVersion == linked.contentVersion)
        #expect(lstatInfo(root.path + "/a")?.st_nlink == 2)
        let taken = await failure {
            _ = try await provider.link(ItemIdentifier("a"), to: ItemIdentifier("d"), named: "taken")
        }
        #expect(taken?.code == .alreadyExists)
        let directory = await failure { _ = try await provider.link(ItemIdentifier("d"), to: .root, named: "e") }
        #expect(directory?.code == .wrongKind && directory?.errno == EPERM)

        // A stale base version: nothing written. The right one: the bytes go into the file, so
        // both names have them, and the inode stays.
        let inode = lstatInfo(root.path + "/a")?.st_ino
        let stale = await failure {
            _ = try await provider.upload(
                from: try localFile(Array("stale".utf8), in: scratch),
                to: .replace(ItemIdentifier("a"), baseVersion: ContentVersion("s1-m1-i1")),
                permissions: nil, modificationTime: nil)
        }
        #expect(stale?.code == .versionChanged)
        #expect(try String(contentsOfFile: root.path + "/d/b", encoding: .utf8) == "one")
        let uploaded = try await provider.upload(
            from: try localFile(Array("two, longer".utf8), in: scratch),
            to: .replace(ItemIdentifier("d/b"), baseVersion: a.contentVersion),
            permissions: 0o600, modificationTime: ItemTime(seconds: 1_000_000_000))
        #expect(uploaded.size == 11)
        #expect(try String(contentsOfFile: root.path + "/a", encoding: .utf8) == "two, longer")
        #expect(lstatInfo(root.path + "/a")?.st_ino == inode)
        #expect(lstatInfo(root.path + "/d/b")?.st_ino == inode)
        #expect(lstatInfo(root.path + "/a").map { $0.st_mode & 0o7777 } == 0o600)
        #expect(lstatInfo(root.path + "/a")?.st_mtim.tv_sec == 1_000_000_000)
        #expect(try entries(root.path + "/d") == ["b", "taken"], "no staging file left")
    }

    @Test("atime and ctime: a local source's shown, atime set by setAttributes, mtime left alone (D-397)")
    func accessAndChangeTimes() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let before = try await provider.item(for: ItemIdentifier("file"))
        var info = stat()
        #expect(lstat(root.path + "/file", &info) == 0)
        #expect(
            before.changeTime == ItemTime(seconds: Int64(info.st_ctim.tv_sec), nanoseconds: Int32(info.st_ctim.tv_nsec))
        )
        let atime = ItemTime(seconds: 1_900_000_000, nanoseconds: 123)
        let after = try await provider.setAttributes(ItemIdentifier("file"), ItemAttributeChanges(accessTime: atime))
        #expect(after.accessTime == atime)
        #expect(after.modificationTime == before.modificationTime)
        #expect(lstat(root.path + "/file", &info) == 0)
        #expect(info.st_atim.tv_sec == 1_900_000_000 && info.st_atim.tv_nsec == 123)
        #expect(after.changeTime.map { $0 >= before.changeTime! } == true)
    }

    @Test("owners (D-397): as root, items carry the source's; chown comes before chmod; setgid is inherited")
    func ownership() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        guard geteuid() == 0 else {
            // Not root (and no CAP_CHOWN in a plain user's run): no owners, as before.
            #expect(!provider.capabilities.contains(.storesOwnership))
            #expect(try await provider.item(for: ItemIdentifier("file")).owner == nil)
            return
        }
        #expect(provider.capabilities.contains(.storesOwnership))
        #expect(try await provider.item(for: ItemIdentifier("file")).owner == ItemOwner(uid: 0, gid: 0))
        _ = try await provider.setAttributes(ItemIdentifier("file"), ItemAttributeChanges(permissions: 0o4755))
        // The owner first, then the mode: the chown's clearing of setuid does not undo the mode asked.
        let given = try await provider.setAttributes(
            ItemIdentifier("file"), ItemAttributeChanges(permissions: 0o4750, uid: 65534, gid: 65533))
        #expect(given.owner == ItemOwner(uid: 65534, gid: 65533))
        #expect(given.permissions == 0o4750)
        var info = stat()
        #expect(lstat(root.path + "/file", &info) == 0)
        #expect(info.st_uid == 65534 && info.st_gid == 65533 && info.st_mode & 0o7777 == 0o4750)
        // A group alone.
        let regrouped = try await provider.setAttributes(ItemIdentifier("file"), ItemAttributeChanges(gid: 7))
        #expect(regrouped.owner == ItemOwner(uid: 65534, gid: 7))
        #expect(regrouped.permissions == 0o750)  // Linux's chown clears setuid, root's too
        // A directory made in a setgid directory keeps the setgid it inherits (and its group).
        let team = try await provider.createDirectory(named: "team", in: .root, permissions: 0o2775)
        _ = try await provider.setAttributes(team.identifier, ItemAttributeChanges(permissions: 0o2775, gid: 4242))
        let sub = try await provider.createDirectory(named: "sub", in: team.identifier, permissions: 0o755)
        #expect(sub.permissions == 0o2755)
        #expect(sub.owner?.gid == 4242)
        // A symbolic link's owner, not its target's.
        let link = try await provider.createSymbolicLink(named: "link", in: .root, target: "file")
        let linkGiven = try await provider.setAttributes(link.identifier, ItemAttributeChanges(uid: 5, gid: 6))
        #expect(linkGiven.owner == ItemOwner(uid: 5, gid: 6))
        #expect(try await provider.item(for: ItemIdentifier("file")).owner == ItemOwner(uid: 65534, gid: 7))
        // A new version (the atomic replace makes a new inode) keeps the file's owner and mode.
        try root.write("local", [9, 9])
        let replaced = try await provider.upload(
            from: root.path + "/local", to: .replace(ItemIdentifier("file"), baseVersion: nil), permissions: nil,
            modificationTime: nil)
        #expect(replaced.owner == ItemOwner(uid: 65534, gid: 7))
        #expect(replaced.permissions == 0o750)
        #expect(replaced.size == 2)
    }

    @Test("createDirectory stores the permissions asked (umask aside) and refuses a taken name")
    func createDirectory() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let made = try await provider.createDirectory(named: "new", in: ItemIdentifier("a"), permissions: 0o705)
        #expect(made.identifier == ItemIdentifier("a/new"))
        #expect(made.kind == .directory)
        let info = try #require(lstatInfo(root.path + "/a/new"))
        #expect(info.st_mode & S_IFMT == S_IFDIR)
        #expect(info.st_mode & 0o7777 == 0o705)
        #expect(try await provider.item(for: made.identifier) == made)

        let taken = await failure {
            _ = try await provider.createDirectory(named: "file", in: ItemIdentifier("a"), permissions: 0o755)
        }
        #expect(taken?.code == .alreadyExists)
        #expect(taken?.errno == EEXIST)
        let missing = await failure {
            _ = try await provider.createDirectory(named: "x", in: ItemIdentifier("nope"), permissions: 0o755)
        }
        #expect(missing?.code == .noSuchItem)
        let inFile = await failure {
            _ = try await provider.createDirectory(named: "x", in: ItemIdentifier("a/file"), permissions: 0o755)
        }
        #expect(inFile?.code == .wrongKind)
    }

    @Test("names that are not one component, too long, or reserved are refused, and nothing is created")
    func badNames() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([1, 2, 3], in: local)
        let long = String(repeating: "n", count: 256)
        for name in ["", ".", "..", "x/y", "../escape", "nul\u{0}name", long, ".providerfs-upload-1234"] {
            let calls: [(String, () async throws -> Void)] = [
                ("mkdir", { _ = try await provider.createDirectory(named: name, in: .root, permissions: 0o755) }),
                ("symlink", { _ = try await provider.createSymbolicLink(named: name, in: .root, target: "a") }),
                (
                    "upload",
                    {
                        _ = try await provider.upload(
                            from: source, to: .create(name: name, in: .root), permissions: nil, modificationTime: nil)
                    }
                ),
                (
                    "move",
                    { _ = try await provider.move(ItemIdentifier("a/file"), to: .root, named: name, mode: .replacing) }
                ),
            ]
            for (call, body) in calls {
                let error = await failure(body)
                #expect(error?.code == .invalidName, "\(call) '\(name.prefix(20))'")
                if name == long { #expect(error?.errno == ENAMETOOLONG, "\(call)") }
            }
        }
        // 255 bytes is a good name.
        let longest = String(repeating: "n", count: 255)
        #expect(try await provider.createDirectory(named: longest, in: .root, permissions: 0o755).name == longest)
        #expect(try entries(root.path) == ["a", longest].sorted())
        #expect(try entries(root.path + "/a") == ["file"])
        // Identifiers that leave the root are refused too.
        for identifier in ["../x", "a/../../x", "/etc"] {
            let error = await failure { try await provider.delete(ItemIdentifier(identifier), kind: .file) }
            #expect(error?.code == .invalidName, "\(identifier)")
        }
        let atRoot = await failure { try await provider.delete(.root, kind: .directory) }
        #expect(atRoot?.code == .invalidName)
    }

    @Test("an item whose source path would pass PATH_MAX is refused with ENAMETOOLONG where it is made (D-393)")
    func pathsPastPathMax() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        // A directory whose own source path is 100 bytes short of PATH_MAX.
        let component = String(repeating: "d", count: 250)
        var deep = component
        while root.path.utf8.count + 1 + deep.utf8.count + 1 + component.utf8.count < Int(PATH_MAX) - 102 {
            deep += "/" + component
        }
        let last = Int(PATH_MAX) - 100 - (root.path.utf8.count + 1 + deep.utf8.count + 1)
        deep += "/" + String(repeating: "e", count: last)
        #expect(root.path.utf8.count + 1 + deep.utf8.count == Int(PATH_MAX) - 100)
        #expect(mkdirAll(root.path + "/" + deep))
        try root.write("file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([1, 2, 3], in: local)
        let parent = ItemIdentifier(deep)
        let tooLong = String(repeating: "n", count: 220)
        let calls: [(String, () async throws -> Void)] = [
            ("mkdir", { _ = try await provider.createDirectory(named: tooLong, in: parent, permissions: 0o755) }),
            ("symlink", { _ = try await provider.createSymbolicLink(named: tooLong, in: parent, target: "a") }),
            (
                "upload",
                {
                    _ = try await provider.upload(
                        from: source, to: .create(name: tooLong, in: parent), permissions: nil, modificationTime: nil)
                }
            ),
            (
                "move",
                { _ = try await provider.move(ItemIdentifier("file"), to: parent, named: tooLong, mode: .replacing) }
            ),
        ]
        for (call, body) in calls {
            let error = await failure(body)
            #expect(
                error?.code == .invalidName && error?.errno == ENAMETOOLONG, "\(call): \(String(describing: error))")
        }
        #expect(try entries(root.path + "/" + deep) == [], "nothing was made")
        #expect(try entries(root.path) == [String(deep.prefix(250)), "file"].sorted(), "nothing moved")
        // A name that fits is made.
        let fits = String(repeating: "n", count: 90)
        #expect(try await provider.createDirectory(named: fits, in: parent, permissions: 0o755).name == fits)
    }

    @Test("a symbolic link in the parent path is never followed out of the source")
    func symlinkedParentEscaping() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        try outside.write("sub/victim", [9])
        symlink(outside.path, root.path + "/out")
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([1], in: local)
        // The link itself as the parent: not a directory (O_NOFOLLOW).
        let direct = await failure {
            _ = try await provider.createDirectory(named: "x", in: ItemIdentifier("out"), permissions: 0o755)
        }
        #expect(direct?.code == .wrongKind)
        // Through the link: the parent's real path is outside the source.
        let through = await failure {
            _ = try await provider.upload(
                from: source, to: .create(name: "x", in: ItemIdentifier("out/sub")), permissions: nil,
                modificationTime: nil)
        }
        #expect(through?.code == .invalidName)
        let delete = await failure { try await provider.delete(ItemIdentifier("out/sub/victim"), kind: .file) }
        #expect(delete?.code == .invalidName)
        let replace = await failure {
            _ = try await provider.upload(
                from: source, to: .replace(ItemIdentifier("out/sub/victim"), baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        #expect(replace?.code == .invalidName)
        let move = await failure {
            _ = try await provider.move(ItemIdentifier("out/sub/victim"), to: .root, named: "v", mode: .replacing)
        }
        #expect(move?.code == .invalidName)
        let attributes = await failure {
            _ = try await provider.setAttributes(
                ItemIdentifier("out/sub/victim"), ItemAttributeChanges(permissions: 0o777))
        }
        #expect(attributes?.code == .invalidName)
        #expect(try entries(outside.path) == ["sub"])
        #expect(try entries(outside.path + "/sub") == ["victim"])
        #expect(try readFile(outside.path + "/sub/victim") == [9])
        #expect(try #require(lstatInfo(outside.path + "/sub/victim")).st_mode & 0o777 != 0o777)
    }

    @Test("a link swapped in after the provider worked in a directory is refused as before (D-425)")
    func linkSwappedInAfterUse() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        try root.write("a/b/f", [1])
        try outside.write("b/f", [9])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([1], in: local)
        // The directory used first: its descriptor and the root's are what a cache would keep.
        _ = try await provider.createDirectory(named: "x", in: ItemIdentifier("a/b"), permissions: 0o755)
        #expect(try await provider.child(named: "f", of: ItemIdentifier("a/b"))?.size == 1)
        #expect(try await provider.item(for: ItemIdentifier("a/b/f")).size == 1)
        // Watched: the immediate answers (childNow, deferCreateNow) are given for it.
        _ = try await provider.trackedChildren(of: ItemIdentifier("a/b"))
        #expect(try provider.childNow(named: "f", of: ItemIdentifier("a/b")) != .declined)
        // `a` becomes a link out of the source; `a/b` now resolves to `outside/b`.
        #expect(rename(root.path + "/a", root.path + "/a-old") == 0)
        #expect(symlink(outside.path, root.path + "/a") == 0)
        let made = await failure {
            _ = try await provider.createDirectory(named: "y", in: ItemIdentifier("a/b"), permissions: 0o755)
        }
        #expect(made?.code == .invalidName)
        let uploaded = await failure {
            _ = try await provider.upload(
                from: source, to: .create(name: "g", in: ItemIdentifier("a/b")), permissions: nil,
                modificationTime: nil)
        }
        #expect(uploaded?.code == .invalidName)
        let looked = await failure { _ = try await provider.child(named: "f", of: ItemIdentifier("a/b")) }
        #expect(looked?.code == .invalidName)
        let stated = await failure { _ = try await provider.item(for: ItemIdentifier("a/b/f")) }
        #expect(stated?.code == .invalidName)
        let immediate = await failure { _ = try provider.childNow(named: "f", of: ItemIdentifier("a/b")) }
        #expect(immediate?.code == .invalidName)
        let deleted = await failure { try await provider.delete(ItemIdentifier("a/b/f"), kind: .file) }
        #expect(deleted?.code == .invalidName)
        let deferred = await failure { _ = try provider.deferCreateNow(named: "h", in: ItemIdentifier("a/b")) }
        #expect(deferred?.code == .invalidName)
        #expect(try entries(outside.path + "/b") == ["f"])
        #expect(try readFile(outside.path + "/b/f") == [9])
        // The directory itself replaced by a link: not followed (O_NOFOLLOW), as before.
        #expect(unlink(root.path + "/a") == 0)
        #expect(rename(root.path + "/a-old", root.path + "/a") == 0)
        #expect(rename(root.path + "/a/b", root.path + "/a/b-old") == 0)
        #expect(symlink(outside.path + "/b", root.path + "/a/b") == 0)
        let direct = await failure {
            _ = try await provider.createDirectory(named: "y", in: ItemIdentifier("a/b"), permissions: 0o755)
        }
        #expect(direct?.code == .wrongKind)
        #expect(try entries(outside.path + "/b") == ["f"])
    }

    @Test("a root given as a link follows the link: retargeted, the provider serves the new directory (D-425)")
    func rootLinkRetargeted() async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        try parent.write("one/d/f", [1])
        try parent.write("two/d/f", [2, 2])
        #expect(symlink(parent.path + "/one", parent.path + "/root") == 0)
        let provider = LocalDirectoryProvider(root: parent.path + "/root")
        _ = try await provider.createDirectory(named: "x", in: ItemIdentifier("d"), permissions: 0o755)
        #expect(try await provider.item(for: ItemIdentifier("d/f")).size == 1)
        #expect(unlink(parent.path + "/root") == 0)
        #expect(symlink(parent.path + "/two", parent.path + "/root") == 0)
        #expect(try await provider.item(for: ItemIdentifier("d/f")).size == 2)
        #expect(try await provider.child(named: "f", of: ItemIdentifier("d"))?.size == 2)
        _ = try await provider.createDirectory(named: "y", in: ItemIdentifier("d"), permissions: 0o755)
        #expect(try entries(parent.path + "/two/d") == ["f", "y"])
        #expect(try entries(parent.path + "/one/d") == ["f", "x"])
        // The served directory moved and the link with it: still the same directory, found anew.
        #expect(rename(parent.path + "/two", parent.path + "/three") == 0)
        #expect(unlink(parent.path + "/root") == 0)
        #expect(symlink(parent.path + "/three", parent.path + "/root") == 0)
        _ = try await provider.createDirectory(named: "z", in: ItemIdentifier("d"), permissions: 0o755)
        #expect(try entries(parent.path + "/three/d") == ["f", "y", "z"])
    }

    @Test("createSymbolicLink stores the target as given, never resolved")
    func createSymbolicLink() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a/file", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let link = try await provider.createSymbolicLink(
            named: "link", in: ItemIdentifier("a"), target: "../../nowhere")
        #expect(link.kind == .symbolicLink)
        #expect(link.symbolicLinkTarget == "../../nowhere")
        var buffer = [CChar](repeating: 0, count: 256)
        let count = readlink(root.path + "/a/link", &buffer, 255)
        #expect(
            String(decoding: buffer[0..<max(0, count)].map { UInt8(bitPattern: $0) }, as: UTF8.self) == "../../nowhere")
        #expect(try await provider.item(for: link.identifier) == link)
        let taken = await failure {
            _ = try await provider.createSymbolicLink(named: "file", in: ItemIdentifier("a"), target: "x")
        }
        #expect(taken?.code == .alreadyExists)
    }

    @Test(
        "an upload creates a file exclusively: its bytes, permissions and mtime on disk, the version item(for:) reports"
    )
    func uploadCreate() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("dir/existing", [7, 7])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let bytes = (0..<100_000).map { UInt8($0 % 253) }
        let source = try localFile(bytes, in: local)
        let time = ItemTime(seconds: 1_600_000_000, nanoseconds: 123_456_789)
        let item = try await provider.upload(
            from: source, to: .create(name: "new", in: ItemIdentifier("dir")), permissions: 0o640,
            modificationTime: time)
        #expect(item.identifier == ItemIdentifier("dir/new"))
        #expect(item.size == Int64(bytes.count))
        #expect(item.modificationTime == time)
        #expect(item.permissions == 0o640)
        #expect(try readFile(root.path + "/dir/new") == bytes)
        #expect(try #require(lstatInfo(root.path + "/dir/new")).st_mode & 0o7777 == 0o640)
        #expect(try await provider.item(for: item.identifier) == item)
        #expect(try entries(root.path + "/dir") == ["existing", "new"])

        // A taken name: nothing replaced, no staging file left.
        let taken = await failure {
            _ = try await provider.upload(
                from: source, to: .create(name: "existing", in: ItemIdentifier("dir")), permissions: nil,
                modificationTime: nil)
        }
        #expect(taken?.code == .alreadyExists)
        #expect(try readFile(root.path + "/dir/existing") == [7, 7])
        #expect(try entries(root.path + "/dir") == ["existing", "new"])

        // No permissions given: 0644. A missing local file: an I/O error, nothing created.
        let plain = try await provider.upload(
            from: source, to: .create(name: "plain", in: .root), permissions: nil, modificationTime: nil)
        #expect(plain.permissions == 0o644)
        let noSource = await failure {
            _ = try await provider.upload(
                from: local.path + "/missing", to: .create(name: "other", in: .root), permissions: nil,
                modificationTime: nil)
        }
        #expect(noSource?.code == .io)
        #expect(noSource?.errno == ENOENT)
        let noParent = await failure {
            _ = try await provider.upload(
                from: source, to: .create(name: "x", in: ItemIdentifier("gone")), permissions: nil,
                modificationTime: nil)
        }
        #expect(noParent?.code == .noSuchItem)
        #expect(try entries(root.path) == ["dir", "plain"])
    }

    @Test("an empty create is made under its name at once: exclusive, its mode and mtime, no temporary file (D-380)")
    func emptyCreate() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("dir/existing", [7, 7])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let empty = try localFile([], in: local)
        let time = ItemTime(seconds: 1_600_000_000, nanoseconds: 5)
        let item = try await provider.upload(
            from: empty, to: .create(name: "new", in: ItemIdentifier("dir")), permissions: 0o640,
            modificationTime: time)
        #expect(item.identifier == ItemIdentifier("dir/new"))
        #expect(item.size == 0)
        #expect(item.modificationTime == time)
        #expect(item.permissions == 0o640)
        let info = try #require(lstatInfo(root.path + "/dir/new"))
        #expect(info.st_mode & 0o7777 == 0o640 && info.st_size == 0)
        #expect(try await provider.item(for: item.identifier) == item)
        #expect(try entries(root.path + "/dir") == ["existing", "new"])
        // Exclusive: a taken name (a file, or a directory) is EEXIST and stays as it was.
        for taken in ["existing", "new"] {
            let refused = await failure {
                _ = try await provider.upload(
                    from: empty, to: .create(name: taken, in: ItemIdentifier("dir")), permissions: nil,
                    modificationTime: nil)
            }
            #expect(refused?.code == .alreadyExists, "\(taken)")
        }
        #expect(try readFile(root.path + "/dir/existing") == [7, 7])
        // A name that is not valid is refused before anything is made.
        let invalid = await failure {
            _ = try await provider.upload(
                from: empty, to: .create(name: "a/b", in: ItemIdentifier("dir")), permissions: nil,
                modificationTime: nil)
        }
        #expect(invalid?.code == .invalidName)
        #expect(try entries(root.path + "/dir") == ["existing", "new"])
    }

    @Test("an upload replaces a file: new bytes and version, its permissions kept, the base version checked")
    func uploadReplace() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", Array("old content".utf8))
        chmod(root.path + "/f", 0o600)
        try root.write("d/inner", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let before = try await provider.item(for: ItemIdentifier("f"))
        let source = try localFile(Array("new!".utf8), in: local)
        let after = try await provider.upload(
            from: source, to: .replace(ItemIdentifier("f"), baseVersion: before.contentVersion), permissions: nil,
            modificationTime: nil)
        #expect(after.contentVersion != before.contentVersion)
        #expect(after.permissions == 0o600)
        #expect(try readFile(root.path + "/f") == Array("new!".utf8))
        #expect(try await provider.item(for: ItemIdentifier("f")) == after)

        // The old version as base: refused, the file untouched, no staging file left.
        let other = try localFile(Array("newer".utf8), in: local, named: "other")
        let stale = await failure {
            _ = try await provider.upload(
                from: other, to: .replace(ItemIdentifier("f"), baseVersion: before.contentVersion), permissions: 0o644,
                modificationTime: nil)
        }
        #expect(stale?.code == .versionChanged)
        #expect(try readFile(root.path + "/f") == Array("new!".utf8))
        // Untouched but for its ctime (swapped out and back, D-372): the same version, mode, mtime.
        let untouched = try await provider.item(for: ItemIdentifier("f"))
        #expect(untouched.contentVersion == after.contentVersion && untouched.permissions == after.permissions)
        #expect(untouched.modificationTime == after.modificationTime)
        #expect(try entries(root.path) == ["d", "f"])

        // No base version: replaced whatever is there.
        let last = try await provider.upload(
            from: other, to: .replace(ItemIdentifier("f"), baseVersion: nil), permissions: 0o644, modificationTime: nil)
        #expect(last.permissions == 0o644)
        #expect(try readFile(root.path + "/f") == Array("newer".utf8))

        let directory = await failure {
            _ = try await provider.upload(
                from: other, to: .replace(ItemIdentifier("d"), baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        #expect(directory?.code == .wrongKind)
        let gone = await failure {
            _ = try await provider.upload(
                from: other, to: .replace(ItemIdentifier("gone"), baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        #expect(gone?.code == .noSuchItem)
        #expect(try entries(root.path) == ["d", "f"])
    }

    /// D-408: an upload that puts its directory's times back does it under the directory's entry
    /// lock, and so does every change of the directory's entries or times through the provider:
    /// an unlink made while the upload swaps the file in moves the mtime after the restore, never
    /// under it (the differential tester's seed 12769367757050257476 showed an explicit old mtime
    /// brought back over an unlink's).
    @Test func anEntryChangeDuringAReplaceKeepsItsMtime() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        mkdir(root.path + "/d", 0o755)
        try root.write("d/f", Array("old".utf8))
        try root.write("d/g", Array("doomed".utf8))
        var old = [timespec(tv_sec: 1_000_000_070, tv_nsec: 0), timespec(tv_sec: 1_000_000_070, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, root.path + "/d", &old, 0) == 0)
        var provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile(Array("new".utf8), in: local)
        let inside = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        provider.uploadHooks = UploadHooks(insideEntryLock: {
            inside.signal()
            release.wait()
        })
        let before = try await provider.item(for: ItemIdentifier("d/f"))
        // Its hook blocks its thread: off the cooperative pool (two threads on CI), where it could
        // wait behind other blocked tests and not start within the deadline (TSan, CI).
        let upload = Task(executorPreference: BlockingTestExecutor.unbounded) { [provider] in
            try await provider.upload(
                from: source, to: .replace(ItemIdentifier("d/f"), baseVersion: before.contentVersion),
                permissions: nil, modificationTime: nil)
        }
        #expect(
            await withCheckedContinuation { done in
                DispatchQueue.global().async { done.resume(returning: inside.wait(timeout: .now() + 30) == .success) }
            })
        let removed = Locked(false)
        let delete = Task { [provider] in
            try await provider.delete(ItemIdentifier("d/g"), kind: .file)
            removed.withLock { $0 = true }
        }
        // Bounded: with the lock the unlink waits for the upload's restore (it never ends here);
        // without it, it ends at once and the restore below then undoes its mtime.
        let deadline = ContinuousClock.now + .milliseconds(300)
        while !removed.withLock({ $0 }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(!removed.withLock { $0 }, "the unlink waited for the upload's entry lock")
        release.signal()
        _ = try await upload.value
        try await delete.value
        var info = stat()
        #expect(stat(root.path + "/d", &info) == 0)
        #expect(info.st_mtim.tv_sec > 1_000_000_070, "the unlink's mtime stands: \(info.st_mtim.tv_sec)")
        #expect(try readFile(root.path + "/d/f") == Array("new".utf8))
        #expect(try entries(root.path + "/d") == ["f"])
    }

    /// D-521: a directory's utimens no longer waits for the uploads into it, so one made while
    /// an upload that reads and puts back the directory's times outside the entry lock (a file
    /// system without O_TMPFILE) is between the two must stay: the restore is left out.
    @Test func aDirectorysTimesSetDuringANamedReplaceStay() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        mkdir(root.path + "/d", 0o755)
        try root.write("d/f", Array("old".utf8))
        var old = [timespec(tv_sec: 1_000_000_070, tv_nsec: 0), timespec(tv_sec: 1_000_000_070, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, root.path + "/d", &old, 0) == 0)
        var provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile(Array("new".utf8), in: local)
        let set = ItemTime(seconds: 1_200_000_000, nanoseconds: 0)
        let unchanged = provider
        provider.uploadHooks = UploadHooks(
            beforePublish: {
                _ = try? unchanged.setAttributesSync(ItemIdentifier("d"), ItemAttributeChanges(modificationTime: set))
            }, namedTemporary: true)
        let before = try await provider.item(for: ItemIdentifier("d/f"))
        _ = try await provider.upload(
            from: source, to: .replace(ItemIdentifier("d/f"), baseVersion: before.contentVersion), permissions: nil,
            modificationTime: nil)
        var info = stat()
        #expect(stat(root.path + "/d", &info) == 0)
        #expect(info.st_mtim.tv_sec == 1_200_000_000, "the utimens stands: \(info.st_mtim.tv_sec)")
        #expect(try readFile(root.path + "/d/f") == Array("new".utf8))
    }

    /// Both ways of publishing: an unnamed temporary file (O_TMPFILE) and a named one.
    @Test(
        "a replace whose file is moved, or replaced by another, just before it publishes changes nothing (D-372)",
        arguments: [false, true])
    func replaceRacingAMove(namedTemporary: Bool) async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", Array("old content".utf8))
        var provider = LocalDirectoryProvider(root: root.path)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let before = try await provider.item(for: ItemIdentifier("f"))
        let source = try localFile(Array("new!".utf8), in: local)
        // Moved after the upload looked at it, before it publishes: a plain rename would make a
        // new "f" beside the moved one.
        provider.uploadHooks = UploadHooks(
            beforePublish: { _ = rename(root.path + "/f", root.path + "/g") }, namedTemporary: namedTemporary)
        let moved = await failure {
            _ = try await provider.upload(
                from: source, to: .replace(ItemIdentifier("f"), baseVersion: before.contentVersion), permissions: nil,
                modificationTime: nil)
        }
        #expect(moved?.code == .noSuchItem, "\(String(describing: moved))")
        #expect(try entries(root.path) == ["g"], "nothing under the old name, no staging file")
        #expect(try readFile(root.path + "/g") == Array("old content".utf8))

        // Another file took the name meanwhile: swapped in, found to be another version, swapped
        // back. The other file is intact.
        try root.write("f", Array("first".utf8))
        let first = try await provider.item(for: ItemIdentifier("f"))
        provider.uploadHooks = UploadHooks(
            beforePublish: {
                _ = rename(root.path + "/f", root.path + "/h")
                try? root.write("f", Array("another file".utf8))
            }, namedTemporary: namedTemporary)
        let replaced = await failure {
            _ = try await provider.upload(
                from: source, to: .replace(ItemIdentifier("f"), baseVersion: first.contentVersion), permissions: nil,
                modificationTime: nil)
        }
        #expect(replaced?.code == .versionChanged, "\(String(describing: replaced))")
        #expect(try readFile(root.path + "/f") == Array("another file".utf8))
        #expect(try entries(root.path) == ["f", "g", "h"])

        // With nothing in the way a replace and a create go through, and leave no staging file.
        provider.uploadHooks = UploadHooks(namedTemporary: namedTemporary)
        let current = try await provider.item(for: ItemIdentifier("f"))
        let uploaded = try await provider.upload(
            from: source, to: .replace(ItemIdentifier("f"), baseVersion: current.contentVersion), permissions: 0o600,
            modificationTime: nil)
        #expect(try readFile(root.path + "/f") == Array("new!".utf8))
        #expect(uploaded.size == 4 && uploaded.permissions == 0o600)
        _ = try await provider.upload(
            from: source, to: .create(name: "c", in: .root), permissions: nil, modificationTime: nil)
        #expect(try readFile(root.path + "/c") == Array("new!".utf8))
        #expect(try entries(root.path) == ["c", "f", "g", "h"])
    }

    /// D-386: a deferred create checks the name as `.create` would and moves the directory's mtime
    /// now; its later `.create` upload keeps the directory's times (an explicit mtime set since
    /// stays), where an ordinary `.create` moves them. Only in a watched directory.
    @Test("deferCreateNow: the name checked, the directory's mtime moved now and kept by the upload")
    func deferredCreate() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let local = try TemporaryDirectory()
        defer { local.remove() }
        try FileManager.default.createDirectory(atPath: root.path + "/d", withIntermediateDirectories: false)
        try root.write("d/taken", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let d = ItemIdentifier("d")
        #expect(try provider.deferCreateNow(named: "n", in: d) == nil, "not watched yet: created at once")
        _ = try await provider.trackedChildren(of: d)
        var old = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, root.path + "/d", &old, 0) == 0)
        #expect(throws: ProviderError.self) { _ = try provider.deferCreateNow(named: "taken", in: d) }
        #expect(throws: ProviderError.self) { _ = try provider.deferCreateNow(named: "a/b", in: d) }
        let deferred = try #require(try provider.deferCreateNow(named: "n", in: d))
        #expect(deferred.identifier == ItemIdentifier("d/n"))
        #expect(try entries(root.path + "/d") == ["taken"], "nothing made at the provider")
        let touched = try #require(lstatInfo(root.path + "/d")).st_mtim.tv_sec
        #expect(touched > 1_000_000_000, "the create moved the directory's mtime")
        #expect(deferred.directory?.modificationTime.seconds == Int64(touched))
        // tar sets the directory's mtime after its files; the upload comes later and keeps it.
        var explicit = [timespec(tv_sec: 1_000_000_500, tv_nsec: 0), timespec(tv_sec: 1_000_000_500, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, root.path + "/d", &explicit, 0) == 0)
        let source = try localFile(Array("bytes".utf8), in: local)
        let created = try await provider.upload(
            from: source, to: .create(name: "n", in: d), permissions: 0o640, modificationTime: nil)
        #expect(created.identifier == deferred.identifier && created.permissions == 0o640)
        #expect(FileManager.default.contents(atPath: root.path + "/d/n").map { [UInt8]($0) } == Array("bytes".utf8))
        #expect(lstatInfo(root.path + "/d")?.st_mtim.tv_sec == 1_000_000_500)
        // An ordinary create moves it.
        _ = try await provider.upload(
            from: source, to: .create(name: "m", in: d), permissions: nil, modificationTime: nil)
        #expect((lstatInfo(root.path + "/d")?.st_mtim.tv_sec ?? 0) > 1_000_000_500)
        #expect(try entries(root.path + "/d") == ["m", "n", "taken"], "no staging file left")
    }

    @Test("an upload cancelled midway leaves nothing: no file, no staging file")
    func uploadCancelled() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([UInt8](repeating: 0x5A, count: 20 << 20), in: local)
        let reached = Locked(false)
        let proceed = DispatchSemaphore(value: 0)
        var provider = LocalDirectoryProvider(root: root.path)
        provider.uploadHooks = UploadHooks(afterCopyStep: { _ in
            let first = reached.withLock { reached -> Bool in
                defer { reached = true }
                return !reached
            }
            if first { proceed.wait() }
        })
        let uploading = provider
        let task = Task(executorPreference: BlockingTestExecutor.unbounded) {  // its hook blocks
            try await uploading.upload(
                from: source, to: .create(name: "big", in: .root), permissions: nil, modificationTime: nil)
        }
        let deadline = ContinuousClock.now + .seconds(60)
        while !reached.withLock({ $0 }) {
            try #require(ContinuousClock.now < deadline, "the upload never copied a step")
            try await Task.sleep(for: .milliseconds(5))
        }
        // The staging file exists now: unnamed (O_TMPFILE, D-386), or under a hidden name where the
        // file system has no unnamed files; never under the item's name, and never listed.
        #expect(try entries(root.path).allSatisfy { $0.hasPrefix(LocalDirectoryProvider.temporaryNamePrefix) })
        #expect(try await provider.children(of: .root).isEmpty)
        task.cancel()
        proceed.signal()
        let result = await task.result
        #expect(throws: CancellationError.self) { try result.get() }
        #expect(try entries(root.path).isEmpty)
    }

    @Test("a reader of the provider never sees a partial file while a large upload replaces it")
    func readersSeeOldOrNew() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let old = [UInt8](repeating: 0x11, count: 1 << 20)
        try root.write("f", old)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let new = (0..<(24 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        let source = try localFile(new, in: local)
        let reads = Locked((old: 0, new: 0, bad: 0))
        var provider = LocalDirectoryProvider(root: root.path)
        // Each copy step waits for a whole read of the provider, so reads interleave with staging.
        provider.uploadHooks = UploadHooks(afterCopyStep: { _ in
            let seen = reads.withLock { $0.old + $0.new }
            // (ends at the read; the bound only keeps a broken reader from hanging the test)
            let deadline = ContinuousClock.now + .seconds(60)
            while reads.withLock({ $0.old + $0.new }) == seen, ContinuousClock.now < deadline { usleep(1000) }
        })
        let reader = provider
        let done = Locked(false)
        let readerTask = Task {
            var afterDone = 0
            while afterDone < 2 {
                if done.withLock({ $0 }) { afterDone += 1 }
                do {
                    let item = try await reader.item(for: ItemIdentifier("f"))
                    let stream = try await reader.fetchContents(
                        of: item.identifier, version: item.contentVersion, range: 0..<item.size)
                    var bytes: [UInt8] = []
                    while let chunk = try await stream.next(maximumLength: 1 << 20) { bytes += chunk }
                    stream.close()
                    reads.withLock {
                        if bytes == old { $0.old += 1 } else if bytes == new { $0.new += 1 } else { $0.bad += 1 }
                    }
                } catch let error as ProviderError where error.code == .versionChanged {
                    continue
                }
            }
        }
        let item = try await provider.upload(
            from: source, to: .replace(ItemIdentifier("f"), baseVersion: nil), permissions: nil, modificationTime: nil)
        done.withLock { $0 = true }
        try await readerTask.value
        let counts = reads.withLock { $0 }
        #expect(counts.bad == 0)
        #expect(counts.old >= 2)
        #expect(counts.new >= 1)
        #expect(item.size == Int64(new.count))
        #expect(try entries(root.path) == ["f"])
    }

    @Test("delete: unlink of files and links, rmdir of empty directories, refusals by kind and content")
    func delete() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", [1])
        try root.write("full/inner", [1])
        mkdir(root.path + "/empty", 0o755)
        symlink("f", root.path + "/link")
        let provider = LocalDirectoryProvider(root: root.path)

        let fileAsDirectory = await failure { try await provider.delete(ItemIdentifier("f"), kind: .directory) }
        #expect(fileAsDirectory?.code == .wrongKind)
        #expect(fileAsDirectory?.errno == ENOTDIR)
        let directoryAsFile = await failure { try await provider.delete(ItemIdentifier("empty"), kind: .file) }
        #expect(directoryAsFile?.code == .wrongKind)
        #expect(directoryAsFile?.errno == EISDIR)
        let linkAsFile = await failure { try await provider.delete(ItemIdentifier("link"), kind: .file) }
        #expect(linkAsFile?.code == .wrongKind)
        let full = await failure { try await provider.delete(ItemIdentifier("full"), kind: .directory) }
        #expect(full?.code == .notEmpty)
        #expect(full?.errno == ENOTEMPTY)
        #expect(try entries(root.path) == ["empty", "f", "full", "link"])

        try await provider.delete(ItemIdentifier("link"), kind: .symbolicLink)
        try await provider.delete(ItemIdentifier("f"), kind: .file)
        try await provider.delete(ItemIdentifier("empty"), kind: .directory)
        try await provider.delete(ItemIdentifier("full/inner"), kind: .file)
        #expect(try entries(root.path) == ["full"])
        let gone = await failure { try await provider.delete(ItemIdentifier("f"), kind: .file) }
        #expect(gone?.code == .noSuchItem)
    }

    @Test("move: rename over a file, RENAME_NOREPLACE, RENAME_EXCHANGE, and the refusals")
    func move() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("a", Array("A".utf8))
        try root.write("b", Array("B".utf8))
        try root.write("d/inner", Array("I".utf8))
        try root.write("full/x", [1])
        mkdir(root.path + "/empty", 0o755)
        let provider = LocalDirectoryProvider(root: root.path)
        let a = try await provider.item(for: ItemIdentifier("a"))

        // NOREPLACE: refused over an existing name, nothing changed; fine to a free one.
        let taken = await failure {
            _ = try await provider.move(ItemIdentifier("a"), to: .root, named: "b", mode: .noReplace)
        }
        #expect(taken?.code == .alreadyExists)
        #expect(try readFile(root.path + "/b") == Array("B".utf8))
        let moved = try await provider.move(ItemIdentifier("a"), to: ItemIdentifier("d"), named: "a2", mode: .noReplace)
        #expect(moved.identifier == ItemIdentifier("d/a2"))
        #expect(moved.parent == ItemIdentifier("d"))
        // A rename keeps the inode: same content version.
        #expect(moved.contentVersion == a.contentVersion)
        #expect(try readFile(root.path + "/d/a2") == Array("A".utf8))
        #expect(lstatInfo(root.path + "/a") == nil)

        // EXCHANGE: both stay, swapped.
        let swapped = try await provider.move(ItemIdentifier("d/a2"), to: .root, named: "b", mode: .exchange)
        #expect(swapped.identifier == ItemIdentifier("b"))
        #expect(try readFile(root.path + "/b") == Array("A".utf8))
        #expect(try readFile(root.path + "/d/a2") == Array("B".utf8))
        let noPartner = await failure {
            _ = try await provider.move(ItemIdentifier("b"), to: .root, named: "none", mode: .exchange)
        }
        #expect(noPartner?.code == .noSuchItem)

        // Replacing: over a file; a directory over an empty one, not over a full one.
        let replaced = try await provider.move(ItemIdentifier("d/a2"), to: .root, named: "b", mode: .replacing)
        #expect(try readFile(root.path + "/b") == Array("B".utf8))
        #expect(try await provider.item(for: ItemIdentifier("b")) == replaced)
        let overFull = await failure {
            _ = try await provider.move(ItemIdentifier("d"), to: .root, named: "full", mode: .replacing)
        }
        #expect(overFull?.code == .notEmpty)
        let fileOverDirectory = await failure {
            _ = try await provider.move(ItemIdentifier("b"), to: .root, named: "empty", mode: .replacing)
        }
        #expect(fileOverDirectory?.code == .wrongKind)
        #expect(fileOverDirectory?.errno == EISDIR)
        let intoItself = await failure {
            _ = try await provider.move(ItemIdentifier("d"), to: ItemIdentifier("d"), named: "sub", mode: .replacing)
        }
        #expect(intoItself?.code == .invalidName)
        #expect(intoItself?.errno == EINVAL)
        let intoItselfNoReplace = await failure {
            _ = try await provider.move(ItemIdentifier("d"), to: ItemIdentifier("d"), named: "sub", mode: .noReplace)
        }
        #expect(intoItselfNoReplace?.code == .invalidName)
        let overEmpty = try await provider.move(ItemIdentifier("d"), to: .root, named: "empty", mode: .replacing)
        #expect(overEmpty.identifier == ItemIdentifier("empty"))
        #expect(try readFile(root.path + "/empty/inner") == Array("I".utf8))
        #expect(try entries(root.path) == ["b", "empty", "full"])
        let gone = await failure {
            _ = try await provider.move(ItemIdentifier("d"), to: .root, named: "z", mode: .replacing)
        }
        #expect(gone?.code == .noSuchItem)
    }

    @Test("setAttributesNow: declined outside a watched directory, else what setAttributes does (D-426)")
    func setAttributesNow() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("d/a", [1])
        try root.write("d/b", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        let changes = ItemAttributeChanges(
            permissions: 0o640, modificationTime: ItemTime(seconds: 1_500_000_000, nanoseconds: 7),
            accessTime: ItemTime(seconds: 1_400_000_000, nanoseconds: 0))
        // Never listed: not watched, declined, nothing changed.
        #expect(try provider.setAttributesNow(ItemIdentifier("d/a"), changes) == nil)
        #expect(try provider.setAttributesNow(.root, changes) == nil)
        #expect(try #require(lstatInfo(root.path + "/d/a")).st_mode & 0o7777 != 0o640)
        _ = try await provider.trackedChildren(of: ItemIdentifier("d"))
        let now = try #require(try provider.setAttributesNow(ItemIdentifier("d/a"), changes))
        let async = try await provider.setAttributes(ItemIdentifier("d/b"), changes)
        #expect(now.permissions == 0o640 && now.modificationTime == changes.modificationTime)
        #expect(now.permissions == async.permissions && now.modificationTime == async.modificationTime)
        #expect(now.accessTime == async.accessTime)
        #expect(try await provider.item(for: ItemIdentifier("d/a")) == now)
        // Its errors are setAttributes' own.
        let missing = await failure { _ = try provider.setAttributesNow(ItemIdentifier("d/gone"), changes) }
        #expect(missing?.code == .noSuchItem)
    }

    @Test("setAttributes: chmod and mtime stored; a link's permissions left alone, its own mtime set")
    func setAttributes() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("f", [1, 2, 3])
        symlink("f", root.path + "/link")
        let provider = LocalDirectoryProvider(root: root.path)
        let before = try await provider.item(for: ItemIdentifier("f"))
        let time = ItemTime(seconds: 1_500_000_000, nanoseconds: 42)
        let after = try await provider.setAttributes(
            ItemIdentifier("f"), ItemAttributeChanges(permissions: 0o751, modificationTime: time))
        #expect(after.permissions == 0o751)
        #expect(after.modificationTime == time)
        #expect(after.contentVersion != before.contentVersion)
        let info = try #require(lstatInfo(root.path + "/f"))
        #expect(info.st_mode & 0o7777 == 0o751)
        #expect(info.st_mtim.tv_sec == 1_500_000_000 && info.st_mtim.tv_nsec == 42)
        #expect(try await provider.item(for: ItemIdentifier("f")) == after)
        // Only the time: the permissions stay.
        let timeOnly = try await provider.setAttributes(
            ItemIdentifier("f"), ItemAttributeChanges(modificationTime: ItemTime(seconds: 5)))
        #expect(timeOnly.permissions == 0o751)

        let link = try await provider.setAttributes(
            ItemIdentifier("link"), ItemAttributeChanges(permissions: 0o600, modificationTime: ItemTime(seconds: 1_000))
        )
        #expect(link.kind == .symbolicLink)
        #expect(link.modificationTime == ItemTime(seconds: 1_000))
        // The target is untouched by either change.
        let target = try #require(lstatInfo(root.path + "/f"))
        #expect(target.st_mode & 0o7777 == 0o751)
        #expect(target.st_mtim.tv_sec == 5)
        let gone = await failure {
            _ = try await provider.setAttributes(ItemIdentifier("gone"), ItemAttributeChanges(permissions: 0o600))
        }
        #expect(gone?.code == .noSuchItem)
    }

    @Test("setuid, setgid and sticky: shown as the source stores them and stored by setAttributes (D-391)")
    func specialPermissionBits() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write("tool", [1])
        #expect(chmod(root.path + "/tool", 0o6755) == 0)
        #expect(mkdir(root.path + "/shared", 0o755) == 0 && chmod(root.path + "/shared", 0o1777) == 0)
        try root.write("plain", [2])
        #expect(chmod(root.path + "/plain", 0o644) == 0)
        let provider = LocalDirectoryProvider(root: root.path)
        #expect(try await provider.item(for: ItemIdentifier("tool")).permissions == 0o6755)
        #expect(try await provider.children(of: .root).map(\.permissions).sorted() == [0o644, 0o1777, 0o6755])
        let changed = try await provider.setAttributes(
            ItemIdentifier("plain"), ItemAttributeChanges(permissions: 0o4711))
        #expect(changed.permissions == 0o4711)
        #expect(try #require(lstatInfo(root.path + "/plain")).st_mode & 0o7777 == 0o4711)
        #expect(try await provider.item(for: ItemIdentifier("plain")).permissions == 0o4711)
    }

    @Test("staging names are never items: not listed, not looked up, not reported as changes")
    func stagingNamesHidden() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        try root.write(".providerfs-upload-leftover", [1])
        try root.write("visible", [1])
        let provider = LocalDirectoryProvider(root: root.path)
        #expect(try await provider.children(of: .root).map(\.name) == ["visible"])
        #expect(try await provider.child(named: ".providerfs-upload-leftover", of: .root) == nil)
        let item = await failure { _ = try await provider.item(for: ItemIdentifier(".providerfs-upload-leftover")) }
        #expect(item?.code == .noSuchItem)

        let seen = Locked<[ProviderChange]>([])
        provider.observeChanges { changes in seen.withLock { $0 += changes ?? [] } }
        _ = try await provider.trackedChildren(of: .root)
        let local = try TemporaryDirectory()
        defer { local.remove() }
        let source = try localFile([UInt8](repeating: 3, count: 4096), in: local)
        _ = try await provider.upload(
            from: source, to: .create(name: "published", in: .root), permissions: nil, modificationTime: nil)
        let deadline = ContinuousClock.now + .seconds(10)
        while !seen.withLock({ $0.contains(.membership(directory: .root, name: "published")) }) {
            try #require(ContinuousClock.now < deadline, "the publishing rename was never reported")
            try await Task.sleep(for: .milliseconds(5))
        }
        provider.observeChanges(nil)
        let changes = seen.withLock { $0 }
        for change in changes {
            if case .membership(_, let name) = change { #expect(!name.hasPrefix(".providerfs-upload-"), "\(change)") }
            if case .entry(_, let name) = change { #expect(!name.hasPrefix(".providerfs-upload-"), "\(change)") }
        }
    }
}

/// mkdir -p, one component at a time (each call's path fits PATH_MAX).
private func mkdirAll(_ path: String) -> Bool {
    var current = ""
    for component in path.split(separator: "/") {
        current += "/" + component
        if mkdir(current, 0o755) != 0 && errno != EEXIST { return false }
    }
    return true
}
