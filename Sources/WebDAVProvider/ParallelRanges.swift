// One large fetch as ranged GETs of consecutive parts, up to `parallelRanges` of them at once,
// handed over in order (D-513). The first part's GET is started and judged before the stream is
// returned (its status, its version), and the parts after it start only once its first chunk was
// handed over: time to first byte is one GET's, with nothing else on the link or the CPU. Each part is a `WebDAVContentStream` of its own: its own If-Match and version check, its
// own stall deadline, its own bounded queue (so memory stays within `parallelRanges` queues). The
// reader takes the parts in order; a part that fails throws when the reader reaches it (the bytes
// before it were delivered), and a part that ends short ends the whole stream there (the caller
// sees the short count: no byte is ever placed after a gap). A server that ignores Range answers
// the first part with the whole file: that one stream delivers the whole fetch (no more GETs).

import ProviderModel
import SystemSupport

/// One part's GET: started on a task of its own, closed from any thread.
final class RangePart: Sendable {
    let range: Range<Int64>
    /// The current attempt's stream (a retry makes a new one), and whether the part was closed.
    private let attempt = Locked<(stream: WebDAVContentStream?, closed: Bool)>((nil, false))
    private let started = Locked<Task<WebDAVContentStream, any Error>?>(nil)

    init(range: Range<Int64>) { self.range = range }

    /// Starts the part's GET (`open` calls `adopt` with each attempt's stream).
    func begin(_ open: @escaping @Sendable (RangePart) async throws -> WebDAVContentStream) {
        let task = Task { try await open(self) }
        started.withLock { $0 = task }
    }

    /// A part whose GET was already started (the first: `fetchContents` waited for its status).
    func begin(with stream: WebDAVContentStream) {
        _ = adopt(stream)
        begin { _ in stream }
    }

    /// An attempt's stream, before its GET starts: false when the part was closed meanwhile.
    func adopt(_ stream: WebDAVContentStream) -> Bool {
        attempt.withLock { attempt in
            guard !attempt.closed else { return false }
            attempt.stream = stream
            return true
        }
    }

    /// The part's stream once its status is known, or what its GET threw. A cancelled caller
    /// closes the part (its GET's start then returns at once).
    func stream() async throws -> WebDAVContentStream {
        guard let task = started.withLock({ $0 }) else { throw CancellationError() }
        return try await withTaskCancellationHandler {
            try await task.value
        } onCancel: {
            self.close()
        }
    }

    func close() {
        let stream = attempt.withLock { attempt -> WebDAVContentStream? in
            attempt.closed = true
            return attempt.stream
        }
        stream?.close()
    }
}

final class ParallelRangeStream: ContentStream, Sendable {
    let parts: [Range<Int64>]
    let width: Int
    private let open: @Sendable (RangePart) async throws -> WebDAVContentStream
    private struct State {
        /// The part the reader is in, and the bytes of it handed over.
        var current = 0
        var taken: Int64 = 0
        /// The parts started and not yet read to their end, by index.
        var running: [Int: RangePart] = [:]
        /// The parts after the first were started (after the first chunk).
        var aheadStarted = false
        var closed = false
    }
    private let state = Locked(State())

    /// `first`: the first part's stream, its status known. `open` starts a later part's GET.
    init(
        first: WebDAVContentStream, parts: [Range<Int64>], width: Int,
        open: @escaping @Sendable (RangePart) async throws -> WebDAVContentStream
    ) {
        self.parts = parts
        self.width = width
        self.open = open
        let head = RangePart(range: parts[0])
        head.begin(with: first)
        state.withLock { $0.running[0] = head }
    }

    /// Starts the parts after the first, once.
    private func startAhead() {
        let start = state.withLock { state -> Bool in
            guard !state.aheadStarted, state.current > 0 || state.taken > 0 else { return false }
            state.aheadStarted = true
            return true
        }
        guard start else { return }
        for index in 1..<min(width, parts.count) { launch(index) }
    }

    deinit { close() }

    private func launch(_ index: Int) {
        let part = RangePart(range: parts[index])
        let open = self.open
        let added = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.running[index] = part
            return true
        }
        if added { part.begin(open) }
    }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        while true {
            startAhead()
            let at = state.withLock { state -> (index: Int, part: RangePart, taken: Int64)? in
                guard !state.closed, let part = state.running[state.current] else { return nil }
                return (state.current, part, state.taken)
            }
            guard let at else { return nil }
            let left = Int64(parts[at.index].count) - at.taken
            if left > 0 {
                let stream = try await at.part.stream()
                let asked = Int(min(Int64(maximumLength), left))
                // The first chunk goes as soon as it comes (time to first byte); later ones are
                // filled (D-513: a part shares the link with those ahead, and small chunks cost).
                if at.index > 0 || at.taken > 0 { await stream.fill(asked) }
                if let bytes = try await stream.next(maximumLength: asked) {
                    state.withLock { $0.taken += Int64(bytes.count) }
                    return bytes
                }
                // The part ended short: so does the stream (nothing after a gap is handed over).
                close()
                return nil
            }
            // The part is all here: the reader goes on to the next, and one more part starts.
            state.withLock { state in
                state.running[at.index] = nil
                state.current += 1
                state.taken = 0
            }
            at.part.close()
            if at.index + width < parts.count { launch(at.index + width) }
        }
    }

    func close() {
        let running = state.withLock { state -> [RangePart] in
            state.closed = true
            defer { state.running = [:] }
            return Array(state.running.values)
        }
        for part in running { part.close() }
    }
}
