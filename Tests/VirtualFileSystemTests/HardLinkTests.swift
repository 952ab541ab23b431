import Foundation
import ProviderCache
import ProviderFSCommands
import ProviderModel
import SystemSupport
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A writable file system over `source`, as `providerfs mount --writable` composes it.
private func writableFileSystem(_ source: TemporaryDirectory, _ cache: TemporaryDirectory) throws -> ProviderFileSystem
{
    var options = FileSystemOptions()
    options.writable = true
    return try MountComposition.makeFileSystem(source: source.path, cacheDirectory: cache.path, options: options)
}

/// The source's `path` as lstat sees it.
private func sourceStat(_ source: TemporaryDirectory, _ path: String) -> stat? {
    var info = stat()
    return lstat(source.path + "/" + path, &info) == 0 ? info : nil
}

private func sourceText(_ source: TemporaryDirectory, _ path: String) -> String? {
    (try? Data(contentsOf: URL(fileURLWithPath: source.path + "/" + path))).map { String(decoding: $0, as: UTF8.self) }
}

/// Opens `inode` for writing (O_TRUNC), writes `text`, flushes and releases: close(2) publishes.
private func overwrite(_ fileSystem: ProviderFileSystem, _ inode: InodeNumber, _ text: String) async throws {
    let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: O_WRONLY | O_TRUNC), context: .kernel)
    _ = try await fileSystem.write(inode, handle: opened.handle, offset: 0, data: Array(text.utf8), context: .kernel)
    try await fileSystem.flush(inode, handle: opened.handle, context: .kernel)
    await fileSystem.release(inode, handle: opened.handle)
}

private func text(_ fileSystem: ProviderFileSystem, _ path: String) async throws -> String {
    String(decoding: try await readAll(fileSystem, try await resolve(fileSystem, path).inode), as: UTF8.self)
}

/// Waits until nothing is left to upload (real time, bounded).
private func settled(_ fileSystem: ProviderFileSystem) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(20)
    while ContinuousClock.now < deadline {
        if fileSystem.cache.writes.pendingUploads.isEmpty { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return false
}

@Suite("Hard links through the mount over a local directory (D-396)", .timeLimit(.minutes(3)))
struct HardLinkTests {
    @Test("link(2) makes the link at the source; both names are one node, one st_ino, nlink 2, one content")
    func linkSharesTheFile() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("hello\n".utf8))
        try source.write("d/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        let d = try await resolve(fileSystem, "d")
        #expect(a.attributes.linkCount == 1)

        let b = try await fileSystem.makeHardLink(a.inode, newParent: d.inode, newName: "b", context: .kernel)
        #expect(b.inode == a.inode)
        #expect(b.attributes.serialNumber == a.attributes.serialNumber)
        #expect(b.attributes.linkCount == 2)
        let aAgain = try await fileSystem.getAttributes(a.inode, context: .kernel)
        #expect(aAgain.linkCount == 2)
        let looked = try await resolve(fileSystem, "d/b")
        #expect(looked.inode == a.inode)
        #expect(looked.attributes.serialNumber == a.attributes.serialNumber)
        #expect(looked.attributes.linkCount == 2)
        // At the source: one inode under both names.
        let sourceA = try #require(sourceStat(source, "a"))
        let sourceB = try #require(sourceStat(source, "d/b"))
        #expect(sourceA.st_ino == sourceB.st_ino)
        #expect(sourceA.st_nlink == 2)
        #expect(try await text(fileSystem, "d/b") == "hello\n")

        // Bytes written through one name are the other's, through the mount and at the source,
        // and the link survives the upload.
        try await overwrite(fileSystem, looked.inode, "written through b\n")
        #expect(try await text(fileSystem, "a") == "written through b\n")
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "a") == "written through b\n")
        #expect(sourceText(source, "d/b") == "written through b\n")
        #expect(sourceStat(source, "a")?.st_ino == sourceStat(source, "d/b")?.st_ino)
        #expect(sourceStat(source, "a")?.st_nlink == 2)
        #expect(try await resolve(fileSystem, "a").attributes.size == 18)
        #expect(try await resolve(fileSystem, "d/b").attributes.size == 18)
        await fileSystem.shutdown()
    }

    @Test("unlink of either name leaves the other (and the node) intact; nlink falls; the last removes the file")
    func unlinkEitherName() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("one\n".utf8))
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "b", context: .kernel)
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "c", context: .kernel)
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).linkCount == 3)

        // The name the node was resolved through goes: the node carries on under another.
        try await fileSystem.unlink(parent: .root, name: "a", context: .kernel)
        #expect(await failureErrno { _ = try await resolve(fileSystem, "a") } == .noSuchFileOrDirectory)
        let node = try await fileSystem.getAttributes(a.inode, context: .kernel)
        #expect(node.linkCount == 2)
        #expect(node.serialNumber == a.attributes.serialNumber)
        #expect(String(decoding: try await readAll(fileSystem, a.inode), as: UTF8.self) == "one\n")
        #expect(try await resolve(fileSystem, "b").inode == a.inode)
        #expect(sourceStat(source, "a") == nil)
        #expect(sourceStat(source, "b")?.st_nlink == 2)

        // Written through the node after its first name went: the file under the other names.
        try await overwrite(fileSystem, a.inode, "two\n")
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "b") == "two\n")
        #expect(sourceText(source, "c") == "two\n")

        try await fileSystem.unlink(parent: .root, name: "c", context: .kernel)
        let b = try await resolve(fileSystem, "b")
        #expect(b.attributes.linkCount == 1)
        #expect(b.attributes.serialNumber == a.attributes.serialNumber)
        #expect(try await text(fileSystem, "b") == "two\n")
        try await fileSystem.unlink(parent: .root, name: "b", context: .kernel)
        #expect(sourceStat(source, "b") == nil)
        // The last name gone: the node answers as an unlinked file.
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).linkCount == 0)
        await fileSystem.shutdown()
    }

    @Test("rename of one name keeps the link, the node and the number")
    func renameOneName() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("x\n".utf8))
        try source.write("d/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        let d = try await resolve(fileSystem, "d")
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "b", context: .kernel)
        try await fileSystem.rename(
            parent: .root, name: "a", newParent: d.inode, newName: "moved", flags: 0, context: .kernel)
        let moved = try await resolve(fileSystem, "d/moved")
        let b = try await resolve(fileSystem, "b")
        #expect(moved.inode == a.inode)
        #expect(b.inode == a.inode)
        #expect(moved.attributes.serialNumber == a.attributes.serialNumber)
        #expect(b.attributes.linkCount == 2)
        #expect(sourceStat(source, "d/moved")?.st_ino == sourceStat(source, "b")?.st_ino)
        try await fileSystem.unlink(parent: .root, name: "b", context: .kernel)
        #expect(try await resolve(fileSystem, "d/moved").attributes.linkCount == 1)
        #expect(try await text(fileSystem, "d/moved") == "x\n")
        await fileSystem.shutdown()
    }

    @Test("a file created through the mount and not uploaded yet is made at the source, then linked, bytes kept")
    func linkOfAnUnbornFile() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        let fileSystem = try writableFileSystem(source, cache)
        let (created, opened) = try await fileSystem.create(
            parent: .root, name: "new", permissions: 0o444, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            created.inode, handle: opened.handle, offset: 0, data: Array("fresh bytes\n".utf8), context: .kernel)
        try await fileSystem.flush(created.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(created.inode, handle: opened.handle)
        let linked = try await fileSystem.makeHardLink(
            created.inode, newParent: .root, newName: "other", context: .kernel)
        #expect(linked.inode == created.inode)
        #expect(linked.attributes.linkCount == 2)
        #expect(try await text(fileSystem, "other") == "fresh bytes\n")
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "new") == "fresh bytes\n")
        #expect(sourceText(source, "other") == "fresh bytes\n")
        #expect(sourceStat(source, "new")?.st_ino == sourceStat(source, "other")?.st_ino)
        #expect(sourceStat(source, "other").map { $0.st_mode & 0o777 } == 0o444)
        await fileSystem.shutdown()
    }

    @Test("maildir delivery: write a new file, link it elsewhere, unlink the first name: the bytes stay")
    func linkThenUnlinkKeepsTheBytes() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("tmp/keep", [])
        try source.write("new/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let tmp = try await resolve(fileSystem, "tmp")
        let new = try await resolve(fileSystem, "new")
        for round in 0..<20 {
            let name = "message\(round)"
            let (created, opened) = try await fileSystem.create(
                parent: tmp.inode, name: name, permissions: 0o600, flags: OpenFlags(rawValue: O_WRONLY),
                context: .kernel)
            _ = try await fileSystem.write(
                created.inode, handle: opened.handle, offset: 0, data: Array("body \(round)\n".utf8),
                context: .kernel)
            try await fileSystem.flush(created.inode, handle: opened.handle, context: .kernel)
            await fileSystem.release(created.inode, handle: opened.handle)
            _ = try await fileSystem.makeHardLink(created.inode, newParent: new.inode, newName: name, context: .kernel)
            try await fileSystem.unlink(parent: tmp.inode, name: name, context: .kernel)
            #expect(try await text(fileSystem, "new/\(name)") == "body \(round)\n")
        }
        #expect(await settled(fileSystem))
        for round in 0..<20 {
            #expect(sourceText(source, "new/message\(round)") == "body \(round)\n", "round \(round)")
            #expect(sourceStat(source, "tmp/message\(round)") == nil)
        }
        await fileSystem.shutdown()
    }

    @Test("bytes written through one name and not uploaded yet reach the other names when that name is unlinked")
    func unlinkRightAfterAWrite() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("old\n".utf8))
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "b", context: .kernel)
        for round in 0..<10 {
            try await overwrite(fileSystem, a.inode, "round \(round)\n")
            let (name, other) = round % 2 == 0 ? ("a", "b") : ("b", "a")
            try await fileSystem.unlink(parent: .root, name: name, context: .kernel)
            #expect(try await text(fileSystem, other) == "round \(round)\n")
            _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: name, context: .kernel)
        }
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "a") == "round 9\n")
        #expect(sourceText(source, "b") == "round 9\n")
        #expect(sourceStat(source, "a")?.st_ino == sourceStat(source, "b")?.st_ino)
        await fileSystem.shutdown()
    }

    @Test("a write handle open when its name is unlinked writes on into the file the other names keep")
    func writerOutlivesItsName() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("0123".utf8))
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "b", context: .kernel)
        let opened = try await fileSystem.open(a.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            a.inode, handle: opened.handle, offset: 4, data: Array("45".utf8), context: .kernel)
        try await fileSystem.unlink(parent: .root, name: "a", context: .kernel)
        _ = try await fileSystem.write(
            a.inode, handle: opened.handle, offset: 6, data: Array("67".utf8), context: .kernel)
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).size == 8)
        try await fileSystem.flush(a.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(a.inode, handle: opened.handle)
        #expect(try await text(fileSystem, "b") == "01234567")
        #expect(try await fileSystem.getAttributes(a.inode, context: .kernel).linkCount == 1)
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "b") == "01234567")
        #expect(sourceStat(source, "a") == nil)
        await fileSystem.shutdown()
    }

    @Test("a file just linked, truncated through one name and written through the other, keeps the last bytes")
    func truncateThroughOneNameWriteThroughTheOther() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a/c/keep", [])
        try source.write("b/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let b = try await resolve(fileSystem, "b")
        let c = try await resolve(fileSystem, "a/c")
        let (created, opened) = try await fileSystem.create(
            parent: b.inode, name: "h", permissions: 0o755, flags: OpenFlags(rawValue: O_RDWR), context: .kernel)
        _ = try await fileSystem.write(
            created.inode, handle: opened.handle, offset: 0, data: [UInt8](repeating: 7, count: 61256),
            context: .kernel)
        try await fileSystem.flush(created.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(created.inode, handle: opened.handle)
        _ = try await fileSystem.makeHardLink(created.inode, newParent: c.inode, newName: "l", context: .kernel)
        let l = try await resolve(fileSystem, "a/c/l")
        let truncating = try await fileSystem.open(
            l.inode, flags: OpenFlags(rawValue: O_RDWR | O_TRUNC), context: .kernel)
        try await fileSystem.flush(l.inode, handle: truncating.handle, context: .kernel)
        await fileSystem.release(l.inode, handle: truncating.handle)
        let h = try await resolve(fileSystem, "b/h")
        let writing = try await fileSystem.open(h.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            h.inode, handle: writing.handle, offset: 3154, data: [UInt8](repeating: 9, count: 9412), context: .kernel)
        try await fileSystem.flush(h.inode, handle: writing.handle, context: .kernel)
        await fileSystem.release(h.inode, handle: writing.handle)
        let expected = [UInt8](repeating: 0, count: 3154) + [UInt8](repeating: 9, count: 9412)
        #expect(try await readAll(fileSystem, try await resolve(fileSystem, "b/h").inode) == expected)
        #expect(try await readAll(fileSystem, try await resolve(fileSystem, "a/c/l").inode) == expected)
        #expect(await settled(fileSystem))
        #expect(try Array(Data(contentsOf: URL(fileURLWithPath: source.path + "/b/h"))) == expected)
        #expect(try Array(Data(contentsOf: URL(fileURLWithPath: source.path + "/a/c/l"))) == expected)
        await fileSystem.shutdown()
    }

    @Test(
        "the kernel forgets the node while an edit waits for its upload: another name's new node reads the edit, and writes on from it"
    )
    func anotherNameAfterTheNodeWasForgotten() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("b/h", Array("old\n".utf8))
        try source.write("a/c/keep", [])
        var options = FileSystemOptions()
        options.writable = true
        // The uploads wait for the shutdown's flush: the edits stay local until then.
        options.cache.uploadSettle = .seconds(600)
        options.cache.maximumUploadSettle = .seconds(600)
        options.cache.shutdownFlush = .seconds(20)
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cache.path, options: options)
        let h = try await resolve(fileSystem, "b/h")
        let c = try await resolve(fileSystem, "a/c")
        _ = try await fileSystem.makeHardLink(h.inode, newParent: c.inode, newName: "l", context: .kernel)

        // Written through the node (its item: b/h), then forgotten by the kernel (no handle, no
        // dentry left): a lookup of the other name makes a new node, which must show the edit.
        try await overwrite(fileSystem, h.inode, "first edit\n")
        fileSystem.forget(h.inode, count: .max)
        let l = try await resolve(fileSystem, "a/c/l")
        #expect(l.attributes.size == 11)
        #expect(String(decoding: try await readAll(fileSystem, l.inode), as: UTF8.self) == "first edit\n")
        #expect(try await resolve(fileSystem, "b/h").inode == l.inode)

        // Once more, the new node made by a listing of the other name's directory this time.
        try await overwrite(fileSystem, l.inode, "second edit\n")
        fileSystem.forget(l.inode, count: .max)
        let directory = try await fileSystem.openDirectory(c.inode, context: .kernel)
        let listed = try await fileSystem.readDirectory(
            c.inode, handle: directory, after: 0, limit: 100, context: .kernel)
        fileSystem.releaseDirectory(c.inode, handle: directory)
        #expect(listed.map(\.name) == [".", "..", "keep", "l"])
        let again = try await resolve(fileSystem, "a/c/l")
        #expect(String(decoding: try await readAll(fileSystem, again.inode), as: UTF8.self) == "second edit\n")

        // A write through that name starts from the edit: one file at the source, no conflict copy.
        let writing = try await fileSystem.open(again.inode, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            again.inode, handle: writing.handle, offset: 12, data: Array("third\n".utf8), context: .kernel)
        try await fileSystem.flush(again.inode, handle: writing.handle, context: .kernel)
        await fileSystem.release(again.inode, handle: writing.handle)
        #expect(try await text(fileSystem, "b/h") == "second edit\nthird\n")
        await fileSystem.shutdown()
        #expect(sourceText(source, "b/h") == "second edit\nthird\n")
        #expect(sourceText(source, "a/c/l") == "second edit\nthird\n")
        #expect(sourceStat(source, "b/h")?.st_ino == sourceStat(source, "a/c/l")?.st_ino)
        #expect(try FileManager.default.contentsOfDirectory(atPath: source.path + "/b") == ["h"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: source.path + "/a/c").sorted() == ["keep", "l"])
    }

    @Test("uploads through one name, then the other (the node forgotten between): each name reads the last bytes")
    func uploadsThroughEitherNameSupersedeEachOther() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("b/h", Array("old\n".utf8))
        try source.write("a/c/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let h = try await resolve(fileSystem, "b/h")
        let c = try await resolve(fileSystem, "a/c")
        _ = try await fileSystem.makeHardLink(h.inode, newParent: c.inode, newName: "l", context: .kernel)
        // Written and uploaded through b/h (the node's item), then the kernel forgets the node.
        try await overwrite(fileSystem, h.inode, "through h, a longer text\n")
        #expect(await settled(fileSystem))
        fileSystem.forget(h.inode, count: .max)
        // A new node by the other name (no edit waits: its item is a/c/l's), written and uploaded.
        let l = try await resolve(fileSystem, "a/c/l")
        #expect(try await text(fileSystem, "a/c/l") == "through h, a longer text\n")
        try await overwrite(fileSystem, l.inode, "through l\n")
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "b/h") == "through l\n")
        fileSystem.forget(l.inode, count: .max)
        // b/h's own upload is older than the file's bytes now: looked up anew, it reads them.
        let again = try await resolve(fileSystem, "b/h")
        #expect(again.attributes.size == 10)
        #expect(try await text(fileSystem, "b/h") == "through l\n")
        #expect(try await text(fileSystem, "a/c/l") == "through l\n")
        await fileSystem.shutdown()
    }

    @Test(
        "a writer whose name a rename replaces (its fsynced bytes uploaded first) writes on under the other name, no conflict"
    )
    func writerOutlivesANameReplacedByARename() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("f", Array("old".utf8))
        try source.write("x", Array("other".utf8))
        try source.write("b/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let f = try await resolve(fileSystem, "f")
        let b = try await resolve(fileSystem, "b")
        _ = try await fileSystem.makeHardLink(f.inode, newParent: b.inode, newName: "h", context: .kernel)
        let writer = try await fileSystem.open(f.inode, flags: OpenFlags(rawValue: O_RDWR), context: .kernel)
        _ = try await fileSystem.write(
            f.inode, handle: writer.handle, offset: 0, data: Array("0123456789".utf8), context: .kernel)
        try await fileSystem.fsync(f.inode, handle: writer.handle, dataOnly: false, context: .kernel)
        // x replaces f: f's upload ends first, the writer goes on under b/h.
        try await fileSystem.rename(
            parent: .root, name: "x", newParent: .root, newName: "f", flags: 0, context: .kernel)
        _ = try await fileSystem.write(
            f.inode, handle: writer.handle, offset: 10, data: Array("ab".utf8), context: .kernel)
        try await fileSystem.flush(f.inode, handle: writer.handle, context: .kernel)
        await fileSystem.release(f.inode, handle: writer.handle)
        #expect(try await text(fileSystem, "b/h") == "0123456789ab")
        #expect(await settled(fileSystem))
        #expect(sourceText(source, "b/h") == "0123456789ab")
        #expect(sourceText(source, "f") == "other")
        #expect(try FileManager.default.contentsOfDirectory(atPath: source.path + "/b").sorted() == ["h", "keep"])
        await fileSystem.shutdown()
    }

    @Test("links made at the source show as one file: one node, one st_ino, nlink the names; kept across a remount")
    func sourceMadeLinksAndRemount() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("shared\n".utf8))
        try source.write("d/keep", [])
        #expect(link(source.path + "/a", source.path + "/d/b") == 0)
        var fileSystem = try writableFileSystem(source, cache)
        let b = try await resolve(fileSystem, "d/b")
        let a = try await resolve(fileSystem, "a")
        let keep = try await resolve(fileSystem, "d/keep")
        #expect(a.inode == b.inode)
        #expect(a.attributes.serialNumber == b.attributes.serialNumber)
        #expect(keep.attributes.serialNumber != a.attributes.serialNumber)
        #expect(a.attributes.linkCount == 2)
        #expect(try await text(fileSystem, "d/b") == "shared\n")
        // One more through the mount.
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "c", context: .kernel)
        let number = a.attributes.serialNumber
        await fileSystem.shutdown()

        fileSystem = try writableFileSystem(source, cache)
        for path in ["a", "d/b", "c"] {
            let entry = try await resolve(fileSystem, path)
            #expect(entry.attributes.serialNumber == number, "\(path)")
            #expect(entry.attributes.linkCount == 3, "\(path)")
        }
        #expect(try await resolve(fileSystem, "c").inode == (try await resolve(fileSystem, "a").inode))
        await fileSystem.shutdown()
    }

    @Test("a link made while an edit of the file waits to upload shows the edit under the new name")
    func aLinkMadeWhileAnEditWaitsShowsTheEdit() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("hello\n".utf8))
        var options = FileSystemOptions()
        options.writable = true
        options.cache.uploadSettle = .seconds(30)  // the edit waits to upload for the whole test
        options.cache.maximumUploadSettle = .seconds(30)
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cache.path, options: options)
        let a = try await resolve(fileSystem, "a")
        _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "l", context: .kernel)
        try await overwrite(fileSystem, a.inode, "a longer edit\n")
        #expect(sourceText(source, "a") == "hello\n", "not uploaded yet")
        let b = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "b", context: .kernel)
        #expect(b.attributes.size == 14, "the link's reply")
        #expect(try await resolve(fileSystem, "b").attributes.size == 14, "a lookup of the new name")
        #expect(try await text(fileSystem, "b") == "a longer edit\n")
        #expect(try await resolve(fileSystem, "l").attributes.size == 14)
    }

    @Test("a utimens through one name of a file made through the mount reaches readdirplus of another name")
    func aTimeSetThroughOneNameShowsInAListingOfAnother() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("d/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        // Made through the mount: the name "f" holds the file's local version.
        let (created, opened) = try await fileSystem.create(
            parent: .root, name: "f", permissions: 0o644, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        _ = try await fileSystem.write(
            created.inode, handle: opened.handle, offset: 0, data: Array("bytes\n".utf8), context: .kernel)
        try await fileSystem.flush(created.inode, handle: opened.handle, context: .kernel)
        await fileSystem.release(created.inode, handle: opened.handle)
        let d = try await resolve(fileSystem, "d")
        _ = try await fileSystem.makeHardLink(created.inode, newParent: d.inode, newName: "l", context: .kernel)
        #expect(await settled(fileSystem))
        // d's listing is held by the catalog before the change.
        #expect(try await listAll(fileSystem, d.inode).map(\.name).filter { !$0.hasPrefix(".") } == ["keep", "l"])

        // Another file made through the mount, exchanged with "f" (RENAME_EXCHANGE): the file
        // goes by "g" now, with its local version.
        let (other, otherOpened) = try await fileSystem.create(
            parent: .root, name: "g", permissions: 0o600, flags: OpenFlags(rawValue: O_WRONLY), context: .kernel)
        await fileSystem.release(other.inode, handle: otherOpened.handle)
        try await fileSystem.rename(
            parent: .root, name: "g", newParent: .root, newName: "f", flags: 2, context: .kernel)
        #expect(try await resolve(fileSystem, "g").inode == created.inode)

        let set = Timestamp(seconds: 1_000_000_838)
        _ = try await fileSystem.setAttributes(
            created.inode, changes: AttributeChanges(modificationTime: set), handle: nil, context: .kernel)
        // The kernel forgets the node (its names' dentries were invalidated by the change).
        fileSystem.forget(created.inode, count: .max)
        let sourceTime =
            try FileManager.default.attributesOfItem(atPath: source.path + "/d/l")[.modificationDate] as? Date
        #expect(sourceTime.map { Int64($0.timeIntervalSince1970) } == set.seconds)

        let handle = try await fileSystem.openDirectory(d.inode, context: .kernel)
        defer { fileSystem.releaseDirectory(d.inode, handle: handle) }
        let entries = try await fileSystem.readDirectoryPlus(
            d.inode, handle: handle, after: 0, limit: 100, context: .kernel)
        let l = try #require(entries.first { $0.entry.name == "l" })
        // Either no attributes (the kernel looks the name up) or the ones just set: never the
        // record from before the change.
        if let lookup = l.lookup {
            #expect(lookup.attributes.modificationTime == set, "readdirplus's attributes of d/l")
        }
        #expect(try await resolve(fileSystem, "d/l").attributes.modificationTime == set, "a lookup of d/l")
        await fileSystem.shutdown()
    }

    @Test("link errors: a directory EPERM, a taken name EEXIST, a file as directory ENOTDIR, read-only EROFS")
    func linkErrors() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("a", Array("a\n".utf8))
        try source.write("taken", [])
        try source.write("d/keep", [])
        let fileSystem = try writableFileSystem(source, cache)
        let a = try await resolve(fileSystem, "a")
        let d = try await resolve(fileSystem, "d")
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeHardLink(d.inode, newParent: .root, newName: "e", context: .kernel)
            } == .notPermitted)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeHardLink(a.inode, newParent: .root, newName: "taken", context: .kernel)
            } == .fileExists)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeHardLink(a.inode, newParent: a.inode, newName: "x", context: .kernel)
            } == .notDirectory)
        #expect(sourceStat(source, "e") == nil)
        #expect(sourceStat(source, "a")?.st_nlink == 1)
        #expect(try await resolve(fileSystem, "a").attributes.linkCount == 1)
        await fileSystem.shutdown()

        let readOnly = try MountComposition.makeFileSystem(source: source.path, cacheDirectory: cache.path)
        let node = try await resolve(readOnly, "a")
        #expect(
            await failureErrno {
                _ = try await readOnly.makeHardLink(node.inode, newParent: .root, newName: "b", context: .kernel)
            } == .readOnlyFileSystem)
        await readOnly.shutdown()
    }

    @Test("a provider without hard links answers EPERM, as vfat")
    func providerWithoutHardLinks() async throws {
        let fixture = try VFSFixture(options: VFSFixture.writableOptions())
        fixture.provider.putFile("f", .bytes([1]))
        let fileSystem = try fixture.makeFileSystem()
        let f = try await fileSystem.lookup(parent: .root, name: "f", context: .kernel)
        #expect(
            await failureErrno {
                _ = try await fileSystem.makeHardLink(f.inode, newParent: .root, newName: "g", context: .kernel)
            } == .notPermitted)
        #expect(
            await failureErrno { _ = try await fileSystem.lookup(parent: .root, name: "g", context: .kernel) }
                == .noSuchFileOrDirectory)
    }
}
