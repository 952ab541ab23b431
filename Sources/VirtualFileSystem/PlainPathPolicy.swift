// The port through which require-token mode (`providerfs mount --require-token`, docs/SEMANTICS.md
// "Require-token mode") decides who may use plain paths: everything under the mount except the
// root's own attributes and `.scoped`. The file system knows no processes: the daemon hands in an
// adapter (ProviderFSCommands/Daemon/MountPlainPaths.swift: the mounting user's own `providerfs`
// commands); tests hand in a fake caller identity. Without one (`FileSystemOptions.plainPaths`
// nil) plain paths are open as usual.

/// Whether a caller may use plain paths.
public enum PlainPathDecision: Sendable, Equatable {
    case allowed
    /// Refused: why, in a sentence naming the caller (logged and put in the EACCES error's message).
    case refused(reason: String)
}

/// Decides, per request, whether its caller may use plain paths. Synchronous and short: it runs on
/// every operation on a plain node in require-token mode, also on the FUSE thread.
public protocol PlainPathPolicy: Sendable {
    func decide(_ context: RequestContext) -> PlainPathDecision
}
