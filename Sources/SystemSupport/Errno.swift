#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A POSIX error number, as a typed value.
public struct Errno: RawRepresentable, Error, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// The value of the calling thread's `errno`.
    public static var current: Errno { Errno(errno) }

    public static let notPermitted = Errno(EPERM)
    public static let noSuchFileOrDirectory = Errno(ENOENT)
    public static let interrupted = Errno(EINTR)
    public static let ioError = Errno(EIO)
    public static let badFileDescriptor = Errno(EBADF)
    public static let tryAgain = Errno(EAGAIN)
    public static let noMemory = Errno(ENOMEM)
    public static let permissionDenied = Errno(EACCES)
    public static let busy = Errno(EBUSY)
    public static let fileExists = Errno(EEXIST)
    public static let notDirectory = Errno(ENOTDIR)
    public static let isDirectory = Errno(EISDIR)
    public static let invalidArgument = Errno(EINVAL)
    public static let noSpace = Errno(ENOSPC)
    public static let readOnlyFileSystem = Errno(EROFS)
    public static let nameTooLong = Errno(ENAMETOOLONG)
    public static let notSupported = Errno(ENOTSUP)
    public static let noSys = Errno(ENOSYS)
    public static let notEmpty = Errno(ENOTEMPTY)
    public static let deadlock = Errno(EDEADLK)
    public static let timedOut = Errno(ETIMEDOUT)
    public static let stale = Errno(ESTALE)
    public static let networkUnreachable = Errno(ENETUNREACH)
    public static let noData = Errno(ENODATA)
    public static let range = Errno(ERANGE)
    public static let notConnected = Errno(ENOTCONN)
    public static let crossDevice = Errno(EXDEV)
    public static let connectionRefused = Errno(ECONNREFUSED)
    public static let canceled = Errno(ECANCELED)
    public static let fileTooLarge = Errno(EFBIG)

    /// The C name of the error, e.g. "ENOENT", when known.
    public var name: String {
        Errno.names[rawValue] ?? "E\(rawValue)"
    }

    /// The C library's message for this error, e.g. "No such file or directory".
    public var message: String {
        String(cString: strerror(rawValue))
    }

    public var description: String { "\(name) (\(message))" }

    /// Parses "EIO", "eio", "5": the forms the CLI accepts for `--error`.
    public init?(parsing text: String) {
        if let number = Int32(text), number > 0 {
            self.init(number)
            return
        }
        let upper = text.uppercased()
        guard let match = Errno.names.first(where: { $0.value == upper }) else { return nil }
        self.init(match.key)
    }

    public static func ~= (lhs: Errno, rhs: any Error) -> Bool { (rhs as? Errno) == lhs }

    private static let names: [Int32: String] = [
        EPERM: "EPERM", ENOENT: "ENOENT", EINTR: "EINTR", EIO: "EIO", EBADF: "EBADF", EAGAIN: "EAGAIN",
        ENOMEM: "ENOMEM", EACCES: "EACCES", EBUSY: "EBUSY", EEXIST: "EEXIST", ENOTDIR: "ENOTDIR",
        EISDIR: "EISDIR", EINVAL: "EINVAL", ENOSPC: "ENOSPC", EROFS: "EROFS", ENAMETOOLONG: "ENAMETOOLONG",
        ENOTSUP: "ENOTSUP", ENOSYS: "ENOSYS", ENOTEMPTY: "ENOTEMPTY", EDEADLK: "EDEADLK",
        ETIMEDOUT: "ETIMEDOUT", ESTALE: "ESTALE", ENETUNREACH: "ENETUNREACH", ENODATA: "ENODATA",
        ERANGE: "ERANGE", ENOTCONN: "ENOTCONN", EXDEV: "EXDEV", ECONNREFUSED: "ECONNREFUSED",
        ECANCELED: "ECANCELED", EFBIG: "EFBIG", EMFILE: "EMFILE", ENFILE: "ENFILE", EPIPE: "EPIPE",
        ECONNRESET: "ECONNRESET", EHOSTUNREACH: "EHOSTUNREACH", ENXIO: "ENXIO", ENODEV: "ENODEV",
        ELOOP: "ELOOP", ENOTTY: "ENOTTY", EDQUOT: "EDQUOT",
    ]
}

/// A failed system call: which call, and the errno it set.
public struct SystemCallError: Error, Sendable, CustomStringConvertible {
    public var systemCall: String
    public var errno: Errno
    public init(_ systemCall: String, _ errno: Errno = .current) {
        self.systemCall = systemCall
        self.errno = errno
    }
    public var description: String { "\(systemCall): \(errno.message)" }
}

/// Runs a syscall-shaped closure (returns -1 and sets errno on failure), retrying on EINTR.
public func retryingOnInterrupt<T: BinaryInteger>(_ call: () -> T) -> T {
    while true {
        let result = call()
        if result == -1 && errno == EINTR { continue }
        return result
    }
}
