// Big directories (D-470 to D-472): a directory of thousands of entries lists as the source has
// it, with the same d_ino in every listing and in stat; READDIRPLUS gives the kernel the entries'
// attributes, so stat after a listing sends no LOOKUP; a kept listing is served by the kernel and
// still shows a change in the source at once. Requests are counted in libfuse's trace
// (PROVIDERFS_FUSE_DEBUG=1), as in KernelCacheMountTests.

import Foundation
import SystemSupport
import TestScheduling
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One entry as readdir(3) shows it.
struct ListedName: Hashable {
    var name: String
    var inode: UInt64
    var type: UInt8
}

/// Every entry of `path` but "." and "..", read with opendir/readdir.
func readDirectoryEntries(_ path: String) -> [ListedName]? {
    guard let directory = opendir(path) else { return nil }
    defer { closedir(directory) }
    var result: [ListedName] = []
    while let entry = readdir(directory) {
        let name = withUnsafePointer(to: &entry.pointee.d_name) {
            $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
        }
        if name == "." || name == ".." { continue }
        result.append(ListedName(name: name, inode: UInt64(entry.pointee.d_ino), type: entry.pointee.d_type))
    }
    return result
}

@Suite(.serialized, .enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct BigDirectoryMountTests: MountLayoutSuite {
    let layout: MountLayout
    static let files = 3000

    init() throws {
        layout = try MountLayout(prefix: "bigdir")
        mkdir(source + "/big", 0o755)
        for index in 0..<Self.files {
            writeTestFile(source + "/big/file-\(index).txt", Array(repeating: UInt8(ascii: "x"), count: index % 97))
        }
        for index in 0..<20 { mkdir(source + "/big/dir-\(index)", 0o755) }
        for index in 0..<10 { symlink("file-\(index).txt", source + "/big/link-\(index)") }
    }

    func mount(trace: Bool = false) throws -> MountedFileSystem {
        try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache],
            environment: ["PROVIDERFS_RUNTIME_DIR": runtime].merging(
                trace ? ["PROVIDERFS_FUSE_DEBUG": "1"] : [:], uniquingKeysWith: { $1 }))
    }

    func requests(_ mount: MountedFileSystem, _ pattern: String) -> Int {
        mount.child.standardError.split(separator: "\n").count { $0.contains(pattern) }
    }

    /// Waits until the trace has every request made so far (a marker getxattr of the root shows up).
    func settleTrace(_ mount: MountedFileSystem) throws {
        let marker = "opcode: GETXATTR (22), nodeid: 1,"
        let before = requests(mount, marker)
        _ = try shell("getfattr -n user.providerfs.state \(quoted(mount.mountpoint)) 2>&1")
        #expect(waitUntil(.seconds(10)) { requests(mount, marker) > before }, "the marker reached the trace")
    }

    @Test func aDirectoryOfThousandsOfEntriesListsAsTheSourceWithStableNumbers() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let expected = try #require(readDirectoryEntries(source + "/big"))
        let first = try #require(readDirectoryEntries(mount.path("big")))
        let second = try #require(readDirectoryEntries(mount.path("big")))
        #expect(first.count == expected.count)
        #expect(Set(first.map(\.name)) == Set(expected.map(\.name)))
        #expect(Set(first.map(\.name)).count == first.count, "no name listed twice")
        let sourceTypes = Dictionary(uniqueKeysWithValues: expected.map { ($0.name, $0.type) })
        #expect(first.allSatisfy { sourceTypes[$0.name] == $0.type }, "d_type as in the source")
        // The same d_ino in both listings, and it is what stat shows (through READDIRPLUS's
        // attributes or a LOOKUP).
        #expect(Set(first) == Set(second))
        for entry in first {
            var info = stat()
            #expect(lstat(mount.path("big/" + entry.name), &info) == 0)
            #expect(UInt64(info.st_ino) == entry.inode, "\(entry.name): d_ino is st_ino")
            var sourceInfo = stat()
            #expect(lstat(source + "/big/" + entry.name, &sourceInfo) == 0)
            if info.st_mode & S_IFMT == S_IFREG {
                #expect(info.st_size == sourceInfo.st_size, "\(entry.name): size as in the source")
            }
            #expect(info.st_mode & S_IFMT == sourceInfo.st_mode & S_IFMT, "\(entry.name): kind as in the source")
        }
        // Numbers are distinct (one per item).
        #expect(Set(first.map(\.inode)).count == first.count)
    }

    @Test func statAfterAListingSendsNoLookupOfItsEntries() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(trace: true)
        defer { mount.stop() }
        let directory = try nodeNumber(mount.path("big"))
        try settleTrace(mount)
        let lookups = requests(mount, "opcode: LOOKUP (1), nodeid: \(directory),")
        // `ls -l`'s pattern (coreutils 9): each name is stat'ed as readdir(3) gives it, so the
        // names of one getdents buffer are stat'ed before the next is read.
        let listing = try #require(opendir(mount.path("big")))
        var listed = 0
        var sizes = 0
        while let entry = readdir(listing) {
            let name = withUnsafePointer(to: &entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
            }
            if name == "." || name == ".." { continue }
            var info = stat()
            #expect(lstat(mount.path("big/" + name), &info) == 0)
            #expect(UInt64(info.st_ino) == UInt64(entry.pointee.d_ino), "\(name): d_ino is st_ino")
            sizes += Int(info.st_size)
            listed += 1
        }
        closedir(listing)
        #expect(listed == Self.files + 30)
        #expect(sizes > 0)
        try settleTrace(mount)
        let after = requests(mount, "opcode: LOOKUP (1), nodeid: \(directory),")
        // Every entry came with its attributes (the kernel asks for READDIRPLUS once its caller
        // stat'ed an entry, D-487): none is looked up (a few may be, where the kernel let go of
        // a node under memory pressure; far fewer than the thousands listed).
        #expect(requests(mount, "opcode: READDIRPLUS (44), nodeid: \(directory),") > 1)
        #expect(after - lookups < listed / 10, "lookups after the listing: \(after - lookups)")
    }

    @Test func aListingNobodyStatsIsReadWithoutAttributes() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(trace: true)
        defer { mount.stop() }
        let directory = try nodeNumber(mount.path("big"))
        // `ls -f`, `find`: names only. After the first request the kernel asks for plain READDIR
        // (D-487): no node and no attributes for names nobody stats.
        let listed = try #require(readDirectoryEntries(mount.path("big")))
        #expect(listed.count == Self.files + 30)
        try settleTrace(mount)
        let plus = requests(mount, "opcode: READDIRPLUS (44), nodeid: \(directory),")
        let plain = requests(mount, "opcode: READDIR (28), nodeid: \(directory),")
        #expect(plus <= 1, "READDIRPLUS only for the listing's first request")
        #expect(plain > 0, "the rest as plain READDIR")
    }

    @Test func aKeptListingIsServedByTheKernelAndShowsASourceChangeAtOnce() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(trace: true)
        defer { mount.stop() }
        let big = mount.path("big")
        #expect(readDirectoryEntries(big)?.count == Self.files + 30)
        #expect(readDirectoryEntries(big)?.count == Self.files + 30)
        try settleTrace(mount)
        let directory = try nodeNumber(big)
        func listingRequests() -> Int {
            requests(mount, "opcode: READDIR (28), nodeid: \(directory),")
                + requests(mount, "opcode: READDIRPLUS (44), nodeid: \(directory),")
        }
        let before = listingRequests()
        #expect(readDirectoryEntries(big)?.count == Self.files + 30)
        try settleTrace(mount)
        #expect(listingRequests() == before, "a kept listing is read from the kernel's cache")
        // A file created in the source, then one removed: each listing after shows it (the
        // provider's change invalidates the kept listing; nothing waits for a timeout).
        writeTestFile(source + "/big/new-file.txt", Array("new\n".utf8))
        #expect(
            waitUntil(.seconds(3)) { readDirectoryEntries(big)?.contains { $0.name == "new-file.txt" } == true },
            "a file created in the source is listed")
        #expect(unlink(source + "/big/file-7.txt") == 0)
        #expect(
            waitUntil(.seconds(3)) { readDirectoryEntries(big)?.contains { $0.name == "file-7.txt" } == false },
            "a file removed from the source is not listed")
        #expect(readDirectoryEntries(big)?.count == Self.files + 30)
    }
}
