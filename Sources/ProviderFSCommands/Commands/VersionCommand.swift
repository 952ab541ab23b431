/// `providerfs version [--json]`.
struct VersionCommand: CLICommand {
    static let name = "version"
    static let summary = "print the version of providerfs"
    static let usage = "providerfs version [--json]"

    struct Output: Encodable { var version: String }

    static func run(_ arguments: inout ArgumentList, io: CommandIO) async throws -> Int32 {
        try arguments.finish()
        if io.json { io.emit(Output(version: ProviderFSCLI.version)) } else { io.line(ProviderFSCLI.version) }
        return ExitStatus.success
    }
}
