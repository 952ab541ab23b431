// The mount-helper calling convention: `mount -t fuse.providerfs SOURCE MOUNTPOINT -o OPTS` (and an
// /etc/fstab line) makes mount(8) run /sbin/mount.fuse3, which runs `providerfs SOURCE MOUNTPOINT
// -o OPTS` found on PATH. This turns that form into `providerfs mount …`.

/// Translates mount-helper arguments into `mount` command arguments, or nil when `arguments` is
/// not in that form (then the CLI reports an unknown command as usual).
///
/// SOURCE is a directory, `demo` for the demo provider, or an `http://` / `https://` URL (a WebDAV
/// collection, `--webdav`; then also `webdav_user=NAME`, `password_file=F`, `ca_file=F` — not
/// `user=`, which is mount(8)'s own; `password=…` becomes a bare `--password`, which `mount` refuses
/// without echoing it, D-421). Options understood: `cache=DIR`,
/// `log=FILE`, `ro` (`--read-only`), `allow_other`, `no_passthrough`, `require_token`, `ctag_covers_subtree`,
/// `stall_timeout=D`, `write_back_delay=D`, `poll_interval=D` (or 0), `lock_timeout=D`, `checksum_limit=S`, `parallel_ranges=N`, `cache_max_size=S`, `cache_min_free=S`, `cache_max_age=D`, `no_download_for=A:B`,
/// `download_for=A:B` (names separated by ':', since ',' separates options); `-f` runs in the foreground. Other generic mount options (rw, defaults, noauto, nofail, _netdev, user, x-systemd.*,
/// …) are mount(8)'s business and ignored, except one that looks like a misspelled
/// `require_token` (`require-token`, `require_token=yes`, …): that is refused, never ignored, so
/// that a mount meant to be locked down does not come up open (D-333).
func mountHelperArguments(_ arguments: [String]) -> [String]? {
    guard let source = arguments.first else { return nil }
    let webdav = source.hasPrefix("http://") || source.hasPrefix("https://")
    guard source == "demo" || source.hasPrefix("/") || webdav else { return nil }
    var rest = Array(arguments.dropFirst())
    guard let mountpoint = rest.first, !mountpoint.hasPrefix("-") else { return nil }
    rest.removeFirst()
    var result = ["mount", source == "demo" ? "--demo" : webdav ? "--webdav=\(source)" : "--source=\(source)"]
    var options: [String] = []
    while !rest.isEmpty {
        let argument = rest.removeFirst()
        switch argument {
        case "-o":
            guard !rest.isEmpty else { return nil }
            options += rest.removeFirst().split(separator: ",").map(String.init)
        case "-f": result.append("--foreground")
        case "-s", "-n", "-v", "-d": continue  // single-threaded/no-mtab/verbose/debug: not ours
        default:
            if argument.hasPrefix("-o") {
                options += argument.dropFirst(2).split(separator: ",").map(String.init)
            } else {
                return nil
            }
        }
    }
    for option in options {
        let parts = option.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        if parts.count == 2, let flag = mountHelperValueOptions[String(parts[0])] {
            result.append(flag + "=" + parts[1])
        } else if option == "allow_other" {
            result.append("--allow-other")
        } else if option == "ro" {
            if !result.contains("--read-only") { result.append("--read-only") }
        } else if option == "no_passthrough" {
            result.append("--no-passthrough")
        } else if option == "ctag_covers_subtree" {
            result.append("--ctag-covers-subtree")
        } else if option == "require_token" {
            // Once, however often fstab repeats it.
            if !result.contains("--require-token") { result.append("--require-token") }
        } else if option.lowercased().contains("require") {
            result.append("--unknown-mount-option=" + option)
        } else if option == "password" || option.hasPrefix("password=") {
            // Refused by `mount`, and never carried further: the value is dropped here.
            if !result.contains("--password") { result.append("--password") }
        }
    }
    result.append(mountpoint)
    return result
}

/// The `-o KEY=VALUE` options and the `mount` flag each becomes (`--FLAG=VALUE`).
private let mountHelperValueOptions: [String: String] = [
    "cache": "--cache", "log": "--log", "stall_timeout": "--stall-timeout", "write_back_delay": "--write-back-delay",
    "cache_max_size": "--cache-max-size", "cache_min_free": "--cache-min-free", "cache_max_age": "--cache-max-age",
    "no_download_for": "--no-download-for", "download_for": "--download-for", "webdav_user": "--user",
    "password_file": "--password-file", "ca_file": "--ca-file", "poll_interval": "--poll-interval",
    "lock_timeout": "--lock-timeout",
    "checksum_limit": "--checksum-limit", "parallel_ranges": "--parallel-ranges",
]
