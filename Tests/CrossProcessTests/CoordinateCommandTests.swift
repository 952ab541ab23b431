// `providerfs coordinate`, `present`, `claims` from a shell, as a user would run them. Ordering is
// proven with marker files and the claim dump, not with timing.
import FileCoordination
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.serialized, .blockingThreads) struct CoordinateCommandTests {
    /// Runs a shell snippet in the world's environment (PF = providerfs path, F = files dir).
    func shell(_ world: CoordinationWorld, _ script: String) throws -> Child {
        var environment = world.environment
        environment["PF"] = providerfsPath
        environment["F"] = world.files
        let child = try Child("/bin/bash", ["-c", script], environment: environment)
        world.children.append(child)
        return child
    }

    func exists(_ world: CoordinationWorld, _ name: String) -> Bool {
        FileManager.default.fileExists(atPath: world.path(name))
    }

    @Test func twoWritersRunStrictlyOneAfterTheOther() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        // Writer 1 holds the claim until the test creates "go"; writer 2 checks that writer 1 has
        // finished when it starts.
        let first = try shell(
            world,
            #"$PF coordinate --write "$F/doc" -- sh -c 'touch "$F/in1"; while [ ! -e "$F/go" ]; do sleep 0.01; done; touch "$F/out1"'"#
        )
        for _ in 0..<2000 where !exists(world, "in1") { usleep(5000) }
        #expect(exists(world, "in1"))
        let second = try shell(
            world, #"$PF coordinate --write "$F/doc" -- sh -c 'test -e "$F/out1" && touch "$F/in2"'"#)
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        #expect(!exists(world, "in2"))
        _ = FileManager.default.createFile(atPath: world.path("go"), contents: nil)
        #expect(first.stop(grace: 10) == 0)
        #expect(second.stop(grace: 10) == 0)
        #expect(exists(world, "in2"), "the second writer ran after the first one ended")
    }

    @Test func writeDeletingADirectoryWaitsForAReaderInsideAndMovingAndReplacingAreAccepted() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        try FileManager.default.createDirectory(atPath: world.path("dir"), withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: world.path("dir/f"), contents: Data("x".utf8))
        let reader = try shell(
            world,
            #"$PF coordinate --read "$F/dir/f" -- sh -c 'touch "$F/reading"; while [ ! -e "$F/go" ]; do sleep 0.01; done'"#
        )
        for _ in 0..<2000 where !exists(world, "reading") { usleep(5000) }
        #expect(exists(world, "reading"))
        let deleter = try shell(world, #"$PF coordinate --write=deleting "$F/dir" -- rm -r "$F/dir""#)
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        #expect(exists(world, "dir/f"), "the delete waits for the read inside the directory")
        _ = FileManager.default.createFile(atPath: world.path("go"), contents: nil)
        #expect(reader.stop(grace: 10) == 0)
        #expect(deleter.stop(grace: 10) == 0)
        #expect(!exists(world, "dir"))
        // The other writing options run their command under the claim and exit with its status.
        _ = FileManager.default.createFile(atPath: world.path("a"), contents: Data("a".utf8))
        let moving = try shell(world, #"$PF coordinate --write=moving "$F/a" -- mv "$F/a" "$F/b""#)
        #expect(moving.stop(grace: 10) == 0)
        let replacing = try shell(
            world, #"$PF coordinate --write=replacing "$F/b" -- sh -c 'echo new > "$F/b.tmp" && mv "$F/b.tmp" "$F/b"'"#)
        #expect(replacing.stop(grace: 10) == 0)
        let merging = try shell(world, #"$PF coordinate --write=merging "$F/b" -- sh -c 'exit 3'"#)
        #expect(merging.stop(grace: 10) == 3)
        #expect(try String(contentsOfFile: world.path("b"), encoding: .utf8) == "new\n")
    }

    @Test func readersOverlap() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        // Each reader waits (5 s at most) for the other's marker: they can only both succeed if
        // their commands run at the same time.
        let wait = #"for i in $(seq 500); do [ -e "$F/$1" ] && exit 0; sleep 0.01; done; exit 1"#
        let a = try shell(world, #"$PF coordinate --read "$F/doc" -- sh -c 'touch "$F/a"; \#(wait)' _ b"#)
        let b = try shell(world, #"$PF coordinate --read "$F/doc" -- sh -c 'touch "$F/b"; \#(wait)' _ a"#)
        #expect(a.stop(grace: 10) == 0)
        #expect(b.stop(grace: 10) == 0)
    }

    @Test func rule34_coordinateWriteEvictingNeedsPresentersThatAccommodateIt() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let plain = try world.probe(["present", world.path("doc")])
        #expect(plain.waitForLine("ready") != nil)
        let refused = try shell(world, #"$PF coordinate --write=evicting "$F/doc" -- touch "$F/ran" 2>&1"#)
        #expect(refused.stop() == 1)
        #expect(refused.waitForLine("providerfs")?.contains("accommodatePresentedItemEviction") == true)
        #expect(!exists(world, "ran"))
        #expect(plain.stop() == 0)
        let evictable = try world.probe(["present", world.path("doc"), "--evictable"])
        #expect(evictable.waitForLine("ready") != nil)
        let evicted = try shell(world, #"$PF coordinate --write=evicting "$F/doc" -- touch "$F/ran""#)
        #expect(evicted.stop() == 0)
        #expect(exists(world, "ran"))
        #expect(evictable.waitForLine("event accommodateEviction") != nil)
        #expect(evictable.stop() == 0)
    }

    @Test func exitStatusIsTheCommandsAnd75OnTimeout() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let status = try shell(world, #"$PF coordinate --read "$F/doc" -- sh -c 'exit 7'"#)
        #expect(status.stop() == 7)
        let holder = try world.probe(["hold", "--write", world.path("doc")])
        #expect(holder.waitForLine("granted") != nil)
        let timedOut = try shell(world, #"$PF coordinate --write "$F/doc" --timeout 100ms -- true"#)
        #expect(timedOut.stop() == 75)
        #expect(holder.stop() == 0)
    }

    @Test(arguments: [
        ["coordinate", "/tmp/x", "--", "true"],
        ["coordinate", "--read", "--write", "/tmp/x", "--", "true"],
        ["coordinate", "--write=sideways", "/tmp/x", "--", "true"],
        ["coordinate", "--read", "/tmp/x"],
        ["coordinate", "--read", "--", "true"],
        ["coordinate", "--read", "/tmp/x", "--timeout", "soon", "--", "true"],
        ["present"], ["claims", "extra"], ["coordinator", "--idle-exit", "x"],
    ])
    func usageErrorsExit64WithOneSentence(arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: providerfsPath)
        process.arguments = arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 64)
        let first = text.split(separator: "\n").first ?? ""
        #expect(first.hasPrefix("providerfs ") && first.hasSuffix("."))
    }

    @Test func presentPrintsJSONLinesAndStopsOnSIGTERM() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        let presenter = try Child(providerfsPath, ["present", file], environment: world.environment)
        world.children.append(presenter)
        #expect(presenter.waitForLine(#"{"event":"ready""#) != nil)
        let writer = try shell(world, #"$PF coordinate --write "$F/doc" -- sh -c 'echo x > "$F/doc"'"#)
        #expect(writer.stop() == 0)
        #expect(presenter.waitForLine(#"{"event":"presentedItemDidChange""#) != nil)
        let lines = presenter.output_
        let events = lines.compactMap { line -> String? in
            guard let data = line.data(using: .utf8),
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
            else { return nil }
            return object["event"] as? String
        }
        #expect(events.count == lines.count, "every line is JSON")
        #expect(events.prefix(2) == ["ready", "relinquishToWriter"])
        #expect(events.contains("presentedItemDidChange"))
        _ = kill(presenter.pid, SIGTERM)
        presenter.process.waitUntilExit()
        #expect(presenter.process.terminationStatus == 0)
        #expect(presenter.output_.last?.contains(#""event":"stopped""#) == true)
    }

    @Test func claimsListsHeldAndWaitingWithPidAndKind() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let holder = try world.probe(["hold", "--write=merging", world.path("doc")])
        #expect(holder.waitForLine("granted") != nil)
        let waiter = try world.probe(["hold", "--read", world.path("doc")])
        #expect(world.eventually { $0.claims.count == 2 })
        let listing = try Child(providerfsPath, ["claims"], environment: world.environment)
        #expect(listing.stop() == 0)
        let text = listing.output_.joined(separator: "\n")
        #expect(text.contains("held") && text.contains("write(merging)") && text.contains(String(holder.pid)))
        #expect(text.contains("waiting") && text.contains(String(waiter.pid)))
        let json = try Child(providerfsPath, ["claims", "--json"], environment: world.environment)
        #expect(json.stop() == 0)
        let dump = try CoordinationDump.decode(json.output_.joined())
        #expect(dump.claims.map(\.pid) == [holder.pid, waiter.pid])
        #expect(dump.claims.map(\.state) == ["held", "waiting"])
    }
}
