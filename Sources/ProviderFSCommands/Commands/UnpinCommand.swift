// `providerfs unpin PATH…`: download on read from now on (an explicit state: it holds inside a
// pinned folder too) and evict now what eviction allows (PinCommand.swift does the work; D-445).
// The files kept are listed with the reason (open, not uploaded, pinned below, a presenter
// refused); the command still succeeds: the state is set.

struct UnpinCommand: CLICommand {
    static let name = "unpin"
    static let summary = "download files (or folders) only on read from now on, and evict them now"
    static let usage = "providerfs unpin PATH... [--json]"

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        try await PinCommand.run(state: "unpinned", &arguments, io: io, usage: usage)
    }
}
