// Module FileCoordination: see docs/ARCHITECTURE.md.
