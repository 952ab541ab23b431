/// A provider failure: what went wrong (a code callers switch on), a message for logs and the
/// `user.providerfs.error` xattr, and, when the failure came from the system, its errno value.
public struct ProviderError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, Equatable, CaseIterable {
        /// The item does not exist (any more).
        case noSuchItem
        /// The item exists but no longer has the requested content version.
        case versionChanged
        /// The provider cannot be reached (server down, network off, source directory missing).
        case unreachable
        /// Reading or transferring failed (includes a stream that ended early).
        case io
        /// Children were asked of something that is not a directory, or content of a directory.
        case wrongKind
        /// The provider refused access.
        case accessDenied
        /// No progress before a deadline.
        case timedOut
        /// The request was cancelled by the caller.
        case cancelled
        /// A name or identifier that the provider rejects (e.g. one that escapes its root; with
        /// ENAMETOOLONG as its errno when it is too long).
        case invalidName
        /// A write call's name is taken (create, mkdir, a RENAME_NOREPLACE move).
        case alreadyExists
        /// A directory that must be empty is not (delete, a move over a directory).
        case notEmpty
        /// The provider does not offer this call (see `ProviderCapabilities`).
        case notSupported
        /// The provider has no room: disk full or quota (errno ENOSPC or EDQUOT).
        case noSpace
        /// The content is larger than the provider accepts (errno EFBIG).
        case tooLarge
    }

    public var code: Code
    public var message: String
    /// The errno behind the failure, when there is one (e.g. EIO from a fault, ENOENT from lstat).
    public var errno: Int32?

    public init(_ code: Code, _ message: String, errno: Int32? = nil) {
        self.code = code
        self.message = message
        self.errno = errno
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// Maps any error thrown by a provider to a ProviderError (cancellation included).
    public static func from(_ error: any Error) -> ProviderError {
        if let error = error as? ProviderError { return error }
        if error is CancellationError { return ProviderError(.cancelled, "cancelled") }
        return ProviderError(.io, "\(error)")
    }
}
