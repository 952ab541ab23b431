/// Every `providerfs` command, in the order `providerfs --help` lists them.
/// Add one line per command (one file per command beside this one).
enum CommandRegistry {
    static let commands: [any CLICommand.Type] = [
        MountCommand.self,
        UnmountCommand.self,
        StatusCommand.self,
        DownloadCommand.self,
        EvictCommand.self,
        PinCommand.self,
        UnpinCommand.self,
        RefreshCommand.self,
        FaultCommand.self,
        TokenCommand.self,
        CoordinateCommand.self,
        PresentCommand.self,
        ClaimsCommand.self,
        CoordinatorCommand.self,
        VersionCommand.self,
    ]
}
