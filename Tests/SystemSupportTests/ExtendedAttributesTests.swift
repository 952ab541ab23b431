// ExtendedAttributes.value: one getxattr for a short value, the size asked for only for a longer
// one (D-534); the value is the same either way.

import CLinuxHeaders
import Foundation
import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct ExtendedAttributesTests {
    @Test func readsShortAndLongValuesAndReportsAMissingOne() throws {
        let path = FileManager.default.temporaryDirectory.path + "/xattr-\(UUID().uuidString)"
        #expect(FileManager.default.createFile(atPath: path, contents: Data()))
        defer { unlink(path) }
        let short = Array("materialized".utf8)
        let long = (0..<1000).map { UInt8(truncatingIfNeeded: $0 * 7) }
        for (name, value) in [("user.short", short), ("user.long", long), ("user.empty", [])] {
            let rc = value.withUnsafeBytes { setxattr(path, name, $0.baseAddress, $0.count, 0) }
            try #require(rc == 0, "setxattr \(name): \(Errno.current)")
        }
        #expect(try ExtendedAttributes.value("user.short", of: path).get() == short)
        #expect(try ExtendedAttributes.value("user.long", of: path).get() == long)
        #expect(try ExtendedAttributes.value("user.empty", of: path).get() == [])
        guard case .failure(let error) = ExtendedAttributes.value("user.missing", of: path) else {
            Issue.record("a missing attribute has no value")
            return
        }
        #expect(error.rawValue == ENODATA)
    }
}
