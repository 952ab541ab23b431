// The adapter of processes that must not download (D-433): matched by executable name, or by the
// kernel's command name (15 bytes), never by a name it does not carry; the defaults with
// `--no-download-for` added and `--download-for` taken away.

import ProviderFSCommands
import Testing
import VirtualFileSystem

@Suite struct MountDownloadPolicyTests {
    static func facts(executable: String?, command: String) -> MountDownloadPolicy.ProcessFacts {
        MountDownloadPolicy.ProcessFacts(executableName: { _ in executable }, process: { _ in (812, command) })
    }

    static let caller = RequestContext(threadID: 812, uid: 1000, gid: 1000)

    @Test func executableOrCommandNameRefusesTheDefaultsAndTheAdded() {
        let byExecutable = MountDownloadPolicy(facts: Self.facts(executable: "tracker-miner-fs-3", command: "pool-1"))
        #expect(byExecutable.refusal(Self.caller) == "tracker-miner-fs-3 (pid 812) is a process that must not download")
        // A script: its executable is the interpreter, its command name the one the kernel keeps
        // (15 bytes of "tracker-miner-fs-3").
        let byCommand = MountDownloadPolicy(facts: Self.facts(executable: "python3.11", command: "tracker-miner-f"))
        #expect(byCommand.refusal(Self.caller) == "tracker-miner-f (pid 812) is a process that must not download")
        let plain = MountDownloadPolicy(facts: Self.facts(executable: "cat", command: "cat"))
        #expect(plain.refusal(Self.caller) == nil)
        let added = MountDownloadPolicy(refused: ["cat"], facts: Self.facts(executable: "cat", command: "cat"))
        #expect(added.refusal(Self.caller) != nil)
        let allowed = MountDownloadPolicy(
            allowed: ["baloo_file"], facts: Self.facts(executable: "baloo_file", command: "baloo_file"))
        #expect(allowed.refusal(Self.caller) == nil)
        #expect(allowed.names.contains("tracker-miner-fs-3") && !allowed.names.contains("baloo_file"))
        // Let through by name: its command name too, though "tracker-miner-fs" shares its 15 bytes.
        let through = MountDownloadPolicy(
            allowed: ["tracker-miner-fs-3"],
            facts: Self.facts(executable: "tracker-miner-fs-3", command: "tracker-miner-f"))
        #expect(through.refusal(Self.caller) == nil)
        let unknown = MountDownloadPolicy(facts: Self.facts(executable: nil, command: "bash"))
        #expect(unknown.refusal(Self.caller) == nil)
    }
}
