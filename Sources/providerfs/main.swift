import ProviderFSCommands

#if canImport(Glibc)
import Glibc
#endif

exit(await ProviderFSCLI.main(CommandLine.arguments))
