// Rules 50–52: a coordinated read of an item inside a ProviderFS mount runs its accessor only once
// the item's content is local (a directory: once it is listed), unless the read asked for
// `.immediatelyAvailableMetadataOnly`. The claim is held meanwhile, as Apple holds it while a
// File Provider materializes the item; a failed download fails the coordination and the accessor
// never runs.

import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

package enum ProviderContent {
    /// The state extended attribute every item of a ProviderFS mount has (docs/SEMANTICS.md).
    static let stateAttribute = "user.providerfs.state"
    static let errorAttribute = "user.providerfs.error"

    /// Makes the item at `path` (in a ProviderFS mount) available for reading: a regular file is
    /// read to its end through the mount (which downloads what is missing, and nothing when it is
    /// materialized), a directory is listed. Other kinds, and a missing item, need nothing.
    /// `isCancelled` is asked between steps (1 MiB each): a cancelled coordination stops waiting
    /// for the download at once (rule 53); what was fetched stays in the mount's cache.
    package static func makeAvailable(_ path: String, isCancelled: () -> Bool) throws(CoordinationError) {
        var info = stat()
        guard lstat(path, &info) == 0 else { return }  // not there (yet): nothing to fetch
        switch info.st_mode & S_IFMT {
        case S_IFREG:
            if attribute(stateAttribute, of: path) == "materialized" { return }
            try readToEnd(path, isCancelled: isCancelled)
        case S_IFDIR:
            try list(path)
        default:
            return
        }
    }

    private static func readToEnd(_ path: String, isCancelled: () -> Bool) throws(CoordinationError) {
        let fd = retryingOnInterrupt { open(path, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else { throw failure(path, Errno.current) }
        defer { close(fd) }
        let capacity = 1 << 20
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 4096)
        defer { buffer.deallocate() }
        while true {
            if isCancelled() { throw CoordinationError(.cancelled, "The coordination was cancelled.") }
            // An interrupted read of a stalled download ends the wait once the coordination is
            // cancelled (the canceller interrupts this thread; reading-list does).
            var count = read(fd, buffer, capacity)
            while count < 0 && errno == EINTR {
                if isCancelled() { throw CoordinationError(.cancelled, "The coordination was cancelled.") }
                count = read(fd, buffer, capacity)
            }
            if count == 0 { return }
            if count < 0 { throw failure(path, Errno.current) }
        }
    }

    private static func list(_ path: String) throws(CoordinationError) {
        guard let stream = opendir(path) else { throw failure(path, Errno.current) }
        defer { closedir(stream) }
        errno = 0
        while readdir(stream) != nil {}
        if errno != 0 { throw failure(path, Errno.current) }
    }

    private static func failure(_ path: String, _ errno: Errno) -> CoordinationError {
        var text = "Could not get the content of \(path) from its provider before the coordinated read: "
        text += errno.message
        if let reason = attribute(errorAttribute, of: path) { text += " (\(reason))" }
        return CoordinationError(.downloadFailed, text + ".")
    }

    /// The value of an extended attribute as text, or nil.
    private static func attribute(_ name: String, of path: String) -> String? {
        guard case .success(let value) = ExtendedAttributes.value(name, of: path) else { return nil }
        return String(decoding: value, as: UTF8.self)
    }
}
