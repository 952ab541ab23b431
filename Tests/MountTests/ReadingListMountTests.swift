// reading-list against a real mount (issue 13's tests; the imports, validation, read failures and
// the reads cut mid-copy over each provider: a local directory, rclone, Apache; grants, passwords
// and kills after the copy, which read nothing more of the provider, locally): imports from plain and token
// paths, the app's copy outliving its source, a failed download as a `read` failure and a retry
// after `fault clear`, a token that expires mid-copy, SIGINT during an import, and kill -9 with
// the pending record made, repaired by the next start. Waits are on events (files appearing,
// output lines, process exits), each bounded.

import Foundation
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
import TestScheduling
#endif

@Suite(.enabled(if: MountTestGate.enabled, "PROVIDERFS_SKIP_MOUNT_TESTS=1"), .blockingThreads)
struct ReadingListMountTests: MountLayoutSuite, TokenGranting {
    let layout: MountLayout
    let data: String

    init() throws {
        layout = try MountLayout(prefix: "reading-list-mount")
        data = layout.scratch + "/data"
        mkdir(source + "/docs", 0o755)
        mkdir(source + "/other", 0o755)
        writeTestFile(source + "/docs/paper.pdf", TestPDF(pages: 3).bytes())
        writeTestFile(source + "/other/paper.pdf", TestPDF(pages: 5).bytes())
        writeTestFile(source + "/docs/big.pdf", TestPDF(pages: 2, padding: 6 << 20).bytes())
        writeTestFile(source + "/docs/notes.pdf", Array("these are notes, not a PDF\n".utf8))
        writeTestFile(source + "/docs/repaired.pdf", TestPDF(pages: 1, wrongOffsets: true).bytes())
        let whole = TestPDF(pages: 4).bytes()
        writeTestFile(source + "/docs/cut.pdf", Array(whole.prefix(whole.count / 4)))
    }

    /// A mount of `source` over `kind`: the directory, or rclone or Apache serving it.
    func mount(over kind: ProviderKind = .local) throws -> ServedMount {
        try layout.mount(over: kind)
    }

    var environment: [String: String] { ["PROVIDERFS_RUNTIME_DIR": runtime] }

    /// `reading-list ARGUMENTS… --data-dir DATA`.
    func readingList(_ arguments: [String]) throws -> (status: Int32, output: String, error: String) {
        try ChildProcess.run(
            productsDirectory + "/reading-list", arguments + ["--data-dir", data], environment: environment,
            timeout: .seconds(120))
    }

    func startReadingList(_ arguments: [String], extra: [String: String] = [:]) throws -> ChildProcess {
        try ChildProcess(
            productsDirectory + "/reading-list", arguments + ["--data-dir", data],
            environment: environment.merging(extra) { _, new in new })
    }

    /// The JSON line of one import.
    func imported(_ path: String, _ extra: [String] = []) throws -> [String: Any] {
        let result = try readingList(["import", path, "--json"] + extra)
        let line = try #require(result.output.split(separator: "\n").last, "no output: \(result)")
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }

    func documents() throws -> [[String: Any]] {
        let result = try readingList(["list", "--json"])
        #expect(result.status == 0, "\(result)")
        return try result.output.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
    }

    func names(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
    }

    func expectNothingLeft(_ sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(
            names(data + "/staging").isEmpty, "staging: \(names(data + "/staging"))", sourceLocation: sourceLocation)
        let ids = try documents().compactMap { $0["id"] as? String }
        #expect(
            names(data + "/library") == ids.map { $0 + ".pdf" }.sorted(), "library files vs records",
            sourceLocation: sourceLocation)
    }

    /// Waits until `condition` holds, polling every 10 ms, for at most `limit`.
    func waitUntil(_ limit: Duration = .seconds(60), _ condition: () -> Bool) -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if condition() { return true }
            usleep(10_000)
        }
        return condition()
    }

    @Test(arguments: ProviderKind.available) func importsFromPlainAndTokenPathsAndTheCopyOutlivesItsSource(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }

        let plain = try imported(mounted.path("docs/paper.pdf"))
        #expect(plain["result"] as? String == "imported", "\(plain)")
        #expect(plain["pages"] as? Int == 3)
        let token = try imported(try grant(mounted.path("other/paper.pdf"), ["--ttl", "10m"]).accessPath)
        #expect(token["result"] as? String == "imported", "\(token)")
        #expect(token["pages"] as? Int == 5)
        // The token path was started through ScopedAccess: a token derived for reading-list's
        // process, released by its stop when the import ended.
        let log = try providerfs(["token", "log"], runtime: runtime).output
        #expect(log.contains("released by its process (stop)"), "\(log)")
        let first = try #require(plain["documentID"] as? String)
        let second = try #require(token["documentID"] as? String)
        #expect(first != second, "same display name, two documents")
        #expect(plain["displayName"] as? String == "paper.pdf" && token["displayName"] as? String == "paper.pdf")

        let report = try readingList(["report", "--json"])
        #expect(report.output.contains("\"sourceCategory\":\"mountPath\""), "\(report.output)")
        #expect(report.output.contains("\"sourceCategory\":\"tokenPath\""), "\(report.output)")
        #expect(report.output.contains("ProviderFS mount of"), "the provider version is recorded")
        #expect(!report.output.contains("pfs_"), "no token in the report")

        // The source is moved, then removed, in the provider; the app (a new process each time)
        // still opens identical bytes.
        #expect(rename(source + "/docs/paper.pdf", source + "/docs/moved.pdf") == 0)
        #expect(unlink(source + "/docs/moved.pdf") == 0)
        let bytes = try ChildProcess.run(
            productsDirectory + "/reading-list", ["open", first, "--cat", "--data-dir", data], environment: environment,
            timeout: .seconds(60))
        #expect(bytes.status == 0)
        #expect(Array(bytes.output.utf8) == TestPDF(pages: 3).bytes())
        let path = try readingList(["open", String(first.prefix(8))]).output.trimmingCharacters(in: .newlines)
        #expect(path == data + "/library/" + first + ".pdf")
        try expectNothingLeft()

        // remove: the record and the file go; the other document stays.
        let removed = try readingList(["remove", first])
        #expect(removed.status == 0, "\(removed)")
        #expect(try documents().compactMap { $0["id"] as? String } == [second])
        #expect(access(data + "/library/" + first + ".pdf", F_OK) != 0)
        #expect(try readingList(["open", first]).status == 1, "a removed id is unknown")
        try expectNothingLeft()
    }

    @Test func anEndedGrantFailsAtAccess() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        let grant = try providerfs(["token", "grant", mounted.path("docs/paper.pdf"), "--json"], runtime: runtime)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(grant.output.utf8)) as? [String: Any])
        let accessPath = try #require(object["accessPath"] as? String)
        let id = try #require(object["id"] as? String)
        #expect(try providerfs(["token", "revoke", id], runtime: runtime).status == 0)
        let outcome = try imported(accessPath)
        #expect(outcome["result"] as? String == "failed")
        #expect(outcome["stage"] as? String == "access", "\(outcome)")
        #expect((outcome["error"] as? String)?.contains("revoked") == true, "\(outcome)")
        #expect(!(outcome["error"] as? String ?? "").contains("pfs_"))
        try expectNothingLeft()
    }

    @Test func anEncryptedPDFNeedsItsPasswordFile() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let plain = source + "/docs/plain.pdf"
        writeTestFile(plain, TestPDF(pages: 2).bytes())
        let encrypt = try ChildProcess.run(
            "/usr/bin/qpdf", ["--encrypt", "user-pw", "owner-pw", "256", "--", plain, source + "/docs/locked.pdf"],
            timeout: .seconds(60))
        #expect(encrypt.status == 0, "\(encrypt)")
        let mounted = try mount()
        defer { mounted.stop() }
        let locked = mounted.path("docs/locked.pdf")
        let without = try imported(locked)
        #expect(without["stage"] as? String == "validate")
        #expect((without["error"] as? String)?.contains("password") == true, "\(without)")
        writeTestFile(scratch + "/wrong", Array("nope\n".utf8))
        #expect(try imported(locked, ["--password-file", scratch + "/wrong"])["stage"] as? String == "validate")
        writeTestFile(scratch + "/password", Array("user-pw\n".utf8))
        let with = try imported(locked, ["--password-file", scratch + "/password"])
        #expect(with["result"] as? String == "imported", "\(with)")
        #expect(with["pages"] as? Int == 2)
        // The next start's reconcile keeps it (it cannot check an encrypted file without its password,
        // but its bytes are the ones validated).
        #expect(try documents().count == 1)
        try expectNothingLeft()
    }

    @Test(arguments: ProviderKind.available) func corruptFailsAtValidateAndRepairedIsFlagged(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }
        let notes = try imported(mounted.path("docs/notes.pdf"))
        #expect(notes["result"] as? String == "failed")
        #expect(notes["stage"] as? String == "validate", "\(notes)")
        // A real PDF cut short (a download that lost its end, saved by someone else): qpdf cannot
        // find its pages.
        let cut = try imported(mounted.path("docs/cut.pdf"))
        #expect(cut["result"] as? String == "failed")
        #expect(cut["stage"] as? String == "validate", "\(cut)")
        // Bytes that go bad on the way (a corrupt fault): the mount's checksum refuses them, so
        // it is a read failure, and no damaged copy ever reaches validate.
        let corruptFault = try providerfs(
            ["fault", "add", mounted.path("other/paper.pdf"), "--corrupt", "--at", "100", "--times", "0"],
            runtime: runtime)
        #expect(corruptFault.status == 0, "\(corruptFault)")
        let corrupted = try imported(mounted.path("other/paper.pdf"))
        #expect(corrupted["stage"] as? String == "read", "\(corrupted)")
        #expect((corrupted["error"] as? String)?.contains("Input/output error") == true, "\(corrupted)")
        let repaired = try imported(mounted.path("docs/repaired.pdf"))
        #expect(repaired["result"] as? String == "imported")
        #expect(repaired["repaired"] as? Bool == true)
        let strict = try imported(mounted.path("docs/repaired.pdf"), ["--strict"])
        #expect(strict["stage"] as? String == "validate", "\(strict)")
        #expect(try documents().count == 1)
        try expectNothingLeft()
    }

    @Test(arguments: ProviderKind.available) func aFailedDownloadIsAReadFailureAndARetryAfterFaultClearSucceeds(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }
        let big = mounted.path("docs/big.pdf")
        let fault = try providerfs(["fault", "add", big, "--fail-at", "1MiB", "--times", "0"], runtime: runtime)
        #expect(fault.status == 0, "\(fault)")
        let failed = try imported(big)
        #expect(failed["result"] as? String == "failed")
        #expect(failed["stage"] as? String == "read", "\(failed)")
        #expect(try documents().isEmpty)
        try expectNothingLeft()
        #expect(try providerfs(["fault", "clear", big], runtime: runtime).status == 0)
        let retried = try imported(big)
        #expect(retried["result"] as? String == "imported", "\(retried)")
        let id = try #require(retried["documentID"] as? String)
        #expect(try readFile(data + "/library/" + id + ".pdf") == TestPDF(pages: 2, padding: 6 << 20).bytes())
        try expectNothingLeft()
    }

    @Test(arguments: ProviderKind.available) func aTokenThatExpiresMidCopyFailsWithoutARecord(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }
        let grant = try providerfs(
            ["token", "grant", mounted.path("docs/big.pdf"), "--ttl", "10m", "--json"], runtime: runtime)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(grant.output.utf8)) as? [String: Any])
        let accessPath = try #require(object["accessPath"] as? String)
        let id = try #require(object["id"] as? String)
        // Stopped with the first MiB of 6 staged, the claim and the source open; the token ends
        // there; the import goes on.
        let child = try startReadingList(["import", accessPath, "--json"], extra: ["READING_LIST_PAUSE_AT": "copy"])
        defer { child.signal(SIGKILL) }
        #expect(waitUntil { child.standardError.contains("paused at copy") || !child.isRunning }, "not paused")
        #expect(child.isRunning, "\(child.standardError)")
        #expect(try providerfs(["token", "expire", id], runtime: runtime).status == 0)
        child.signal(SIGCONT)
        #expect(child.wait(timeout: .seconds(60)) == 1, "\(child.standardError)")
        let line = try #require(child.standardOutput.split(separator: "\n").last, "\(child.standardError)")
        let outcome = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(outcome["result"] as? String == "failed")
        #expect(outcome["stage"] as? String == "read", "\(outcome)")
        #expect((outcome["error"] as? String)?.contains("after \(1 << 20) bytes") == true, "\(outcome)")
        #expect((outcome["error"] as? String)?.contains("access ended") == true, "\(outcome)")
        #expect(try documents().isEmpty)
        try expectNothingLeft()
    }

    @Test func aOneUseGrantImportsOnceAndTheReportNamesTheCopysType() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        // The import spends exactly the one use (its ScopedAccess start); looking at the source
        // for the report spends none.
        let accessPath = try grant(mounted.path("docs/paper.pdf"), ["--uses", "1"]).accessPath
        let first = try imported(accessPath)
        #expect(first["result"] as? String == "imported", "\(first)")
        let again = try imported(accessPath)
        #expect(again["stage"] as? String == "access", "\(again)")
        #expect((again["error"] as? String)?.contains("used") == true, "\(again)")
        let report = try readingList(["report", "--json"])
        #expect(report.output.contains("\"fileType\":\"pdf\""), "\(report.output)")
        #expect(report.output.contains("\"fileType\":\"unread\""), "the refused one read nothing: \(report.output)")
        try expectNothingLeft()
    }

    @Test(arguments: ProviderKind.available) func twoImportsInTwoProcessesOverlappingMidCopyEachGetTheirDocument(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }
        // Both stopped inside their coordinated reads of the same file at once, then resumed.
        let children = try (0..<2).map { _ in
            try startReadingList(
                ["import", mounted.path("docs/big.pdf"), "--json"], extra: ["READING_LIST_PAUSE_AT": "copy"])
        }
        defer { children.forEach { $0.signal(SIGKILL) } }
        for child in children {
            #expect(waitUntil { child.standardError.contains("paused at copy") || !child.isRunning })
            #expect(child.isRunning, "\(child.standardError)")
        }
        #expect(names(data + "/staging").count == 2, "two staged copies at once")
        children.forEach { $0.signal(SIGCONT) }
        var ids: [String] = []
        for child in children {
            #expect(child.wait(timeout: .seconds(60)) == 0, "\(child.standardError)")
            let line = try #require(child.standardOutput.split(separator: "\n").last, "\(child.standardError)")
            let outcome = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            ids.append(try #require(outcome["documentID"] as? String, "\(outcome)"))
        }
        #expect(Set(ids).count == 2)
        for id in ids {
            #expect(try readFile(data + "/library/" + id + ".pdf") == TestPDF(pages: 2, padding: 6 << 20).bytes())
        }
        try expectNothingLeft()
    }

    @Test(arguments: ProviderKind.available) func sigintDuringAnImportCreatesNoRecordAndLeavesNothing(
        over kind: ProviderKind
    ) throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount(over: kind)
        defer { mounted.stop() }
        let big = mounted.path("docs/big.pdf")
        #expect(try providerfs(["fault", "add", big, "--slow", "1MiB", "--times", "0"], runtime: runtime).status == 0)
        // SIGTERM first, then SIGINT: both cancel.
        let terminated = try startReadingList(["import", big])
        #expect(waitUntil { !names(data + "/staging").isEmpty || !terminated.isRunning }, "no staging file appeared")
        terminated.signal(SIGTERM)
        #expect(terminated.wait(timeout: .seconds(30)) == 143, "\(terminated.standardError)")
        #expect(names(data + "/staging").isEmpty)
        let child = try startReadingList(["import", big])
        // The import has begun once its staging file exists.
        #expect(waitUntil { !names(data + "/staging").isEmpty || !child.isRunning }, "no staging file appeared")
        child.signal(SIGINT)
        let status = child.wait(timeout: .seconds(30))
        #expect(status == 130, "exit \(String(describing: status)): \(child.standardError)")
        #expect(child.standardError.contains("cancelled"), "\(child.standardError)")
        #expect(try documents().isEmpty)
        try expectNothingLeft()
        let report = try readingList(["report", "--json"])
        #expect(report.output.contains("\"result\":\"cancelled\""), "\(report.output)")
    }

    @Test func killDashNineAfterTheMoveIsMadeAvailableByReconcileInTheXDGDataDirectory() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        // No --data-dir: the XDG location.
        let xdg = scratch + "/xdg"
        let environment = self.environment.merging(["XDG_DATA_HOME": xdg, "HOME": scratch + "/home"]) { _, new in new }
        let app = productsDirectory + "/reading-list"
        let child = try ChildProcess(
            app, ["import", mounted.path("docs/paper.pdf")],
            environment: environment.merging(["READING_LIST_PAUSE_AT": "record"]) { _, new in new })
        defer { child.signal(SIGKILL) }
        #expect(waitUntil { child.standardError.contains("paused at record") || !child.isRunning })
        #expect(child.isRunning, "\(child.standardError)")
        child.signal(SIGKILL)
        _ = child.wait(timeout: .seconds(10))
        let root = xdg + "/reading-list"
        var info = stat()
        #expect(stat(root, &info) == 0 && info.st_mode & 0o777 == 0o700, "the data directory is private")
        let moved = names(root + "/library")
        #expect(moved.count == 1 && names(root + "/staging").isEmpty, "killed after the move: \(moved)")

        // reconcile, on its own: the moved file validates, so its pending record becomes available.
        let reconciled = try ChildProcess.run(app, ["reconcile"], environment: environment, timeout: .seconds(60))
        #expect(reconciled.status == 0, "\(reconciled)")
        let id = try #require(moved.first.map { String($0.dropLast(".pdf".count)) })
        #expect(reconciled.output.contains("made available: 1,"), "\(reconciled.output)")
        #expect(reconciled.output.contains("interrupted imports: 1"), "\(reconciled.output)")
        #expect(reconciled.output.contains("  available: \(id)"), "\(reconciled.output)")
        let again = try ChildProcess.run(app, ["reconcile"], environment: environment, timeout: .seconds(60))
        #expect(again.output.hasPrefix("made available: 0, records removed: 0, files removed: 0"), "\(again.output)")
        let bytes = try ChildProcess.run(app, ["open", id, "--cat"], environment: environment, timeout: .seconds(60))
        #expect(Array(bytes.output.utf8) == TestPDF(pages: 3).bytes())

        // The text report: the attempt, interrupted, with its type, category, versions and stages.
        let report = try ChildProcess.run(app, ["report"], environment: environment, timeout: .seconds(60))
        #expect(report.status == 0, "\(report)")
        let lines = report.output.split(separator: "\n").map(String.init)
        #expect(lines.first?.contains("interrupted") == true, "\(report.output)")
        #expect(lines.first?.contains("  pdf  mountPath  ") == true, "\(report.output)")
        #expect(lines.contains { $0.hasPrefix("  system: Linux ") }, "\(report.output)")
        #expect(lines.contains { $0.hasPrefix("  provider: ProviderFS mount of ") }, "\(report.output)")
        #expect(lines.contains { $0.hasPrefix("  app: reading-list ") && $0.contains("libqpdf") }, "\(report.output)")
        #expect(
            lines.contains { ["access", "read", "copy", "validate", "store", "record"].allSatisfy($0.contains) },
            "\(report.output)")
    }

    @Test func killDashNineWithThePendingRecordMadeIsRepairedAtTheNextStart() throws {
        guard requireFUSE() else { return }
        defer { cleanup() }
        let mounted = try mount()
        defer { mounted.stop() }
        let child = try startReadingList(
            ["import", mounted.path("docs/paper.pdf")], extra: ["READING_LIST_PAUSE_AT": "pending-record"])
        #expect(waitUntil { child.standardError.contains("paused at pending-record") || !child.isRunning })
        #expect(child.isRunning, "\(child.standardError)")
        child.signal(SIGKILL)
        _ = child.wait(timeout: .seconds(10))
        #expect(names(data + "/staging").count == 1, "the staged copy the killed import left")
        // The next start (any command) reconciles: the pending record and the staged copy go.
        let list = try readingList(["list", "--json"])
        #expect(list.status == 0)
        #expect(list.output.isEmpty, "\(list.output)")
        #expect(list.error.contains("repaired at start"), "\(list.error)")
        try expectNothingLeft()
        let report = try readingList(["report", "--json"])
        #expect(report.output.contains("\"result\":\"interrupted\""), "\(report.output)")
        // And the import works afterwards.
        #expect(try imported(mounted.path("docs/paper.pdf"))["result"] as? String == "imported")
    }
}
