// One mount fixture (issue 25): a scratch directory with the provider's files (`tree`), a cache
// and a runtime directory, and the real binary mounted over them — a local directory
// (`--source`), or the same directory served by `rclone serve webdav` or Apache mod_dav on
// 127.0.0.1 (`--webdav`, issue 26), so that one test runs over every provider. The server is
// stopped by its PID in `stop`, and when the fixture goes.

import SystemSupport
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The provider a mount test runs over.
enum ProviderKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case local
    case rclone
    case apache

    var testDescription: String { rawValue }

    /// Every provider, WebDAV's unless the environment asks to skip them
    /// (PROVIDERFS_SKIP_WEBDAV_TESTS=1; without rclone or apache2 those tests fail, never skip).
    static var available: [ProviderKind] { WebDAVTestGate.enabled ? allCases : [.local] }
}

/// A mount of a scratch tree over one provider (see the file's header).
final class SourceMount {
    let scratch: String
    /// The provider's files on disk: the `--source` directory, or the one the server serves.
    let tree: String
    let cache: String
    let environment: [String: String]
    let kind: ProviderKind
    /// The WebDAV server (nil for a local directory).
    let server: WebDAVTestServer?
    /// What `remount` mounts again.
    let arguments: [String]
    var mount: MountedFileSystem

    init(
        prefix: String, kind: ProviderKind = .local, writable: Bool = true, arguments extra: [String] = [],
        environment extraEnvironment: [String: String] = [:]
    ) throws {
        scratch = try makeTemporaryDirectory(prefix: prefix)
        tree = scratch + "/tree"
        cache = scratch + "/cache"
        self.kind = kind
        mkdir(tree, 0o755)
        environment = ["PROVIDERFS_RUNTIME_DIR": scratch + "/run"].merging(extraEnvironment) { $1 }
        var source: [String]
        switch kind {
        case .local:
            server = nil
            source = ["--source", tree]
        case .rclone, .apache:
            if let problem = WebDAVTestGate.problem {
                removeTreeWithinFileSystem(scratch)
                throw SystemCallError(problem, Errno(ENOENT))
            }
            let started = try WebDAVTestServer(
                root: tree, kind: kind == .apache ? .apache : .rclone(user: nil, password: nil))
            server = started
            source = ["--webdav", started.url]
        }
        arguments = source + ["--cache", cache] + (writable ? [] : ["--read-only"]) + extra
        do {
            mount = try MountedFileSystem.providerfs(arguments, environment: environment)
        } catch {
            server?.stop()
            removeTreeWithinFileSystem(scratch)
            throw error
        }
    }

    /// The runtime directory (registry, control socket) that `providerfs` commands are given.
    var runtime: String { scratch + "/run" }

    func path(_ relative: String) -> String { mount.path(relative) }
    /// A file of the provider, on disk.
    func source(_ relative: String) -> String { tree + "/" + relative }

    /// Mounts again on the same cache (after a stop or a kill).
    func remount() throws {
        mount = try MountedFileSystem.providerfs(arguments, environment: environment)
    }

    func stop() {
        mount.stop()
        server?.stop()
        removeTreeWithinFileSystem(scratch)
    }
}

/// The writable mount the write tests were written with.
typealias WritableMount = SourceMount

/// A mount of a suite's own `tree` over one provider: `--source tree`, or `--webdav` of rclone or
/// Apache serving it on 127.0.0.1 (stopped with the mount), for suites whose fixture lays out
/// its scratch directory itself.
struct ServedMount {
    let mount: MountedFileSystem
    let server: WebDAVTestServer?
    let tree: String

    init(tree: String, kind: ProviderKind, arguments: [String], environment: [String: String]) throws {
        self.tree = tree
        switch kind {
        case .local:
            server = nil
            mount = try MountedFileSystem.providerfs(["--source", tree] + arguments, environment: environment)
        case .rclone, .apache:
            if let problem = WebDAVTestGate.problem { throw SystemCallError(problem, Errno(ENOENT)) }
            let started = try WebDAVTestServer(
                root: tree, kind: kind == .apache ? .apache : .rclone(user: nil, password: nil))
            server = started
            do {
                mount = try MountedFileSystem.providerfs(
                    ["--webdav", started.url] + arguments, environment: environment)
            } catch {
                started.stop()
                throw error
            }
        }
    }

    var mountpoint: String { mount.mountpoint }
    func path(_ relative: String) -> String { mount.path(relative) }

    /// Gives `relative`, made in the served tree after the server started, to the tree's owner
    /// (Apache's workers run as nobody under root and must write and delete it; a no-op else).
    func adopt(_ relative: String) {
        var owner = stat()
        guard server != nil, stat(tree, &owner) == 0 else { return }
        chown(tree + "/" + relative, owner.st_uid, owner.st_gid)
    }

    /// Unmounts, then stops the server (both safe twice).
    func stop() {
        mount.stop()
        server?.stop()
    }
}
