import SystemSupport
import Testing

@Suite("inotify event parsing")
struct InotifyEventsTests {
    /// One record as the kernel writes it: header, then the name NUL-padded to `padded` bytes.
    static func record(watch: Int32, mask: UInt32, name: String, padded: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        withUnsafeBytes(of: watch.littleEndian) { bytes += $0 }
        withUnsafeBytes(of: mask.littleEndian) { bytes += $0 }
        withUnsafeBytes(of: UInt32(0)) { bytes += $0 }  // cookie
        withUnsafeBytes(of: UInt32(padded).littleEndian) { bytes += $0 }
        let name = Array(name.utf8)
        return bytes + name + [UInt8](repeating: 0, count: padded - name.count)
    }

    @Test("records with and without names, padding stripped")
    func wellFormed() {
        let bytes =
            Self.record(watch: 3, mask: 0x100, name: "new file", padded: 16)
            + Self.record(watch: 4, mask: 0x400, name: "", padded: 0)
            + Self.record(watch: 3, mask: 0x2, name: "ünï", padded: 32)
        #expect(
            parseInotifyEvents(bytes[...]) == [
                InotifyEvent(watch: 3, mask: 0x100, name: "new file"),
                InotifyEvent(watch: 4, mask: 0x400, name: ""),
                InotifyEvent(watch: 3, mask: 0x2, name: "ünï"),
            ])
    }

    @Test("a truncated record or a length past the end ends the batch; garbage never crashes")
    func malformed() {
        let good = Self.record(watch: 1, mask: 0x2, name: "a", padded: 16)
        #expect(parseInotifyEvents((good + good.prefix(20))[...]).count == 1)
        var lying = Self.record(watch: 2, mask: 0x2, name: "b", padded: 16)
        lying[12] = 0xFF
        lying[13] = 0xFF
        #expect(parseInotifyEvents((good + lying)[...]) == [InotifyEvent(watch: 1, mask: 0x2, name: "a")])
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<2000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let count = Int(state >> 54)
            let garbage = (0..<count).map { index in
                UInt8(truncatingIfNeeded: (state >> UInt64(index % 56)) &+ UInt64(index))
            }
            _ = parseInotifyEvents(garbage[...])
        }
    }
}
