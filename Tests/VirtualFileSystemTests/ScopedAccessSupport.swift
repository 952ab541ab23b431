// What the access-path suites (ScopedPathTests, ScopedWriteTests, ScopedEntryCacheTests,
// FastPathTwinTests) share: a grant of an in-memory provider's item, and a walk of
// `.scoped/<token>/<path>`.

import AccessTokens
import Testing
import VirtualFileSystem

extension TokenAuthority {
    /// A token for the item at `path` (the in-memory provider's identifiers are paths).
    func grant(
        _ path: String, _ mode: TokenMode = .read, ttl: Duration? = nil, pid: Int32? = nil, uses: Int? = nil
    ) throws -> IssuedToken {
        try grant(scope: TokenScope(identifier: path, path: path), mode: mode, ttl: ttl, pid: pid, uses: uses)
    }
}

extension ProviderFileSystem {
    /// `.scoped/<token>/<path>` walked with lookups: every entry on the way, the token's first.
    func walkScoped(_ token: String, _ path: String = "", context: RequestContext = .kernel) async throws -> [Entry] {
        let scoped = try await lookup(parent: .root, name: ".scoped", context: .kernel)
        var entries = [try await lookup(parent: scoped.inode, name: token, context: context)]
        for component in path.split(separator: "/") {
            entries.append(try await lookup(parent: entries.last!.inode, name: String(component), context: context))
        }
        return entries
    }

    /// The entry at the end of `.scoped/<token>/<path>`.
    func resolveScoped(_ token: String, _ path: String = "") async throws -> Entry {
        try await walkScoped(token, path).last!
    }
}

/// `body` fails with `code`; returns the error's message.
@discardableResult
func expectFailure(
    _ code: FileSystemError.Code, _ what: String, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async -> String {
    do {
        try await body()
        Issue.record("\(what) did not fail", sourceLocation: sourceLocation)
    } catch let error as FileSystemError {
        #expect(error.code == code, "\(what): \(error)", sourceLocation: sourceLocation)
        return error.message
    } catch {
        Issue.record("\(what): \(error)", sourceLocation: sourceLocation)
    }
    return ""
}
