// Namespace changes through a writable mount (issue 14 items 4-5): mkdir, rmdir, unlink, rename
// (flags included), symlink, chmod/utimens, link, with ordinary tools and raw syscalls; each
// checks the source directory too, and the errno of every error case is compared with the same
// operation on a plain temporary directory. Presenters in another process (`providerfs present`)
// hear of deletions before they happen. A mount without PROVIDERFS_WRITES=1 refuses all of it.
// Each test runs over a local directory and the same tree served by rclone and Apache (issue 26):
// over WebDAV a symlink or a link(2) is EPERM and RENAME_EXCHANGE EINVAL (no such capabilities,
// docs/WEBDAV.md), and the served tree is checked by polling (rclone's MOVE is not atomic).

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// renameat2(2), found in libc at run time (Swift's Glibc module does not export it).
private func renameat2(_ from: String, _ to: String, flags: UInt32) -> Int32 {
    typealias Function = @convention(c) (Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32) -> Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "renameat2") else {
        errno = ENOSYS
        return -1
    }
    let function = unsafeBitCast(symbol, to: Function.self)
    return function(AT_FDCWD, from, AT_FDCWD, to, flags)
}

private let renameNoReplace: UInt32 = 1
private let renameExchange: UInt32 = 2

/// 0 or the errno of a call that returns -1 on failure.
private func outcome(_ call: () -> Int32) -> Int32 {
    errno = 0
    return call() == 0 ? 0 : errno
}

private func exists(_ path: String) -> Bool {
    var info = stat()
    return lstat(path, &info) == 0
}

/// Polls `condition` until it holds or `limit` passes (the condition is checked once more at the end).
private func eventually(_ limit: Duration = .seconds(20), _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + limit
    while ContinuousClock.now < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

private func contents(_ path: String) -> String? {
    FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
}

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct NamespaceMountTests: MountLayoutSuite {
    let layout: MountLayout
    let providerfs = productsDirectory + "/providerfs"

    init() throws {
        layout = try MountLayout(prefix: "namespace")
    }

    /// A mount of `source` over `kind` (over WebDAV polling every second, so that a file made in
    /// the served tree is seen within the test's waits).
    func mount(
        over kind: ProviderKind, writable: Bool = true, environment extra: [String: String] = [:]
    ) throws -> ServedMount {
        try layout.mount(
            over: kind,
            arguments: (writable ? [] : ["--read-only"]) + (kind == .local ? [] : ["--poll-interval", "1s"]),
            environment: extra)
    }

    /// Whether `condition` holds of the source within 60 s (at once for a local directory; over
    /// WebDAV, rclone's MOVE leaves a name missing for a moment).
    func atSource(_ condition: () -> Bool) -> Bool { eventually(.seconds(60), condition) }

    /// The tree every test starts from, made under `base` (the source, or a plain directory).
    static func makeTree(_ base: String) {
        mkdir(base + "/docs", 0o755)
        mkdir(base + "/docs/sub", 0o755)
        writeTestFile(base + "/docs/a.txt", Array("alpha\n".utf8))
        writeTestFile(base + "/docs/sub/b.txt", Array("beta\n".utf8))
        writeTestFile(base + "/top.txt", Array("top\n".utf8))
        mkdir(base + "/empty", 0o755)
        mkdir(base + "/other", 0o755)
    }

    @Test(arguments: ProviderKind.available)
    func mkdirRmdirUnlinkRenameAndSymlinkReachTheSource(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        let m = mount.path("")
        let symlinks = kind == .local
        if !symlinks {
            #expect(outcome { symlink("../top.txt", mount.path("other/link")) } == EPERM)
            #expect(!exists(mount.path("other/link")) && !exists(source + "/other/link"))
        }
        let result = try shell(
            """
            set -e
            cd \(quoted(m))
            mkdir -p new/deep/er
            rmdir new/deep/er
            mv docs/a.txt other/a-moved.txt
            mv docs/sub other/sub-moved
            \(symlinks ? "ln -s ../top.txt other/link; readlink other/link; cat other/link" : "")
            cat other/sub-moved/b.txt
            rm other/a-moved.txt
            ls -a other | tr '\\n' ' '
            """)
        #expect(result.status == 0, "\(result.output) \(result.error)")
        #expect(
            result.output == (symlinks ? "../top.txt\ntop\nbeta\n. .. link sub-moved " : "beta\n. .. sub-moved "),
            "\(result.output)")
        #expect(atSource { exists(source + "/new/deep") && !exists(source + "/new/deep/er") })
        #expect(atSource { !exists(source + "/docs/a.txt") && !exists(source + "/other/a-moved.txt") })
        #expect(atSource { !exists(source + "/docs/sub") })
        #expect(atSource { contents(source + "/other/sub-moved/b.txt") == "beta\n" })
        if symlinks {
            #expect(
                (try? FileManager.default.destinationOfSymbolicLink(atPath: source + "/other/link")) == "../top.txt")
        }
        // rm -r of a tree, then the mount and the source agree.
        let removal = try shell("rm -r \(quoted(mount.path("other"))) && ls \(quoted(m)) | tr '\\n' ' '")
        #expect(removal.status == 0, "\(removal.error)")
        #expect(removal.output == "docs empty new top.txt ", "\(removal.output)")
        #expect(atSource { !exists(source + "/other") })
    }

    @Test(arguments: ProviderKind.available)
    func everyErrorCaseAnswersTheErrnoOfAPlainDirectory(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let plain = scratch + "/plain"
        mkdir(plain, 0o755)
        Self.makeTree(plain)
        Self.makeTree(source)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        let long = String(repeating: "n", count: 256)
        let cases: [(String, (String) -> Int32)] = [
            ("mkdir existing", { mkdir($0 + "/docs", 0o755) }),
            ("mkdir in missing", { mkdir($0 + "/missing/x", 0o755) }),
            ("mkdir under a file", { mkdir($0 + "/top.txt/x", 0o755) }),
            ("mkdir long name", { mkdir($0 + "/" + long, 0o755) }),
            ("rmdir non-empty", { rmdir($0 + "/docs") }),
            ("rmdir a file", { rmdir($0 + "/top.txt") }),
            ("rmdir missing", { rmdir($0 + "/missing") }),
            ("unlink a directory", { unlink($0 + "/docs") }),
            ("unlink missing", { unlink($0 + "/missing") }),
            ("rename missing", { rename($0 + "/missing", $0 + "/x") }),
            ("rename dir over non-empty dir", { rename($0 + "/empty", $0 + "/docs") }),
            ("rename file over dir", { rename($0 + "/top.txt", $0 + "/empty") }),
            ("rename dir over file", { rename($0 + "/empty", $0 + "/top.txt") }),
            ("rename dir into itself", { rename($0 + "/docs", $0 + "/docs/sub/inside") }),
            ("rename into missing dir", { rename($0 + "/top.txt", $0 + "/missing/top.txt") }),
            ("noreplace over a file", { renameat2($0 + "/top.txt", $0 + "/docs/a.txt", flags: renameNoReplace) }),
            ("exchange with missing", { renameat2($0 + "/top.txt", $0 + "/missing", flags: renameExchange) }),
            ("both flags", { renameat2($0 + "/top.txt", $0 + "/x", flags: renameExchange | renameNoReplace) }),
            ("symlink over existing", { symlink("target", $0 + "/top.txt") }),
            ("rename dir over empty dir", { rename($0 + "/other", $0 + "/empty") }),
            ("rename file over file", { rename($0 + "/docs/a.txt", $0 + "/top.txt") }),
            ("noreplace to a new name", { renameat2($0 + "/top.txt", $0 + "/fresh.txt", flags: renameNoReplace) }),
            ("rmdir empty", { rmdir($0 + "/empty") }),
        ]
        for (name, operation) in cases {
            let expected = outcome { operation(plain) }
            let got = outcome { operation(mount.mountpoint) }
            #expect(got == expected, "\(name): the mount answered \(Errno(got)), a plain directory \(Errno(expected))")
        }
        // The successful ones changed the source as they changed the plain directory.
        let listing = { (base: String) in (try? FileManager.default.subpathsOfDirectory(atPath: base).sorted()) ?? [] }
        #expect(atSource { listing(source) == listing(plain) }, "\(listing(source)) against \(listing(plain))")
        #expect(atSource { contents(source + "/fresh.txt") == "alpha\n" })
    }

    /// The type and content of everything under `base` (symbolic links by target), for comparing
    /// two trees.
    static func snapshot(_ base: String) -> [String] {
        let paths = (try? FileManager.default.subpathsOfDirectory(atPath: base).sorted()) ?? []
        return paths.map { path in
            let full = base + "/" + path
            var info = stat()
            guard lstat(full, &info) == 0 else { return path + " ?" }
            switch info.st_mode & S_IFMT {
            case S_IFDIR: return path + "/"
            case S_IFLNK:
                return path + " -> " + ((try? FileManager.default.destinationOfSymbolicLink(atPath: full)) ?? "?")
            default: return path + " = " + (contents(full) ?? "?")
            }
        }
    }

    /// Over WebDAV the symbolic links and exchanges the sequence draws are left out (EPERM and
    /// EINVAL there, checked by the tests above); the rest is compared as locally.
    @Test(arguments: ProviderKind.available)
    func aRandomSequenceOfChangesMatchesAPlainDirectory(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let plain = scratch + "/plain"
        mkdir(plain, 0o755)
        for base in [plain, source] {
            for name in ["a", "b"] { mkdir(base + "/" + name, 0o755) }
            for (index, name) in ["f", "a/g", "b/h", "a/i"].enumerated() {
                writeTestFile(base + "/" + name, Array("content \(index)\n".utf8))
            }
        }
        let mount = try mount(over: kind)
        defer { mount.stop() }
        let seed = UInt64(environmentInteger("PROVIDERFS_NAMESPACE_SEED", default: 14))
        var random = SeededRandom(seed: seed)
        let names = ["a", "b", "c", "f", "a/g", "a/x", "b/h", "b/y", "c/z", "a/i", "b/a", "a/b/f"]
        func pick() -> String { names[Int(random.next() % UInt64(names.count))] }
        var log: [String] = []
        // 300 changes made (the draws left out over WebDAV do not count).
        var step = -1
        while log.count < 300 {
            step += 1
            let (one, two) = (pick(), pick())
            let choice = random.next() % 7
            let flags = UInt32(random.next() % 3)
            if kind != .local && (choice == 3 || flags & renameExchange != 0) { continue }
            let description: String
            let operation: (String) -> Int32
            switch choice {
            case 0:
                description = "mkdir \(one)"
                operation = { mkdir($0 + "/" + one, 0o755) }
            case 1:
                description = "rmdir \(one)"
                operation = { rmdir($0 + "/" + one) }
            case 2:
                description = "unlink \(one)"
                operation = { unlink($0 + "/" + one) }
            case 3:
                description = "symlink \(two) at \(one)"
                operation = { symlink(two, $0 + "/" + one) }
            default:
                description = "rename \(one) \(two) flags \(flags)"
                operation = { renameat2($0 + "/" + one, $0 + "/" + two, flags: flags) }
            }
            let expected = outcome { operation(plain) }
            let got = outcome { operation(mount.mountpoint) }
            log.append("\(step) \(description): \(Errno(expected))")
            guard got == expected else {
                Issue.record(
                    "seed \(seed), step \(step) \(description): the mount answered \(Errno(got)), a plain directory \(Errno(expected))\n\(log.suffix(10).joined(separator: "\n"))"
                )
                return
            }
        }
        // The sequence really changed the tree (not only errors).
        let succeeded = log.count { $0.hasSuffix(": \(Errno(0))") }
        #expect(succeeded >= 30, "only \(succeeded) of \(log.count) changes succeeded (seed \(seed))")
        let plainTree = Self.snapshot(plain)
        #expect(atSource { Self.snapshot(source) == plainTree }, "the source after the sequence (seed \(seed))")
        #expect(Self.snapshot(mount.mountpoint) == plainTree, "the mount after the sequence (seed \(seed))")
    }

    @Test(arguments: ProviderKind.available)
    func renameat2ExchangesAndRefusesToReplace(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        #expect(
            outcome { renameat2(mount.path("top.txt"), mount.path("docs/a.txt"), flags: renameNoReplace) } == EEXIST)
        #expect(contents(source + "/top.txt") == "top\n")
        let exchanged = outcome { renameat2(mount.path("top.txt"), mount.path("docs/a.txt"), flags: renameExchange) }
        // A provider that cannot exchange answers EINVAL, as a file system without the flag: a
        // local directory exchanges, WebDAV cannot.
        #expect(exchanged == (kind == .local ? 0 : EINVAL))
        if exchanged == 0 {
            #expect(atSource { contents(source + "/top.txt") == "alpha\n" })
            #expect(atSource { contents(source + "/docs/a.txt") == "top\n" })
            #expect(contents(mount.path("top.txt")) == "alpha\n")
            #expect(contents(mount.path("docs/a.txt")) == "top\n")
        } else {
            #expect(exchanged == EINVAL)
            #expect(contents(source + "/top.txt") == "top\n")
        }
        #expect(outcome { renameat2(mount.path("top.txt"), mount.path("fresh.txt"), flags: renameNoReplace) } == 0)
        #expect(atSource { exists(source + "/fresh.txt") && !exists(source + "/top.txt") })
    }

    @Test(arguments: ProviderKind.available)
    func openFilesKeepTheirBytesWhenUnlinkedOrReplaced(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let big = patternBytes(count: 5 << 20, seed: 21)
        writeTestFile(source + "/big.bin", big)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        func readAll(_ fd: Int32) -> [UInt8] {
            var result: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count <= 0 { return result }
                result += buffer[0..<count]
            }
        }
        let fd = open(mount.path("big.bin"), O_RDONLY | O_CLOEXEC)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(unlink(mount.path("big.bin")) == 0)
        #expect(atSource { !exists(source + "/big.bin") } && !exists(mount.path("big.bin")))
        // Compared as one Bool: a failed comparison of two 5 MiB arrays makes the test library
        // compute their difference for a very long time.
        let readBack = readAll(fd)
        let same = readBack == big
        #expect(same, "the unlinked file reads whole through its descriptor: \(readBack.count) of \(big.count) bytes")
        var info = stat()
        #expect(fstat(fd, &info) == 0 && info.st_size == Int64(big.count) && info.st_nlink == 0)

        let old = open(mount.path("docs/a.txt"), O_RDONLY | O_CLOEXEC)
        #expect(old >= 0)
        defer { close(old) }
        #expect(rename(mount.path("top.txt"), mount.path("docs/a.txt")) == 0)
        #expect(String(decoding: readAll(old), as: UTF8.self) == "alpha\n")
        #expect(contents(mount.path("docs/a.txt")) == "top\n")
        #expect(atSource { contents(source + "/docs/a.txt") == "top\n" })
    }

    @Test(arguments: ProviderKind.available)
    func aFileOpenInAnotherProcessIsRemovedAtOnceAndStaysReadableThere(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        // A claim deadline far beyond the test's bound: rm must not wait for the reader's claim.
        let mount = try mount(over: kind, environment: ["PROVIDERFS_CLAIM_TIMEOUT": "120s"])
        defer { mount.stop() }
        let go = scratch + "/go"
        let out = scratch + "/out"
        let reader = try ChildProcess(
            "/bin/sh",
            [
                "-c",
                "exec 3< \(quoted(mount.path("docs/a.txt"))); touch \(quoted(scratch + "/opened")); "
                    + "i=0; while [ ! -e \(quoted(go)) ]; do i=$((i+1)); [ $i -gt 2000 ] && exit 9; sleep 0.01; done; "
                    + "cat <&3 > \(quoted(out))",
            ])
        defer {
            if reader.wait(timeout: .seconds(30)) == nil {
                reader.signal(SIGKILL)
                reader.wait(timeout: .seconds(5))
            }
        }
        #expect(eventually { exists(scratch + "/opened") })
        let start = ContinuousClock.now
        #expect(unlink(mount.path("docs/a.txt")) == 0, "\(Errno.current)")
        #expect(ContinuousClock.now - start < .seconds(20), "rm waited for the reader's claim")
        #expect(rename(mount.path("docs"), mount.path("moved")) == 0)
        writeTestFile(go, [])
        #expect(reader.wait(timeout: .seconds(30)) == 0)
        #expect(contents(out) == "alpha\n")
        #expect(atSource { !exists(source + "/docs/a.txt") && exists(source + "/moved/sub/b.txt") })
    }

    /// Over WebDAV chmod and utimens are kept by the mount, and link(2) and chown to another owner
    /// are EPERM (no hard links, no owners at the server: docs/WEBDAV.md "Metadata").
    @Test(arguments: ProviderKind.available)
    func chmodAndUtimensShowInStatAndLinkMakesASecondName(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        #expect(chmod(mount.path("top.txt"), 0o600) == 0)
        var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 1_234_567, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, mount.path("top.txt"), &times, 0) == 0)
        var info = stat()
        #expect(stat(mount.path("top.txt"), &info) == 0)
        #expect(info.st_mode & 0o7777 == 0o600)
        #expect(info.st_mtim.tv_sec == 1_234_567)
        guard kind == .local else {
            #expect(outcome { link(mount.path("top.txt"), mount.path("hard")) } == EPERM)
            #expect(!exists(mount.path("hard")) && !exists(source + "/hard"))
            #expect(outcome { chown(mount.path("top.txt"), 12345, 12346) } == EPERM)
            #expect(stat(mount.path("top.txt"), &info) == 0 && info.st_uid == geteuid())
            return
        }
        // link(2) (D-396): one file under two names, at the mount and at the source; a
        // directory's is EPERM, a taken name EEXIST.
        #expect(outcome { link(mount.path("top.txt"), mount.path("hard")) } == 0)
        var linked = stat()
        #expect(stat(mount.path("top.txt"), &info) == 0 && stat(mount.path("hard"), &linked) == 0)
        #expect(info.st_ino == linked.st_ino && info.st_nlink == 2 && linked.st_nlink == 2)
        #expect(linked.st_mode & 0o7777 == 0o600)
        var sourceOne = stat()
        var sourceOther = stat()
        #expect(stat(source + "/top.txt", &sourceOne) == 0 && stat(source + "/hard", &sourceOther) == 0)
        #expect(sourceOne.st_ino == sourceOther.st_ino && sourceOne.st_nlink == 2)
        #expect(outcome { link(mount.path("other"), mount.path("hard-dir")) } == EPERM)
        #expect(outcome { link(mount.path("top.txt"), mount.path("hard")) } == EEXIST)
        // A daemon run by root keeps owners at the source (D-397); any other: every node the
        // mounting user's, chown to another EPERM.
        if geteuid() == 0 {
            #expect(chown(mount.path("top.txt"), 12345, 12346) == 0)
            #expect(stat(mount.path("top.txt"), &info) == 0 && info.st_uid == 12345 && info.st_gid == 12346)
            #expect(stat(source + "/top.txt", &info) == 0 && info.st_uid == 12345 && info.st_gid == 12346)
        } else {
            #expect(outcome { chown(mount.path("top.txt"), 12345, 12345) } == EPERM)
        }
    }

    @Test(arguments: ProviderKind.available)
    func aPresenterHearsOfTheDeletionBeforeTheFileIsGoneAndOfAMove(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let mount = try mount(over: kind)
        defer { mount.stop() }
        let environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        let watched = mount.path("docs/a.txt")
        let presenter = try ChildProcess(providerfs, ["present", watched], environment: environment)
        defer {
            presenter.signal(SIGTERM)
            if presenter.wait(timeout: .seconds(10)) == nil {
                presenter.signal(SIGKILL)
                presenter.wait(timeout: .seconds(5))
            }
        }
        #expect(
            eventually { presenter.standardOutput.contains(#""event":"ready""#) || !presenter.isRunning }
                && presenter.standardOutput.contains(#""event":"ready""#), "\(presenter.standardError)")
        // The presenter wrote its line before it answered, and rm's claim waited for the answer:
        // the line is there the moment rm returns.
        let removal = try shell("rm \(quoted(watched))")
        #expect(removal.status == 0, "\(removal.error)")
        #expect(presenter.standardOutput.contains("accommodatePresentedItemDeletion"), "\(presenter.standardOutput)")
        #expect(atSource { !exists(source + "/docs/a.txt") })

        // A directory presenter hears of a move inside it.
        let directory = try ChildProcess(providerfs, ["present", mount.path("docs")], environment: environment)
        defer {
            directory.signal(SIGTERM)
            if directory.wait(timeout: .seconds(10)) == nil {
                directory.signal(SIGKILL)
                directory.wait(timeout: .seconds(5))
            }
        }
        #expect(
            eventually { directory.standardOutput.contains(#""event":"ready""#) || !directory.isRunning }
                && directory.standardOutput.contains(#""event":"ready""#), "\(directory.standardError)")
        // A subitem moved out of it (subitem deletions are told only to package presenters, rule 22).
        writeTestFile(source + "/docs/c.txt", Array("gamma\n".utf8))
        mount.adopt("docs/c.txt")
        #expect(eventually(.seconds(60)) { exists(mount.path("docs/c.txt")) })
        #expect(rename(mount.path("docs/c.txt"), mount.path("other/c.txt")) == 0)
        #expect(
            eventually { directory.standardOutput.contains("presentedSubitemDidMove") }, "\(directory.standardOutput)")
        #expect(rename(mount.path("docs"), mount.path("renamed")) == 0)
        #expect(
            eventually { directory.standardOutput.contains("presentedItemDidMove") }, "\(directory.standardOutput)")
        #expect(directory.standardOutput.contains(mount.path("renamed")))
        #expect(atSource { exists(source + "/renamed/sub/b.txt") && exists(source + "/other/c.txt") })
    }

    @Test(arguments: ProviderKind.available)
    func aMountWithoutWritesRefusesEveryChangeWithEROFS(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        Self.makeTree(source)
        let mount = try mount(over: kind, writable: false)
        defer { mount.stop() }
        let m = mount.mountpoint
        let changes: [(String, () -> Int32)] = [
            ("mkdir", { mkdir(m + "/new", 0o755) }),
            ("rmdir", { rmdir(m + "/empty") }),
            ("unlink", { unlink(m + "/top.txt") }),
            ("rename", { rename(m + "/top.txt", m + "/other/top.txt") }),
            ("renameat2", { renameat2(m + "/top.txt", m + "/x", flags: renameNoReplace) }),
            ("symlink", { symlink("top.txt", m + "/link") }),
            ("link", { link(m + "/top.txt", m + "/hard") }),
            ("chmod", { chmod(m + "/top.txt", 0o600) }),
        ]
        for (name, change) in changes { #expect(outcome(change) == EROFS, "\(name)") }
        #expect(exists(source + "/top.txt") && exists(source + "/empty") && !exists(source + "/new"))
    }
}
