// Builds the FileSystem a mount serves. The one place that knows how ProviderFileSystem is made.

import SystemSupport
import VirtualFileSystem

enum MountSource {
    static func makeFileSystem(source: String, cacheDirectory: String) throws(FileSystemError) -> any FileSystem {
        try ProviderFileSystem.make(source: source, cacheDirectory: cacheDirectory)
    }
}

enum DemoSource {
    static func ensure(at path: String) throws {
        throw FileSystemError(.unsupported, "the demo source generator is not available in this build yet")
    }
}
