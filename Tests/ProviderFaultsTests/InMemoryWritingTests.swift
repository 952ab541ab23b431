// InMemoryProvider's write calls (the test double other suites write through): the same
// semantics as a local directory's, configurable capabilities, injected failures, counters.

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

@Suite("InMemoryProvider writing")
struct InMemoryWritingTests {
    @Test("create, upload, replace with a base version, move, exchange, delete, attributes")
    func semantics() async throws {
        let provider = InMemoryProvider()
        provider.addDirectory("d")
        provider.putFile("d/f", .bytes([1, 2]))
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try directory.write("src", [9, 8, 7])
        let source = directory.path + "/src"

        let made = try await provider.createDirectory(named: "e", in: .root, permissions: 0o700)
        #expect(made.permissions == 0o700 && made.kind == .directory)
        #expect(
            await failure { _ = try await provider.createDirectory(named: "e", in: .root, permissions: 0o700) }?.code
                == .alreadyExists)
        #expect(
            await failure { _ = try await provider.createDirectory(named: "a/b", in: .root, permissions: 0o700) }?.code
                == .invalidName)
        let long = await failure {
            _ = try await provider.createDirectory(
                named: String(repeating: "x", count: 256), in: .root, permissions: 0o700)
        }
        #expect(long?.code == .invalidName && long?.errno == ENAMETOOLONG)

        let created = try await provider.upload(
            from: source, to: .create(name: "new", in: ItemIdentifier("e")), permissions: nil,
            modificationTime: ItemTime(seconds: 3))
        #expect(created.identifier == ItemIdentifier("e/new") && created.permissions == 0o644)
        #expect(created.modificationTime == ItemTime(seconds: 3))
        #expect(provider.content(of: "e/new")?.0 == .bytes([9, 8, 7]))
        #expect(try await provider.item(for: created.identifier) == created)
        let exclusive = await failure {
            _ = try await provider.upload(
                from: source, to: .create(name: "f", in: ItemIdentifier("d")), permissions: nil, modificationTime: nil)
        }
        #expect(exclusive?.code == .alreadyExists)
        #expect(provider.content(of: "d/f")?.0 == .bytes([1, 2]))

        let old = try await provider.item(for: ItemIdentifier("d/f"))
        let replaced = try await provider.upload(
            from: source, to: .replace(old.identifier, baseVersion: old.contentVersion), permissions: nil,
            modificationTime: nil)
        #expect(replaced.contentVersion != old.contentVersion)
        let stale = await failure {
            _ = try await provider.upload(
                from: source, to: .replace(old.identifier, baseVersion: old.contentVersion), permissions: nil,
                modificationTime: nil)
        }
        #expect(stale?.code == .versionChanged)

        // A directory moves with everything inside it, re-keyed.
        let moved = try await provider.move(ItemIdentifier("e"), to: ItemIdentifier("d"), named: "e2", mode: .noReplace)
        #expect(moved.identifier == ItemIdentifier("d/e2"))
        let inner = try await provider.item(for: ItemIdentifier("d/e2/new"))
        #expect(inner.parent == ItemIdentifier("d/e2") && inner.contentVersion == created.contentVersion)
        #expect(await failure { _ = try await provider.item(for: ItemIdentifier("e/new")) }?.code == .noSuchItem)
        let intoItself = await failure {
            _ = try await provider.move(ItemIdentifier("d"), to: ItemIdentifier("d/e2"), named: "x", mode: .replacing)
        }
        #expect(intoItself?.code == .invalidName && intoItself?.errno == EINVAL)
        #expect(
            await failure {
                _ = try await provider.move(
                    ItemIdentifier("d/f"), to: ItemIdentifier("d"), named: "e2", mode: .noReplace)
            }?.code == .alreadyExists)
        #expect(
            await failure {
                _ = try await provider.move(
                    ItemIdentifier("d/f"), to: ItemIdentifier("d"), named: "e2", mode: .replacing)
            }?.code == .wrongKind)

        provider.putFile("g", .bytes([5]))
        _ = try await provider.move(ItemIdentifier("g"), to: ItemIdentifier("d"), named: "f", mode: .exchange)
        #expect(provider.content(of: "d/f")?.0 == .bytes([5]))
        #expect(provider.content(of: "g")?.0 == .bytes([9, 8, 7]))

        let changed = try await provider.setAttributes(
            ItemIdentifier("g"), ItemAttributeChanges(permissions: 0o600, modificationTime: ItemTime(seconds: 9)))
        #expect(changed.permissions == 0o600 && changed.modificationTime == ItemTime(seconds: 9))

        #expect(await failure { try await provider.delete(ItemIdentifier("d"), kind: .directory) }?.code == .notEmpty)
        let wrongKind = await failure { try await provider.delete(ItemIdentifier("d"), kind: .file) }
        #expect(wrongKind?.code == .wrongKind && wrongKind?.errno == EISDIR)
        try await provider.delete(ItemIdentifier("g"), kind: .file)
        #expect(await failure { try await provider.delete(ItemIdentifier("g"), kind: .file) }?.code == .noSuchItem)
        #expect(provider.writeCount(.upload) == 4)
        #expect(provider.writeCount(.delete) == 4)
    }

    @Test("capabilities chosen by the test; injected failures thrown once each, in order, and counted")
    func capabilitiesAndFailures() async throws {
        let readOnly = InMemoryProvider(capabilities: .immediateMetadata)
        #expect(
            await failure { _ = try await readOnly.createDirectory(named: "x", in: .root, permissions: 0o755) }?.code
                == .notSupported)
        let noExchange = InMemoryProvider(capabilities: [.writing])
        noExchange.putFile("a", .bytes([1]))
        noExchange.putFile("b", .bytes([2]))
        #expect(
            await failure {
                _ = try await noExchange.move(ItemIdentifier("a"), to: .root, named: "b", mode: .exchange)
            }?.code == .notSupported)
        #expect(
            await failure { _ = try await noExchange.createSymbolicLink(named: "l", in: .root, target: "a") }?.code
                == .notSupported)
        // Without `.storesAttributes` the call succeeds and keeps nothing.
        let kept = try await noExchange.setAttributes(ItemIdentifier("a"), ItemAttributeChanges(permissions: 0o600))
        #expect(kept.permissions == 0o644)

        let provider = InMemoryProvider()
        provider.failNext(.createDirectory, with: ProviderError(.noSpace, "full", errno: ENOSPC))
        provider.failNext(.createDirectory, with: ProviderError(.accessDenied, "no", errno: EACCES))
        #expect(
            await failure { _ = try await provider.createDirectory(named: "x", in: .root, permissions: 0o755) }?.code
                == .noSpace)
        #expect(
            await failure { _ = try await provider.createDirectory(named: "x", in: .root, permissions: 0o755) }?.code
                == .accessDenied)
        #expect(try await provider.createDirectory(named: "x", in: .root, permissions: 0o755).name == "x")
        #expect(provider.writeCount(.createDirectory) == 3)
        #expect(provider.writeCount(.upload) == 0)
    }

    @Test("held uploads wait before changing anything until released")
    func heldUploads() async throws {
        let provider = InMemoryProvider()
        provider.putFile("f", .bytes([1]))
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try directory.write("src", [2, 2])
        provider.holdUploads()
        let upload = Task {
            try await provider.upload(
                from: directory.path + "/src", to: .replace(ItemIdentifier("f"), baseVersion: nil), permissions: nil,
                modificationTime: nil)
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while provider.heldUploadCount == 0 {
            try #require(ContinuousClock.now < deadline, "the upload never reached the gate")
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(provider.content(of: "f")?.0 == .bytes([1]))
        provider.releaseUploads()
        #expect(try await upload.value.size == 2)
        #expect(provider.content(of: "f")?.0 == .bytes([2, 2]))
    }
}
