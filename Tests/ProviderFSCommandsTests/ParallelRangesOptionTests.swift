// `--parallel-ranges N` (fstab `parallel_ranges=N`, D-513): the fstab form becomes the flag, the
// flag reaches the daemon's WebDAV configuration (the default without it), and a count outside
// 1...32, or the flag without --webdav, is a usage error.

import SystemSupport
import TestScheduling
import Testing
import WebDAVProvider

@testable import ProviderFSCommands

@Suite(.blockingThreads) struct ParallelRangesOptionTests {
    @Test func theOptionReachesTheConfigurationAndBadCountsAreRefused() async throws {
        #expect(
            mountHelperArguments(["https://dav.example.com/", "/mnt/dav", "-o", "_netdev,parallel_ranges=2"])
                == ["mount", "--webdav=https://dav.example.com/", "--parallel-ranges=2", "/mnt/dav"])
        let location = try WebDAVLocation("https://dav.example.com/")
        for count in [1, 8] {
            var source = MountCommand.WebDAVSource(location: location)
            source.parallelRanges = count
            #expect(try MountCommand.webdavConfiguration(source).parallelRanges == count)
        }
        #expect(
            try MountCommand.webdavConfiguration(MountCommand.WebDAVSource(location: location)).parallelRanges == 4,
            "the default without the option")
        for (arguments, message) in [
            (["--webdav", "http://127.0.0.1:9/", "--parallel-ranges", "0", "/m"], "from 1 to 32"),
            (["--webdav", "http://127.0.0.1:9/", "--parallel-ranges", "many", "/m"], "from 1 to 32"),
            (["--webdav", "http://127.0.0.1:9/", "--parallel-ranges=33", "/m"], "from 1 to 32"),
            (["--source", "/tmp", "--parallel-ranges", "2", "/m"], "go with --webdav URL"),
        ] {
            var parsed = ArgumentList(arguments, commandName: "providerfs mount")
            do {
                _ = try await MountCommand.run(&parsed, io: CommandIO(json: false))
                Issue.record("\(arguments) was accepted")
            } catch let error as UsageError {
                #expect(error.message.contains(message), "\(error.message)")
            }
        }
    }
}
