// Module FUSEAdapter: see docs/ARCHITECTURE.md.
