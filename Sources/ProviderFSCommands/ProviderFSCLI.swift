import Foundation

/// Entry point of the `providerfs` executable, as a library so tests can run it in-process.
public enum ProviderFSCLI {
    public static let version = "0.1.0"

    public static func main(_ arguments: [String]) async -> Int32 {
        var rest = Array(arguments.dropFirst())
        guard let name = rest.first else {
            CommandIO(json: false).error("providerfs: missing command. Run 'providerfs --help' for the list.")
            return ExitStatus.usage
        }
        rest.removeFirst()
        let stdout = CommandIO(json: false)
        switch name {
        case "--help", "-h", "help":
            stdout.line(helpText)
            return ExitStatus.success
        case "--version":
            stdout.line("providerfs \(version)")
            return ExitStatus.success
        default:
            break
        }
        if CommandRegistry.commands.allSatisfy({ $0.name != name }),
            let translated = mountHelperArguments([name] + rest)
        {
            // Called by mount.fuse3 for `mount -t fuse.providerfs SOURCE MOUNTPOINT -o …`.
            return await main([arguments.first ?? "providerfs"] + translated)
        }
        guard let command = CommandRegistry.commands.first(where: { $0.name == name }) else {
            stdout.error("providerfs: unknown command '\(name)'. Run 'providerfs --help' for the list.")
            return ExitStatus.usage
        }
        if rest.first == "--help" || rest.first == "-h" {
            stdout.line("usage: " + command.usage)
            return ExitStatus.success
        }
        var list = ArgumentList(rest, commandName: "providerfs \(name)")
        let json: Bool
        do { json = try list.flag("--json") } catch {
            stdout.error(error.message)
            return ExitStatus.usage
        }
        let io = CommandIO(json: json)
        do {
            return try await command.run(&list, io: io)
        } catch let error as UsageError {
            io.error(error.message)
            io.error("usage: " + command.usage)
            return ExitStatus.usage
        } catch let error as CommandFailure {
            io.error("providerfs \(name): \(error.message)")
            return error.status
        } catch {
            io.error("providerfs \(name): \(error)")
            return ExitStatus.failure
        }
    }

    static var helpText: String {
        var lines = ["usage: providerfs COMMAND [ARGS] [--json]", "", "commands:"]
        let width = CommandRegistry.commands.map { $0.name.count }.max() ?? 0
        for command in CommandRegistry.commands {
            lines.append(
                "  " + command.name.padding(toLength: width + 2, withPad: " ", startingAt: 0) + command.summary)
        }
        lines.append("")
        lines.append("Run 'providerfs COMMAND --help' for a command's usage. Exit status: 0 success, 1 failure,")
        lines.append("64 usage error, 75 coordination timeout.")
        return lines.joined(separator: "\n")
    }
}
