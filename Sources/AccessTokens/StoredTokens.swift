// The token file's contents: the mount's tag and salt, and every remembered token as a hash.

import Foundation

/// `tokens.json`: `{"version": 1, "mountTag": …, "salt": hex, "tokens": [ … ]}`.
struct StoredTokens: Codable {
    static let formatVersion = 1

    struct Token: Codable {
        var id: String
        var hash: String
        var identifier: String
        var path: String
        var mode: TokenMode
        var grantedAt: Date
        /// Monotonic time left when the file was written.
        var remainingNanoseconds: Int64?
        /// The wall-clock deadline when the file was written (write time + remaining).
        var wallDeadline: Date?
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
