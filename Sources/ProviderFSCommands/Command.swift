/// One `providerfs` sub-command. Each lives in its own file and is listed in `CommandRegistry`.
public protocol CLICommand: Sendable {
    /// The word after `providerfs` (e.g. "coordinate"); nested commands use "token", "fault" with their own
    /// sub-dispatch.
    static var name: String { get }
    /// One line for `providerfs --help`.
    static var summary: String { get }
    /// The usage line(s) for `providerfs NAME --help`.
    static var usage: String { get }
    /// Runs the command. Throw `UsageError` (exit 64) or `CommandFailure`; return the exit status.
    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32
}
