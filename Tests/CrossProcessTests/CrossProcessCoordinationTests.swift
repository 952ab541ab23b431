// Coordination between real processes: coordination-probe children and the providerfs binary,
// each test with its own runtime directory and server, stopped by PID at the end. Waiting states
// are observed through the server's claim dump, never assumed after a sleep.
import FileCoordination
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.serialized, .blockingThreads) struct CrossProcessCoordinationTests {
    @Test func rule01_readersInTwoProcessesShare() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        let a = try world.probe(["hold", "--read", file])
        let b = try world.probe(["hold", "--read", file])
        #expect(a.waitForLine("granted") != nil)
        #expect(b.waitForLine("granted") != nil)
        #expect(a.stop() == 0 && b.stop() == 0)
    }

    @Test func rule02_readerWaitsForWriterInAnotherProcess() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        let writer = try world.probe(["hold", "--write", file])
        #expect(writer.waitForLine("granted") != nil)
        let reader = try world.probe(["hold", "--read", file])
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        #expect(!reader.hasLine("granted"))
        writer.closeInput()
        #expect(reader.waitForLine("granted") != nil)
        #expect(writer.stop() == 0 && reader.stop() == 0)
    }

    @Test func rule03_writersInTwoProcessesExclude() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        let first = try world.probe(["hold", "--write", file])
        #expect(first.waitForLine("granted") != nil)
        let second = try world.probe(["hold", "--write", file])
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        let dump = try world.dump()
        #expect(dump?.claims.map(\.pid) == [first.pid, second.pid], "SO_PEERCRED names the processes")
        #expect(!second.hasLine("granted"))
        first.closeInput()
        #expect(second.waitForLine("granted") != nil)
        #expect(first.stop() == 0 && second.stop() == 0)
    }

    @Test func rule12_forDeletingOnADirectoryWaitsForAClaimInsideIt() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let directory = world.path("D")
        try FileManager.default.createDirectory(atPath: directory + "/sub", withIntermediateDirectories: true)
        let inside = try world.probe(["hold", "--read", directory + "/sub/x"])
        #expect(inside.waitForLine("granted") != nil)
        let deleter = try world.probe(["hold", "--write=deleting", directory])
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        #expect(!deleter.hasLine("granted"))
        inside.closeInput()
        #expect(deleter.waitForLine("granted") != nil)
        #expect(deleter.stop() == 0)
    }

    @Test func rule34_evictionAcrossProcessesNeedsAPresenterThatRemovesItself() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        // A presenter without accommodatePresentedItemEviction vetoes the eviction.
        let plain = try world.probe(["present", file])
        #expect(plain.waitForLine("ready") != nil)
        let refused = try world.probe(["hold", "--write=evicting", file])
        let failure = refused.waitForLine("failed")
        #expect(failure?.contains("presenterFailed") == true)
        #expect(failure?.contains("accommodatePresentedItemEviction") == true)
        #expect(refused.stop() == 1)
        plain.closeInput()
        #expect(plain.stop() == 0)
        // One that implements it is asked, removes itself over the wire, and the eviction runs.
        let evictable = try world.probe(["present", file, "--evictable"])
        #expect(evictable.waitForLine("ready") != nil)
        let evictor = try world.probe(["hold", "--write=evicting", file])
        #expect(evictor.waitForLine("granted") != nil)
        // The presenter prints the event before it answers, and the grant waits for that answer;
        // the line may still be in the pipe to this process, so wait for it rather than peek.
        #expect(evictable.waitForLine("event accommodateEviction \(file)") != nil)
        evictor.closeInput()
        #expect(evictor.stop() == 0)
        evictable.closeInput()
        #expect(evictable.stop() == 0)
    }

    @Test func killMinus9OfAHolderFreesItsClaimAtOnce() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        let holder = try world.probe(["hold", "--write", file])
        #expect(holder.waitForLine("granted") != nil)
        let waiter = try world.probe(["hold", "--write", file])
        #expect(world.eventually { $0.claims.count == 2 })
        holder.kill9()
        #expect(waiter.waitForLine("granted") != nil)
        #expect(world.eventually { $0.claims.map(\.pid) == [waiter.pid] })
    }

    @Test func presenterInAnotherProcessRelinquishesBeforeTheWriteAndHearsDidChangeAfter() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        let presenter = try world.probe(["present", file])
        #expect(presenter.waitForLine("ready") != nil)
        let writer = try world.probe(["hold", "--write", file])
        #expect(writer.waitForLine("granted") != nil)
        // The grant waited for the presenter's answer, which it gives after printing the event.
        #expect(presenter.waitForLine("event relinquishToWriter \(file)") != nil)
        #expect(!presenter.hasLine("event didChange"))
        writer.closeInput()
        #expect(presenter.waitForLine("event didChange \(file)") != nil)
        #expect(presenter.waitForLine("event reacquire") != nil)
        #expect(writer.stop() == 0)
    }

    @Test func rule17_theGrantWaitsForTheAnswerOfAPresenterInAnotherProcess() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        let presenter = try world.probe(["present", file, "--answer-on-input"])
        #expect(presenter.waitForLine("ready") != nil)
        let writer = try world.probe(["hold", "--write", file])
        #expect(presenter.waitForLine("event relinquishToWriter \(file)") != nil)
        // Asked and not answered: the server holds the claim back, and the writer has no grant.
        #expect(world.eventually { $0.claims.map(\.state) == ["messaging"] })
        #expect(!writer.hasLine("granted"))
        presenter.send("answer")
        #expect(writer.waitForLine("granted") != nil)
        #expect(world.eventually { $0.claims.map(\.state) == ["held"] })
        writer.closeInput()
        #expect(presenter.waitForLine("event reacquire") != nil)
        #expect(writer.stop() == 0 && presenter.stop() == 0)
    }

    @Test func aPresenterWhoseProcessDiesCountsAsAnsweredAtOnce() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        let presenter = try world.probe(["present", file, "--answer-on-input"])
        #expect(presenter.waitForLine("ready") != nil)
        // A presenter deadline far beyond the waits below: only the death can let the writer in.
        let writer = try world.probe(["hold", "--write", file], extra: ["PROVIDERFS_PRESENTER_TIMEOUT": "300s"])
        #expect(presenter.waitForLine("event relinquishToWriter") != nil)
        #expect(world.eventually { $0.claims.map(\.state) == ["messaging"] })
        presenter.kill9()
        #expect(writer.waitForLine("granted") != nil)
        #expect(world.eventually { $0.presenters.isEmpty && $0.claims.map(\.state) == ["held"] })
        #expect(writer.stop() == 0)
    }

    @Test func rule67_filePresentersListsOnlyThisProcesssPresenters() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let first = try world.probe(["present", world.path("a")])
        // Each process sees its own presenter only, while the server knows both.
        #expect(first.waitForLine("ready 1") != nil)
        let second = try world.probe(["present", world.path("b")])
        #expect(second.waitForLine("ready 1") != nil)
        #expect(world.eventually { $0.presenters.count == 2 })
        #expect(first.stop() == 0 && second.stop() == 0)
    }

    @Test func silentPresenterHitsItsDeadlineAndTheWriteStillHappens() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("doc")
        let presenter = try world.probe(["present", file, "--silent"])
        #expect(presenter.waitForLine("ready") != nil)
        let started = Date()
        let writer = try world.probe(["hold", "--write", file], extra: ["PROVIDERFS_PRESENTER_TIMEOUT": "300ms"])
        #expect(writer.waitForLine("granted") != nil)
        #expect(Date().timeIntervalSince(started) >= 0.3)
        #expect(presenter.waitForLine("event relinquishToWriter") != nil)
        let dump = try world.dump()
        let events = dump?.claims.first?.events ?? []
        #expect(events.count == 1 && events[0].contains("did not answer") && events[0].contains("pid \(presenter.pid)"))
        #expect(dump?.events.last?.text.contains("did not answer") == true)
        #expect(writer.stop() == 0)
    }

    @Test func rule35_39_moveInAnotherProcessRedirectsWaitersAndPresenters() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let from = world.path("old")
        let to = world.path("new")
        _ = FileManager.default.createFile(atPath: from, contents: Data("x".utf8))
        let presenter = try world.probe(["present", from])
        #expect(presenter.waitForLine("ready") != nil)
        let mover = try world.probe(["move", from, to])
        #expect(mover.waitForLine("moving") != nil)
        let reader = try world.probe(["hold", "--read", from])
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        mover.closeInput()
        #expect(mover.waitForLine("moved") != nil)
        #expect(reader.waitForLine("granted") == "granted \(to)", "rule 39: the waiting claim follows the move")
        #expect(presenter.waitForLine("event didMove \(to)") != nil, "rule 35")
        #expect(presenter.hasLine("event relinquishToWriter"))
        #expect(reader.stop() == 0)
    }

    @Test func libraryStartsTheServerOnDemandOnceForManyClients() throws {
        let world = try CoordinationWorld(startServer: false)
        defer { world.tearDown() }
        let file = world.path("f")
        let probes = try (0..<4).map { _ in try world.probe(["hold", "--read", file]) }
        for probe in probes { #expect(probe.waitForLine("granted") != nil) }
        let serverPid = world.onDemandServerPid() ?? 0
        #expect(serverPid > 0)
        let dump = try world.dump()
        #expect(dump?.serverPid == serverPid)
        #expect(dump?.claims.count == 4, "every client reached the one server")
        // Servers started by the other clients saw the running one and left: one remains.
        var servers: [Int32] = []
        for _ in 0..<500 {
            servers = coordinatorProcesses(runtime: world.runtime)
            if servers == [serverPid] { break }
            usleep(10_000)
        }
        #expect(servers == [serverPid])
        // The server holds no descriptor of its starter: its stdio is /dev/null.
        for fd in 0...2 {
            let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(serverPid)/fd/\(fd)")
            #expect(target == "/dev/null")
        }
        // Nor any pipe shared with this test (which holds the read ends of the probes' stdout): its
        // only pipe is its own wake-up pipe.
        let ours = Set(pipes(of: "self"))
        #expect(Set(pipes(of: "\(serverPid)")).isDisjoint(with: ours))
        #expect(!ours.isEmpty, "sanity: the test does hold pipes")
        for probe in probes { #expect(probe.stop() == 0) }
    }

    @Test func onDemandServerExitsWhenIdle() throws {
        let world = try CoordinationWorld(startServer: false)
        defer { world.tearDown() }
        let probe = try world.probe(["hold", "--read", world.path("f")], extra: [:])
        #expect(probe.waitForLine("granted") != nil)
        #expect(probe.stop() == 0)
        let serverPid = world.onDemandServerPid() ?? 0
        #expect(serverPid > 0)
        // PROVIDERFS_COORDINATOR_IDLE=3s in this world: it must be gone well within 10 s.
        var gone = false
        for _ in 0..<1000 {
            if processIsGone(serverPid) {
                gone = true
                break
            }
            usleep(10_000)
        }
        #expect(gone)
        #expect(!FileManager.default.fileExists(atPath: world.runtime + "/coordinator.sock"))
    }

    /// `providerfs coordinator` processes whose environment names this runtime directory.
    private func coordinatorProcesses(runtime: String) -> [Int32] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(Int32.init).filter { pid in
            guard let command = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"),
                let environment = FileManager.default.contents(atPath: "/proc/\(pid)/environ")
            else { return false }
            let arguments = command.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            let variables = environment.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            return arguments.count > 1 && arguments[1] == "coordinator"
                && variables.contains("PROVIDERFS_RUNTIME_DIR=" + runtime) && !processIsGone(pid)
        }.sorted()
    }

    private func pipes(of process: String) -> [String] {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(process)/fd")) ?? []
        return fds.compactMap {
            try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(process)/fd/\($0)")
        }
        .filter { $0.hasPrefix("pipe:") }
    }
}
