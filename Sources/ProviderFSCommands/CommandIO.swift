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
        emitLines([value])
    }

    /// Writes one JSON document per value, a line each, with one encoder and in large writes
    /// (10,000 lines took one encoder and one write each before, D-338).
    public func emitLines<T: Encodable>(_ values: [T]) {
        let encoder = Self.lineEncoder()
        var buffer = Data()
        for value in values {
            guard let data = try? encoder.encode(value) else { continue }
            buffer.append(data)
            buffer.append(0x0A)
            if buffer.count >= 1 << 20 {
                FileHandle.standardOutput.write(buffer)
                buffer.removeAll(keepingCapacity: true)
            }
        }
        if !buffer.isEmpty { FileHandle.standardOutput.write(buffer) }
    }

    static func lineEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
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
