/// Exit statuses of every `providerfs` command (DESIGN.md §6). Scripts depend on these numbers.
public enum ExitStatus {
    public static let success: Int32 = 0
    public static let failure: Int32 = 1
    /// The command line was wrong (sysexits EX_USAGE).
    public static let usage: Int32 = 64
    /// A coordination claim was not granted before its deadline (sysexits EX_TEMPFAIL).
    public static let timeout: Int32 = 75
    /// `coordinate`'s claim was lost while CMD ran: its coordination server died and the claim
    /// could not be re-established (D-402; sysexits EX_PROTOCOL).
    public static let claimLost: Int32 = 76
    /// `coordinate`'s CMD was found but could not be executed (as `env` and `timeout` exit).
    public static let commandNotExecutable: Int32 = 126
    /// `coordinate`'s CMD was not found (as `env` and `timeout` exit).
    public static let commandNotFound: Int32 = 127
}

/// A command line that cannot be run as written. Printed as one sentence; exits 64.
public struct UsageError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// A command that ran and failed. Printed as one sentence; exits with `status` (1 unless said).
public struct CommandFailure: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var status: Int32
    public init(_ message: String, status: Int32 = ExitStatus.failure) {
        self.message = message
        self.status = status
    }
    public var description: String { message }
}
