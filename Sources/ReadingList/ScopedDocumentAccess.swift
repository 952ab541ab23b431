// The app's access stage over the ScopedAccess module: an access path (`MOUNTPOINT/.scoped/<token>/…`)
// is started as a security-scoped URL (the mount derives a token bound to this process) and read
// through the path that start gives; the stop, on every exit path, ends this process's access at
// once. Other paths carry no scope: nothing to start, as Apple's start returns false for them.

import AccessTokens
import ScopedAccess

/// Access through `SecurityScopedURL` for token access paths; nothing to start for other paths.
public struct ScopedDocumentAccess: DocumentAccess {
    public init() {}

    public func start(_ path: String, category: SourceCategory) throws(ImportFailure) -> AccessSession {
        let url = SecurityScopedURL(path: path)
        guard url.hasSecurityScope else { return AccessSession(readPath: path, scoped: false, stop: {}) }
        do {
            try url.startAccessing()
        } catch {
            throw ImportFailure(.access, "scoped access could not start: \(TokenRedaction.redacted(error.description))")
        }
        return AccessSession(readPath: url.path, scoped: true, stop: { url.stopAccessingSecurityScopedResource() })
    }
}
