// Module ProviderModel: see docs/ARCHITECTURE.md.
