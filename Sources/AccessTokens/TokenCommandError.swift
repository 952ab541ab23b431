// Why `revoke` or `expire` did nothing.

/// A revoke or expire that changed nothing.
public enum TokenCommandError: Error, Sendable, Equatable, CustomStringConvertible {
    case unknownID(String)
    /// The token had ended already (expired, revoked or used up): it stays as it was.
    case alreadyEnded(id: String, TokenState)

    public var description: String {
        switch self {
        case .unknownID(let id): "no token has the id \(id)"
        case .alreadyEnded(let id, let state): "token \(id) has already ended (\(state.rawValue))"
        }
    }
}
