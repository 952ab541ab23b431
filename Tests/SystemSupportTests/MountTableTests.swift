import SystemSupport
import Testing

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

    @Test func mountPointPathResolvesOnlyTheParent() {
        #expect(mountPointPath("/") == "/")
        #expect(mountPointPath("/tmp/") == (canonicalPath("/tmp") ?? "/tmp"))
        #expect(mountPointPath("/tmp/does-not-exist") == (canonicalPath("/tmp") ?? "/tmp") + "/does-not-exist")
        #expect(MountTable.containing("/")?.mountPoint == "/")
    }
}
