// The app's access stage. Until the ScopedAccess module's start/stop is wired in (issue 12's
// Swift API), an access path is checked by asking the mount about it: a token that has ended
// answers EACCES, which fails the import at `access`.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Access for ordinary sources: token access paths are checked, other paths need nothing.
public struct ScopedDocumentAccess: DocumentAccess {
    public init() {}

    public func start(_ path: String, category: SourceCategory) throws(ImportFailure) -> AccessSession {
        var info = stat()
        guard stat(path, &info) == 0 else {
            let error = Errno.current
            let why = error.rawValue == EACCES ? " (the access token is not valid)" : ""
            throw ImportFailure(.access, "cannot reach \(path): \(error.message)\(why)")
        }
        return AccessSession(readPath: path, scoped: false, stop: {})
    }
}
