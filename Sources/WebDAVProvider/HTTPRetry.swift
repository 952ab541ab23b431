// Retries of WebDAV requests (issue 26, D-452): a server that answers 502, 503, 504 or 429, or a
// connection that could not be made, is asked again after a backoff, while the request's deadline
// allows. The rule is pure (`HTTPRetry.delay`); `HTTPTransport.send` applies it.

import Foundation

/// When to ask a server again.
public struct HTTPRetry: Sendable, Equatable {
    /// Retries after the first attempt.
    public var attempts = 3
    /// The first backoff; each next one is `factor` times longer.
    public var initialDelay: Duration = .milliseconds(100)
    public var factor = 3
    /// The longest wait, a server's Retry-After included.
    public var maximumDelay: Duration = .seconds(5)

    public init(
        attempts: Int = 3, initialDelay: Duration = .milliseconds(100), factor: Int = 3,
        maximumDelay: Duration = .seconds(5)
    ) {
        self.attempts = attempts
        self.initialDelay = initialDelay
        self.factor = factor
        self.maximumDelay = maximumDelay
    }

    /// Never again (tests of the first answer).
    public static let never = HTTPRetry(attempts: 0)

    /// Methods a second copy of which changes nothing more than the first (RFC 9110 §9.2.2), so
    /// they are asked again also when the first may have reached the server.
    public static let idempotent: Set<String> = ["GET", "HEAD", "OPTIONS", "PROPFIND", "PUT", "DELETE"]

    /// What the server said, or how the request failed.
    public enum Outcome: Equatable, Sendable {
        /// A response with this status and Retry-After header.
        case status(Int, retryAfter: String?)
        /// No connection was made: the server did not see the request.
        case notConnected
        /// The connection broke before an answer: the server may have acted on it.
        case noAnswer
        /// Anything else (a deadline, a transfer broken midway, a refusal of ours).
        case other
    }

    /// The wait before attempt `attempt + 1` (`attempt` counts from 1), or nil: answer with the
    /// outcome. 502/503/504/429 mean the server did not act on the request (a busy or restarting
    /// server, a proxy without its backend), so every method is asked again; a request that got
    /// no answer is asked again only when idempotent.
    public func delay(after attempt: Int, method: String, outcome: Outcome) -> Duration? {
        guard attempt <= attempts else { return nil }
        var wait = initialDelay
        for _ in 1..<attempt { wait = min(maximumDelay, wait * factor) }
        switch outcome {
        case .status(let status, let retryAfter):
            guard [429, 502, 503, 504].contains(status) else { return nil }
            // Retry-After in seconds: not sooner (an HTTP date is treated as our own backoff).
            if let retryAfter, let seconds = Int(retryAfter.trimmingCharacters(in: .whitespaces)), seconds >= 0 {
                wait = min(maximumDelay, max(wait, .seconds(seconds)))
            }
            return wait
        case .notConnected:
            // Once, soon: a server that is down should read as unreachable within moments.
            return attempt == 1 ? initialDelay : nil
        case .noAnswer:
            return Self.idempotent.contains(method) ? wait : nil
        case .other:
            return nil
        }
    }
}
