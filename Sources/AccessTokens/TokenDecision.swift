// The answer of a check: allowed with the grant, or denied with the reason.

public enum TokenDecision: Sendable, Hashable {
    case allowed(TokenGrant)
    case denied(TokenDenialReason)

    public var grant: TokenGrant? {
        if case .allowed(let grant) = self { return grant }
        return nil
    }

    public var denialReason: TokenDenialReason? {
        if case .denied(let reason) = self { return reason }
        return nil
    }
}
