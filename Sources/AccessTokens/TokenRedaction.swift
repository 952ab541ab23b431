// Hiding tokens in text that others may see: claim dumps, reports, messages. A token is a secret
// (docs/TOKENS.md); an access path names one (`MOUNTPOINT/.scoped/<token>/…`).

/// Text with tokens hidden.
public enum TokenRedaction {
    /// `text` with every token-shaped word (`pfs_` and the letters, digits and underscores after
    /// it) replaced by `<token>`.
    public static func redacted(_ text: String) -> String {
        guard text.contains("pfs_") else { return text }
        return text.replacing(/pfs_[A-Za-z0-9_]+/, with: "<token>")
    }
}
