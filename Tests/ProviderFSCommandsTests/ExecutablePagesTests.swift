// The daemon's code mapped at the start (D-531): the executable's mappings as /proc/<pid>/maps
// lists them, and a mounted daemon whose code and read-only data are all in its page tables
// (/proc/<pid>/pagemap), so that no request waits for the disk to bring a page of its code back
// after the page cache dropped it.

import SystemSupport
import TestScheduling
import TestSupport
import Testing

@testable import ProviderFSCommands

#if canImport(Glibc)
import Glibc
#endif

@Suite(.blockingThreads) struct ExecutablePagesTests {
    @Test func theExecutablesMappingsAreFoundByPath() {
        let maps = """
            55d0c0800000-55d0c0a00000 r--p 00000000 fe:00 16287262                   /opt/a b/providerfs
            55d0c0a00000-55d0c0f34000 r-xp 00200000 fe:00 16287262                   /opt/a b/providerfs
            55d0c0f35000-55d0c0f83000 rw-p 00734000 fe:00 16287262                   /opt/a b/providerfs
            7f3a10000000-7f3a10021000 r-xp 00000000 fe:00 1234                       /opt/a b/providerfs.so
            7f3a20000000-7f3a20021000 rw-p 00000000 00:00 0
            7ffd69ce5000-7ffd69d06000 rw-p 00000000 00:00 0                          [stack]
            """
        #expect(
            ExecutablePages.parse(maps, executable: "/opt/a b/providerfs") == [
                .init(start: 0x55d0_c080_0000, end: 0x55d0_c0a0_0000, writable: false),
                .init(start: 0x55d0_c0a0_0000, end: 0x55d0_c0f3_4000, writable: false),
                .init(start: 0x55d0_c0f3_5000, end: 0x55d0_c0f8_3000, writable: true),
            ])
        #expect(!ExecutablePages.mappings().filter { !$0.writable }.isEmpty, "this test's own executable")
    }

    @Test(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"))
    func aMountedDaemonHasAllItsCodeInItsPageTables() throws {
        if let problem = MountTestGate.problem {
            Issue.record(Comment(rawValue: problem))
            return
        }
        let mounted = try SourceMount(prefix: "executable-pages")
        defer { mounted.stop() }
        let process = String(mounted.mount.child.pid)
        let code = ExecutablePages.mappings(of: process).filter { !$0.writable }
        #expect(!code.isEmpty)
        var pages = 0
        var absent = 0
        for mapping in code {
            let present = try presentPages(of: process, mapping)
            pages += present.count
            absent += present.filter { !$0 }.count
        }
        #expect(pages > 0)
        #expect(absent == 0, "\(absent) of the daemon's \(pages) pages of code and read-only data are not mapped")
    }

    /// For each page of `mapping`, whether /proc/<process>/pagemap says it is present (bit 63).
    private func presentPages(of process: String, _ mapping: ExecutablePages.Mapping) throws -> [Bool] {
        let fd = open("/proc/\(process)/pagemap", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SystemCallError("open pagemap", Errno.current) }
        defer { close(fd) }
        let page = UInt(sysconf(Int32(_SC_PAGESIZE)))
        let count = Int((mapping.end - mapping.start) / page)
        var entries = [UInt64](repeating: 0, count: count)
        let wanted = count * 8
        let got = entries.withUnsafeMutableBytes { raw in
            readFully(fd, into: raw.baseAddress!, count: wanted, at: Int64(mapping.start / page) * 8)
        }
        guard case .success(let read) = got, read == wanted else {
            throw SystemCallError("read pagemap", Errno(EIO))
        }
        return entries.map { $0 & (1 << 63) != 0 }
    }
}
