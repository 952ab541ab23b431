public import SystemSupport

/// A file-system failure: a code that says what went wrong, a message for logs and xattrs, and the
/// underlying cause. `errno` is the ONLY place in ProviderFS where failures become error numbers
/// (docs/SEMANTICS.md, "Errno contract", documents this table).
public struct FileSystemError: Error, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable, CaseIterable {
        case notFound
        case notADirectory
        case isADirectory
        case exists
        case notEmpty
        case nameTooLong
        case invalidArgument
        case readOnlyFileSystem
        case permissionDenied
        case notPermitted
        case noAttribute
        case rangeTooSmall
        case badHandle
        case unsupported
        case crossDevice
        case noSpace
        /// A write past what the provider accepts.
        case fileTooLarge
        /// A download failed (provider error, short or corrupt data).
        case downloadFailed
        /// A download made no progress before its deadline.
        case timedOut
        /// The provider cannot be reached and the bytes are not local.
        case providerUnreachable
        /// The content version changed under an open handle.
        case stale
        /// A token expired, was revoked, or does not cover this item.
        case accessDenied
        /// Materialization refused for this process.
        case materializationRefused
        /// Evicting an item that is dirty or open.
        case busy
        /// A coordination claim was not granted (timeout or nested deadlock).
        case coordinationFailed
        case interrupted
        case io
    }

    public var code: Code
    public var message: String
    public var cause: (any Error & Sendable)?

    public init(_ code: Code, _ message: String, cause: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    /// The errno the kernel, and so the calling process, sees. One exhaustive switch, no default.
    public var errno: Errno {
        switch code {
        case .notFound: .noSuchFileOrDirectory
        case .notADirectory: .notDirectory
        case .isADirectory: .isDirectory
        case .exists: .fileExists
        case .notEmpty: .notEmpty
        case .nameTooLong: .nameTooLong
        case .invalidArgument: .invalidArgument
        case .readOnlyFileSystem: .readOnlyFileSystem
        case .permissionDenied: .permissionDenied
        case .notPermitted: .notPermitted
        case .noAttribute: .noData
        case .rangeTooSmall: .range
        case .badHandle: .badFileDescriptor
        case .unsupported: .notSupported
        case .crossDevice: .crossDevice
        case .noSpace: .noSpace
        case .fileTooLarge: .fileTooLarge
        case .downloadFailed: .ioError
        case .timedOut: .timedOut
        case .providerUnreachable: .networkUnreachable
        case .stale: .stale
        case .accessDenied: .permissionDenied
        case .materializationRefused: .deadlock
        case .busy: .busy
        // A claim that cannot be granted in time reads as ETIMEDOUT; a nested deadlock as EDEADLK is
        // decided by the caller choosing .materializationRefused-like codes; see SEMANTICS.md.
        case .coordinationFailed: .timedOut
        case .interrupted: .interrupted
        case .io: .ioError
        }
    }

    public var description: String { "\(message) [\(errno.name)]" }
}
