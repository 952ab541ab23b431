// `providerfs mount --source DIR` end to end: the real binary, the provider-backed file system,
// ordinary tools. The source is a temp directory; the cache is private to each test.

import FUSEAdapter
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct ProviderMountTests: MountLayoutSuite {
    let layout: MountLayout

    init() throws {
        layout = try MountLayout(prefix: "provider")
        mkdir(source + "/docs", 0o755)
        mkdir(source + "/docs/nested", 0o755)
        writeTestFile(source + "/hello.txt", Array("hello, provider\n".utf8))
        writeTestFile(source + "/docs/name with spaces.txt", Array("spaces\n".utf8))
        writeTestFile(source + "/docs/ünïcødé.txt", Array("unicode\n".utf8))
        writeTestFile(source + "/docs/nested/" + String(repeating: "l", count: 255), Array("long\n".utf8))
        writeTestFile(source + "/big.bin", patternBytes(count: 6 << 20, seed: 7))
        writeTestFile(source + "/other.bin", patternBytes(count: 1 << 20, seed: 8))
    }

    func mount(_ extra: [String] = []) throws -> MountedFileSystem {
        try MountedFileSystem.providerfs(
            ["--source", source, "--cache", cache] + extra, environment: ["PROVIDERFS_RUNTIME_DIR": runtime])
    }

    func state(_ path: String) -> String? {
        guard case .success(let bytes) = ExtendedAttributes.value("user.providerfs.state", of: path) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test func listingShowsPlaceholdersWithRealSizesAndNothingIsDownloaded() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let s = quoted(source)
        let listing = try shell("cd \(m) && find . | LC_ALL=C sort")
        let expected = try shell("cd \(s) && find . | LC_ALL=C sort")
        #expect(listing.status == 0)
        #expect(listing.output == expected.output)
        let format = "stat -c '%n %s %Y %F'"
        #expect(
            try shell("cd \(m) && \(format) big.bin hello.txt docs/*.txt").output
                == (try shell("cd \(s) && \(format) big.bin hello.txt docs/*.txt").output))
        #expect(try shell("ls -lR \(m) > /dev/null").status == 0)
        // Listing and stat fetched no content: every file is still a placeholder.
        for file in ["big.bin", "hello.txt", "docs/name with spaces.txt"] {
            #expect(state(mount.path(file)) == "dataless", "\(file)")
        }
        #expect(try shell("stat -c %b \(m)/big.bin").output == "0\n", "a placeholder has no local blocks")
    }

    /// The access-path namespace through the kernel (docs/SEMANTICS.md, "Scoped access paths"):
    /// the daemon's file system has it; no token can be granted here (that needs `token grant`).
    @Test func scopedDirectoryIsHiddenUnlistableAndRefusesBadTokens() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let listing = try shell("ls -a \(m)")
        #expect(listing.status == 0 && listing.output.contains("hello.txt"))
        #expect(!listing.output.contains(".scoped"))
        #expect(try shell("stat -c %F:%a \(m)/.scoped").output == "directory:111\n")
        let list = try shell("ls \(m)/.scoped 2>&1")
        #expect(list.status != 0 && list.output.contains("Permission denied"), "\(list.output)")
        let bad = try shell("cat \(m)/.scoped/pfs_notatoken/hello.txt 2>&1")
        #expect(bad.status != 0 && bad.output.contains("Permission denied"), "\(bad.output)")
        #expect(try shell("cat \(m)/hello.txt").output == "hello, provider\n")
    }

    @Test func ftsBasedWalksSeeEverySubdirectory() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        // FileManager's enumerator uses fts, which trusts a directory link count of 2 to mean "no
        // subdirectories": the mount must not claim that for folders that have some.
        func walk(_ root: String) -> [String] {
            var paths: [String] = []
            let enumerator = FileManager.default.enumerator(atPath: root)
            while let path = enumerator?.nextObject() as? String { paths.append(path) }
            return paths.sorted()
        }
        let expected = walk(source)
        #expect(expected.contains("docs/nested/" + String(repeating: "l", count: 255)))
        #expect(walk(mount.mountpoint) == expected)
        #expect(try shell("stat -c %h \(quoted(mount.path("docs")))").output == "1\n")
    }

    @Test func contentMatchesTheSourceWithOrdinaryTools() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let s = quoted(source)
        for (skip, count) in [(5000, 3), (0, 1), (6143, 1), (1024, 100)] {
            let ours = try shell("dd if=\(m)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            let theirs = try shell("dd if=\(s)/big.bin bs=1024 skip=\(skip) count=\(count) status=none | sha256sum")
            #expect(ours.output == theirs.output, "dd skip=\(skip) count=\(count)")
        }
        let script = """
            import os, random, sys
            random.seed(11)
            a = open(sys.argv[1] + '/other.bin', 'rb'); b = open(sys.argv[2] + '/other.bin', 'rb')
            size = os.path.getsize(sys.argv[2] + '/other.bin')
            for _ in range(200):
                off = random.randrange(0, size + 10); n = random.randrange(1, 70000)
                a.seek(off); b.seek(off)
                if a.read(n) != b.read(n): print('mismatch', off, n); sys.exit(1)
            print('ok')
            """
        #expect(try shell("python3 -c \(quoted(script)) \(m) \(s)").output == "ok\n")
        let files = "big.bin hello.txt other.bin 'docs/name with spaces.txt' docs/ünïcødé.txt"
        #expect(
            try shell("cd \(m) && sha256sum \(files)").output == (try shell("cd \(s) && sha256sum \(files)").output))
        #expect(try shell("cat \(m)/hello.txt").output == "hello, provider\n")
        #expect(
            try shell("cp \(m)/big.bin \(quoted(scratch))/copy && cmp \(s)/big.bin \(quoted(scratch))/copy").status == 0
        )
        #expect(state(mount.path("hello.txt")) == "materialized")
        #expect(try shell("getfattr -d \(m)/hello.txt").output.contains("user.providerfs.state=\"materialized\""))
    }

    @Test func twoReadersAtOnceGetTheSameBytes() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        let result = try shell(
            "sha256sum \(m)/big.bin > \(quoted(scratch))/one & sha256sum \(m)/big.bin > \(quoted(scratch))/two & wait; "
                + "cat \(quoted(scratch))/one \(quoted(scratch))/two")
        let expected = try shell("sha256sum \(quoted(source))/big.bin").output.split(separator: " ").first!
        let lines = result.output.split(separator: "\n")
        #expect(lines.count == 2)
        #expect(lines.allSatisfy { $0.hasPrefix(expected) })
    }

    @Test func writesFailWithEROFSOnAReadOnlyMountAndTheSourceIsUntouched() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount(["--read-only"])
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        for command in [
            "echo x > \(m)/new.txt", "echo x >> \(m)/hello.txt", "mkdir \(m)/dir", "mv \(m)/hello.txt \(m)/x.txt",
            "rm \(m)/hello.txt", "touch \(m)/hello.txt", "truncate -s 0 \(m)/hello.txt",
        ] {
            let result = try shell(command)
            #expect(result.status != 0, "\(command)")
            #expect(result.error.contains("Read-only file system"), "\(command): \(result.error)")
        }
        #expect(try shell("cat \(quoted(source))/hello.txt").output == "hello, provider\n")
        #expect(access(source + "/new.txt", F_OK) != 0)
        // Read-only for the kernel itself, so EROFS does not depend on who asks: an ordinary
        // user's create would otherwise meet the r-x modes first and get EACCES.
        let options = try shell("findmnt -n -o OPTIONS --target \(m)").output
        #expect(options.split(separator: ",").first == "ro", "\(options)")
    }

    @Test func sourceChangesWhileMountedAreSeenAndAVanishedItemFailsFast() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try mount()
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        #expect(try shell("ls \(m)").output.contains("other.bin"))
        // Gone on the provider after it was listed: ENOENT (docs/SEMANTICS.md), never a hang.
        unlink(source + "/other.bin")
        writeTestFile(source + "/added.txt", Array("added later\n".utf8))
        usleep(2_500_000)  // past the 1 s entry/attribute timeouts and the listing refresh interval
        let start = ContinuousClock.now
        let vanished = try shell("cat \(m)/other.bin > /dev/null", timeout: .seconds(30))
        #expect(vanished.status != 0)
        #expect(vanished.error.contains("No such file or directory"), "\(vanished.error)")
        #expect(ContinuousClock.now - start < .seconds(10))
        #expect(try shell("cat \(m)/added.txt").output == "added later\n")
    }

    @Test func aRestartKeepsMaterializedItemsAndServesThemWithoutTheSource() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let expected = try shell("sha256sum < \(quoted(source))/big.bin").output
        do {
            let first = try mount()
            defer { first.stop() }
            #expect(try shell("sha256sum < \(quoted(first.path("big.bin")))").output == expected)
            #expect(state(first.path("big.bin")) == "materialized")
            #expect(first.stop() == 0)
        }
        let second = try mount()
        defer { second.stop() }
        // The provider goes away while mounted: materialized items are still served from the cache.
        #expect(rename(source, source + ".away") == 0)
        defer { rename(source + ".away", source) }
        #expect(state(second.path("big.bin")) == "materialized")
        #expect(try shell("sha256sum < \(quoted(second.path("big.bin")))").output == expected)
        #expect(try shell("ls \(quoted(second.mountpoint))").output.contains("hello.txt"))
        // An item that was never downloaded fails with an error, not a hang.
        let missing = try shell("cat \(quoted(second.path("other.bin"))) > /dev/null", timeout: .seconds(30))
        #expect(missing.status != 0)
    }

    @Test func backgroundMountStatusDownloadAndUnmount() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        let providerfsPath = productsDirectory + "/providerfs"
        let environment = ["PROVIDERFS_RUNTIME_DIR": runtime]
        // Through a pipe: if the daemon kept the pipe open, `cat` would never see EOF.
        let start = ContinuousClock.now
        let mounted = try ChildProcess.run(
            "/bin/sh",
            [
                "-c",
                "\(quoted(providerfsPath)) mount --source \(quoted(source)) \(quoted(mountpoint)) --cache \(quoted(cache)) | cat",
            ],
            environment: environment, timeout: .seconds(60))
        defer {
            if MountTable.entry(at: mountpoint) != nil {
                _ = try? providerfs(["unmount", mountpoint, "--lazy"], runtime: runtime)
                _ = try? shell("fusermount3 -uz \(quoted(mountpoint))")
            }
        }
        #expect(ContinuousClock.now - start < .seconds(30))
        #expect(mounted.status == 0, "\(mounted)")
        #expect(mounted.output.contains("Mounted \(source) at \(mountpoint)"))
        #expect(mounted.output.contains("providerfs unmount \(mountpoint)"))
        #expect(MountTable.entry(at: mountpoint)?.fileSystemType == "fuse.providerfs")

        let list = try providerfs(["status", "--json"], runtime: runtime)
        let records = try JSONSerialization.jsonObject(with: Data(list.output.utf8)) as? [[String: Any]] ?? []
        #expect(records.count == 1)
        let pid = (records.first?["pid"] as? Int).map(Int32.init) ?? 0
        #expect(records.first?["state"] as? String == "running")
        #expect(records.first?["mountpoint"] as? String == mountpoint)
        #expect(kill(pid, 0) == 0)
        let logFile = records.first?["logFile"] as? String ?? ""
        #expect(access(logFile, R_OK) == 0)

        let before = try providerfs(["status", mountpoint + "/big.bin"], runtime: runtime)
        #expect(before.status == 0)
        #expect(before.output.contains("state:    dataless"), "\(before.output)")
        let download = try providerfs(["download", mountpoint + "/big.bin"], runtime: runtime)
        #expect(download.status == 0, "\(download)")
        #expect(download.output.contains("100%"))
        let after = try providerfs(["status", mountpoint + "/big.bin", "--json"], runtime: runtime)
        #expect(after.output.contains("\"state\":\"materialized\""), "\(after.output)")

        let unmount = try providerfs(["unmount", mountpoint], runtime: runtime)
        #expect(unmount.status == 0, "\(unmount)")
        #expect(MountTable.entry(at: mountpoint) == nil)
        #expect(!processExists(pid), "the daemon exited before unmount returned")
        #expect(try providerfs(["status", "--json"], runtime: runtime).output == "[]\n")
    }

    @Test func mountTypeFuseProviderfsAndAnFstabLineWork() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        // mount(8) runs mount.fuse3 with PATH=/usr/local/sbin:/usr/local/bin:…, so the binary must
        // be in /usr/local/bin: link it there for this test unless something else is installed.
        let installed = "/usr/local/bin/providerfs"
        var linked = false
        if access(installed, F_OK) != 0 {
            #expect(symlink(productsDirectory + "/providerfs", installed) == 0)
            linked = true
        } else if canonicalPath(installed) != canonicalPath(productsDirectory + "/providerfs") {
            Issue.record("\(installed) exists and is not this build; the test would exercise another binary")
            return
        }
        defer { if linked { unlink(installed) } }
        let mountpoint = scratch + "/mnt"
        mkdir(mountpoint, 0o755)
        let environment = "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime))"
        let helper = try shell(
            "\(environment) mount -t fuse.providerfs \(quoted(source)) \(quoted(mountpoint)) -o cache=\(quoted(cache)),noatime"
        )
        defer { _ = try? shell("fusermount3 -uz \(quoted(mountpoint)) 2>/dev/null") }
        #expect(helper.status == 0, "\(helper)")
        #expect(MountTable.entry(at: mountpoint)?.fileSystemType == "fuse.providerfs")
        #expect(try shell("cat \(quoted(mountpoint))/hello.txt").output == "hello, provider\n")
        // Writable by default: the write reaches the source (write-back).
        #expect(try shell("echo helper > \(quoted(mountpoint))/written.txt").status == 0)
        let uploaded = ContinuousClock.now + .seconds(20)
        while (try? readFile(source + "/written.txt")) != Array("helper\n".utf8) && ContinuousClock.now < uploaded {
            usleep(50_000)
        }
        #expect((try? readFile(source + "/written.txt")) == Array("helper\n".utf8))
        #expect(try shell("\(environment) umount \(quoted(mountpoint))").status == 0)
        waitUntilUnmounted(mountpoint)
        unlink(source + "/written.txt")

        // An fstab line, from a private fstab file (never /etc/fstab).
        let fstab = scratch + "/fstab"
        writeTestFile(
            fstab, Array("\(source) \(mountpoint) fuse.providerfs noauto,nofail,ro,cache=\(cache) 0 0\n".utf8))
        let fromFstab = try shell("\(environment) mount --fstab \(quoted(fstab)) \(quoted(mountpoint))")
        #expect(fromFstab.status == 0, "\(fromFstab)")
        // `ro` is --read-only: read-only for the kernel too.
        let options = try shell("findmnt -n -o OPTIONS --target \(quoted(mountpoint))").output
        #expect(options.split(separator: ",").first == "ro", "\(options)")
        #expect(
            try shell("sha256sum < \(quoted(mountpoint))/other.bin").output
                == (try shell("sha256sum < \(quoted(source))/other.bin").output))
        let unmount = try providerfs(["unmount", mountpoint], runtime: runtime)
        #expect(unmount.status == 0, "\(unmount)")
        #expect(MountTable.entry(at: mountpoint) == nil)
    }

    @Test func theDemoShowsPlaceholdersPDFsALargeFileAndAFailingItem() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mount = try MountedFileSystem.providerfs(
            ["--demo"],
            environment: [
                "PROVIDERFS_RUNTIME_DIR": runtime, "XDG_DATA_HOME": scratch + "/data",
                "XDG_CACHE_HOME": cache,
            ])
        defer { mount.stop() }
        let m = quoted(mount.mountpoint)
        #expect(
            access(scratch + "/data/providerfs/demo/source/README.txt", R_OK) == 0,
            "the demo source is generated on first use"
        )
        #expect(try shell("ls \(m)").output == "Documents\nFaults\nLarge\nProjects\nREADME.txt\n")
        #expect(try shell("stat -c %s \(m)/Large/sparse-1GiB.bin").output == "1073741824\n")
        #expect(state(mount.path("Large/sparse-1GiB.bin")) == "dataless")
        for pdf in ["overview.pdf", "errno contract.pdf", "one-page.pdf"] {
            let check = try shell("qpdf --check \(quoted(mount.path("Documents/Papers/" + pdf)))")
            #expect(check.status == 0, "\(pdf): \(check.output) \(check.error)")
        }
        let start = ContinuousClock.now
        #expect(
            try shell("dd if=\(m)/Large/sparse-1GiB.bin bs=1 skip=536870912 count=16 status=none").output
                == "ProviderFS demo:")
        #expect(ContinuousClock.now - start < .seconds(5), "one range of 1 GiB is served without the rest")
        let failing = try shell("cat \(m)/Faults/fails-halfway.bin > /dev/null")
        #expect(failing.status != 0)
        #expect(failing.error.contains("Input/output error"), "\(failing.error)")
        // Rule 51: a coordinated read of it fails with the download, and its accessor never runs.
        let coordinated = try shell(
            "echo | PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) \(quoted(productsDirectory + "/coordination-probe"))"
                + " hold --read \(m)/Faults/fails-halfway.bin")
        #expect(coordinated.status == 1, "\(coordinated)")
        #expect(coordinated.output.hasPrefix("failed downloadFailed"), "\(coordinated.output)")
        #expect(coordinated.output.contains("Input/output error"), "\(coordinated.output)")
        #expect(!coordinated.output.contains("granted"), "\(coordinated.output)")
        let status = try providerfs(["status", mount.path("Faults/fails-halfway.bin"), "--json"], runtime: runtime)
        #expect(status.output.contains("\"state\":\"error\""), "\(status.output)")
        #expect(status.output.contains("EIO"), "\(status.output)")
        #expect(try shell("cat \(m)/README.txt").output.hasPrefix("Welcome to the ProviderFS demo."))
        // On a terminal (script(1) provides one) download draws a bar; in a pipe it prints lines.
        // It asks the daemon, found (like the coordination server) through the runtime directory.
        let binary = "PROVIDERFS_RUNTIME_DIR=\(quoted(runtime)) " + quoted(productsDirectory + "/providerfs")
        let onTerminal = try shell("script -qec \(quoted("\(binary) download \(m)/Documents/notes")) /dev/null")
        #expect(onTerminal.status == 0, "\(onTerminal)")
        #expect(onTerminal.output.contains("] 100%") && onTerminal.output.contains("\r"), "\(onTerminal.output)")
        // The PDFs were read whole by qpdf above: nothing left to download.
        let papers = try shell("\(binary) download \(m)/Documents/Papers")
        #expect(papers.status == 0, "\(papers)")
        #expect(papers.output.contains("overview.pdf: already downloaded"), "\(papers.output)")
        let inPipe = try shell("\(binary) download \(m)/Projects | cat")
        #expect(inPipe.output.contains("leaf.txt: 100%"), "\(inPipe.output)")
        #expect(!inPipe.output.contains("\r"))
        #expect(state(mount.path("Projects/providerfs/notes/2026/11/deep/nested/leaf.txt")) == "materialized")
    }

    @Test func anOrdinaryUserMountsReadsAndUnmountsThroughFusermount3() throws {
        // The README's reader is no root: the daemon then mounts through fusermount3 (setuid),
        // passthrough is refused (EPERM) and reads go through the daemon. As root, the test runs
        // the commands as nobody; /dev/fuse must be usable by others, as Debian makes it.
        guard requireFUSE() else { return }
        defer { cleanup() }
        let nobody: uid_t = 65534
        let asNobody = getuid() == 0 ? "setpriv --reuid=\(nobody) --regid=\(nobody) --clear-groups " : ""
        var info = stat()
        stat("/dev/fuse", &info)
        let restoreMode = info.st_mode & 0o777
        if getuid() == 0 && info.st_mode & 0o006 != 0o006 { chmod("/dev/fuse", restoreMode | 0o006) }
        defer { if getuid() == 0 { chmod("/dev/fuse", restoreMode) } }
        let home = scratch + "/user"
        mkdir(home, 0o755)
        mkdir(home + "/mnt", 0o755)
        chmod(scratch, 0o755)
        if getuid() == 0 {
            chown(home, nobody, gid_t(nobody))
            chown(home + "/mnt", nobody, gid_t(nobody))
        }
        let mnt = quoted(home + "/mnt")
        let binary = quoted(productsDirectory + "/providerfs")
        let prelude = "export HOME=\(quoted(home)) XDG_RUNTIME_DIR=\(quoted(home + "/run")); "
        let mounted = try shell(
            asNobody + "sh -c " + quoted(prelude + "\(binary) mount --source \(quoted(source)) \(mnt)"))
        defer {
            if MountTable.entry(at: home + "/mnt") != nil { _ = try? shell("fusermount3 -uz \(mnt)") }
        }
        #expect(mounted.status == 0, "\(mounted)")
        #expect(mounted.output.contains("Unmount: providerfs unmount"), "\(mounted.output)")
        let read = try shell(
            asNobody + "sh -c "
                + quoted(
                    prelude + "cat \(mnt)/hello.txt && getfattr --only-values -n user.providerfs.state \(mnt)/hello.txt"
                        + " && cmp \(mnt)/big.bin \(quoted(source + "/big.bin")) && echo same"))
        #expect(read.output == "hello, provider\nmaterializedsame\n", "\(read)")
        let unmounted = try shell(asNobody + "sh -c " + quoted(prelude + "\(binary) unmount \(mnt)"))
        #expect(unmounted.status == 0, "\(unmounted)")
        #expect(MountTable.entry(at: home + "/mnt") == nil)
    }

    @Test func theSystemdUnitsCommandsMountAndStopAsSystemdRunsThem() throws {
        // What `systemctl --user start providerfs@test` runs, run the same way: the instance's
        // EnvironmentFile read, %h/%i and ${VAR} expanded, ExecStartPre in order ("-" may fail),
        // ExecStart in the foreground; a crash (SIGKILL) and the restart on the stale mount
        // point; then the stop: KillSignal, within TimeoutStopSec.
        guard requireFUSE() else { return }
        defer { cleanup() }
        let unit = try shell("cat \(quoted(packageRoot + "/Mount/providerfs@.service"))").output
        let home = scratch + "/home"
        mkdir(home, 0o755)
        let mountpoint = home + "/Remote"
        var environment: [String: String] = [:]  // from the EnvironmentFile, below
        func expand(_ line: String) -> [String] {
            var text = line.replacingOccurrences(of: "%h", with: home).replacingOccurrences(of: "%i", with: "test")
            for (name, value) in environment { text = text.replacingOccurrences(of: "${\(name)}", with: value) }
            // An unbraced `$NAME` word is split at spaces, and is no word at all when unset.
            return text.split(separator: " ").flatMap { word -> [String] in
                guard word.hasPrefix("$") else { return [String(word)] }
                return (environment[String(word.dropFirst())] ?? "").split(separator: " ").map(String.init)
            }.map {
                $0 == "/usr/local/bin/providerfs" ? productsDirectory + "/providerfs" : $0
            }
        }
        func values(_ key: String) -> [String] {
            unit.split(separator: "\n").filter { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
        }
        // The EnvironmentFile the unit names, in the format the unit's header documents.
        #expect(values("EnvironmentFile") == ["%h/.config/providerfs/%i.conf"])
        let conf = home + "/.config/providerfs/test.conf"
        #expect(try shell("mkdir -p \(quoted(home))/.config/providerfs").status == 0)
        writeTestFile(conf, Array("SOURCE=--source=\(source)\nMOUNTPOINT=\(mountpoint)\n".utf8))
        for line in (try shell("cat \(quoted(conf))").output).split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1).map(String.init)
            environment[parts[0]] = parts[1]
        }
        let runtime = ["PROVIDERFS_RUNTIME_DIR": self.runtime]
        /// ExecStartPre in order, then ExecStart; returns the daemon once it has mounted.
        func start() throws -> ChildProcess {
            for pre in values("ExecStartPre") {
                let mayFail = pre.hasPrefix("-")
                let argv = expand(mayFail ? String(pre.dropFirst()) : pre)
                let result = try ChildProcess.run(argv[0], Array(argv.dropFirst()), environment: runtime)
                #expect(mayFail || result.status == 0, "\(argv): \(result)")
            }
            let start = values("ExecStart")
            #expect(start.count == 1)
            let argv = expand(start[0])
            #expect(argv.last == "--foreground", "systemd's Type=simple needs the foreground form")
            let daemon = try ChildProcess(argv[0], Array(argv.dropFirst()), environment: runtime)
            // Served: the file reads (not the stale mount's ENOTCONN, which `access` can miss
            // while the kernel's attributes are cached, nor the empty directory under it between
            // the cleanup and the new mount).
            let deadline = ContinuousClock.now + .seconds(30)
            while readTextFile(mountpoint + "/hello.txt") == nil && daemon.isRunning && ContinuousClock.now < deadline {
                usleep(10_000)
            }
            return daemon
        }
        let crashed = try start()
        defer {
            if crashed.isRunning {
                crashed.signal(SIGKILL)
                _ = crashed.wait(timeout: .seconds(10))
            }
        }
        #expect(MountTable.entry(at: mountpoint) != nil, "mounted: \(crashed.standardError)")
        #expect(try shell("cat \(quoted(mountpoint + "/hello.txt"))").output == "hello, provider\n")
        // A crash, then what Restart=on-failure runs: the same commands on the stale mount point.
        crashed.signal(SIGKILL)
        #expect(crashed.wait(timeout: .seconds(10)) != nil)
        #expect(values("Restart") == ["on-failure"])
        let daemon = try start()
        defer {
            if daemon.isRunning {
                daemon.signal(SIGKILL)
                _ = daemon.wait(timeout: .seconds(10))
            }
            if MountTable.entry(at: mountpoint) != nil { _ = try? shell("fusermount3 -uz \(quoted(mountpoint))") }
        }
        #expect(daemon.isRunning, "restarted after the crash: \(daemon.standardError)")
        #expect(
            try shell("cat \(quoted(mountpoint + "/hello.txt"))").output == "hello, provider\n",
            "\(daemon.standardError)")
        #expect(MountTable.current().filter { $0.mountPoint == mountpoint }.count == 1, "the stale mount is gone")
        #expect(values("KillSignal") == ["SIGTERM"])
        let stopTimeout = Int(values("TimeoutStopSec").first ?? "") ?? 90
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: .seconds(stopTimeout)) == 0, "\(daemon.standardError)")
        #expect(MountTable.entry(at: mountpoint) == nil, "SIGTERM unmounts")
    }

    @Test func theSystemdUserUnitVerifies() throws {
        defer { cleanup() }
        guard access("/usr/bin/systemd-analyze", X_OK) == 0 else {
            Issue.record("systemd-analyze is missing (apt-get install systemd)")
            return
        }
        let unit = try shell("cat \(quoted(packageRoot + "/Mount/providerfs@.service"))").output
        let local = unit.replacingOccurrences(of: "/usr/local/bin/providerfs", with: productsDirectory + "/providerfs")
        writeTestFile(scratch + "/providerfs@demo.service", Array(local.utf8))
        let result = try shell("systemd-analyze verify --man=no \(quoted(scratch))/providerfs@demo.service")
        #expect(result.status == 0, "\(result)")
        #expect(result.error.isEmpty, "\(result.error)")
    }
}

/// The package root (where Package.swift is), from the products directory (.build/<triple>/debug).
var packageRoot: String {
    var directory = productsDirectory
    while !directory.isEmpty, access(directory + "/Package.swift", F_OK) != 0 {
        guard let slash = directory.lastIndex(of: "/") else { return "" }
        directory = String(directory[..<slash])
    }
    return directory
}

/// umount(8) returns before the daemon has finished; later mounts need the mount point free.
func waitUntilUnmounted(_ mountpoint: String) {
    let deadline = ContinuousClock.now + .seconds(10)
    while MountTable.entry(at: mountpoint) != nil && ContinuousClock.now < deadline { usleep(20_000) }
}

/// True while `pid` runs; a zombie (exited, not yet reaped by init) counts as gone.
func processExists(_ pid: Int32) -> Bool {
    guard let text = readTextFile("/proc/\(pid)/stat"), let close = text.lastIndex(of: ")") else { return false }
    return !text[text.index(after: close)...].hasPrefix(" Z")
}
