// A coordination server killed with SIGKILL while clients hold and wait for claims (D-402): the
// server is a child of this test, killed by its PID; its successor is started on demand by the
// clients themselves. Waiting states are read from the successor's claim dump.
import FileCoordination
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.serialized, .blockingThreads) struct ServerRestartCrossProcessTests {
    /// Kills the world's own server by PID and reaps it.
    func killServer(_ world: CoordinationWorld) -> Int32 {
        let server = world.server!
        server.kill9()
        server.process.waitUntilExit()
        return server.pid
    }

    @Test func aWriteClaimSurvivesKillMinus9OfTheServerAndConflictingClaimsWaitForIt() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        let holder = try world.probe(["hold", "--write", file])
        #expect(holder.waitForLine("granted") != nil)
        let waiting = try world.probe(["hold", "--write", file])
        #expect(world.eventually { $0.claims.map(\.state) == ["held", "waiting"] })
        let killed = Date()
        let dead = killServer(world)
        let late = try world.probe(["hold", "--write", file])
        // The successor (started on demand by a client) has the holder's claim held, and both
        // others waiting: the one that waited before the crash was resubmitted, not failed.
        #expect(
            world.eventually { dump in
                dump.serverPid != dead && dump.claims.count == 3
                    && dump.claims.filter { $0.state == "held" }.map(\.pid) == [holder.pid]
            })
        let reestablished = Date().timeIntervalSince(killed)
        print("claim re-established \(Int(reestablished * 1000)) ms after the kill (with a client start)")
        #expect(!waiting.hasLine("granted") && !waiting.hasLine("failed"))
        #expect(!late.hasLine("granted") && !late.hasLine("failed"))
        #expect(!holder.hasLine("lost"))
        // Stale files of the dead server were replaced: the pid file names the running successor.
        let successor = world.onDemandServerPid() ?? 0
        #expect(successor != dead && successor > 0 && !processIsGone(successor))
        #expect(try world.dump()?.serverPid == successor)
        // The holder ends: exactly one of the others gets in, then the other.
        holder.closeInput()
        #expect(holder.stop() == 0)
        #expect(
            world.eventually { dump in
                dump.claims.count == 2 && dump.claims.filter { $0.state == "held" }.count == 1
            })
        // The dump shows the grant before the client has printed it: wait for the line.
        let granted = Date().addingTimeInterval(30)
        while !waiting.hasLine("granted") && !late.hasLine("granted") && Date() < granted { usleep(5_000) }
        let first = waiting.hasLine("granted") ? waiting : late
        let second = first === waiting ? late : waiting
        #expect(first.waitForLine("granted") != nil)
        #expect(!second.hasLine("granted"))
        first.closeInput()
        #expect(second.waitForLine("granted") != nil)
        second.closeInput()
        #expect(first.stop() == 0 && second.stop() == 0)
    }

    @Test func aClaimThatCannotBeReclaimedIsReportedToTheHolder() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        let file = world.path("f")
        // Successors started by this holder have no grace period: nothing can be reclaimed.
        let holder = try world.probe(["hold", "--write", file], extra: ["PROVIDERFS_COORDINATOR_GRACE": "0s"])
        #expect(holder.waitForLine("granted") != nil)
        _ = killServer(world)
        let lost = holder.waitForLine("lost")
        #expect(lost?.contains("could not be re-established") == true)
        #expect(lost?.contains(file) == true)
        // Not reclaimed: another writer is served while the holder still runs.
        let other = try world.probe(["hold", "--write", file])
        #expect(other.waitForLine("granted") != nil)
        #expect(other.stop() == 0 && holder.stop() == 0)
    }

    /// `coordinate -- CMD` whose claim is lost: a warning on stderr at once, status 76 after CMD.
    @Test func coordinateWarnsAndExits76WhenItsClaimIsLost() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        var environment = world.environment
        environment["PROVIDERFS_COORDINATOR_GRACE"] = "0s"
        environment["F"] = world.files
        environment["PF"] = providerfsPath
        environment["SCRIPT"] = #"touch "$F/in"; while [ ! -e "$F/go" ]; do sleep 0.01; done"#
        let wrapper = try Child(
            "/bin/bash", ["-c", #"exec "$PF" coordinate --write "$F/doc" -- sh -c "$SCRIPT" 2>"$F/err""#],
            environment: environment)
        world.children.append(wrapper)
        for _ in 0..<2000 where !FileManager.default.fileExists(atPath: world.path("in")) { usleep(5000) }
        #expect(FileManager.default.fileExists(atPath: world.path("in")))
        _ = killServer(world)
        var warning = ""
        for _ in 0..<2000 {
            warning = (try? String(contentsOfFile: world.path("err"), encoding: .utf8)) ?? ""
            if warning.contains("warning") { break }
            usleep(5000)
        }
        #expect(warning.contains("warning: The claim on \(world.path("doc"))"), "told while CMD runs: \(warning)")
        #expect(wrapper.process.isRunning, "CMD goes on")
        _ = FileManager.default.createFile(atPath: world.path("go"), contents: nil)
        #expect(wrapper.stop(grace: 10) == 76)
        let text = (try? String(contentsOfFile: world.path("err"), encoding: .utf8)) ?? ""
        #expect(text.contains("was lost while CMD ran (CMD exited with status 0)"))
    }

    /// With the default grace period, `coordinate --write` keeps its claim across the kill: a
    /// second writer started after the kill runs only after the first one's CMD ended. The
    /// reclaimed claim still names CMD (D-406).
    @Test func coordinateKeepsItsClaimAcrossKillMinus9OfTheServer() throws {
        let world = try CoordinationWorld()
        defer { world.tearDown() }
        var environment = world.environment
        environment["F"] = world.files
        func coordinate(_ script: String) throws -> Child {
            let child = try Child(
                providerfsPath, ["coordinate", "--write", world.path("doc"), "--", "sh", "-c", script],
                environment: environment)
            world.children.append(child)
            return child
        }
        let first = try coordinate(
            #"echo $$ > "$F/cmd.pid"; touch "$F/in1"; while [ ! -e "$F/go" ]; do sleep 0.01; done; touch "$F/out1""#)
        for _ in 0..<2000 where !FileManager.default.fileExists(atPath: world.path("in1")) { usleep(5000) }
        let command = try #require(
            (try? String(contentsOfFile: world.path("cmd.pid"), encoding: .utf8)).flatMap {
                Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
            })
        let dead = killServer(world)
        let second = try coordinate(#"test -e "$F/out1" && touch "$F/in2""#)
        #expect(world.eventually { $0.claims.map(\.state).sorted() == ["held", "waiting"] })
        #expect(
            world.eventually { dump in
                dump.serverPid != dead && dump.claims.filter { $0.state == "held" }.map(\.pid) == [command]
            })
        #expect(!FileManager.default.fileExists(atPath: world.path("in2")))
        _ = FileManager.default.createFile(atPath: world.path("go"), contents: nil)
        #expect(first.stop(grace: 10) == 0)
        #expect(second.stop(grace: 10) == 0)
        #expect(FileManager.default.fileExists(atPath: world.path("in2")), "the second writer ran after the first")
    }
}
