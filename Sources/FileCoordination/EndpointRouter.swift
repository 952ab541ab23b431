// Routing of paths to coordination servers (stub, replaced below).
import SystemSupport

final class EndpointRouter: @unchecked Sendable {
    weak var delegate: DelegateBox?
    func endpoint(for path: String) throws(CoordinationError) -> any CoordinationEndpoint {
        throw CoordinationError(.serverUnavailable, "not yet")
    }
}
