// The coordination protocol, version 4 (docs/COORDINATION-PROTOCOL.md; D-120, D-402, D-406): length-prefixed binary
// frames over a Unix stream socket. Hand-written encoding, because a claim round trip must stay in
// tens of microseconds and JSON costs more than that. The decoder trusts nothing: every length is
// bounded and checked, strings must be UTF-8, unknown types are errors.

import SystemSupport

/// Protocol constants.
package enum WireProtocol {
    /// The protocol version this build speaks.
    package static let version: UInt16 = 4
    /// "PFSC" — first field of `hello`, so a stray client is recognised at once.
    package static let magic: UInt32 = 0x5046_5343
    /// Largest frame payload accepted (bytes).
    package static let maximumFrame = 1 << 20
    /// Largest string accepted (bytes): a path is at most PATH_MAX; messages are sentences.
    package static let maximumString = 16 * 1024
    /// Largest array accepted (items, paths, held claims).
    package static let maximumCount = 4096
}

/// One claim of a `reclaim` message: a claim the client held under a server that died (D-402).
package struct ReclaimedClaim: Sendable, Equatable {
    /// The client's number for the claim (unchanged across servers).
    package var local: UInt64
    /// The claim's purpose identifier.
    package var purpose: String
    /// How long a presenter may take to answer (kept for the claim's later messages).
    package var presenterTimeout: UInt64
    /// Its items, as first submitted (moved items rewritten by the client).
    package var intents: [ClaimIntent]
    /// A reclaimed claim; see the properties.
    package init(local: UInt64, purpose: String, presenterTimeout: UInt64, intents: [ClaimIntent]) {
        self.local = local
        self.purpose = purpose
        self.presenterTimeout = presenterTimeout
        self.intents = intents
    }
}

/// Why bytes could not be decoded as a message.
package struct WireError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was wrong, as a sentence.
    package var message: String
    /// An error explained by `message`.
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// One message of the protocol.
package enum WireMessage: Sendable, Equatable {
    // Client → server.
    /// First message of a client.
    case hello(magic: UInt32, version: UInt16)
    /// A claim.
    case submit(
        local: UInt64, purpose: String, waitTimeout: UInt64, presenterTimeout: UInt64, held: [UInt64],
        intents: [ClaimIntent])
    /// End of a granted claim (or abandoning a waiting one).
    case release(local: UInt64)
    /// Stop waiting for a claim.
    case cancel(local: UInt64)
    /// Register a presenter.
    case addPresenter(
        local: UInt64, purpose: String, path: String, identity: ItemIdentity?, isDirectory: Bool,
        packageRoot: String?, methods: UInt32)
    /// Unregister a presenter.
    case removePresenter(local: UInt64)
    /// A presenter's answer to a message.
    case reply(messageID: UInt64, error: String?)
    /// `item(at:didMoveTo:)`.
    case itemMoved(from: String, to: String, purpose: String)
    /// Ask for the claim dump.
    case dumpRequest(requestID: UInt64)
    /// A version event.
    case versionChanged(path: String, change: UInt8, version: String, versionName: String)
    /// Version 3 (D-402): the claims connection `previousOwner` of the server with pid
    /// `previousServer` had granted, which died; the client still holds them. Each is answered
    /// with `granted` (re-established) or `failed(claimLost)`.
    case reclaim(previousServer: Int32, previousOwner: UInt64, claims: [ReclaimedClaim])
    /// Version 4 (D-406): the claims of this connection, held and to come, are for process `pid`
    /// (started at `startTime`, clock ticks since boot, as in /proc/PID/stat): the mount lets that
    /// process and its descendants through them. No answer.
    case holdFor(pid: Int32, startTime: UInt64)
    // Server → client.
    /// Answer to hello.
    case welcome(version: UInt16, serverPid: Int32, owner: UInt64)
    /// A claim is granted.
    case granted(local: UInt64, paths: [String])
    /// A claim will not be granted.
    case failed(local: UInt64, code: UInt16, message: String)
    /// A message for a presenter of this client.
    case deliver(presenter: UInt64, messageID: UInt64, message: PresenterMessage, claim: ClaimID?)
    /// The claim dump, as JSON.
    case dump(requestID: UInt64, json: String)
    /// Why the server drops this connection.
    case fatal(code: UInt16, message: String)

    var typeCode: UInt8 {
        switch self {
        case .hello: 1
        case .submit: 2
        case .release: 3
        case .cancel: 4
        case .addPresenter: 5
        case .removePresenter: 6
        case .reply: 7
        case .itemMoved: 8
        case .dumpRequest: 9
        case .versionChanged: 10
        case .reclaim: 11
        case .holdFor: 12
        case .welcome: 64
        case .granted: 65
        case .failed: 66
        case .deliver: 67
        case .dump: 68
        case .fatal: 69
        }
    }

    /// The frame: a 4-byte big-endian payload length, then the payload.
    package func frame() -> [UInt8] {
        var writer = WireWriter()
        writer.bytes.reserveCapacity(64)
        writer.u32(0)
        writer.u8(typeCode)
        switch self {
        case .hello(let magic, let version):
            writer.u32(magic)
            writer.u16(version)
        case .submit(let local, let purpose, let waitTimeout, let presenterTimeout, let held, let intents):
            writer.u64(local)
            writer.string(purpose)
            writer.u64(waitTimeout)
            writer.u64(presenterTimeout)
            writer.u32(UInt32(held.count))
            for id in held { writer.u64(id) }
            writer.u32(UInt32(intents.count))
            for intent in intents { writer.intent(intent) }
        case .release(let local), .cancel(let local), .removePresenter(let local):
            writer.u64(local)
        case .addPresenter(
            let local, let purpose, let path, let identity, let isDirectory, let packageRoot, let methods):
            writer.u64(local)
            writer.string(purpose)
            writer.string(path)
            writer.identity(identity)
            writer.bool(isDirectory)
            writer.optionalString(packageRoot)
            writer.u32(methods)
        case .reply(let messageID, let error):
            writer.u64(messageID)
            writer.optionalString(error)
        case .itemMoved(let from, let to, let purpose):
            writer.string(from)
            writer.string(to)
            writer.string(purpose)
        case .dumpRequest(let requestID):
            writer.u64(requestID)
        case .versionChanged(let path, let change, let version, let versionName):
            writer.string(path)
            writer.u8(change)
            writer.string(version)
            writer.string(versionName)
        case .reclaim(let server, let owner, let claims):
            writer.u32(UInt32(bitPattern: server))
            writer.u64(owner)
            writer.u32(UInt32(claims.count))
            for claim in claims {
                writer.u64(claim.local)
                writer.string(claim.purpose)
                writer.u64(claim.presenterTimeout)
                writer.u32(UInt32(claim.intents.count))
                for intent in claim.intents { writer.intent(intent) }
            }
        case .holdFor(let pid, let startTime):
            writer.u32(UInt32(bitPattern: pid))
            writer.u64(startTime)
        case .welcome(let version, let serverPid, let owner):
            writer.u16(version)
            writer.u32(UInt32(bitPattern: serverPid))
            writer.u64(owner)
        case .granted(let local, let paths):
            writer.u64(local)
            writer.u32(UInt32(paths.count))
            for path in paths { writer.string(path) }
        case .failed(let local, let code, let message):
            writer.u64(local)
            writer.u16(code)
            writer.string(message)
        case .deliver(let presenter, let messageID, let message, let claim):
            writer.u64(presenter)
            writer.u64(messageID)
            writer.presenterMessage(message)
            writer.bool(claim != nil)
            if let claim {
                writer.u64(claim.owner)
                writer.u64(claim.local)
            }
        case .dump(let requestID, let json):
            writer.u64(requestID)
            writer.string(json, limit: WireProtocol.maximumFrame - 64)
        case .fatal(let code, let message):
            writer.u16(code)
            writer.string(message)
        }
        let length = UInt32(writer.bytes.count - 4)
        writer.bytes[0] = UInt8(length >> 24)
        writer.bytes[1] = UInt8((length >> 16) & 0xff)
        writer.bytes[2] = UInt8((length >> 8) & 0xff)
        writer.bytes[3] = UInt8(length & 0xff)
        return writer.bytes
    }

    /// Decodes one payload (without the length prefix). Throws on anything malformed.
    package static func decode(_ payload: ArraySlice<UInt8>) throws(WireError) -> WireMessage {
        var reader = WireReader(bytes: payload)
        let type = try reader.u8()
        let message: WireMessage
        switch type {
        case 1: message = .hello(magic: try reader.u32(), version: try reader.u16())
        case 2:
            let local = try reader.u64()
            let purpose = try reader.string()
            let wait = try reader.u64()
            let presenter = try reader.u64()
            let heldCount = try reader.count()
            var held: [UInt64] = []
            for _ in 0..<heldCount { held.append(try reader.u64()) }
            let intentCount = try reader.count()
            var intents: [ClaimIntent] = []
            for _ in 0..<intentCount { intents.append(try reader.intent()) }
            message = .submit(
                local: local, purpose: purpose, waitTimeout: wait, presenterTimeout: presenter, held: held,
                intents: intents)
        case 3: message = .release(local: try reader.u64())
        case 4: message = .cancel(local: try reader.u64())
        case 5:
            message = .addPresenter(
                local: try reader.u64(), purpose: try reader.string(), path: try reader.path(),
                identity: try reader.identity(), isDirectory: try reader.bool(), packageRoot: try reader.optionalPath(),
                methods: try reader.u32())
        case 6: message = .removePresenter(local: try reader.u64())
        case 7: message = .reply(messageID: try reader.u64(), error: try reader.optionalString())
        case 8: message = .itemMoved(from: try reader.path(), to: try reader.path(), purpose: try reader.string())
        case 9: message = .dumpRequest(requestID: try reader.u64())
        case 10:
            let path = try reader.path()
            let change = try reader.u8()
            guard VersionChange(rawValue: change) != nil else { throw WireError("Unknown version change \(change).") }
            message = .versionChanged(
                path: path, change: change, version: try reader.path(), versionName: try reader.string())
        case 11:
            let server = Int32(bitPattern: try reader.u32())
            let owner = try reader.u64()
            let count = try reader.count()
            var claims: [ReclaimedClaim] = []
            for _ in 0..<count {
                let local = try reader.u64()
                let purpose = try reader.string()
                let presenterTimeout = try reader.u64()
                let intentCount = try reader.count()
                var intents: [ClaimIntent] = []
                for _ in 0..<intentCount { intents.append(try reader.intent()) }
                claims.append(
                    ReclaimedClaim(local: local, purpose: purpose, presenterTimeout: presenterTimeout, intents: intents)
                )
            }
            message = .reclaim(previousServer: server, previousOwner: owner, claims: claims)
        case 12: message = .holdFor(pid: Int32(bitPattern: try reader.u32()), startTime: try reader.u64())
        case 64:
            message = .welcome(
                version: try reader.u16(), serverPid: Int32(bitPattern: try reader.u32()), owner: try reader.u64())
        case 65:
            let local = try reader.u64()
            let count = try reader.count()
            var paths: [String] = []
            for _ in 0..<count { paths.append(try reader.path()) }
            message = .granted(local: local, paths: paths)
        case 66: message = .failed(local: try reader.u64(), code: try reader.u16(), message: try reader.string())
        case 67:
            let presenter = try reader.u64()
            let messageID = try reader.u64()
            let body = try reader.presenterMessage()
            let claim = try reader.bool() ? ClaimID(owner: try reader.u64(), local: try reader.u64()) : nil
            message = .deliver(presenter: presenter, messageID: messageID, message: body, claim: claim)
        case 68:
            message = .dump(requestID: try reader.u64(), json: try reader.string(limit: WireProtocol.maximumFrame))
        case 69: message = .fatal(code: try reader.u16(), message: try reader.string())
        default: throw WireError("Unknown message type \(type).")
        }
        guard reader.isAtEnd else { throw WireError("Message type \(type) has \(reader.remaining) trailing bytes.") }
        return message
    }
}

/// Splits a byte stream into frames.
package struct FrameBuffer: Sendable {
    private var bytes: [UInt8] = []
    private var start = 0

    /// An empty buffer.
    package init() {}

    /// Appends received bytes.
    package mutating func append(_ data: UnsafeRawBufferPointer) {
        if start > 0 && start == bytes.count {
            bytes.removeAll(keepingCapacity: true)
            start = 0
        }
        bytes.append(contentsOf: data)
    }

    /// The next complete payload, nil when more bytes are needed; throws on an oversized frame.
    package mutating func next() throws(WireError) -> ArraySlice<UInt8>? {
        guard bytes.count - start >= 4 else { return nil }
        let length =
            Int(bytes[start]) << 24 | Int(bytes[start + 1]) << 16 | Int(bytes[start + 2]) << 8 | Int(bytes[start + 3])
        guard length >= 1, length <= WireProtocol.maximumFrame else {
            throw WireError("Frame length \(length) is out of range.")
        }
        guard bytes.count - start >= 4 + length else { return nil }
        let payload = bytes[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        if start > 1 << 16 {
            bytes.removeSubrange(0..<start)
            start = 0
            return ArraySlice(Array(payload))
        }
        return payload
    }

    /// Bytes received but not yet returned as frames.
    package var pendingCount: Int { bytes.count - start }
}

struct WireWriter {
    var bytes: [UInt8] = []
    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u16(_ value: UInt16) {
        bytes.append(UInt8(value >> 8))
        bytes.append(UInt8(value & 0xff))
    }
    mutating func u32(_ value: UInt32) {
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8((value >> UInt32(shift)) & 0xff)) }
    }
    mutating func u64(_ value: UInt64) {
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((value >> UInt64(shift)) & 0xff)) }
    }
    mutating func bool(_ value: Bool) { bytes.append(value ? 1 : 0) }
    mutating func string(_ value: String, limit: Int = WireProtocol.maximumString) {
        var utf8 = Array(value.utf8)
        if utf8.count > limit { utf8 = Array(utf8.prefix(limit)) }
        u32(UInt32(utf8.count))
        bytes += utf8
    }
    mutating func optionalString(_ value: String?) {
        bool(value != nil)
        if let value { string(value) }
    }
    mutating func identity(_ value: ItemIdentity?) {
        bool(value != nil)
        if let value {
            u64(value.device)
            u64(value.inode)
        }
    }
    mutating func intent(_ intent: ClaimIntent) {
        u8(intent.kind.rawValue)
        u32(intent.readingOptions.rawValue)
        u32(intent.writingOptions.rawValue)
        string(intent.path)
        identity(intent.identity)
        bool(intent.isDirectory)
        optionalString(intent.packageRoot)
    }
    mutating func presenterMessage(_ message: PresenterMessage) {
        switch message {
        case .relinquishToReader: u8(0)
        case .relinquishToWriter: u8(1)
        case .savePresentedItemChanges: u8(2)
        case .accommodateDeletion: u8(3)
        case .accommodateSubitemDeletion(let path):
            u8(4)
            string(path)
        case .reacquire: u8(5)
        case .didChange: u8(6)
        case .subitemDidChange(let path):
            u8(7)
            string(path)
        case .didMove(let path):
            u8(8)
            string(path)
        case .subitemDidMove(let from, let to):
            u8(9)
            string(from)
            string(to)
        case .versionChanged(let change, let item, let version, let versionName):
            u8(10)
            u8(change.rawValue)
            string(item)
            string(version)
            string(versionName)
        case .accommodateEviction: u8(11)
        }
    }
}

struct WireReader {
    let bytes: ArraySlice<UInt8>
    var offset: Int

    init(bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        offset = bytes.startIndex
    }

    var isAtEnd: Bool { offset == bytes.endIndex }
    var remaining: Int { bytes.endIndex - offset }

    mutating func take(_ count: Int) throws(WireError) -> ArraySlice<UInt8> {
        guard count >= 0, remaining >= count else { throw WireError("The message is truncated.") }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }
    mutating func u8() throws(WireError) -> UInt8 { try take(1).first! }
    mutating func u16() throws(WireError) -> UInt16 {
        try take(2).reduce(0) { $0 << 8 | UInt16($1) }
    }
    mutating func u32() throws(WireError) -> UInt32 {
        try take(4).reduce(0) { $0 << 8 | UInt32($1) }
    }
    mutating func u64() throws(WireError) -> UInt64 {
        try take(8).reduce(0) { $0 << 8 | UInt64($1) }
    }
    mutating func bool() throws(WireError) -> Bool {
        switch try u8() {
        case 0: return false
        case 1: return true
        case let other: throw WireError("\(other) is not a boolean.")
        }
    }
    mutating func count() throws(WireError) -> Int {
        let count = Int(try u32())
        guard count <= WireProtocol.maximumCount else { throw WireError("Count \(count) is too large.") }
        return count
    }
    mutating func string(limit: Int = WireProtocol.maximumString) throws(WireError) -> String {
        let length = Int(try u32())
        guard length <= limit else { throw WireError("A string of \(length) bytes is too long.") }
        let utf8 = try take(length)
        guard let text = String(validating: utf8, as: UTF8.self) else { throw WireError("A string is not UTF-8.") }
        return text
    }
    /// An absolute path without NUL bytes.
    mutating func path() throws(WireError) -> String {
        let text = try string()
        guard text.hasPrefix("/"), !text.utf8.contains(0) else { throw WireError("'\(text)' is not an absolute path.") }
        return text
    }
    mutating func optionalString() throws(WireError) -> String? { try bool() ? try string() : nil }
    mutating func optionalPath() throws(WireError) -> String? { try bool() ? try path() : nil }
    mutating func identity() throws(WireError) -> ItemIdentity? {
        try bool() ? ItemIdentity(device: try u64(), inode: try u64()) : nil
    }
    mutating func intent() throws(WireError) -> ClaimIntent {
        guard let kind = AccessKind(rawValue: try u8()) else { throw WireError("Unknown access kind.") }
        let reading = ReadingOptions(rawValue: try u32())
        let writing = WritingOptions(rawValue: try u32())
        guard ReadingOptions.known.isSuperset(of: reading), WritingOptions.known.isSuperset(of: writing)
        else { throw WireError("Unknown option bits.") }
        return ClaimIntent(
            kind: kind, path: try path(), readingOptions: reading, writingOptions: writing, identity: try identity(),
            isDirectory: try bool(), packageRoot: try optionalPath())
    }
    mutating func presenterMessage() throws(WireError) -> PresenterMessage {
        switch try u8() {
        case 0: return .relinquishToReader
        case 1: return .relinquishToWriter
        case 2: return .savePresentedItemChanges
        case 3: return .accommodateDeletion
        case 4: return .accommodateSubitemDeletion(at: try path())
        case 5: return .reacquire
        case 6: return .didChange
        case 7: return .subitemDidChange(at: try path())
        case 8: return .didMove(to: try path())
        case 9: return .subitemDidMove(from: try path(), to: try path())
        case 10:
            guard let change = VersionChange(rawValue: try u8()) else { throw WireError("Unknown version change.") }
            return .versionChanged(change: change, item: try path(), version: try path(), versionName: try string())
        case 11: return .accommodateEviction
        case let other: throw WireError("Unknown presenter message \(other).")
        }
    }
}
