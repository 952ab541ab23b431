// The routing of paths to servers: a `fuse.providerfs` mount's embedded server, or the
// standalone one (started on demand by `ServerLauncher`).

import SystemSupport

/// Routes paths to servers and keeps one connection per server.
final class EndpointRouter: @unchecked Sendable {
    // Safe: `delegate` is set once right after creation, before any use; `links` is a Locked.
    weak var delegate: DelegateBox?
    private let links = Locked<[String: ServerLink]>([:])
    private let mounts = ProviderMountWatch()
    /// The environment is read once: building it is costlier than a whole claim round trip.
    private let environment = currentEnvironment()
    private let standaloneSocket: String

    init() {
        standaloneSocket = CoordinationServer.standaloneSocketPath(environment: environment)
    }

    func endpoint(for path: String) throws(CoordinationError) -> any CoordinationEndpoint {
        // Fast path (D-112): route with the mount table as last read, then one poll checks both
        // that the table did not change since and that the chosen link's server is still there.
        if let known = mounts.knownProviderMount(containing: path) {
            let socket =
                known.mount.map { CoordinationServer.socketPath(forMountPoint: $0, environment: environment) }
                ?? standaloneSocket
            if let link = links.withLock({ $0[socket] }), !link.isDead {
                let (tableChanged, hungUp) = mounts.pollChanges(since: known.generation, alongWith: link.fd)
                if !tableChanged && !hungUp { return link }
                if hungUp { link.markDead() }
            }
        }
        let mountPoint = mounts.providerMount(containing: path)
        let socket =
            mountPoint.map { CoordinationServer.socketPath(forMountPoint: $0, environment: environment) }
            ?? standaloneSocket
        if let link = links.withLock({ $0[socket] }), !link.isDead {
            // A link nobody reads does not see the server go away; check before using it.
            if !link.peerHungUp() { return link }
            link.markDead()
        }
        // Connect without holding the lock (it may take a server start); keep one link per socket.
        let link: ServerLink
        if let mountPoint {
            do {
                link = try ServerLink.connect(socketPath: socket, delegate: delegate)
                link.servesProviderMount = true
            } catch {
                throw CoordinationError(
                    .serverUnavailable,
                    "The coordination server of the mount at \(mountPoint) is not reachable: \(error).")
            }
        } else {
            link = try ServerLauncher.connectOrStart(socketPath: socket, delegate: delegate)
        }
        return links.withLock { links -> ServerLink in
            if let existing = links[socket], !existing.isDead, existing !== link {
                link.markDead()  // another thread connected first; keep one link
                return existing
            }
            links[socket] = link
            return link
        }
    }
}
