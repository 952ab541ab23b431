// Who presents a token.

/// The process presenting a token: its process id (the thread group, not a thread id: the
/// enforcement layer maps a FUSE caller's thread to its process first) and its user id.
public struct TokenCaller: Sendable, Hashable {
    public var pid: Int32
    public var uid: UInt32

    public init(pid: Int32, uid: UInt32) {
        self.pid = pid
        self.uid = uid
    }
}
