// The control protocol's wire layer (docs/CONTROL.md): framing, the envelope, errors. Shared by
// the CLI and the daemon (ProviderFSCommands, which adds the typed requests) and by apps
// (ScopedAccess), without anything of the file system.
//
// A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON, one object:
//   request:  {"version": 1, "id": 7, "request": "download", "arguments": {"path": "a/b.bin"}}
//   response: {"version": 1, "id": 7, "ok": {…}}
//          or {"version": 1, "id": 7, "error": {"code": "notFound", "message": "…"}}
// Every request gets exactly one response with its id (null when the request had none or could
// not be read far enough to find it). Parsing never traps: bad input becomes a `ControlError`.

import Foundation

package enum ControlProtocol {
    /// The protocol version this build speaks; a request with another version is refused.
    package static let version = 1
    /// The largest frame payload either side accepts (a larger length prefix closes the connection).
    package static let maximumMessageSize = 1 << 20

    /// `payload` behind its 4-byte big-endian length.
    package static func frame(_ payload: [UInt8]) -> [UInt8] {
        let length = UInt32(payload.count)
        return [UInt8(length >> 24), UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF)]
            + payload
    }

    /// A request frame: `{"version":1,"id":…,"request":kind,"arguments":{…}}`.
    package static func requestFrame(id: Int64, kind: String, arguments: [String: Any]) -> [UInt8] {
        let object: [String: Any] = ["version": version, "id": id, "request": kind, "arguments": arguments]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return frame(Array(data))
    }

    /// A response frame: `{"version":1,"id":…,"ok":<payload>}` or the error form.
    package static func responseFrame(id: Int64?, _ result: Result<[UInt8], ControlError>) -> [UInt8] {
        var text = Array("{\"version\":\(version),\"id\":\(id.map(String.init) ?? "null"),".utf8)
        switch result {
        case .success(let payload):
            text += Array("\"ok\":".utf8) + payload
        case .failure(let error):
            let body: [String: Any] = ["code": error.code.rawValue, "message": error.message]
            let data = (try? JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])) ?? Data("{}".utf8)
            text += Array("\"error\":".utf8) + Array(data)
        }
        text.append(UInt8(ascii: "}"))
        return frame(text)
    }

    /// JSON of an `ok` payload.
    package static func encode<T: Encodable>(_ value: T) -> Result<[UInt8], ControlError> {
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            return .success(Array(try encoder.encode(value)))
        } catch {
            return .failure(ControlError(.failed, "cannot encode the reply: \(error)"))
        }
    }

    /// Reads one request's envelope: its kind and arguments. The id is returned whenever it could
    /// be read, so that an error reply names the request it answers.
    package static func parseEnvelope(
        _ payload: [UInt8]
    ) -> (id: Int64?, envelope: Result<(kind: String, arguments: [String: Any]), ControlError>) {
        guard let object = jsonObject(payload) else {
            return (nil, .failure(ControlError(.malformed, "the message is not a JSON object")))
        }
        var id: Int64?
        if let rawID = object["id"], !(rawID is NSNull) {
            guard let number = integer(rawID) else {
                return (nil, .failure(ControlError(.malformed, "\"id\" must be an integer")))
            }
            id = number
        }
        guard let rawVersion = object["version"], let version = integer(rawVersion) else {
            return (id, .failure(ControlError(.malformed, "\"version\" must be an integer")))
        }
        guard version == Self.version else {
            return (
                id,
                .failure(
                    ControlError(
                        .unsupportedVersion,
                        "protocol version \(version) is not supported; this daemon speaks \(Self.version)"))
            )
        }
        guard let kind = object["request"] as? String else {
            return (id, .failure(ControlError(.malformed, "\"request\" must be a string")))
        }
        let arguments: [String: Any]
        switch object["arguments"] {
        case nil, is NSNull: arguments = [:]
        case let dictionary as [String: Any]: arguments = dictionary
        default: return (id, .failure(ControlError(.invalidArguments, "\"arguments\" must be an object")))
        }
        return (id, .success((kind, arguments)))
    }

    /// Reads one response payload: its id and either the `ok` value (as JSON bytes) or the error.
    package static func parseResponse(_ payload: [UInt8]) -> (id: Int64?, result: Result<[UInt8], ControlError>) {
        guard let object = jsonObject(payload) else {
            return (nil, .failure(ControlError(.malformed, "the daemon's reply is not a JSON object")))
        }
        let id = object["id"].flatMap(integer)
        guard let version = object["version"].flatMap(integer), version == Self.version else {
            return (id, .failure(ControlError(.unsupportedVersion, "the daemon speaks another protocol version")))
        }
        if let error = object["error"] as? [String: Any] {
            let code = (error["code"] as? String).flatMap(ControlError.Code.init(rawValue:)) ?? .failed
            return (id, .failure(ControlError(code, error["message"] as? String ?? "no message")))
        }
        guard let ok = object["ok"], let data = try? JSONSerialization.data(withJSONObject: ok, options: []) else {
            return (id, .failure(ControlError(.malformed, "the daemon's reply has neither \"ok\" nor \"error\"")))
        }
        return (id, .success(Array(data)))
    }

    /// Why a reply gave no `Reply`: the daemon's error (or a reply that is not one), or an `ok`
    /// value this version cannot read.
    package enum ReplyFailure: Error {
        case control(ControlError)
        case unreadable(String)
    }

    /// Reads one response payload: its id and either the `ok` value decoded as `Reply` or the
    /// error. One pass of JSONDecoder over the payload: the `ok` value is never re-encoded (a
    /// 10,000-token list took 2 s through `parseResponse(_:)`'s JSONSerialization and back, D-338).
    package static func parseResponse<Reply: Decodable>(
        _ payload: [UInt8], as type: Reply.Type
    ) -> (id: Int64?, result: Result<Reply, ReplyFailure>) {
        guard let envelope = try? JSONDecoder().decode(ResponseEnvelope<Reply>.self, from: Data(payload)) else {
            return (nil, .failure(.control(ControlError(.malformed, "the daemon's reply is not a JSON object"))))
        }
        let id = envelope.id
        guard envelope.version == Self.version else {
            return (
                id, .failure(.control(ControlError(.unsupportedVersion, "the daemon speaks another protocol version")))
            )
        }
        if let error = envelope.error {
            let code = error.code.flatMap(ControlError.Code.init(rawValue:)) ?? .failed
            return (id, .failure(.control(ControlError(code, error.message ?? "no message"))))
        }
        switch envelope.ok {
        case .success(let reply)?: return (id, .success(reply))
        case .failure(let error)?: return (id, .failure(.unreadable("\(error)")))
        case nil:
            return (
                id,
                .failure(.control(ControlError(.malformed, "the daemon's reply has neither \"ok\" nor \"error\"")))
            )
        }
    }

    /// `{"version", "id", "ok" | "error"}`, the `ok` value decoded as `Reply` (its failure kept
    /// apart from the envelope's: a reply this version cannot read is not a malformed message).
    private struct ResponseEnvelope<Reply: Decodable>: Decodable {
        var version: Int?
        var id: Int64?
        var error: ErrorBody?
        var ok: Result<Reply, any Error>?

        struct ErrorBody: Decodable {
            var code: String?
            var message: String?
        }

        enum Keys: String, CodingKey { case version, id, ok, error }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: Keys.self)
            version = try? container.decodeIfPresent(Int.self, forKey: .version)
            id = try? container.decodeIfPresent(Int64.self, forKey: .id)
            error = try? container.decodeIfPresent(ErrorBody.self, forKey: .error)
            if container.contains(.ok), !((try? container.decodeNil(forKey: .ok)) ?? false) {
                do { ok = .success(try container.decode(Reply.self, forKey: .ok)) } catch { ok = .failure(error) }
            }
        }
    }

    private static func jsonObject(_ payload: [UInt8]) -> [String: Any]? {
        guard !payload.isEmpty else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(payload), options: [])) as? [String: Any]
    }

    /// An integral JSON number (not a boolean, not a fraction), as Int64.
    package static func integer(_ value: Any) -> Int64? {
        // Foundation on Linux reads `true` as an NSNumber subclass (__NSCFBoolean), which also
        // bridges to Int: tell it apart by its type.
        guard let number = value as? NSNumber, !String(describing: type(of: value)).contains("Boolean") else {
            return nil
        }
        let double = number.doubleValue
        guard double.isFinite, double == double.rounded(), abs(double) < 9.0e15 else { return nil }
        return number.int64Value
    }
}

/// Splits a byte stream into frame payloads. A length above `maximumMessageSize` is an error
/// (the stream cannot be resynchronized after it: the connection is closed).
package struct ControlFrameReader {
    package private(set) var buffer: [UInt8] = []
    private var start = 0
    package let maximumMessageSize: Int

    package init(maximumMessageSize: Int = ControlProtocol.maximumMessageSize) {
        self.maximumMessageSize = maximumMessageSize
    }

    /// Bytes received and not yet returned as a payload (a frame is partly here).
    package var pendingByteCount: Int { buffer.count - start }

    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    package mutating func append(_ bytes: [UInt8]) { bytes.withUnsafeBytes { append($0) } }

    /// The next complete payload, nil when more bytes are needed.
    package mutating func next() throws(ControlError) -> [UInt8]? {
        guard buffer.count - start >= 4 else { return nil }
        let length =
            Int(buffer[start]) << 24 | Int(buffer[start + 1]) << 16 | Int(buffer[start + 2]) << 8
            | Int(buffer[start + 3])
        guard length <= maximumMessageSize else {
            throw ControlError(.tooLarge, "a message of \(length) bytes is over the limit of \(maximumMessageSize)")
        }
        guard buffer.count - start - 4 >= length else { return nil }
        let payload = Array(buffer[(start + 4)..<(start + 4 + length)])
        start += 4 + length
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 64 * 1024 {
            buffer.removeFirst(start)
            start = 0
        }
        return payload
    }
}

/// What a control request or the connection carrying it failed with. The code is part of the
/// protocol (docs/CONTROL.md); the message is one sentence for a person.
package struct ControlError: Error, Sendable, Equatable, CustomStringConvertible {
    package enum Code: String, Sendable, CaseIterable {
        /// Not a JSON object, or a field of the envelope has the wrong type.
        case malformed
        /// The connection ended (or went silent past the read deadline) inside a frame.
        case truncated
        /// The length prefix is over `maximumMessageSize`.
        case tooLarge
        case unsupportedVersion
        case unknownRequest
        /// A missing argument, or one of the wrong type.
        case invalidArguments
        /// The peer is not the daemon's user (SO_PEERCRED).
        case permissionDenied
        /// Too many connections at once.
        case busy
        /// No request arrived within the idle timeout.
        case timedOut
        case notFound
        /// The request needs a file and the path names something else.
        case notAFile
        /// The token presented gives no access (expired, revoked, unknown…: the message says).
        case accessDenied
        /// The request was valid and the daemon could not do it.
        case failed
        /// Client side only, never sent: the socket could not be reached, or the connection ended
        /// before a reply.
        case unavailable
    }

    package var code: Code
    package var message: String

    package init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    package var description: String { "\(code.rawValue): \(message)" }
}
