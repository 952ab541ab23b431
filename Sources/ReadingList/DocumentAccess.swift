// The access stage's port: how an import starts (and stops) access to its source. The app uses
// security-scoped access for token access paths (ScopedDocumentAccess); tests substitute others.

/// Access to one source while an import reads it.
public struct AccessSession: Sendable {
    /// The path to read (for a started scope, the path the scope gives this process).
    public var readPath: String
    /// Whether a scope was started (and must be stopped).
    public var scoped: Bool
    /// Ends the access. Called exactly once, on every exit path.
    public var stop: @Sendable () -> Void

    public init(readPath: String, scoped: Bool, stop: @escaping @Sendable () -> Void) {
        self.readPath = readPath
        self.scoped = scoped
        self.stop = stop
    }
}

/// Starts access to sources.
public protocol DocumentAccess: Sendable {
    /// Starts access to `path` (of `category`); throws an `access` failure when it cannot.
    func start(_ path: String, category: SourceCategory) throws(ImportFailure) -> AccessSession
}
