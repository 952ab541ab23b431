// The claim dump (`providerfs claims`): every held and waiting claim with item, kind, pid and age,
// the registered presenters, and the recent events (missed presenter deadlines…).

import Foundation

/// A snapshot of a coordination server, as JSON on the wire and for `providerfs claims --json`.
public struct CoordinationDump: Codable, Sendable, Equatable {
    /// One claim.
    public struct Claim: Codable, Sendable, Equatable {
        /// "held", "waiting" or "messaging".
        public var state: String
        /// "owner.local".
        public var id: String
        /// The process the claim is for.
        public var pid: Int32
        /// The claim's purpose identifier.
        public var purpose: String
        /// One entry per item: path and kind ("write(deleting)").
        public var items: [Item]
        /// Milliseconds since the claim was requested.
        public var ageMilliseconds: Double
        /// Missed presenter deadlines and other events of this claim.
        public var events: [String]
    }
    /// One item of a claim.
    public struct Item: Codable, Sendable, Equatable {
        /// Canonical path.
        public var path: String
        /// "read", "write(deleting)"…
        public var kind: String
    }
    /// One presenter.
    public struct Presenter: Codable, Sendable, Equatable {
        /// "owner.local".
        public var id: String
        /// The presenting process.
        public var pid: Int32
        /// Canonical path of the presented item.
        public var path: String
    }
    /// One recent event.
    public struct Event: Codable, Sendable, Equatable {
        /// Milliseconds since the event.
        public var ageMilliseconds: Double
        /// The claim concerned, if any.
        public var claim: String?
        /// What happened.
        public var text: String
    }

    /// The server's pid.
    public var serverPid: Int32
    /// Held and waiting claims, oldest first.
    public var claims: [Claim]
    /// Registered presenters.
    public var presenters: [Presenter]
    /// The last events (at most 100).
    public var events: [Event]

    /// A dump; see the properties.
    public init(serverPid: Int32, claims: [Claim], presenters: [Presenter], events: [Event]) {
        self.serverPid = serverPid
        self.claims = claims
        self.presenters = presenters
        self.events = events
    }

    /// The dump of `host`, with `redact` applied to every path and event text (a mount hides the
    /// tokens of access paths, D-318).
    static func make(host: ArbiterHost, redact: @Sendable (String) -> String = { $0 }) -> CoordinationDump {
        let (claims, presenters, events, now) = host.dump()
        return CoordinationDump(
            serverPid: getpid(),
            claims: claims.map { claim in
                Claim(
                    state: claim.state, id: claim.id.description, pid: claim.pid, purpose: claim.purpose,
                    items: claim.intents.map { Item(path: redact($0.path), kind: $0.kindDescription) },
                    ageMilliseconds: Double(claim.age) / 1e6, events: claim.events.map(redact))
            },
            presenters: presenters.map { Presenter(id: $0.id.description, pid: $0.pid, path: redact($0.path)) },
            events: events.map {
                Event(
                    ageMilliseconds: Double(now >= $0.time ? now - $0.time : 0) / 1e6, claim: $0.claim?.description,
                    text: redact($0.text))
            })
    }

    func json() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(self) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    /// Decodes the JSON text of a dump.
    public static func decode(_ json: String) throws -> CoordinationDump {
        try JSONDecoder().decode(CoordinationDump.self, from: Data(json.utf8))
    }
}
