import ProviderFSCommands
import TestScheduling
import Testing

@Suite(.blockingThreads) struct CLITests {
    @Test func unknownCommandIsAUsageError() async {
        #expect(await ProviderFSCLI.main(["providerfs", "frobnicate"]) == ExitStatus.usage)
    }

    @Test func missingCommandIsAUsageError() async {
        #expect(await ProviderFSCLI.main(["providerfs"]) == ExitStatus.usage)
    }

    @Test func unknownFlagIsAUsageError() async {
        #expect(await ProviderFSCLI.main(["providerfs", "version", "--bogus"]) == ExitStatus.usage)
    }

    @Test func argumentListConsumesFlagsAndOptions() throws {
        var list = ArgumentList(["--timeout", "2s", "--read", "/tmp/x", "--", "echo", "--read"], commandName: "t")
        #expect(try list.flag("--read"))
        #expect(try list.duration("--timeout") == .seconds(2))
        #expect(list.positional() == "/tmp/x")
        #expect(list.trailing == ["echo", "--read"])
        try list.finish()
    }

    @Test func argumentListRejectsLeftovers() {
        var list = ArgumentList(["--size=12", "extra"], commandName: "t")
        #expect(throws: UsageError.self) { try list.finish() }
        #expect(throws: UsageError.self) {
            _ = try list.size("--size").map { $0 } ?? 0; try list.finish()
        }
    }
}
