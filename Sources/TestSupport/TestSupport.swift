// Module TestSupport: see docs/ARCHITECTURE.md.
