import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct MountTableTests {
    @Test func parsesMountinfoLinesAndUnescapesPaths() {
        let text = """
            22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
            42 22 0:39 / /tmp/with\\040space rw,nosuid,nodev,relatime shared:5 - fuse.providerfs /srv/src rw,user_id=0
            garbage line
            """
        let entries = MountTable.parse(text)
        #expect(entries.count == 2)
        #expect(entries[1].mountPoint == "/tmp/with space")
        #expect(entries[1].device == "0:39")
        #expect(entries[1].fileSystemType == "fuse.providerfs")
        #expect(entries[1].source == "/srv/src")
        #expect(entries[1].options == "rw,nosuid,nodev,relatime")
    }

    /// Lines without optional fields, and with several, parse alike; the fields after the
    /// separator are found by position from "-", not from the start.
    @Test func parsesLinesWithAnyNumberOfOptionalFields() {
        let text = """
            22 1 0:21 / /proc rw,nosuid - proc proc rw
            40 22 0:35 / /mnt/cloud\\040drive rw,nosuid,nodev shared:7 master:2 - fuse.providerfs providerfs rw
            41 22 0:36 / /mnt/tab\\011and\\134back rw - fuse.sshfs host:/x\\040y rw
            """
        let entries = MountTable.parse(text)
        #expect(entries.map(\.mountPoint) == ["/proc", "/mnt/cloud drive", "/mnt/tab\tand\\back"])
        #expect(entries.map(\.fileSystemType) == ["proc", "fuse.providerfs", "fuse.sshfs"])
        #expect(entries[2].source == "host:/x y")
    }

    /// Only a backslash and three octal digits of at most 255 is an escape; anything else is
    /// kept as it is, and a line cut short is skipped.
    @Test func keepsWhatIsNoEscapeAndSkipsShortLines() {
        let text = """
            40 22 0:35 / /mnt/a\\400b\\9xy\\12 rw - fuse.providerfs /src\\134 rw
            41 22 0:36 / /mnt/short rw - ext4

            42 22 0:37 / /mnt/\\303\\251t\\303\\251 rw shared:3 - ext4 /dev/vdb rw
            """
        let entries = MountTable.parse(text)
        #expect(entries.map(\.mountPoint) == ["/mnt/a\\400b\\9xy\\12", "/mnt/été"])
        #expect(entries.map(\.source) == ["/src\\", "/dev/vdb"])
        #expect(entries.map(\.device) == ["0:35", "0:37"])
    }

    /// `load(from:)` reads the table again from the start of a descriptor that was read before
    /// (the way a poller of /proc/self/mountinfo re-reads it after POLLPRI).
    @Test func loadRereadsFromTheStartOfTheDescriptor() throws {
        let fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
        try #require(fd >= 0)
        defer { close(fd) }
        let first = try #require(MountTable.load(from: fd))
        let second = try #require(MountTable.load(from: fd))
        #expect(!first.isEmpty)
        #expect(first == second)
        #expect(first.contains { $0.mountPoint == "/" })
        #expect(MountTable.load(from: -1) == nil)
    }

    @Test func mountPointPathResolvesOnlyTheParent() {
        #expect(mountPointPath("/") == "/")
        #expect(mountPointPath("/tmp/") == (canonicalPath("/tmp") ?? "/tmp"))
        #expect(mountPointPath("/tmp/does-not-exist") == (canonicalPath("/tmp") ?? "/tmp") + "/does-not-exist")
        #expect(MountTable.containing("/")?.mountPoint == "/")
    }
}
