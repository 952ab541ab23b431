// Require-token mode (`providerfs mount --require-token`; docs/SEMANTICS.md "Require-token mode";
// D-330..D-334): plain paths are refused (EACCES, logged with the reason) to every caller the
// `PlainPathPolicy` refuses; only access paths (`.scoped/<token>/…`) are open to them.
//
// What stays open to everyone: the root's attributes (stat, df, findmnt and the CLI's own checks
// of the mount point), statfs (without the item count), and the lookup of `.scoped` in the root.
// Everything else on a plain node asks the policy: lookup in a plain directory (the root too),
// getattr of any other node, readlink, opendir/readdir (the root's listing too), open, every read
// of a plain handle, getxattr/listxattr/setxattr/removexattr, setattr and the mutations (EACCES
// before EROFS). `..` out of an access path reaches the root only, where nothing but its
// attributes is open.
//
// The kernel must ask every time, so in this mode plain nodes are cached by nothing: zero entry
// and attribute timeouts (`trackedTimeout`: a dentry another process looked up is revalidated
// with LOOKUP from the new caller), and plain handles are direct I/O without keep_cache or
// passthrough (every read reaches `read`, and so the policy). The root's attributes and `.scoped`,
// open to everyone, keep the mount's usual timeouts.

import Diagnostics

extension ProviderFileSystem {
    /// The policy's refusal of the caller as the error to answer with (logged), or nil when the
    /// caller may use plain paths (or the mount does not require tokens).
    func plainPathRefusal(_ operation: @autoclosure () -> String, context: RequestContext) -> FileSystemError? {
        guard requiresToken, let policy = options.plainPaths else { return nil }
        guard case .refused(let reason) = policy.decide(context) else { return nil }
        let what = operation()
        logger.notice("plain-path \(what) refused (require-token mode): \(reason)")
        return FileSystemError(
            .accessDenied,
            "require-token mode: plain-path \(what) refused: \(reason); "
                + "only access paths (\(Self.scopedDirectoryName)/<token>/…) are open to it")
    }

    /// Whether the caller may use plain paths, asked without logging (statfs, which answers
    /// everyone, only leaves out the item count for a refused caller).
    func mayUsePlainPaths(_ context: RequestContext) -> Bool {
        guard requiresToken, let policy = options.plainPaths else { return true }
        return policy.decide(context) == .allowed
    }

    /// Throws `plainPathRefusal` for an operation on a plain node.
    func checkPlainPath(_ operation: @autoclosure () -> String, context: RequestContext) throws(FileSystemError) {
        guard requiresToken else { return }
        if let refusal = plainPathRefusal(operation(), context: context) { throw refusal }
    }

    /// `checkPlainPath` for an operation whose node may be an access-path node (which has checks
    /// of its own, the token's) or a plain one.
    func checkPlainNode(
        _ resolved: ResolvedNode, _ operation: @autoclosure () -> String, context: RequestContext
    ) throws(FileSystemError) {
        guard requiresToken, case .plain = resolved else { return }
        try checkPlainPath(operation(), context: context)
    }
}
