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

/// Adds a spawn action that closes every descriptor from `lowest` up in the child, after the
/// actions added before it. A descriptor another thread opened without `O_CLOEXEC` (Foundation's
/// `String(contentsOfFile:)` does) would otherwise leak into the child and, for a file on a mount,
/// keep that mount busy for as long as the child runs.
///
/// glibc 2.34+ has `posix_spawn_file_actions_addclosefrom_np`, but declares it only under
/// `_GNU_SOURCE`, which Swift's Glibc module does not set: it is looked up by name. Where it is
/// missing the child inherits what it would have before.
public func closeDescriptors(from lowest: Int32, in actions: inout posix_spawn_file_actions_t) {
    guard let closeFrom = spawnCloseFrom else { return }
    _ = closeFrom(&actions, lowest)
}

private typealias SpawnCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32

private let spawnCloseFrom: SpawnCloseFrom? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        return nil
    }
    return unsafeBitCast(symbol, to: SpawnCloseFrom.self)
}()
