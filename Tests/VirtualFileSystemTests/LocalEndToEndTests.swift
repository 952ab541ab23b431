import ProviderCache
import ProviderFSCommands
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import VirtualFileSystem

#if canImport(Glibc)
import Glibc
#endif

/// A small helper that walks a path with lookups, like the kernel does.
func resolve(_ fileSystem: ProviderFileSystem, _ path: String) async throws -> Entry {
    var inode = InodeNumber.root
    var entry: Entry?
    for component in path.split(separator: "/") {
        let found = try await fileSystem.lookup(parent: inode, name: String(component), context: .kernel)
        inode = found.inode
        entry = found
    }
    return entry!
}

/// Reads a whole file through open/read/release, in `chunk`-sized reads.
func readAll(_ fileSystem: ProviderFileSystem, _ inode: InodeNumber, chunk: Int = 128 << 10) async throws -> [UInt8] {
    let opened = try await fileSystem.open(inode, flags: OpenFlags(rawValue: 0), context: .kernel)
    var result: [UInt8] = []
    while true {
        let data = try await fileSystem.read(
            inode, handle: opened.handle, offset: Int64(result.count), count: chunk, context: .kernel)
        if data.count == 0 { break }
        result += data.bytes
    }
    await fileSystem.release(inode, handle: opened.handle)
    return result
}

@Suite("ProviderFileSystem over a local directory")
struct LocalEndToEndTests {
    @Test("list, stat and read a local source; the source is never modified")
    func listStatRead() async throws {
        let source = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            source.remove()
            cacheDirectory.remove()
        }
        let big = rampBytes(seed: 7, offset: 0, count: 3 << 20 + 123)
        try source.write("docs/readme.txt", Array("hello\n".utf8))
        try source.write("docs/nested/big.bin", big)
        try source.write("name with spaces ü.txt", Array("unicode\n".utf8))
        var before = stat()
        stat(source.path + "/docs/nested/big.bin", &before)

        let fileSystem = try MountComposition.makeFileSystem(source: source.path, cacheDirectory: cacheDirectory.path)
        let directory = try await fileSystem.openDirectory(.root, context: .kernel)
        let names = try await fileSystem.readDirectory(.root, handle: directory, after: 0, limit: 100, context: .kernel)
            .map(\.name)
        fileSystem.releaseDirectory(.root, handle: directory)
        #expect(names == [".", "..", "docs", "name with spaces ü.txt"])

        let entry = try await resolve(fileSystem, "docs/nested/big.bin")
        #expect(entry.attributes.size == Int64(big.count))
        #expect(entry.attributes.blocks == 0)
        #expect(entry.attributes.type == .regular)
        #expect(entry.attributes.permissions & 0o222 == 0)

        let state = try await fileSystem.getExtendedAttribute(
            entry.inode, name: "user.providerfs.state", context: .kernel)
        #expect(String(decoding: state, as: UTF8.self) == "dataless")

        let bytes = try await readAll(fileSystem, entry.inode)
        #expect(byteDifference(bytes, big) == nil)
        let status = try await fileSystem.status(ofPath: "docs/nested/big.bin")
        #expect(status.presentBytes == Int64(big.count))
        let attributes = try await fileSystem.getAttributes(entry.inode, context: .kernel)
        #expect(attributes.blocks > 0)

        var after = stat()
        stat(source.path + "/docs/nested/big.bin", &after)
        // The mtime compared as its bytes: this file imports ProviderFSCommands, whose CFuse3 also
        // declares timespec, and member access would need that import (MemberImportVisibility).
        let unchanged =
            withUnsafeBytes(of: before.st_mtim) { Array($0) } == withUnsafeBytes(of: after.st_mtim) { Array($0) }
        #expect(unchanged && before.st_size == after.st_size)
        await fileSystem.shutdown()
    }

    @Test("a restart keeps metadata and materialized content; served with the source gone")
    func restartServesOffline() async throws {
        let parent = try TemporaryDirectory()
        let cacheDirectory = try TemporaryDirectory()
        defer {
            parent.remove()
            cacheDirectory.remove()
        }
        let sourcePath = parent.path + "/source"
        let content = rampBytes(seed: 3, offset: 0, count: 300_000)
        try writeFile(sourcePath + "/dir/kept.bin", content)
        try writeFile(sourcePath + "/dir/partial.bin", rampBytes(seed: 4, offset: 0, count: 200_000))

        var options = FileSystemOptions()
        options.cache.backgroundCompletion = false
        options.cache.readAheadWindow = 0
        do {
            let fileSystem = try MountComposition.makeFileSystem(
                source: sourcePath, cacheDirectory: cacheDirectory.path, options: options)
            let kept = try await resolve(fileSystem, "dir/kept.bin")
            #expect(byteDifference(try await readAll(fileSystem, kept.inode), content) == nil)
            let partial = try await resolve(fileSystem, "dir/partial.bin")
            let opened = try await fileSystem.open(partial.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
            _ = try await fileSystem.read(
                partial.inode, handle: opened.handle, offset: 0, count: 4096, context: .kernel)
            await fileSystem.release(partial.inode, handle: opened.handle)
            await fileSystem.shutdown()
        }
        let restarted = try MountComposition.makeFileSystem(
            source: sourcePath, cacheDirectory: cacheDirectory.path, options: options)
        // The "server" goes away after the restart: the source directory is renamed.
        #expect(rename(sourcePath, parent.path + "/moved") == 0)
        let status = try await restarted.status(ofPath: "dir/kept.bin")
        #expect(status.state == .materialized)
        let partialStatus = try await restarted.status(ofPath: "dir/partial.bin")
        #expect(partialStatus.state == .partial)
        #expect(partialStatus.presentBytes >= 4096 && partialStatus.presentBytes < 200_000)
        let kept = try await resolve(restarted, "dir/kept.bin")
        #expect(byteDifference(try await readAll(restarted, kept.inode), content) == nil)
        // Not local and the provider is unreachable: ENETUNREACH, at once.
        let partial = try await resolve(restarted, "dir/partial.bin")
        let opened = try await restarted.open(partial.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let error = await #expect(throws: FileSystemError.self) {
            _ = try await restarted.read(
                partial.inode, handle: opened.handle, offset: 150_000, count: 4096, context: .kernel)
        }
        #expect(error?.errno == .networkUnreachable)
        await restarted.release(partial.inode, handle: opened.handle)
        await restarted.shutdown()
    }
}

// Generating the demo source is CPU-bound for minutes under ThreadSanitizer: off the pool.
@Suite("Demo through the file system", .blockingThreads)
struct DemoFileSystemTests {
    @Test("the demo mounts: README reads, the 1 GiB file answers a far read at once, the failing item gives EIO")
    func demo() async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        var options = FileSystemOptions()
        options.cache.retryDelay = .zero
        let (fileSystem, demo) = try MountComposition.makeDemo(
            demoDirectory: parent.path + "/demo", cacheDirectory: parent.path + "/cache", options: options)
        #expect(demo.faults.count == 1)
        let readme = try await resolve(fileSystem, "README.txt")
        #expect(String(decoding: try await readAll(fileSystem, readme.inode), as: UTF8.self).hasPrefix("Welcome"))

        let sparse = try await resolve(fileSystem, "Large/sparse-1GiB.bin")
        #expect(sparse.attributes.size == 1 << 30)
        let opened = try await fileSystem.open(sparse.inode, flags: OpenFlags(rawValue: 0), context: .kernel)
        let marker = try await fileSystem.read(
            sparse.inode, handle: opened.handle, offset: 5 << 26, count: 64, context: .kernel)
        #expect(String(decoding: marker.bytes, as: UTF8.self).hasPrefix("ProviderFS demo: block 5 of 16"))
        await fileSystem.release(sparse.inode, handle: opened.handle)

        let failing = try await resolve(fileSystem, DemoSource.failingItem)
        do {
            _ = try await readAll(fileSystem, failing.inode, chunk: 1 << 20)
            Issue.record("the failing item read to the end")
        } catch let error as FileSystemError {
            #expect(error.errno == .ioError)
        }
        let message = try await fileSystem.getExtendedAttribute(
            failing.inode, name: "user.providerfs.error", context: .kernel)
        #expect(String(decoding: message, as: UTF8.self).hasPrefix("EIO: "))
        await fileSystem.shutdown()
    }
}
