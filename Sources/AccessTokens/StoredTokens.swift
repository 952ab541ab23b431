// The legacy token file's contents (the mount's tag and salt, and every remembered token as a
// hash), and the shape of one token as the store keeps it: `Token` is also each row's JSON in
// tokens.db (D-335), so a field added here is stored without a schema change.

import Foundation

/// `tokens.json` (before D-335; read once to migrate): `{"version": 1, "mountTag": …, "salt":
/// hex, "tokens": [ … ]}`.
struct StoredTokens: Codable {
    static let formatVersion = 1

    struct Token: Codable {
        var id: String
        var hash: String
        var identifier: String
        var path: String
        var mode: TokenMode
        var grantedAt: Date
        /// Monotonic time left when the file (the row) was written.
        var remainingNanoseconds: Int64?
        /// The wall-clock deadline when the file (the row) was written (write time + remaining).
        var wallDeadline: Date?
        /// tokens.db only: the deadline on the store's timeline (D-336), which continues across
        /// restarts; nil in tokens.json and without a TTL.
        var deadlineNanoseconds: Int64?
        var boundPID: Int32?
        var boundStartTime: UInt64?
        var usesLeft: Int?
        var lastUse: Date?
        var state: TokenState
        var endedAt: Date?
        /// A derived token's parent (absent in files written before derived tokens).
        var parentID: String?
    }

    var version: Int
    var mountTag: String
    var salt: String
    var tokens: [Token]
}
