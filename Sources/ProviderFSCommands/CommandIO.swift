import Foundation

/// Output helpers shared by all commands: one clear sentence on stderr for errors, JSON with
/// `--json`. Writes go straight to the file descriptors so lines from threads do not interleave.
public struct CommandIO: Sendable {
    public var json: Bool

    public init(json: Bool) { self.json = json }

    public func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    public func error(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }

    /// Writes one JSON document (sorted keys) on one line.
    public func emit<T: Encodable>(_ value: T) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        guard let data = try? encoder.encode(value) else { return }
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

/// One `--json` line of a command that speaks to several mounts (`fault list`, `token list`): the
/// value's own fields, plus `mountpoint`.
struct OnMount<Value: Encodable>: Encodable {
    var mountpoint: String
    var value: Value

    enum Keys: String, CodingKey { case mountpoint }

    func encode(to encoder: any Encoder) throws {
        try value.encode(to: encoder)
        var container = encoder.container(keyedBy: Keys.self)
        try container.encode(mountpoint, forKey: .mountpoint)
    }
}
