// `--ctag-covers-subtree` (fstab `ctag_covers_subtree`, D-525): the fstab form becomes the flag,
// the flag sets the daemon's WebDAV configuration (off without it), and the flag without --webdav
// is a usage error.

import SystemSupport
import TestScheduling
import Testing
import WebDAVProvider

@testable import ProviderFSCommands

@Suite(.blockingThreads) struct CtagCoversSubtreeOptionTests {
    @Test func theFlagReachesTheConfigurationOnlyForWebDAV() async throws {
        #expect(
            mountHelperArguments(["https://dav.example.com/", "/mnt/dav", "-o", "_netdev,ctag_covers_subtree"])
                == ["mount", "--webdav=https://dav.example.com/", "--ctag-covers-subtree", "/mnt/dav"])
        let location = try WebDAVLocation("https://dav.example.com/")
        var source = MountCommand.WebDAVSource(location: location)
        #expect(try !MountCommand.webdavConfiguration(source).ctagCoversSubtree, "off without the flag")
        source.ctagCoversSubtree = true
        #expect(try MountCommand.webdavConfiguration(source).ctagCoversSubtree)
        var parsed = ArgumentList(
            ["--source", "/tmp", "--ctag-covers-subtree", "/m"], commandName: "providerfs mount")
        do {
            _ = try await MountCommand.run(&parsed, io: CommandIO(json: false))
            Issue.record("--ctag-covers-subtree was accepted with --source")
        } catch let error as UsageError {
            #expect(error.message.contains("go with --webdav URL"), "\(error.message)")
        }
    }
}
