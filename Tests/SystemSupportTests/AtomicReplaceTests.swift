import Dispatch
import Foundation
import SystemSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("replaceFileAtomically")
struct AtomicReplaceTests {
    @Test("writes, replaces, leaves mode 0600 and no temporary file, also under concurrent writers")
    func replaces() throws {
        let directory = NSTemporaryDirectory() + "providerfs-atomic-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/state.json"
        #expect(replaceFileAtomically(path, with: Array("first".utf8)) == nil)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "first")
        #expect(replaceFileAtomically(path, with: Array("second".utf8)) == nil)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "second")
        var info = stat()
        #expect(stat(path, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)

        // Eight writers of the same path at once: each write is whole, the file is one of them.
        let contents = (0..<8).map { index in Array(String(repeating: "\(index)", count: 100_000).utf8) }
        DispatchQueue.concurrentPerform(iterations: 8) { index in
            _ = replaceFileAtomically(path, with: contents[index])
        }
        let final = try #require(FileManager.default.contents(atPath: path))
        #expect(contents.contains(Array(final)), "the file is one whole write")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["state.json"])

        #expect(replaceFileAtomically(directory + "/missing/state.json", with: [1])?.contains("open") == true)
    }
}
