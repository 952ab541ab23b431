// Builds the FileSystem a mount serves. The one place that knows how ProviderFileSystem is made.

import ProviderModel
import SystemSupport
import VirtualFileSystem

enum MountSource {
    /// The provider-backed file system for `source`; for the demo, the generated demo source (its
    /// `source/` directory) with the faults its manifest names.
    static func makeFileSystem(
        source: String, cacheDirectory: String, demo: Bool, claims: any ReadClaimProvider = NoReadClaims()
    ) throws(FileSystemError)
        -> any FileSystem
    {
        if demo {
            // The demo's failing item comes from its manifest (ProviderModel.DemoSource).
            return try ProviderFileSystem.makeDemo(
                demoDirectory: UserDirectories.demoSource, cacheDirectory: cacheDirectory, claims: claims
            ).0
        }
        return try ProviderFileSystem.make(source: source, cacheDirectory: cacheDirectory, claims: claims)
    }
}
