// Module SQLiteStore: see docs/ARCHITECTURE.md.
