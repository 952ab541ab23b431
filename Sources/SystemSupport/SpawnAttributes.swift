#if canImport(Glibc)
public import Glibc
#elseif canImport(Musl)
public import Musl
#endif

/// Runs `body` with `posix_spawn` attributes for a child that starts with a clean signal state:
/// an empty signal mask and default dispositions for SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE and
/// SIGCHLD, whatever the spawning thread had. A child of a Swift concurrency or Dispatch thread
/// otherwise inherits that thread's blocked SIGTERM (reference/swift-fuse-notes.md §4), and a child
/// of a background shell job an ignored SIGINT.
///
/// - Parameter newSession: also start the child in a new session (`setsid`), detached from the
///   caller's terminal and process group: for daemons.
public func withCleanSpawnAttributes<T>(
    newSession: Bool, _ body: (UnsafePointer<posix_spawnattr_t>) throws -> T
) rethrows -> T {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var empty = sigset_t()
    sigemptyset(&empty)
    posix_spawnattr_setsigmask(&attributes, &empty)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    for signal in [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD] { sigaddset(&defaults, signal) }
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    // POSIX_SPAWN_SETSID (0x80, glibc ≥ 2.26) is a GNU extension Swift's Glibc module hides.
    let setsid: Int32 = newSession ? 0x80 : 0
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | setsid))
    return try body(&attributes)
}
