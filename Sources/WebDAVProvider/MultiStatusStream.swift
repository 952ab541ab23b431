// A Multi-Status document parsed as its bytes arrive (D-478): a PROPFIND's body goes from
// libcurl's write callback (`feed`, the transfer thread) through a bounded pipe into an
// XMLParser reading it as an InputStream (`parse`, another thread), which hands each response to
// its reader as soon as it closes. So the first entries of a 100,000-entry listing are known while
// the rest is on the wire, and the document is never held whole (a whole document of more than
// about 10 MB in one piece is refused by libxml2, a listing of some 30,000 entries). The hostile
// input checks of `MultiStatus.parse` hold: the size limit counts the bytes fed, and a DTD is
// refused in the bytes before the parser sees them (a declaration split across two chunks too).

import Dispatch
import Foundation
import SystemSupport

#if canImport(FoundationXML)
import FoundationXML
#endif

/// One Multi-Status document, fed by one thread and parsed by another (or by the same one after
/// the last byte was fed, when the pipe holds the whole document).
public final class MultiStatusStream: @unchecked Sendable {
    // Safe: `tail` is only touched by the feeding thread; `fed`, `pipe` and `refusal` lock.
    public let limits: MultiStatusLimits
    private let pipe: BodyPipe
    private let entry: (MultiStatusEntry) -> Bool
    private let fed = Locked(0)
    /// The last bytes fed, so a declaration split between two chunks is seen.
    private var tail: [UInt8] = []
    private let refusal = Locked<MultiStatusError?>(nil)

    /// `capacity`: bytes fed and not yet parsed before `feed` waits for the parser. `entry`: each
    /// response, on the parsing thread; false stops the parse.
    public init(
        limits: MultiStatusLimits = MultiStatusLimits(), capacity: Int = 1 << 20,
        entry: @escaping (MultiStatusEntry) -> Bool
    ) {
        self.limits = limits
        pipe = BodyPipe(capacity: capacity)
        self.entry = entry
    }

    /// Bytes fed so far.
    public var bytesFed: Int { fed.withLock { $0 } }

    /// The next bytes of the document; waits while the pipe is full. False: the document was
    /// refused (too large, a DTD) or its parse ended; feed no more.
    public func feed(_ bytes: UnsafeRawBufferPointer) -> Bool {
        let total = fed.withLock { fed in
            fed += bytes.count
            return fed
        }
        guard total <= limits.maximumBytes else {
            return refuse("the Multi-Status document is over the limit of \(limits.maximumBytes) bytes")
        }
        // No DTD: a Multi-Status needs none, and a DTD is how entity expansion ("billion laughs")
        // and external entities get in. Refused before the parser sees a byte of it.
        let keyword = 9  // "<!DOCTYPE"
        var seam = tail
        seam.append(contentsOf: bytes.prefix(keyword))
        if MultiStatus.containsDeclaration(seam) || MultiStatus.containsDeclaration(bytes) {
            return refuse("the Multi-Status document has a DTD or entity declaration")
        }
        tail = Array((tail + bytes.suffix(keyword)).suffix(keyword - 1))
        return pipe.push(bytes)
    }

    /// The document ended (`complete`), or its transfer failed: the parse sees the end.
    public func finish(complete: Bool) { pipe.end(failed: !complete) }

    private func refuse(_ message: String) -> Bool {
        refusal.withLock { if $0 == nil { $0 = MultiStatusError(description: message) } }
        pipe.end(failed: true)
        return false
    }

    /// Parses the document, waiting for its bytes until `finish`; hands each response to
    /// `entry`. Throws what was wrong with it; a parse that `entry` stopped throws too (its
    /// reader knows why). Stops the feeding side when it returns.
    public func parse() throws(MultiStatusError) {
        defer { pipe.stop() }
        let reader = MultiStatusReader(limits: limits, entry: entry)
        let parser = XMLParser(stream: pipe)
        parser.shouldProcessNamespaces = true
        parser.shouldReportNamespacePrefixes = false
        parser.shouldResolveExternalEntities = false
        parser.delegate = reader
        let parsed = parser.parse()
        if let refused = refusal.withLock({ $0 }) { throw refused }
        if let failure = reader.failure { throw failure }
        guard parsed else {
            let reason = parser.parserError.map { "\($0.localizedDescription)" } ?? "unknown error"
            throw MultiStatusError(description: "the Multi-Status document is not well-formed XML (\(reason))")
        }
        guard reader.sawMultiStatus else {
            throw MultiStatusError(description: "the document is not a DAV: multistatus")
        }
        // swift-corelibs' XMLParser accepts a document cut short: the root must have been closed.
        guard reader.closedRoot else {
            throw MultiStatusError(description: "the Multi-Status document is not well-formed XML (it ends early)")
        }
    }
}

/// Bytes from one thread to another as an InputStream (what XMLParser reads incrementally). A
/// full pipe makes `push` wait (backpressure: a listing is never held whole); an empty one makes
/// `read` wait. The waits are semaphores signalled once per wait, the state under the project's
/// one lock type (D-006), as in `WebDAVContentStream`.
final class BodyPipe: InputStream {
    // Safe: the state is under its lock; the semaphores are thread-safe.
    private struct State {
        var chunks: [[UInt8]] = []
        /// Bytes of `chunks[0]` already read.
        var head = 0
        var buffered = 0
        var ended = false
        var failed = false
        /// The reader is done: pushes are refused.
        var stopped = false
        var producerWaits = false
        var consumerWaits = false
    }
    private let state = Locked(State())
    private let dataAvailable = DispatchSemaphore(value: 0)
    private let spaceAvailable = DispatchSemaphore(value: 0)
    let capacity: Int

    init(capacity: Int) {
        self.capacity = capacity
        super.init(data: Data())
    }

    /// Queues a copy of `bytes`, then waits while more than `capacity` bytes are queued. False:
    /// the reader stopped.
    func push(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !bytes.isEmpty else { return true }
        let copy = [UInt8](bytes)
        let (accepted, wake, wait) = state.withLock { state -> (Bool, Bool, Bool) in
            guard !state.stopped, !state.ended else { return (false, false, false) }
            state.chunks.append(copy)
            state.buffered += copy.count
            let wake = state.consumerWaits
            state.consumerWaits = false
            let full = state.buffered > capacity
            if full { state.producerWaits = true }
            return (true, wake, full)
        }
        if wake { dataAvailable.signal() }
        guard accepted else { return false }
        if wait {
            spaceAvailable.wait()
            return !state.withLock { $0.stopped }
        }
        return true
    }

    /// No more bytes; `failed`: the reader sees an error instead of the end.
    func end(failed: Bool) {
        let wake = state.withLock { state -> Bool in
            if !state.ended {
                state.ended = true
                state.failed = failed
            }
            defer { state.consumerWaits = false }
            return state.consumerWaits
        }
        if wake { dataAvailable.signal() }
    }

    /// The reader is done: what is queued is dropped and a waiting `push` returns false.
    func stop() {
        let wake = state.withLock { state -> Bool in
            state.stopped = true
            state.chunks = []
            state.buffered = 0
            defer { state.producerWaits = false }
            return state.producerWaits
        }
        if wake { spaceAvailable.signal() }
    }

    override func open() {}
    override func close() {}
    override var hasBytesAvailable: Bool { true }
    override var streamStatus: Stream.Status { .open }
    override var streamError: (any Error)? { nil }

    /// Up to `length` bytes, waiting for them; 0 at the end, -1 when the transfer failed.
    override func read(_ buffer: UnsafeMutablePointer<UInt8>, maxLength length: Int) -> Int {
        while true {
            let (count, wake, wait) = state.withLock { state -> (Int, Bool, Bool) in
                guard !state.chunks.isEmpty else {
                    if state.ended { return (state.failed ? -1 : 0, false, false) }
                    state.consumerWaits = true
                    return (0, false, true)
                }
                let chunk = state.chunks[0]
                let count = min(length, chunk.count - state.head)
                chunk.withUnsafeBufferPointer { bytes in
                    buffer.update(from: bytes.baseAddress! + state.head, count: count)
                }
                state.head += count
                if state.head == chunk.count {
                    state.chunks.removeFirst()
                    state.head = 0
                }
                state.buffered -= count
                let wake = state.producerWaits && state.buffered <= capacity
                if wake { state.producerWaits = false }
                return (count, wake, false)
            }
            if wake { spaceAvailable.signal() }
            if wait {
                dataAvailable.wait()
                continue
            }
            return count
        }
    }
}
