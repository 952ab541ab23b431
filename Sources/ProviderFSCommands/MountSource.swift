// Builds the FileSystem a mount serves. The one place that knows how ProviderFileSystem is made.

import ProviderModel
import SystemSupport
import VirtualFileSystem

enum MountSource {
    /// The provider-backed file system for `source`; the demo adds its fault rules.
    static func makeFileSystem(
        source: String, cacheDirectory: String, demo: Bool, claims: any ReadClaimProvider = NoReadClaims()
    ) throws(FileSystemError)
        -> any FileSystem
    {
        try ProviderFileSystem.make(
            source: source, cacheDirectory: cacheDirectory, faults: demo ? DemoSource.faults() : nil, claims: claims)
    }
}
