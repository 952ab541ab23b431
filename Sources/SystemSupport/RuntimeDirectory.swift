#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where ProviderFS keeps sockets and other per-user runtime state:
/// `$XDG_RUNTIME_DIR/providerfs/`, or `/run/providerfs/` for root when XDG_RUNTIME_DIR is unset,
/// or `/tmp/providerfs-<uid>/` otherwise. `PROVIDERFS_RUNTIME_DIR` overrides all of them (tests use
/// it to keep their servers apart).
public enum RuntimeDirectory {
    public static func path(environment: [String: String] = currentEnvironment()) -> String {
        if let explicit = environment["PROVIDERFS_RUNTIME_DIR"], !explicit.isEmpty { return explicit }
        if let xdg = environment["XDG_RUNTIME_DIR"], !xdg.isEmpty { return xdg + "/providerfs" }
        if getuid() == 0 { return "/run/providerfs" }
        return "/tmp/providerfs-\(getuid())"
    }

    /// Creates the directory (mode 0700) and its parents if needed, and returns its path.
    public static func ensure(environment: [String: String] = currentEnvironment()) throws(SystemCallError) -> String {
        let directory = path(environment: environment)
        try makeDirectories(directory, mode: 0o700)
        return directory
    }
}

/// `mkdir -p`: creates each missing component. An existing directory is fine.
public func makeDirectories(_ path: String, mode: UInt32 = 0o755) throws(SystemCallError) {
    var prefix = path.hasPrefix("/") ? "" : "."
    for component in path.split(separator: "/", omittingEmptySubsequences: true) {
        prefix += "/" + component
        if mkdir(prefix, mode_t(mode)) != 0 && errno != EEXIST {
            throw SystemCallError("mkdir \(prefix)")
        }
    }
    var info = stat()
    guard stat(path, &info) == 0 else { throw SystemCallError("stat \(path)") }
    guard info.st_mode & S_IFMT == S_IFDIR else { throw SystemCallError("mkdir \(path)", .notDirectory) }
}

/// The process environment as a dictionary (without Foundation).
public func currentEnvironment() -> [String: String] {
    var result: [String: String] = [:]
    var pointer = environ
    while let entry = pointer.pointee {
        let text = String(cString: entry)
        if let equals = text.firstIndex(of: "=") {
            result[String(text[..<equals])] = String(text[text.index(after: equals)...])
        }
        pointer += 1
    }
    return result
}
