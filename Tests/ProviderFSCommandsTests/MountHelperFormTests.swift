import ControlWire
import SystemSupport
import TestScheduling
import Testing
import WebDAVProvider

@testable import ProviderFSCommands

@Suite(.blockingThreads) struct MountHelperFormTests {
    @Test func mountFuse3FormBecomesAMountCommand() {
        #expect(
            mountHelperArguments([
                "/srv/remote", "/mnt/remote", "-o", "rw,noauto,cache=/var/cache/x,allow_other,_netdev",
            ])
                == ["mount", "--source=/srv/remote", "--cache=/var/cache/x", "--allow-other", "/mnt/remote"])
        #expect(mountHelperArguments(["demo", "/mnt/demo", "-o", "rw"]) == ["mount", "--demo", "/mnt/demo"])
        #expect(
            mountHelperArguments(["demo", "/mnt/demo", "-o", "no_passthrough"]) == [
                "mount", "--demo", "--no-passthrough", "/mnt/demo",
            ])
        #expect(
            mountHelperArguments(["/s", "/m", "-f", "-orw,log=/tmp/l"]) == [
                "mount", "--source=/s", "--foreground", "--log=/tmp/l", "/m",
            ])
        #expect(
            mountHelperArguments(["/s", "/m", "-o", "stall_timeout=2s"]) == [
                "mount", "--source=/s", "--stall-timeout=2s", "/m",
            ])
        #expect(
            mountHelperArguments(["/s", "/m", "-o", "write_back_delay=500ms"]) == [
                "mount", "--source=/s", "--write-back-delay=500ms", "/m",
            ])
        #expect(
            mountHelperArguments(["/s", "/m", "-o", "cache_max_size=2G,cache_min_free=1G,cache_max_age=168h"]) == [
                "mount", "--source=/s", "--cache-max-size=2G", "--cache-min-free=1G", "--cache-max-age=168h", "/m",
            ])
    }

    /// `-o require_token` locks the mount down; anything that looks like a misspelling of it is
    /// refused by `mount` (never ignored like mount(8)'s own options, D-333).
    @Test func requireTokenOptionAndItsMisspellings() async throws {
        #expect(
            mountHelperArguments(["/s", "/m", "-o", "rw,require_token", "-o", "require_token"]) == [
                "mount", "--source=/s", "--require-token", "/m",
            ])
        for misspelled in ["require-token", "require_token=yes", "requiretoken", "Require_Tokens"] {
            let translated = try #require(mountHelperArguments(["/s", "/m", "-o", misspelled]))
            #expect(translated.contains("--unknown-mount-option=" + misspelled))
            var arguments = ArgumentList(Array(translated.dropFirst()), commandName: "providerfs mount")
            do {
                _ = try await MountCommand.run(&arguments, io: CommandIO(json: false))
                Issue.record("-o \(misspelled) was accepted")
            } catch let error as UsageError {
                #expect(error.message.contains("unknown mount option '\(misspelled)'"), "\(error.message)")
                #expect(error.message.contains("-o require_token"), "\(error.message)")
            }
        }
        var flagWithValue = ArgumentList(["--demo", "--require-token=yes", "/m"], commandName: "providerfs mount")
        do {
            _ = try await MountCommand.run(&flagWithValue, io: CommandIO(json: false))
            Issue.record("--require-token=yes was accepted")
        } catch let error as UsageError {
            #expect(error.message.contains("--require-token takes no value"), "\(error.message)")
        }
    }

    /// The background mount hands `--stall-timeout` to its daemon in a form the daemon parses
    /// back to the same duration (whole milliseconds).
    @Test func stallTimeoutReachesTheDaemonUnchanged() throws {
        for duration in [Duration.milliseconds(1), .milliseconds(250), .seconds(2), .seconds(90), .seconds(3600)] {
            #expect(try parseDuration(MountCommand.durationArgument(duration)) == duration)
        }
        #expect(MountCommand.durationArgument(.microseconds(10)) == "1ms")
    }

    /// An http(s) SOURCE is a WebDAV mount (an fstab line `https://dav/x /mnt/dav fuse.providerfs
    /// webdav_user=alice,password_file=/etc/dav-pw,ca_file=/etc/dav-ca.pem`); `user` stays mount(8)'s,
    /// and a password in the options is refused without being carried or echoed (D-421).
    @Test func webdavSourceAndItsOptions() async throws {
        #expect(
            mountHelperArguments([
                "https://dav.example.com/a%20b/", "/mnt/dav", "-o",
                "rw,user,_netdev,webdav_user=alice,password_file=/etc/dav-pw,ca_file=/etc/dav-ca.pem,cache=/var/c,"
                    + "poll_interval=30s,checksum_limit=1MiB",
            ])
                == [
                    "mount", "--webdav=https://dav.example.com/a%20b/", "--user=alice", "--password-file=/etc/dav-pw",
                    "--ca-file=/etc/dav-ca.pem", "--cache=/var/c", "--poll-interval=30s", "--checksum-limit=1MiB",
                    "/mnt/dav",
                ])
        // `--checksum-limit` (D-495) reaches the daemon's WebDAV configuration; 0 verifies nothing.
        let location = try WebDAVLocation("https://dav.example.com/")
        for limit: Int64 in [0, 1 << 20] {
            var source = MountCommand.WebDAVSource(location: location)
            source.checksumLimit = limit
            #expect(try MountCommand.webdavConfiguration(source).checksumLimit == limit)
        }
        #expect(
            try MountCommand.webdavConfiguration(MountCommand.WebDAVSource(location: location)).checksumLimit
                == WebDAVConfiguration(location: location).checksumLimit, "the default without the option")
        // `--poll-interval` (D-450): a duration of at least 100ms, or 0 / off.
        for (text, expected) in [
            ("30s", Duration.seconds(30)), ("0", .zero), ("off", .zero), ("100ms", .milliseconds(100)),
        ] {
            var parsed = ArgumentList(["--poll-interval", text], commandName: "providerfs mount")
            #expect(try MountCommand.pollIntervalArgument(&parsed) == expected, "\(text)")
        }
        for text in ["10ms", "soon", "-1s"] {
            var parsed = ArgumentList(["--poll-interval", text], commandName: "providerfs mount")
            #expect(throws: UsageError.self, "\(text)") { try MountCommand.pollIntervalArgument(&parsed) }
        }
        #expect(
            mountHelperArguments(["http://127.0.0.1:8080/", "/m", "-f"]) == [
                "mount", "--webdav=http://127.0.0.1:8080/", "--foreground", "/m",
            ])
        #expect(mountHelperArguments(["ftp://host/", "/m"]) == nil)

        let translated = try #require(
            mountHelperArguments(["https://dav.example.com/", "/m", "-o", "webdav_user=alice,password=s3cret"]))
        #expect(translated.contains("--password") && !translated.joined().contains("s3cret"))
        var arguments = ArgumentList(Array(translated.dropFirst()), commandName: "providerfs mount")
        do {
            _ = try await MountCommand.run(&arguments, io: CommandIO(json: false))
            Issue.record("-o password= was accepted")
        } catch let error as UsageError {
            #expect(error.message.contains("no password on the command line"), "\(error.message)")
            #expect(!error.message.contains("s3cret"))
        }
    }

    @Test func otherArgumentListsAreNotTheHelperForm() {
        #expect(mountHelperArguments(["frobnicate"]) == nil)
        #expect(mountHelperArguments(["relative", "/m", "-o", "rw"]) == nil)
        #expect(mountHelperArguments(["/s", "--flag"]) == nil)
        #expect(mountHelperArguments(["/s", "/m", "extra"]) == nil)
        #expect(mountHelperArguments(["/s", "/m", "-o"]) == nil)
    }

    @Test func defaultCacheDirectoryIsStablePerSource() {
        let one = UserDirectories.defaultCache(forSource: "/srv/my remote")
        #expect(one == UserDirectories.defaultCache(forSource: "/srv/my remote"))
        #expect(one != UserDirectories.defaultCache(forSource: "/srv/other"))
        #expect(one.hasSuffix("/providerfs/my_remote-\(fnv1a("/srv/my remote"))"))
    }
}
