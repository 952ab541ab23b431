// Module ProviderCache: see docs/ARCHITECTURE.md.
