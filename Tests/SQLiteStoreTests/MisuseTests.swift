import Foundation
import SQLiteStore
import Testing

/// Programmer errors trap with a message naming the mistake. Each runs in a child process
/// (Swift Testing exit tests re-execute the test binary).
@Suite struct MisuseTests {
    @Test func usingADatabaseAfterItsClosureTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            var escaped: Database?
            try store.write { db in escaped = db }
            try escaped?.execute("DELETE FROM accounts")
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("used outside the read/write closure"))
        }
    }

    @Test func usingADatabaseFromAnotherThreadTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.write { db in
                // Smuggle the connection to another thread (what Sendable checking prevents).
                let smuggled = UnsafeTransfer(db)
                let thread = Thread { _ = try? smuggled.value.fetchValue(Int64.self, "SELECT 1") }
                thread.start()
                Thread.sleep(forTimeInterval: 5)  // never reached: the child traps first
            }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("from a different thread"))
        }
    }

    @Test func nestedWriteTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.write { _ in try store.write { _ in } }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("write was called from inside a read or write closure"))
        }
    }

    @Test func readInsideWriteTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.write { _ in try store.read { _ in } }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("read was called from inside a read or write closure"))
        }
    }

    @Test func readInsideReadTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.read { _ in try store.read { _ in } }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("read was called from inside a read or write closure"))
        }
    }

    @Test func writeInsideReadTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.read { _ in try store.write { _ in } }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("write was called from inside a read or write closure"))
        }
    }

    @Test func waitingForObserversInsideAnObserverTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            store.observe { _ in store.waitForObservers() }
            try store.write { db in try db.execute("INSERT INTO accounts (id, balance) VALUES (1, 1)") }
            store.waitForObservers()
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("waitForObservers() was called from inside an observer handler"))
        }
    }

    @Test func keepingARowPastItsStepTraps() async {
        let directory = TemporaryDirectory()  // owned here: the trapping child never cleans up
        let path = directory.file("test.db")
        await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) { [path = path as String] in
            let store = try DatabaseQueue(path: path, migrator: testMigrator())
            try store.read { db in
                var kept: Row?
                try db.forEachRow("SELECT 1 UNION ALL SELECT 2") { row in kept = kept ?? row }
                _ = try kept?[0] as Int64?
            }
        }.map { result in
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(text.contains("Row was used after its query moved"))
        }
    }
}

/// Moves a non-Sendable value across threads, for the misuse test only.
struct UnsafeTransfer<Value>: @unchecked Sendable {
    // Unsafe on purpose: the test checks that the watchdog catches exactly this.
    let value: Value
    init(_ value: Value) { self.value = value }
}
