public import ProviderModel

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A cache failure, as readers see it. VirtualFileSystem maps each code to a `FileSystemError`
/// (and so to the one errno table); docs/SEMANTICS.md lists the mapping.
public struct CacheError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, Equatable, CaseIterable {
        /// The item does not exist on the provider (lookup, open).
        case notFound
        /// The item was deleted on the provider while a handle still needed bytes of it.
        case deletedRemotely
        /// The download failed (provider error, short transfer) after the retry budget.
        case downloadFailed
        /// No byte arrived before the stall deadline.
        case timedOut
        /// The provider cannot be reached and the bytes are not local.
        case unreachable
        /// The content version changed under a reader that needs bytes of the old version.
        case stale
        /// Content of a directory, children of a file.
        case wrongKind
        /// The provider refused access.
        case accessDenied
        /// The cache file system is full.
        case noSpace
        /// The request was cancelled (interrupted reader, shutdown).
        case cancelled
        /// A name the provider rejects.
        case invalidName
        /// A name or path longer than the provider can hold (the provider's errno ENAMETOOLONG).
        case nameTooLong
        /// A local I/O error on a cache file or the metadata store.
        case io
        /// The bytes of a checksummed fetch do not match the provider's checksum (or the stream
        /// ended without one): none of them became present. Retried like `downloadFailed`, and
        /// read as it (EIO).
        case corrupt
        /// A name is taken (create, mkdir, rename without replacing).
        case exists
        /// A directory that must be empty is not.
        case notEmpty
        /// The provider does not offer the change asked for.
        case unsupported
        /// The content is larger than the provider accepts.
        case tooLarge
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }

    /// The cache's reading of a provider failure.
    public init(_ error: ProviderError) {
        switch error.code {
        case .noSuchItem: self.init(.notFound, error.message)
        case .versionChanged: self.init(.stale, error.message)
        case .unreachable: self.init(.unreachable, error.message)
        case .io: self.init(.downloadFailed, error.message)
        case .wrongKind: self.init(.wrongKind, error.message)
        case .accessDenied: self.init(.accessDenied, error.message)
        case .timedOut: self.init(.timedOut, error.message)
        case .cancelled: self.init(.cancelled, error.message)
        case .invalidName: self.init(error.errno == ENAMETOOLONG ? .nameTooLong : .invalidName, error.message)
        case .alreadyExists: self.init(.exists, error.message)
        case .notEmpty: self.init(.notEmpty, error.message)
        case .notSupported: self.init(.unsupported, error.message)
        case .noSpace: self.init(.noSpace, error.message)
        case .tooLarge: self.init(.tooLarge, error.message)
        }
    }

    static func from(_ error: any Error) -> CacheError {
        if let error = error as? CacheError { return error }
        return CacheError(ProviderError.from(error))
    }
}
