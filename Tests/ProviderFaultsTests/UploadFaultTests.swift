// Upload faults (`providerfs fault add … --on upload`): the wrapper fails, stalls or refuses
// uploads before its base is asked, so nothing is published; offline rules refuse every write
// call; an upload rule never touches reads; its times count uploads; it is stored like the others.

import ProviderFaults
import ProviderModel
import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

private func failure(_ body: () async throws -> Void) async -> ProviderError? {
    do {
        try await body()
        return nil
    } catch {
        return ProviderError.from(error)
    }
}

/// An in-memory provider with a file "d/f" and a local file of `size` bytes to upload.
private struct Fixture {
    let base = InMemoryProvider()
    let plan = FaultPlan()
    let provider: FaultInjectingProvider
    let local: TemporaryDirectory
    let source: String

    init(size: Int = 100) throws {
        base.addDirectory("d")
        base.putFile("d/f", .bytes([1, 2, 3]))
        provider = FaultInjectingProvider(wrapping: base, plan: plan)
        local = try TemporaryDirectory()
        source = local.path + "/upload"
        try writeFile(source, [UInt8](repeating: 7, count: size))
    }

    func replace() async throws -> ProviderItem {
        try await provider.upload(
            from: source, to: .replace(ItemIdentifier("d/f"), baseVersion: nil), permissions: nil, modificationTime: nil
        )
    }

    func create(_ name: String) async throws -> ProviderItem {
        try await provider.upload(
            from: source, to: .create(name: name, in: ItemIdentifier("d")), permissions: nil, modificationTime: nil)
    }
}

@Suite("Upload faults")
struct UploadFaultTests {
    @Test("a failed upload throws the errno's code, publishes nothing, and the retry succeeds")
    func failAtMapsErrno() async throws {
        let expected: [(Int32, ProviderError.Code)] = [
            (EIO, .io), (ENOSPC, .noSpace), (EDQUOT, .noSpace), (EACCES, .accessDenied), (EFBIG, .tooLarge),
        ]
        for (code, kind) in expected {
            let fixture = try Fixture()
            defer { fixture.local.remove() }
            fixture.plan.add(
                FaultRule(
                    identifier: ItemIdentifier("d/f"), fault: .failAfter(offset: 50, errno: code), times: .downloads(1),
                    on: .upload))
            let error = await failure { _ = try await fixture.replace() }
            #expect(error?.code == kind, "\(Errno(code).name)")
            #expect(error?.errno == code)
            #expect(fixture.base.writeCount(.upload) == 0, "the base was never asked")
            #expect(fixture.base.content(of: "d/f")?.0 == .bytes([1, 2, 3]))
            // The rule is used up: the retry reaches the base.
            #expect(fixture.plan.all.isEmpty)
            let item = try await fixture.replace()
            #expect(item.size == 100)
            #expect(fixture.base.content(of: "d/f")?.0 == .bytes([UInt8](repeating: 7, count: 100)))
        }
    }

    @Test("--times counts uploads struck; an upload smaller than the failure's byte is not struck")
    func timesAndSize() async throws {
        let fixture = try Fixture(size: 10)
        defer { fixture.local.remove() }
        fixture.plan.add(
            FaultRule(
                identifier: ItemIdentifier("d"), fault: .failAfter(offset: 10, errno: EIO), times: .downloads(2),
                on: .upload))
        // A rule on the directory strikes an upload of a new file into it.
        #expect(await failure { _ = try await fixture.create("a") }?.code == .io)
        #expect(fixture.plan.states.first?.remaining == 1)
        #expect(await failure { _ = try await fixture.replace() }?.code == .io)
        #expect(fixture.plan.all.isEmpty)
        #expect(try await fixture.create("a").identifier == ItemIdentifier("d/a"))

        let small = try Fixture(size: 9)
        defer { small.local.remove() }
        small.plan.add(
            FaultRule(
                identifier: ItemIdentifier("d/f"), fault: .failAfter(offset: 10, errno: EIO), times: .downloads(1),
                on: .upload))
        _ = try await small.replace()
        #expect(small.plan.states.first?.remaining == 1, "not struck, not consumed")
    }

    @Test("an upload rule leaves reads alone; a download rule leaves uploads alone (unless offline)")
    func uploadRulesDoNotTouchReads() async throws {
        let fixture = try Fixture()
        defer { fixture.local.remove() }
        fixture.plan.add(FaultRule(identifier: .root, fault: .offline, times: .untilCleared, on: .upload))
        let item = try await fixture.provider.item(for: ItemIdentifier("d/f"))
        let stream = try await fixture.provider.fetchContents(
            of: item.identifier, version: item.contentVersion, range: 0..<3)
        #expect(try await stream.next(maximumLength: 10) == [1, 2, 3])
        stream.close()
        #expect(try await fixture.provider.children(of: ItemIdentifier("d")).count == 1)

        // Offline on upload: every write call is refused, and none reaches the base.
        let refusals: [ProviderError?] = [
            await failure { _ = try await fixture.replace() },
            await failure { _ = try await fixture.create("n") },
            await failure {
                _ = try await fixture.provider.createDirectory(named: "e", in: ItemIdentifier("d"), permissions: 0o755)
            },
            await failure {
                _ = try await fixture.provider.createSymbolicLink(named: "l", in: ItemIdentifier("d"), target: "f")
            },
            await failure { try await fixture.provider.delete(ItemIdentifier("d/f"), kind: .file) },
            await failure {
                _ = try await fixture.provider.move(ItemIdentifier("d/f"), to: .root, named: "g", mode: .replacing)
            },
            await failure {
                _ = try await fixture.provider.setAttributes(
                    ItemIdentifier("d/f"), ItemAttributeChanges(permissions: 0o600))
            },
        ]
        #expect(refusals.map { $0?.code } == Array(repeating: .unreachable, count: 7))
        for call in InMemoryWriteCall.allCases { #expect(fixture.base.writeCount(call) == 0, "\(call)") }

        // A download failure does not strike uploads; a download offline rule strikes writes too.
        fixture.plan.clear()
        fixture.plan.add(FaultRule(identifier: ItemIdentifier("d/f"), fault: .failAfter(offset: 0, errno: EIO)))
        _ = try await fixture.replace()
        fixture.plan.add(FaultRule(identifier: ItemIdentifier("d"), fault: .offline))
        #expect(
            await failure { try await fixture.provider.delete(ItemIdentifier("d/f"), kind: .file) }?.code
                == .unreachable)
        #expect(fixture.plan.states.count == 2, "an offline download rule consumes nothing by refusing writes")
    }

    @Test("a stalled upload waits until the rule is cleared, then goes on; cancelled, it publishes nothing")
    func stall() async throws {
        let fixture = try Fixture()
        defer { fixture.local.remove() }
        fixture.plan.add(
            FaultRule(identifier: ItemIdentifier("d/f"), fault: .stall(offset: 0), times: .downloads(1), on: .upload))
        let uploading = Task { try await fixture.replace() }
        // (generous: a loaded machine may take long to start the task; the wait ends at the event)
        let deadline = ContinuousClock.now + .seconds(30)
        while fixture.plan.states.first?.running != 1 {
            try #require(ContinuousClock.now < deadline, "the upload never stalled")
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(fixture.base.writeCount(.upload) == 0)
        fixture.plan.clear()
        let item = try await uploading.value
        #expect(item.size == 100)
        #expect(fixture.base.writeCount(.upload) == 1)

        fixture.plan.add(
            FaultRule(identifier: ItemIdentifier("d"), fault: .stall(offset: 0), times: .downloads(1), on: .upload))
        let cancelled = Task { try await fixture.create("never") }
        let secondDeadline = ContinuousClock.now + .seconds(30)
        while fixture.plan.states.first?.running != 1 {
            try #require(ContinuousClock.now < secondDeadline, "the second upload never stalled")
            try await Task.sleep(for: .milliseconds(5))
        }
        cancelled.cancel()
        #expect(await failure { _ = try await cancelled.value }?.code == .cancelled)
        #expect(fixture.base.content(of: "d/never") == nil)
        // Used up and no longer stalling: the rule is gone.
        #expect(fixture.plan.all.isEmpty)
    }

    @Test("upload rules are stored with their use and read back after a restart")
    func stored() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.path + "/faults.json"
        let plan = FaultPlan.stored(at: path)
        plan.add(
            FaultRule(
                identifier: ItemIdentifier("d/f"), path: "d/f", fault: .failAfter(offset: 0, errno: ENOSPC),
                times: .downloads(3), on: .upload))
        plan.add(FaultRule(identifier: ItemIdentifier("d"), path: "d", fault: .offline, on: .upload))
        plan.add(FaultRule(identifier: ItemIdentifier("x"), path: "x", fault: .truncate(offset: 1)))
        let base = InMemoryProvider()
        base.addDirectory("d")
        base.putFile("d/f", .bytes([1]))
        let local = try TemporaryDirectory()
        defer { local.remove() }
        try local.write("u", [1, 2])
        // The offline rule on "d" comes second: the failure on "d/f" strikes first.
        let error = await failure {
            _ = try await FaultInjectingProvider(wrapping: base, plan: plan).upload(
                from: local.path + "/u", to: .replace(ItemIdentifier("d/f"), baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        #expect(error?.code == .noSpace)

        let reloaded = FaultPlan.stored(at: path)
        #expect(reloaded.all == plan.all)
        #expect(reloaded.all.map(\.on) == [.upload, .upload, .download])
        #expect(reloaded.states.first?.remaining == 2)
        // A download rule's stored form has no "on" (files from before upload rules read the same).
        let text = String(decoding: try readFile(path), as: UTF8.self)
        #expect(text.split(separator: "\"on\"", omittingEmptySubsequences: false).count == 3)
    }
}
