// One mount fixture (issue 25): a scratch directory with the provider's files (`source`), a cache
// and a runtime directory (`MountLayout`), and the real binary mounted over them — a local
// directory (`--source`), or the same directory served by `rclone serve webdav` or Apache mod_dav
// on 127.0.0.1 (`--webdav`, issue 26), so that one test runs over every provider. `SourceMount`
// is a layout mounted at once; a suite that lays out its tree first and mounts it several ways
// holds a `MountLayout` (`MountLayoutSuite`) and mounts it with `mount(over:)`. A server is
// stopped by its PID in `stop`, and when its mount goes.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// The provider a mount test runs over.
public enum ProviderKind: String, CaseIterable, Sendable {
    case local
    case rclone
    case apache

    /// Every provider, WebDAV's unless the environment asks to skip them
    /// (PROVIDERFS_SKIP_WEBDAV_TESTS=1; without rclone or apache2 those tests fail, never skip).
    public static var available: [ProviderKind] { WebDAVTestGate.enabled ? allCases : [.local] }
}

/// The scratch directory of a mount test: the provider's files (`source`, made empty here), the
/// cache (`cache`) and the runtime directory of the mount's registry and control socket
/// (`runtime`, which the `providerfs` commands are given too). `remove()` takes it all away.
public struct MountLayout: Sendable {
    public let scratch: String
    public let source: String
    public let cache: String
    public let runtime: String

    public init(prefix: String) throws {
        scratch = try makeTemporaryDirectory(prefix: prefix)
        source = scratch + "/source"
        cache = scratch + "/cache"
        runtime = scratch + "/run"
        mkdir(source, 0o755)
    }

    /// `PROVIDERFS_RUNTIME_DIR=runtime`, the environment of the mount and of its commands.
    public var environment: [String: String] { ["PROVIDERFS_RUNTIME_DIR": runtime] }

    /// A file of the provider, on disk.
    public func source(_ relative: String) -> String { source + "/" + relative }

    /// `source` mounted over `kind` on `cache`, with `arguments` and `environment` added.
    public func mount(
        over kind: ProviderKind = .local, arguments: [String] = [], environment extra: [String: String] = [:]
    ) throws -> ServedMount {
        try ServedMount(
            tree: source, kind: kind, arguments: ["--cache", cache] + arguments,
            environment: environment.merging(extra) { $1 })
    }

    public func remove() { removeTreeWithinFileSystem(scratch) }
}

/// A mount suite whose tests share one `MountLayout` (made in its `init`, one per test): its
/// directories by name, and `cleanup()`, which each test defers.
public protocol MountLayoutSuite {
    var layout: MountLayout { get }
}

extension MountLayoutSuite {
    public var scratch: String { layout.scratch }
    public var source: String { layout.source }
    public var cache: String { layout.cache }
    public var runtime: String { layout.runtime }
    public func cleanup() { layout.remove() }
}

/// A `MountLayout` mounted at once over one provider (see the file's header).
public final class SourceMount {
    public let layout: MountLayout
    public let kind: ProviderKind
    /// The mount's environment: the layout's and the test's.
    public let environment: [String: String]
    /// The WebDAV server (nil for a local directory).
    public let server: WebDAVTestServer?
    /// What `remount` mounts again.
    public let arguments: [String]
    public var mount: MountedFileSystem

    public init(
        prefix: String, kind: ProviderKind = .local, writable: Bool = true, arguments extra: [String] = [],
        environment extraEnvironment: [String: String] = [:]
    ) throws {
        layout = try MountLayout(prefix: prefix)
        self.kind = kind
        environment = layout.environment.merging(extraEnvironment) { $1 }
        var source: [String]
        switch kind {
        case .local:
            server = nil
            source = ["--source", layout.source]
        case .rclone, .apache:
            if let problem = WebDAVTestGate.problem {
                layout.remove()
                throw SystemCallError(problem, Errno(ENOENT))
            }
            let started = try WebDAVTestServer(
                root: layout.source, kind: kind == .apache ? .apache : .rclone(user: nil, password: nil))
            server = started
            source = ["--webdav", started.url]
        }
        arguments = source + ["--cache", layout.cache] + (writable ? [] : ["--read-only"]) + extra
        do {
            mount = try MountedFileSystem.providerfs(arguments, environment: environment)
        } catch {
            server?.stop()
            layout.remove()
            throw error
        }
    }

    public var scratch: String { layout.scratch }
    /// The provider's files on disk: the `--source` directory, or the one the server serves.
    public var tree: String { layout.source }
    public var cache: String { layout.cache }
    /// The runtime directory (registry, control socket) that `providerfs` commands are given.
    public var runtime: String { layout.runtime }

    public func path(_ relative: String) -> String { mount.path(relative) }
    /// A file of the provider, on disk.
    public func source(_ relative: String) -> String { layout.source(relative) }

    /// Mounts again on the same cache (after a stop or a kill).
    public func remount() throws {
        mount = try MountedFileSystem.providerfs(arguments, environment: environment)
    }

    public func stop() {
        mount.stop()
        server?.stop()
        layout.remove()
    }
}

/// A mount of a suite's own `tree` over one provider: `--source tree`, or `--webdav` of rclone or
/// Apache serving it on 127.0.0.1 (stopped with the mount).
public struct ServedMount {
    public let mount: MountedFileSystem
    public let server: WebDAVTestServer?
    public let tree: String

    public init(tree: String, kind: ProviderKind, arguments: [String], environment: [String: String]) throws {
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

    public var mountpoint: String { mount.mountpoint }
    public func path(_ relative: String) -> String { mount.path(relative) }

    /// Gives `relative`, made in the served tree after the server started, to the tree's owner
    /// (Apache's workers run as nobody under root and must write and delete it; a no-op else).
    public func adopt(_ relative: String) {
        var owner = stat()
        guard server != nil, stat(tree, &owner) == 0 else { return }
        chown(tree + "/" + relative, owner.st_uid, owner.st_gid)
    }

    /// Unmounts, then stops the server (both safe twice).
    public func stop() {
        mount.stop()
        server?.stop()
    }
}
