// `providerfs fault` on a real mount, over each provider (a local directory, rclone, Apache): a fault added from the shell makes the next
// download fail (cat sees EIO), counts in downloads (a plain retry after a one-download fault
// reads the right bytes), `fault list` shows it, `fault clear` removes it, and a stored fault
// survives a remount.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct FaultMountTests {
    /// A mount over `kind` of a tree with once.bin (3 MiB) and docs/kept.bin (2 MiB).
    func mount(over kind: ProviderKind) throws -> SourceMount {
        let mount = try SourceMount(prefix: "fault-mount", kind: kind)
        mkdir(mount.source("docs"), 0o755)
        writeTestFile(mount.source("once.bin"), patternBytes(count: 3 << 20, seed: 21))
        writeTestFile(mount.source("docs/kept.bin"), patternBytes(count: 2 << 20, seed: 22))
        return mount
    }

    /// The errno name a Python read of the whole file ends with ("OK" when it reads it all).
    func readErrno(_ path: String) throws -> String {
        let script = """
            import errno, sys
            try:
                with open(sys.argv[1], 'rb') as f:
                    while f.read(1 << 20): pass
                print('OK')
            except OSError as e:
                print(errno.errorcode.get(e.errno, str(e.errno)))
            """
        return try shell("python3 -c \(quoted(script)) \(quoted(path))").output.trimmingCharacters(
            in: .whitespacesAndNewlines)
    }

    func sha256(_ path: String) throws -> String {
        try shell("sha256sum < \(quoted(path))").output
    }

    func listed(_ mountpoint: String, runtime: String) throws -> [[String: Any]] {
        let result = try providerfs(["fault", "list", mountpoint, "--json"], runtime: runtime)
        #expect(result.status == 0, "\(result)")
        return result.output.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    @Test(arguments: ProviderKind.available)
    func aFaultFromTheShellFailsTheNextDownloadAndIsStored(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        let fixture = try mount(over: kind)
        defer { fixture.stop() }
        let runtime = fixture.runtime
        let mounted = fixture.mount

        // One download (the default): cat meets EIO, the mount's own retries included; then the
        // fault is used up and a plain retry reads the right bytes.
        let once = mounted.path("once.bin")
        let add = try providerfs(["fault", "add", once, "--fail-at", "1MiB"], runtime: runtime)
        #expect(add.status == 0, "\(add)")
        #expect(add.output.contains("fail at 1048576 with EIO, 1 download left"), "\(add.output)")
        let cat = try shell("cat \(quoted(once)) > /dev/null")
        #expect(cat.status != 0)
        #expect(cat.error.contains("Input/output error"), "\(cat.error)")
        #expect(
            try listed(mounted.mountpoint, runtime: runtime).isEmpty,
            "a one-download fault is gone once its download ended")
        #expect(try readErrno(once) == "OK")
        #expect(try sha256(once) == (try sha256(fixture.source("once.bin"))))

        // Until cleared, on a folder: everything inside it fails, and the fault is listed.
        let add2 = try providerfs(
            ["fault", "add", mounted.path("docs"), "--fail-at", "100", "--errno", "ECONNRESET", "--times", "0"],
            runtime: runtime)
        #expect(add2.status == 0, "\(add2)")
        let kept = mounted.path("docs/kept.bin")
        #expect(try readErrno(kept) == "EIO")
        let faults = try listed(mounted.mountpoint, runtime: runtime)
        #expect(faults.count == 1, "\(faults)")
        #expect(faults.first?["path"] as? String == "docs")
        #expect(faults.first?["fault"] as? String == "failAt")
        #expect(faults.first?["errno"] as? String == "ECONNRESET")
        #expect(faults.first?["mountpoint"] as? String == mounted.mountpoint)
        #expect(faults.first?["timesLeft"] == nil, "until cleared")
        let text = try providerfs(["fault", "list", mounted.mountpoint], runtime: runtime)
        #expect(text.output.contains(mounted.path("docs") + "  fail at 100 with ECONNRESET, until cleared"), "\(text)")

        // Stored: it survives a remount on the same cache.
        mounted.stop()
        try fixture.remount()
        let second = fixture.mount
        #expect(try listed(second.mountpoint, runtime: runtime).map { $0["path"] as? String } == ["docs"])
        #expect(try readErrno(second.path("docs/kept.bin")) == "EIO")

        // Cleared: the right bytes.
        let clear = try providerfs(["fault", "clear", second.path("docs")], runtime: runtime)
        #expect(clear.status == 0, "\(clear)")
        #expect(clear.output.contains("1 fault cleared."), "\(clear.output)")
        #expect(try readErrno(second.path("docs/kept.bin")) == "OK")
        #expect(try sha256(second.path("docs/kept.bin")) == (try sha256(fixture.source("docs/kept.bin"))))
        let again = try providerfs(["fault", "clear", second.path("docs")], runtime: runtime)
        #expect(again.status == 1 && again.error.contains("there is no fault on docs"), "\(again)")
        // A path outside any mount is refused in one sentence.
        let outside = try providerfs(["fault", "add", fixture.source("once.bin"), "--offline"], runtime: runtime)
        #expect(outside.status == 1 && outside.error.contains("is not inside a ProviderFS mount"), "\(outside)")
    }

    @Test(arguments: ProviderKind.available)
    func anUploadFaultFromTheShellIsListedStoredAndLeavesReadsAlone(over kind: ProviderKind) throws {
        guard requireFUSE() else { return }
        let fixture = try mount(over: kind)
        defer { fixture.stop() }
        let runtime = fixture.runtime
        let mounted = fixture.mount
        let once = mounted.path("once.bin")
        let add = try providerfs(
            ["fault", "add", once, "--on", "upload", "--fail-at", "0", "--errno", "ENOSPC", "--times", "2"],
            runtime: runtime)
        #expect(add.status == 0, "\(add)")
        #expect(add.output.contains("on upload: fail at 0 with ENOSPC, 2 uploads left"), "\(add.output)")
        let offline = try providerfs(
            ["fault", "add", mounted.path("docs"), "--on", "upload", "--offline"], runtime: runtime)
        #expect(offline.status == 0, "\(offline)")
        // Reads meet neither fault.
        #expect(try readErrno(once) == "OK")
        #expect(try readErrno(mounted.path("docs/kept.bin")) == "OK")
        let faults = try listed(mounted.mountpoint, runtime: runtime)
        #expect(faults.map { $0["on"] as? String } == ["upload", "upload"], "\(faults)")
        #expect(faults.first?["timesLeft"] as? Int == 2)
        // Options that make no sense for an upload: exit 64, one sentence, nothing added.
        let bad = try providerfs(["fault", "add", once, "--on", "upload", "--corrupt"], runtime: runtime)
        #expect(bad.status == 64, "\(bad)")
        #expect(bad.error.contains("--corrupt does not apply to uploads"), "\(bad.error)")

        // Stored: both survive a remount on the same cache.
        mounted.stop()
        try fixture.remount()
        let second = fixture.mount
        let text = try providerfs(["fault", "list", second.mountpoint], runtime: runtime)
        #expect(
            text.output.contains(second.path("once.bin") + "  on upload: fail at 0 with ENOSPC, 2 uploads left"),
            "\(text)")
        #expect(text.output.contains(second.path("docs") + "  on upload: offline, until cleared"), "\(text)")
        let clear = try providerfs(["fault", "clear", "--all", second.mountpoint], runtime: runtime)
        #expect(clear.output.contains("2 faults cleared."), "\(clear.output)")
    }
}
