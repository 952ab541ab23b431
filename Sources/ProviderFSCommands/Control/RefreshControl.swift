// The daemon's side of `providerfs refresh PATH` (D-450): the catalog asks the provider again
// about the path; what changed reaches the kernel, open readers and presenters as any provider
// answer does (Catalog+Refresh.swift).

import ControlWire
import ProviderCache
import ProviderModel
import VirtualFileSystem

/// The reply to `refresh`.
struct ControlRefreshReply: Codable, Sendable, Equatable {
    var path: String
    /// Whether the provider has an item at the path now.
    var present: Bool
    /// file, directory or symlink (present only).
    var kind: String?
    var size: Int64?
    /// The provider's content version now (present only).
    var version: String?
}

extension MountControl {
    func refresh(_ path: String) async throws(ControlError) -> ControlRefreshReply {
        let outcome: RefreshOutcome
        do { outcome = try await fileSystem.cache.catalog.refresh(path: path) } catch {
            throw Self.controlError(FileSystemError(error), path: path)
        }
        switch outcome {
        case .absent:
            return ControlRefreshReply(path: path, present: false)
        case .present(let item):
            return ControlRefreshReply(
                path: path, present: true, kind: item.kind.rawValue, size: item.size,
                version: item.contentVersion.rawValue)
        }
    }
}
