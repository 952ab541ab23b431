// How a recorded download failure reads: the errno its readers got (a checksum mismatch is EIO),
// the byte where it happened, the message.

import ProviderCache
import SystemSupport
import Testing
import VirtualFileSystem

@Suite("Recorded errors")
struct RecordedErrorTests {
    @Test("bytes that do not match their checksum read as EIO, like any failed download")
    func corruptIsEIO() {
        #expect(FileSystemError(CacheError(.corrupt, "bytes 0..<10 do not match")).errno == .ioError)
    }

    @Test("user.providerfs.error is 'ERRNO: at byte N: message', or 'ERRNO: message' without a byte")
    func describeFormat() {
        #expect(
            ProviderFileSystem.describe(RecordedError(code: .corrupt, message: "bytes 0..<10 do not match", offset: 0))
                == "EIO: at byte 0: bytes 0..<10 do not match")
        #expect(
            ProviderFileSystem.describe(RecordedError(code: .timedOut, message: "no data", offset: 4_194_304))
                == "ETIMEDOUT: at byte 4194304: no data")
        #expect(
            ProviderFileSystem.describe(RecordedError(code: .downloadFailed, message: "broken")) == "EIO: broken")
    }
}
