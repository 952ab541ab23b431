// swift-tools-version:6.1
// ProviderFS: a File Provider for Linux over FUSE, with a cross-process file coordinator.
// Layers and the rules between them: docs/ARCHITECTURE.md. Dependencies point down only, and each
// target declares exactly the package modules its sources import (test targets also the
// executables they run).
import PackageDescription

let package = Package(
    name: "ProviderFS",
    products: [
        .library(name: "FileCoordination", targets: ["FileCoordination"]),
        .library(name: "ProviderModel", targets: ["ProviderModel"]),
        .library(name: "ScopedAccess", targets: ["ScopedAccess"]),
        .executable(name: "providerfs", targets: ["providerfs"]),
    ],
    targets: [
        // C libraries from Debian packages. Each is imported by exactly one Swift module.
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev", "fuse3"])]),
        .systemLibrary(name: "CSQLite3", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CLibCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CQPDF", pkgConfig: "libqpdf", providers: [.apt(["libqpdf-dev"])]),
        // libcurl with non-variadic setopt/getinfo wrappers (shim.h), for the WebDAV provider only.
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        // glibc headers Swift's Glibc module lacks (sys/xattr.h); headers only, part of libc6-dev.
        .systemLibrary(name: "CLinuxHeaders"),

        .target(name: "SystemSupport", dependencies: ["CLinuxHeaders"]),
        .target(name: "Diagnostics", dependencies: ["SystemSupport"]),
        .target(name: "SQLiteStore", dependencies: ["CSQLite3", "SystemSupport"]),
        // Digests and constant-time comparison through OpenSSL's libcrypto.
        .target(name: "CryptoSupport", dependencies: ["CLibCrypto"]),
        .target(name: "FileCoordination", dependencies: ["SystemSupport"]),
        // PDF validation with a real parser (libqpdf): pages, a full check, every page's content.
        .target(name: "PDFValidation", dependencies: ["CQPDF"]),
        // The reading-list app (issue 13): imports documents the careful way; its CLI is `reading-list`.
        .target(
            name: "ReadingList",
            dependencies: [
                "AccessTokens", "ScopedAccess", "PDFValidation", "SQLiteStore", "FileCoordination", "CryptoSupport",
                "SystemSupport",
            ]),
        // Scoped access tokens: grant, check, revoke, list, audit, kept hashed in the cache directory.
        .target(name: "AccessTokens", dependencies: ["CryptoSupport", "SQLiteStore", "SystemSupport"]),
        // The control socket's wire layer (framing, envelope, errors, one exchange): the CLI, the
        // daemon and apps (ScopedAccess) speak it; nothing of the file system.
        .target(name: "ControlWire", dependencies: ["SystemSupport"]),
        // For apps: security-scoped URLs (start/stop, bookmarks) over a mount's access paths.
        .target(name: "ScopedAccess", dependencies: ["ControlWire", "SystemSupport"]),
        // Providers: the protocol and its types; then one module per implementation or wrapper.
        .target(name: "ProviderModel", dependencies: ["SystemSupport"]),
        .target(name: "LocalProvider", dependencies: ["ProviderModel", "SystemSupport"]),
        .target(name: "ProviderFaults", dependencies: ["CryptoSupport", "ProviderModel", "SystemSupport"]),
        // A WebDAV server as the remote (issue 26): HTTP on libcurl, 207 Multi-Status with XMLParser.
        .target(name: "WebDAVProvider", dependencies: ["CCurl", "ProviderModel", "SystemSupport"]),
        .target(
            name: "ProviderCache",
            dependencies: ["ProviderModel", "SQLiteStore", "CryptoSupport", "SystemSupport", "Diagnostics"]),
        .target(
            name: "VirtualFileSystem",
            dependencies: ["ProviderCache", "ProviderModel", "SystemSupport", "Diagnostics"]),
        .target(name: "FUSEAdapter", dependencies: ["CFuse3", "VirtualFileSystem", "SystemSupport", "Diagnostics"]),
        .target(
            name: "ProviderFSCommands",
            dependencies: [
                "FUSEAdapter", "VirtualFileSystem", "ProviderCache", "ProviderModel", "LocalProvider", "ProviderFaults",
                "WebDAVProvider", "AccessTokens", "FileCoordination", "ControlWire", "SystemSupport", "Diagnostics",
            ]),
        .executableTarget(name: "providerfs", dependencies: ["ProviderFSCommands"]),
        // One process per import: a release build links the Swift runtime and Foundation statically,
        // which halves its start-up (D-476). The libraries are the toolchain's own static ones.
        .executableTarget(
            name: "reading-list", dependencies: ["ReadingList", "SystemSupport"],
            linkerSettings: [
                .unsafeFlags(
                    [
                        "-static-stdlib", "-Xlinker", "--start-group", "-lFoundation", "-lCoreFoundation",
                        "-lFoundationEssentials", "-lFoundationInternationalization", "-l_FoundationICU",
                        "-l_FoundationCShims", "-l_FoundationCollections", "-Xlinker", "--end-group",
                    ], .when(configuration: .release))
            ]),
        // A small child process for cross-process coordination tests and benchmarks.
        .executableTarget(name: "coordination-probe", dependencies: ["FileCoordination", "SystemSupport"]),
        // SQLiteStore against raw SQLite, built -c release by Benchmarks/sqlite.sh (not run by tests).
        .executableTarget(
            name: "sqlite-bench", dependencies: ["SQLiteStore", "SystemSupport"], path: "Benchmarks/SQLiteBench"),
        // Test-only: mounts an in-memory FileSystem through FUSEAdapter (mount tests of the adapter).
        .executableTarget(
            name: "fuse-fixture",
            dependencies: ["FUSEAdapter", "TestSupport", "VirtualFileSystem", "SystemSupport", "Diagnostics"]),
        // Test-only helpers (manual clock, seeded random, child processes, mounted file systems).
        .target(
            name: "TestSupport",
            dependencies: ["SystemSupport", "ProviderModel", "VirtualFileSystem"]),
        // Test-only: the `.blockingThreads` trait (test bodies that block run off the cooperative pool).
        .target(name: "TestScheduling", dependencies: ["SystemSupport"]),

        // Architecture as tests: the package graph, one lock type, FileCoordination's public API,
        // the decision log. They read the tree and the built modules; they import no module.
        .testTarget(name: "ArchitectureTests", dependencies: []),
        .testTarget(name: "SystemSupportTests", dependencies: ["SystemSupport", "TestScheduling", "CLinuxHeaders"]),
        .testTarget(name: "CryptoSupportTests", dependencies: ["CryptoSupport"]),
        .testTarget(name: "PDFValidationTests", dependencies: ["PDFValidation", "TestSupport"]),
        .testTarget(
            name: "ReadingListTests",
            dependencies: ["FileCoordination", "ReadingList", "SystemSupport", "TestSupport", "TestScheduling"]),
        .testTarget(name: "ScopedAccessTests", dependencies: ["ScopedAccess"]),
        .testTarget(
            name: "AccessTokensTests",
            dependencies: ["AccessTokens", "SQLiteStore", "SystemSupport", "TestSupport", "TestScheduling"]),
        .testTarget(
            name: "SQLiteStoreTests", dependencies: ["SQLiteStore", "SystemSupport", "TestSupport", "TestScheduling"]),
        .testTarget(
            name: "FileCoordinationTests",
            dependencies: ["FileCoordination", "SystemSupport", "TestSupport", "TestScheduling"]),
        .testTarget(
            name: "CrossProcessTests",
            dependencies: ["FileCoordination", "TestScheduling", "coordination-probe", "providerfs"]),
        .testTarget(
            name: "LocalProviderTests",
            dependencies: [
                "LocalProvider", "ProviderFaults", "ProviderModel", "SystemSupport", "TestSupport", "TestScheduling",
            ]),
        // The WebDAV provider: its XML and URL parsers, and against a real `rclone serve webdav`.
        .testTarget(
            name: "WebDAVProviderTests",
            dependencies: [
                "WebDAVProvider", "ProviderCache", "ProviderModel", "SystemSupport", "TestSupport", "TestScheduling",
                "CryptoSupport",
            ]),
        .testTarget(
            name: "ProviderFaultsTests",
            dependencies: ["CryptoSupport", "ProviderFaults", "ProviderModel", "SystemSupport", "TestSupport"]),
        .testTarget(
            name: "ProviderCacheTests",
            dependencies: [
                "ProviderCache", "ProviderModel", "LocalProvider", "ProviderFaults", "SystemSupport", "TestSupport",
                "CryptoSupport", "SQLiteStore",
            ]),
        .testTarget(
            name: "VirtualFileSystemTests",
            dependencies: [
                "VirtualFileSystem", "ProviderCache", "ProviderModel", "ProviderFaults", "ProviderFSCommands",
                "SystemSupport", "AccessTokens",
                "TestSupport", "TestScheduling",
            ]),
        .testTarget(
            name: "ProviderFSCommandsTests",
            dependencies: [
                "ProviderFSCommands", "AccessTokens", "ControlWire", "FileCoordination", "VirtualFileSystem",
                "ProviderCache", "ProviderModel",
                "LocalProvider", "ProviderFaults", "SystemSupport", "TestSupport", "TestScheduling", "WebDAVProvider",
                "providerfs",
            ]),
        // The adapter without /dev/fuse: fake backing files, the hooks writing into a pipe or a socket pair.
        .testTarget(
            name: "FUSEAdapterTests",
            dependencies: ["CFuse3", "FUSEAdapter", "VirtualFileSystem", "SystemSupport", "Diagnostics", "TestSupport"]),
        // Real mounts through /dev/fuse. Never skipped silently: see docs/TESTING.md.
        .testTarget(
            name: "MountTests",
            dependencies: [
                "TestSupport", "TestScheduling", "SystemSupport", "FUSEAdapter", "ProviderModel", "LocalProvider",
                "ScopedAccess", "providerfs",
                "reading-list",
                "fuse-fixture",
                "coordination-probe",
            ]),
    ],
    swiftLanguageModes: [.v6]
)

// Strictness in one place, for every Swift target. CI adds -warnings-as-errors on the command line
// (see .ci/run) so local experiments are not blocked by a stray warning.
for target in package.targets where target.type != .system {
    var settings = target.swiftSettings ?? []
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    settings.append(.enableUpcomingFeature("InternalImportsByDefault"))
    settings.append(.enableExperimentalFeature("StrictConcurrency=complete"))
    target.swiftSettings = settings
}
