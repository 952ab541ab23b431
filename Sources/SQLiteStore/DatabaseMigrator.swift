/// Named, append-only schema migrations, applied in order and recorded in the
/// `schema_migrations` table.
///
/// Rules (docs/DECISIONS.md D-157):
/// - Never edit, rename, remove or reorder a registered migration once it has shipped; add a new
///   one at the end. The recorded names must be a prefix of the registered list, otherwise
///   opening fails with `.migrationMismatch` and nothing is changed.
/// - A database that records names this build does not know was written by a newer ProviderFS:
///   opening fails with `.newerSchema` and nothing is changed.
/// - Each migration runs in its own write transaction together with its record, so a crash
///   leaves it either fully applied and recorded, or not at all.
///
/// ```swift
/// var migrator = DatabaseMigrator()
/// migrator.registerMigration("create items") { db in
///     try db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
/// }
/// let store = try DatabaseQueue(path: path, migrator: migrator)
/// ```
public struct DatabaseMigrator: Sendable {
    /// One registered migration.
    struct Migration: Sendable {
        let name: String
        let migrate: @Sendable (Database) throws -> Void
    }

    private(set) var migrations: [Migration] = []

    /// An empty migrator.
    public init() {}

    /// The registered names, in order.
    public var migrationNames: [String] { migrations.map(\.name) }

    /// Appends a migration. Traps on a duplicate name (a programming mistake).
    public mutating func registerMigration(_ name: String, _ migrate: @escaping @Sendable (Database) throws -> Void) {
        precondition(
            !migrations.contains { $0.name == name }, "SQLiteStore: migration '\(name)' is registered twice")
        migrations.append(Migration(name: name, migrate: migrate))
    }

    /// A migrator holding only the first `count` migrations (to test step-by-step upgrades).
    public func prefix(_ count: Int) -> DatabaseMigrator {
        var copy = self
        copy.migrations = Array(migrations.prefix(count))
        return copy
    }

    /// The table that records applied migrations.
    static let tableName = "schema_migrations"

    /// Checks the recorded migrations against this list without changing anything, and returns
    /// the migrations still to apply.
    func pendingMigrations(recorded: [String], path: String) throws -> [Migration] {
        let known = Set(migrationNames)
        let unknown = recorded.filter { !known.contains($0) }
        if !unknown.isEmpty {
            throw DatabaseError(
                code: .newerSchema,
                message:
                    "the database was written by a newer version of ProviderFS: it records migrations this build "
                    + "does not know (\(unknown.joined(separator: ", "))). Nothing was changed. Use the newer "
                    + "ProviderFS, or move the database aside to start with a fresh one.",
                path: path)
        }
        let expectedPrefix = Array(migrationNames.prefix(recorded.count))
        if expectedPrefix != recorded {
            throw DatabaseError(
                code: .migrationMismatch,
                message:
                    "the recorded migrations (\(recorded.joined(separator: ", "))) are not a prefix of this build's "
                    + "list (\(migrationNames.joined(separator: ", "))): a migration was inserted, renamed or "
                    + "reordered. Nothing was changed. This is a ProviderFS bug; please report it.",
                path: path)
        }
        return Array(migrations.dropFirst(recorded.count))
    }
}
