// Presenters hear the provider (D-403): changes the cache learns from the provider (a listing, an
// item refresh, a lookup; the local provider's inotify pushes make it refresh presented items at
// once) go to the presenters registered with the mount's embedded coordination server, as a
// coordinated write, move or delete would have told them. Changes made through the mount are not
// told here: the mount's own claims tell them.

package import FileCoordination
package import ProviderCache

/// `ProviderChangeListener` over a mount's embedded `CoordinationServer`: paths relative to the
/// provider root become `mountpoint/relativePath`, the paths presenters register.
package final class MountProviderChanges: ProviderChangeListener {
    let host: ArbiterHost
    let mountpoint: String

    package init(server: CoordinationServer, mountpoint: String) {
        self.host = server.host
        self.mountpoint = mountpoint
    }

    private func absolute(_ path: String) -> String { path.isEmpty ? mountpoint : mountpoint + "/" + path }

    package func wantsChanges(near path: String?) -> Bool {
        guard let path else { return host.hasPresenters }
        return host.isPresented(near: absolute(path))
    }

    package func providerChanged(_ changes: [ProviderOriginChange]) {
        for change in changes {
            switch change {
            case .changed(let path): host.providerChanged(path: absolute(path))
            case .moved(let from, let to): host.providerMoved(from: absolute(from), to: absolute(to))
            case .deleted(let path): host.providerDeleted(path: absolute(path))
            }
        }
    }
}
