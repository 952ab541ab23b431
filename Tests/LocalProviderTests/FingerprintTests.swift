import LocalProvider
import ProviderFaults
import ProviderModel
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Local provider fingerprints")
struct FingerprintTests {
    @Test(
        "the fingerprint is the inode: it survives a rename and a rewrite in place, and the fault wrapper forwards it")
    func inode() async throws {
        let root = try TemporaryDirectory()
        defer { root.remove() }
        let provider = LocalDirectoryProvider(root: root.path)
        let file = root.path + "/a.txt"
        let descriptor = open(file, O_CREAT | O_WRONLY, 0o644)
        #expect(write(descriptor, "one", 3) == 3)
        close(descriptor)
        let before = try await provider.item(for: ItemIdentifier("a.txt"))
        var info = stat()
        #expect(stat(file, &info) == 0)
        #expect(provider.fingerprint(of: before) == "i\(info.st_ino)")
        #expect(rename(file, root.path + "/b.txt") == 0)
        let after = try await provider.item(for: ItemIdentifier("b.txt"))
        #expect(after.contentVersion != before.contentVersion || after.identifier != before.identifier)
        #expect(provider.fingerprint(of: after) == provider.fingerprint(of: before))
        let wrapped = FaultInjectingProvider(wrapping: provider, plan: FaultPlan())
        #expect(wrapped.fingerprint(of: after) == provider.fingerprint(of: after))
        var odd = after
        odd.contentVersion = ContentVersion("no-inode-here")
        #expect(provider.fingerprint(of: odd) == nil)
    }
}
