// `providerfs fault`: the command line (every fault kind, and the usage errors a person makes),
// the control requests (strict arguments, a seeded fuzz), and the daemon's side over a real
// ProviderFileSystem (a path resolved to its identifier, list, clear, a stored plan).

import ControlWire
import Foundation
import ProviderFaults
import ProviderModel
import SystemSupport
import TestScheduling
import TestSupport
import Testing
import VirtualFileSystem

@testable import ProviderFSCommands

#if canImport(Glibc)
import Glibc
#endif

private func parse(_ words: [String]) throws(UsageError) -> FaultRequest {
    var list = ArgumentList(words, commandName: "providerfs fault")
    let request = try FaultCommand.parseAdd(&list)
    _ = list.positional()  // PATH
    try list.finish()
    return request
}

private func usageError(_ words: [String]) -> String? {
    do {
        _ = try parse(words)
        return nil
    } catch {
        return error.message
    }
}

@Suite("providerfs fault: the command line")
struct FaultCommandLineTests {
    @Test("every fault kind parses to its fault")
    func everyKind() throws {
        #expect(try parse(["f", "--fail-at", "4MiB"]).fault == .failAfter(offset: 4 << 20, errno: EIO))
        #expect(
            try parse(["f", "--fail-at=0", "--errno", "ECONNRESET"]).fault == .failAfter(offset: 0, errno: ECONNRESET))
        #expect(try parse(["f", "--fail-at", "10", "--errno=eacces"]).fault == .failAfter(offset: 10, errno: EACCES))
        #expect(try parse(["f", "--stall"]).fault == .stall(offset: 0))
        #expect(try parse(["--stall", "f"]).fault == .stall(offset: 0), "a PATH after --stall is not a duration")
        #expect(try parse(["f", "--stall", "2s"]).fault == .stall(offset: 0, duration: .seconds(2)))
        #expect(
            try parse(["--stall=500ms", "--at", "64KiB", "f"]).fault
                == .stall(offset: 64 << 10, duration: .milliseconds(500)))
        #expect(try parse(["f", "--truncate-at", "1000"]).fault == .truncate(offset: 1000))
        #expect(try parse(["f", "--corrupt"]).fault == .corrupt(offset: 0))
        #expect(try parse(["f", "--corrupt", "--at", "1M"]).fault == .corrupt(offset: 1 << 20))
        #expect(try parse(["f", "--change-version-at", "3"]).fault == .changeVersion(offset: 3))
        #expect(try parse(["f", "--slow", "1MiB/s"]).fault == .slow(bytesPerSecond: 1 << 20))
        #expect(try parse(["f", "--slow", "500"]).fault == .slow(bytesPerSecond: 500))
        #expect(try parse(["f", "--offline"]).fault == .offline)
    }

    @Test("--times and --metadata; the defaults: one download, offline and metadata faults until cleared")
    func timesAndMetadata() throws {
        #expect(try parse(["f", "--fail-at", "1"]).faultTimes == .downloads(1))
        #expect(try parse(["f", "--fail-at", "1", "--times", "3"]).faultTimes == .downloads(3))
        #expect(try parse(["f", "--fail-at", "1", "--times", "0"]).faultTimes == .untilCleared)
        #expect(try parse(["f", "--offline"]).faultTimes == .untilCleared)
        #expect(try parse(["f", "--offline", "--times", "2"]).faultTimes == .downloads(2))
        let metadata = try parse(["f", "--stall", "1s", "--metadata"])
        #expect(metadata.metadata && metadata.faultTimes == .untilCleared)
    }

    @Test("--on upload takes a failure (any errno), a stall or offline; --on metadata is --metadata")
    func onUpload() throws {
        let failed = try parse(["f", "--on", "upload", "--fail-at", "1MiB", "--errno", "ENOSPC"])
        #expect(failed.on == .upload && failed.fault == .failAfter(offset: 1 << 20, errno: ENOSPC))
        #expect(failed.faultTimes == .downloads(1) && !failed.metadata)
        for name in ["EDQUOT", "EACCES", "EFBIG"] {
            #expect(try parse(["f", "--on=upload", "--fail-at", "0", "--errno", name]).on == .upload)
        }
        #expect(try parse(["--on", "upload", "--fail-at", "0", "f"]).fault == .failAfter(offset: 0, errno: EIO))
        let stalled = try parse(["f", "--on", "upload", "--stall", "2s", "--times", "3"])
        #expect(stalled.fault == .stall(offset: 0, duration: .seconds(2)) && stalled.faultTimes == .downloads(3))
        #expect(try parse(["f", "--on", "upload", "--stall"]).fault == .stall(offset: 0))
        let offline = try parse(["f", "--on", "upload", "--offline"])
        #expect(offline.on == .upload && offline.faultTimes == .untilCleared)
        let download = try parse(["f", "--on", "download", "--truncate-at", "5"])
        let plain = try parse(["f", "--truncate-at", "5"])
        #expect(download.on == .download && download == plain)
        let onMetadata = try parse(["f", "--on", "metadata", "--stall", "1s"])
        let metadataFlag = try parse(["f", "--stall", "1s", "--metadata"])
        #expect(onMetadata == metadataFlag && onMetadata.metadata)
    }

    @Test("usage errors name what is wrong")
    func usageErrors() {
        let cases: [([String], String)] = [
            (["f"], "name the fault"),
            (["f", "--fail-at", "1", "--offline"], "one fault at a time"),
            (["f", "--corrupt", "--stall"], "one fault at a time"),
            (["f", "--fail-at", "-5"], "not a valid size"),
            (["f", "--fail-at", "lots"], "not a valid size"),
            (["f", "--fail-at", "99999999TiB"], "not a valid size"),
            (["f", "--fail-at", "2048TiB"], "beyond any file"),
            (["f", "--fail-at", "1", "--errno", "ENOPE"], "not an errno name"),
            (["f", "--fail-at", "1", "--errno", "5"], "not an errno name"),
            (["f", "--truncate-at", "1", "--errno", "EIO"], "--errno goes with --fail-at"),
            (["f", "--truncate-at", "1", "--at", "5"], "--at goes with"),
            (["f", "--stall=forever"], "not a valid duration"),
            (["f", "--stall=0s"], "from 1ms to 24h"),
            (["f", "--stall=48h"], "from 1ms to 24h"),
            (["f", "--slow", "0"], "from 1 byte/s"),
            (["f", "--slow", "fast"], "not a valid size"),
            (["f", "--offline", "--times", "-1"], "--times"),
            (["f", "--offline", "--times", "many"], "--times"),
            (["f", "--truncate-at", "1", "--metadata"], "--metadata goes with"),
            (["f", "--fail-at", "1", "--bogus"], "unknown option '--bogus'"),
            (["f", "g", "--fail-at", "1"], "unexpected argument 'g'"),
            (["f", "--fail-at"], "needs a value"),
            (["f", "--metadata=yes", "--offline"], "takes no value"),
            (["f", "--on", "sideways", "--offline"], "--on: 'sideways' is not download, upload or metadata"),
            (["f", "--on"], "needs a value"),
            (["f", "--on", "upload", "--truncate-at", "1"], "--truncate-at does not apply to uploads"),
            (["f", "--on", "upload", "--corrupt"], "--corrupt does not apply to uploads"),
            (["f", "--on", "upload", "--change-version-at", "1"], "--change-version-at does not apply to uploads"),
            (["f", "--on", "upload", "--slow", "1"], "--slow does not apply to uploads"),
            (["f", "--on", "upload", "--stall", "--at", "5"], "--at does not apply to uploads"),
            (["f", "--on", "upload", "--offline", "--metadata"], "--metadata does not go with --on upload"),
            (["f", "--on", "metadata", "--corrupt"], "--on metadata goes with"),
        ]
        for (words, expected) in cases {
            let message = usageError(words)
            #expect(message?.contains(expected) == true, "\(words): \(message ?? "accepted")")
        }
    }

    @Test("the command exits 64 on usage errors and 1 for a path outside any mount", .blockingThreads)
    func exitStatuses() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        #expect(await ProviderFSCLI.main(["providerfs", "fault"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "explode"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "add", "--fail-at", "1"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "add", directory.path, "--offline", "--stall"]) == 64)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "clear"]) == ExitStatus.usage)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "list", "--bogus"]) == ExitStatus.usage)
        #expect(
            await ProviderFSCLI.main(["providerfs", "fault", "add", directory.path, "--on", "upload", "--corrupt"])
                == ExitStatus.usage)
        #expect(
            await ProviderFSCLI.main(["providerfs", "fault", "add", directory.path, "--on", "uplaod", "--offline"])
                == ExitStatus.usage)
        #expect(
            await ProviderFSCLI.main(["providerfs", "fault", "add", directory.path, "--fail-at", "1"])
                == ExitStatus.failure)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "clear", directory.path]) == ExitStatus.failure)
        #expect(await ProviderFSCLI.main(["providerfs", "fault", "--help"]) == ExitStatus.success)
    }
}

@Suite("Fault control requests")
struct FaultControlRequestTests {
    private func parsed(_ kind: String, _ arguments: [String: Any]) -> Result<ControlRequest, ControlError> {
        let object: [String: Any] = ["version": 1, "id": 1, "request": kind, "arguments": arguments]
        let data = try! JSONSerialization.data(withJSONObject: object)
        return ControlProtocol.parseRequest(Array(data)).request
    }

    @Test("faultAdd, faultList and faultClear round trip through the parser")
    func roundTrip() throws {
        let requests: [ControlRequest] = [
            .faultAdd(
                FaultRequest(path: "a/b", fault: .failAfter(offset: 5, errno: ECONNRESET), times: 2, metadata: true)),
            .faultAdd(
                FaultRequest(
                    path: "", fault: .stall(offset: 7, duration: .milliseconds(1500)), times: nil, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .stall(offset: 0), times: 0, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .truncate(offset: 1), times: nil, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .corrupt(offset: 9), times: nil, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .changeVersion(offset: 9), times: nil, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .slow(bytesPerSecond: 1000), times: nil, metadata: false)),
            .faultAdd(FaultRequest(path: "x", fault: .offline, times: 1, metadata: false)),
            .faultAdd(
                FaultRequest(
                    path: "x", fault: .failAfter(offset: 0, errno: EDQUOT), times: 2, metadata: false, on: .upload)),
            .faultAdd(
                FaultRequest(
                    path: "x", fault: .stall(offset: 0, duration: .seconds(1)), times: nil, metadata: false,
                    on: .upload)),
            .faultAdd(FaultRequest(path: "x", fault: .offline, times: 0, metadata: false, on: .upload)),
            .faultList, .faultClear(path: "a b/ü"), .faultClear(path: nil),
        ]
        for request in requests {
            let frame = ControlProtocol.requestFrame(id: 9, request)
            let (id, result) = ControlProtocol.parseRequest(Array(frame.dropFirst(4)))
            #expect(id == 9)
            #expect(try result.get() == request)
        }
    }

    @Test("bad arguments are invalidArguments with a clear message")
    func strictArguments() {
        let cases: [(String, [String: Any], String)] = [
            ("faultAdd", ["path": "a"], "needs a string argument \"fault\""),
            ("faultAdd", ["path": "a", "fault": "explode"], "unknown fault 'explode'"),
            ("faultAdd", ["fault": "offline"], "\"path\""),
            ("faultAdd", ["path": "/etc", "fault": "offline"], "relative to the mount root"),
            ("faultAdd", ["path": "../x", "fault": "offline"], "relative to the mount root"),
            ("faultAdd", ["path": "a", "fault": "failAt"], "needs \"at\""),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": -1], "between 0 and"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": 1 << 60], "between 0 and"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": 1.5], "must be an integer"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": "12"], "must be an integer"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": true], "must be an integer"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": 1, "errno": "EFOO"], "errno name"),
            ("faultAdd", ["path": "a", "fault": "failAt", "at": 1, "errno": 5], "errno name"),
            ("faultAdd", ["path": "a", "fault": "truncate", "at": 1, "errno": "EIO"], "\"errno\" is not an argument"),
            ("faultAdd", ["path": "a", "fault": "offline", "at": 1], "\"at\" is not an argument"),
            ("faultAdd", ["path": "a", "fault": "offline", "bogus": 1], "\"bogus\" is not an argument"),
            ("faultAdd", ["path": "a", "fault": "stall", "durationMilliseconds": 0], "between 1 and"),
            ("faultAdd", ["path": "a", "fault": "stall", "durationMilliseconds": 1 << 40], "between 1 and"),
            ("faultAdd", ["path": "a", "fault": "slow"], "needs \"bytesPerSecond\""),
            ("faultAdd", ["path": "a", "fault": "slow", "bytesPerSecond": 0], "between 1 and"),
            ("faultAdd", ["path": "a", "fault": "offline", "times": -1], "between 0 and"),
            ("faultAdd", ["path": "a", "fault": "offline", "metadata": 1], "true or false"),
            ("faultAdd", ["path": "a", "fault": "corrupt", "metadata": true], "applies to failAt, stall and offline"),
            ("faultAdd", ["path": "a", "fault": "offline", "on": "sideways"], "\"on\" must be"),
            ("faultAdd", ["path": "a", "fault": "offline", "on": 1], "\"on\" must be"),
            (
                "faultAdd", ["path": "a", "fault": "corrupt", "on": "upload"],
                "an upload fault is failAt, stall or offline"
            ),
            ("faultAdd", ["path": "a", "fault": "slow", "bytesPerSecond": 5, "on": "upload"], "an upload fault"),
            (
                "faultAdd", ["path": "a", "fault": "offline", "on": "upload", "metadata": true],
                "does not apply to upload"
            ),
            (
                "faultAdd", ["path": "a", "fault": "stall", "at": 5, "on": "upload"],
                "does not apply to an upload stall"
            ),
            ("faultList", ["path": "a"], "takes no argument"),
            ("faultClear", [:], "either \"path\" or \"all\""),
            ("faultClear", ["path": "a", "all": true], "either \"path\" or \"all\""),
            ("faultClear", ["all": false], "either \"path\" or \"all\""),
            ("faultClear", ["path": "/a"], "relative to the mount root"),
            ("faultClear", ["everything": true], "not an argument"),
        ]
        for (kind, arguments, expected) in cases {
            guard case .failure(let error) = parsed(kind, arguments) else {
                Issue.record("\(kind) \(arguments) was accepted")
                continue
            }
            #expect(error.code == .invalidArguments, "\(kind) \(arguments)")
            #expect(error.message.contains(expected), "\(kind) \(arguments): \(error.message)")
        }
    }

    /// Random values in every field of faultAdd: always a request or invalidArguments, never a trap.
    @Test(arguments: [UInt64(5), 6, 7])
    func fuzzedArgumentsAreAnsweredNeverTrap(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let keys = ["path", "fault", "at", "errno", "durationMilliseconds", "bytesPerSecond", "times", "metadata", "x"]
        let values: [Any] = [
            "a", "", "/", "..", "EIO", "failAt", "stall", "slow", "offline", "corrupt", "truncate", "changeVersion",
            0, -1, 1, Int64.max, Int64.min, 1.5, Double.infinity.isFinite, true, false, NSNull(), [1], ["k": 1],
        ]
        var accepted = 0
        for _ in 0..<2000 {
            var arguments: [String: Any] = [:]
            for _ in 0..<Int.random(in: 0...6, using: &random) {
                arguments[keys[Int.random(in: 0..<keys.count, using: &random)]] =
                    values[Int.random(in: 0..<values.count, using: &random)]
            }
            switch parsed("faultAdd", arguments) {
            case .success: accepted += 1
            case .failure(let error): #expect(error.code == .invalidArguments)
            }
        }
        #expect(accepted < 2000)
    }
}

@Suite("Faults in the daemon", .blockingThreads)
struct MountFaultsTests {
    @Test("faultAdd resolves the path, list shows it, clear removes it; the plan is stored in the cache")
    func addListClear() async throws {
        let source = try TemporaryDirectory()
        let cache = try TemporaryDirectory()
        defer {
            source.remove()
            cache.remove()
        }
        try source.write("docs/a.txt", Array("hello".utf8))
        let faults = try MountComposition.storedFaults(in: cache.path)
        let fileSystem = try MountComposition.makeFileSystem(
            source: source.path, cacheDirectory: cache.path, faults: faults)
        let control = MountFaults(plan: faults, fileSystem: fileSystem)
        func reply(_ request: ControlRequest) async -> Result<[String: Any], ControlError> {
            guard let result = await control.handle(request) else { return .failure(ControlError(.failed, "none")) }
            return result.map { (try? JSONSerialization.jsonObject(with: Data($0))) as? [String: Any] ?? [:] }
        }
        let added = try await reply(
            .faultAdd(
                FaultRequest(path: "docs/a.txt", fault: .failAfter(offset: 2, errno: EIO), times: nil, metadata: false))
        ).get()
        #expect(added["identifier"] as? String == "docs/a.txt")
        #expect(added["timesLeft"] as? Int == 1)
        _ = try await reply(.faultAdd(FaultRequest(path: "docs", fault: .offline, times: nil, metadata: false))).get()
        let missing = await reply(.faultAdd(FaultRequest(path: "nope", fault: .offline, times: nil, metadata: false)))
        #expect(throws: ControlError.self) { try missing.get() }
        if case .failure(let error) = missing { #expect(error.code == .notFound) }

        let listed = try await reply(.faultList).get()["faults"] as? [[String: Any]] ?? []
        #expect(listed.map { $0["path"] as? String } == ["docs/a.txt", "docs"])
        #expect(listed.map { $0["fault"] as? String } == ["failAt", "offline"])
        #expect(listed.map { $0["on"] as? String } == ["download", "download"])
        #expect(listed[1]["timesLeft"] == nil)
        #expect(try MountComposition.storedFaults(in: cache.path).all.count == 2, "stored")

        // An upload fault: listed with "on": "upload", its uploads left, stored.
        let upload = try await reply(
            .faultAdd(
                FaultRequest(
                    path: "docs/a.txt", fault: .failAfter(offset: 0, errno: ENOSPC), times: 2, metadata: false,
                    on: .upload))
        ).get()
        #expect(upload["on"] as? String == "upload")
        #expect(upload["errno"] as? String == "ENOSPC")
        #expect(upload["timesLeft"] as? Int == 2)
        let decoded = try JSONDecoder().decode(
            ControlFaultList.self, from: Data(try #require(await control.handle(.faultList)).get()))
        #expect(
            decoded.faults.map(FaultCommand.describe).last
                == "on upload: fail at 0 with ENOSPC, 2 uploads left")
        let stored = try MountComposition.storedFaults(in: cache.path).all
        #expect(stored.map(\.on) == [.download, .download, .upload])
        #expect(try await reply(.faultClear(path: "docs/a.txt")).get()["cleared"] as? Int == 2)

        #expect(try await reply(.faultClear(path: "docs")).get()["cleared"] as? Int == 1)
        let none = await reply(.faultClear(path: "docs"))
        if case .failure(let error) = none { #expect(error.code == .notFound) } else { Issue.record("cleared twice") }
        #expect(try await reply(.faultClear(path: nil)).get()["cleared"] as? Int == 0)
        #expect(try MountComposition.storedFaults(in: cache.path).all.isEmpty)
        await fileSystem.shutdown()
    }
}
