// Module SQLiteStore: ProviderFS's metadata database, thread-safe by construction.
//
// The shape is GRDB's, trimmed to what ProviderFS needs (docs/ARCHITECTURE.md, "SQLiteStore"):
// - `Database` is one SQLite connection. It is deliberately not Sendable and traps when used
//   outside the `read`/`write` closure that handed it out.
// - `DatabaseQueue` is the one owner of a database file: a writer connection on its own serial
//   dispatch queue plus a pool of read-only WAL connections. Work enters only through
//   `read { db in … }` and `write { db in … }`, synchronously (FUSE threads) or with `await` (tasks).
// - Records are plain Sendable values (`FetchableRecord` / `PersistableRecord`); mutation happens
//   only inside `write`, so there is no setter to protect and nothing to re-dispatch.
// - `DatabaseMigrator` applies named, append-only migrations recorded in `schema_migrations`.
// - Observers learn which tables a committed write transaction changed.
//
// This is the only module that imports CSQLite3.
