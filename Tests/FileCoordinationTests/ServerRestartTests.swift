// A coordination server that dies and its successor (D-402), in this process: the holders file a
// server keeps, the grace period a successor starts from it, reclaims over the wire, and clients
// that reclaim their granted claims and resubmit their waiting ones. A crash is played by stopping
// the server and putting back the holders file a kill -9 would have left; the real kill -9 is in
// Tests/CrossProcessTests/ServerRestartCrossProcessTests.swift.
import FileCoordination
import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

/// Polls `condition` every millisecond for at most `seconds`.
private func eventually(seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(1000)
    }
    return condition()
}

private func holderLine(server: Int32, owner: UInt64, pid: Int32) -> String {
    "\(server) \(owner) \(pid) \(ProcessInfoFiles.startTime(of: pid) ?? 0)\n"
}

/// Messages from a raw connection until one satisfies `stop` (at most 5 s).
private func readMessages(_ fd: Int32, until stop: (WireMessage) -> Bool) -> [WireMessage] {
    var buffer = FrameBuffer()
    var messages: [WireMessage] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, 5000) > 0 else { return messages }
        let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count <= 0 { return messages }
        chunk.withUnsafeBytes { buffer.append(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        while let payload = try? buffer.next(), let message = try? WireMessage.decode(payload) {
            messages.append(message)
            if stop(message) { return messages }
        }
    }
}

private func send(_ fd: Int32, _ message: WireMessage) {
    let frame = message.frame()
    _ = frame.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
}

@Suite(.serialized, .blockingThreads) struct ServerRestartTests {
    @Test func theHoldersFileListsAConnectionWhileItHoldsAClaimAndGoesWithACleanStop() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.stop() }
        let holders = embedded.directory + "/s.holders"
        let coordinator = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        let seen = try coordinator.coordinate(writingItemAt: URL(fileURLWithPath: embedded.directory + "/f")) { _ in
            try String(contentsOfFile: holders, encoding: .utf8)
        }
        let fields = seen.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
        #expect(fields.count == 1)
        #expect(fields.first?[0] == "\(getpid())" && fields.first?[2] == "\(getpid())", "server pid, holder pid")
        #expect(fields.first?[3] == "\(ProcessInfoFiles.startTime(of: getpid()) ?? 0)")
        #expect(eventually { (try? String(contentsOfFile: holders, encoding: .utf8)) == "" }, "released: nobody holds")
        embedded.server.stop()
        #expect(!FileManager.default.fileExists(atPath: holders), "a clean stop leaves nothing to reclaim")
        #expect(!FileManager.default.fileExists(atPath: embedded.socketPath))
    }

    @Test func aSuccessorAwaitsTheLiveHoldersItsPredecessorListedAndGrantsTheirReclaims() throws {
        let live = holderLine(server: 77, owner: 5, pid: getpid())
        let dead = "78 6 \(getpid()) 1\n"  // this pid, another start time: a process that is gone
        let embedded = try EmbeddedServer(grace: .seconds(30), holders: live + dead)
        defer { embedded.stop() }
        #expect(embedded.server.host.awaitedHolders == [ClaimHolder(server: 77, owner: 5)])
        let coordinator = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        coordinator.deadlines.claimWait = .milliseconds(300)
        let file = embedded.directory + "/f"
        #expect {
            try coordinator.coordinate(readingItemAt: URL(fileURLWithPath: embedded.directory + "/other")) { _ in }
        } throws: { error in
            (error as? CoordinationError)?.code == .timedOut
                && (error as? CoordinationError)?.message.contains("restarted") == true
        }
        // The awaited holder reclaims its write on f.
        let fd = embedded.rawConnection()
        defer { close(fd) }
        send(fd, .hello(magic: WireProtocol.magic, version: WireProtocol.version))
        send(
            fd,
            .reclaim(
                previousServer: 77, previousOwner: 5,
                claims: [
                    ReclaimedClaim(
                        local: 1, purpose: "old", presenterTimeout: 1_000_000_000,
                        intents: [ClaimIntent(kind: .write, path: file)])
                ]))
        let replies = readMessages(fd) { if case .granted = $0 { true } else { false } }
        #expect(replies.contains(.granted(local: 1, paths: [file])))
        #expect(embedded.server.host.awaitedHolders.isEmpty, "the grace period ended with the last reclaim")
        #expect {
            try coordinator.coordinate(writingItemAt: URL(fileURLWithPath: file)) { _ in }
        } throws: { error in
            (error as? CoordinationError)?.code == .timedOut
                && (error as? CoordinationError)?.message.contains("waits for claim") == true
        }
        #expect(
            try coordinator.coordinate(readingItemAt: URL(fileURLWithPath: embedded.directory + "/g")) { _ in true })
        // The reclaiming connection is a holder now, listed under this server.
        let text = try String(contentsOfFile: embedded.directory + "/s.holders", encoding: .utf8)
        #expect(text.hasPrefix("\(getpid()) "))
    }

    @Test func aHolderWhoseProcessEndsNoLongerHoldsTheGraceOpen() throws {
        let sleeper = Process()
        sleeper.executableURL = URL(fileURLWithPath: "/bin/sleep")
        sleeper.arguments = ["30"]
        try sleeper.run()
        defer {
            if sleeper.isRunning { kill(sleeper.processIdentifier, SIGKILL) }
            sleeper.waitUntilExit()
        }
        let embedded = try EmbeddedServer(
            grace: .seconds(60), holders: holderLine(server: 77, owner: 5, pid: sleeper.processIdentifier))
        defer { embedded.stop() }
        #expect(embedded.server.host.awaitedHolders.count == 1)
        let started = Date()
        kill(sleeper.processIdentifier, SIGKILL)
        sleeper.waitUntilExit()
        #expect(eventually { embedded.server.host.awaitedHolders.isEmpty })
        #expect(Date().timeIntervalSince(started) < 5, "ended by the holder's death, not the 60 s grace")
        #expect(try embedded.stillServes())
    }

    /// What a kill -9 of the server does to a client holding a write claim and another waiting for
    /// it: the holder reclaims from the successor, the waiter is resubmitted there and keeps
    /// waiting until the holder's accessor ends. Nobody is told of a loss.
    @Test func aHeldClaimIsReclaimedAndAWaitingOneResubmittedAfterTheServerDies() throws {
        let embedded = try EmbeddedServer()
        let successor = EmbeddedServer(successorIn: embedded.directory)
        defer {
            successor.server.stop()
            embedded.stop()
        }
        let file = URL(fileURLWithPath: embedded.directory + "/f")
        let holder = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        let losses = Locked<[CoordinationError]>([])
        holder.claimLostHandler = { error in losses.withLock { $0.append(error) } }
        let waiter = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        waiter.deadlines.claimWait = .seconds(30)
        let waiterResult = Locked<Result<Bool, any Error>?>(nil)
        let holderEnded = Locked(false)
        try holder.coordinate(writingItemAt: file) { _ in
            Thread.detachNewThread {
                let result = Result { try waiter.coordinate(writingItemAt: file) { _ in holderEnded.withLock { $0 } } }
                waiterResult.withLock { $0 = result }
            }
            #expect(eventually { embedded.server.host.dump().claims.map(\.state) == ["held", "waiting"] })
            // The crash: connections gone, the holders file left behind.
            let holders = try String(contentsOfFile: embedded.directory + "/s.holders", encoding: .utf8)
            embedded.server.stop()
            try holders.write(toFile: embedded.directory + "/s.holders", atomically: false, encoding: .utf8)
            try successor.server.start()
            let purposes = { () -> [String: String] in
                Dictionary(
                    successor.server.host.dump().claims.map { ($0.purpose, $0.state) }, uniquingKeysWith: { $1 })
            }
            #expect(
                eventually {
                    purposes() == [holder.purposeIdentifier: "held", waiter.purposeIdentifier: "waiting"]
                })
            #expect(successor.server.host.awaitedHolders.isEmpty)
            #expect(waiterResult.withLock { $0 } == nil, "the waiter neither failed nor got in")
            holderEnded.withLock { $0 = true }
        }
        #expect(eventually { waiterResult.withLock { $0 } != nil })
        let granted = try waiterResult.withLock { $0 }?.get()
        #expect(granted == true, "granted only after the holder's accessor ended")
        #expect(losses.withLock { $0 }.isEmpty)
    }

    /// A successor that cannot re-establish a claim (here: it starts without a grace period, as
    /// after a clean stop) refuses the reclaim, and the holder's coordinator is told while its
    /// accessor runs; a conflicting claim is then served.
    @Test func aClaimThatCannotBeReclaimedIsReportedToItsCoordinator() throws {
        let embedded = try EmbeddedServer()
        let successor = EmbeddedServer(successorIn: embedded.directory)
        defer {
            successor.server.stop()
            embedded.stop()
        }
        let file = URL(fileURLWithPath: embedded.directory + "/f")
        let holder = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        let losses = Locked<[CoordinationError]>([])
        holder.claimLostHandler = { error in losses.withLock { $0.append(error) } }
        let other = FileCoordinator(domain: CoordinationDomain(socketPath: embedded.socketPath))
        let result = try holder.coordinate(writingItemAt: file) { _ -> Bool in
            embedded.server.stop()
            try? successor.server.start()
            #expect(eventually { !losses.withLock { $0 }.isEmpty })
            let error = losses.withLock { $0 }.first
            #expect(error?.code == .claimLost)
            #expect(error?.message.contains(file.path) == true)
            let free = try other.coordinate(writingItemAt: file) { _ in true }
            #expect(free, "the item is free on the new server")
            return true
        }
        #expect(result, "the accessor ran to its end and its result came back")
        #expect(losses.withLock { $0 }.count == 1)
    }
}
