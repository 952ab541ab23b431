// One ranged GET as a `ContentStream`. The transfer runs on a thread of its own (libcurl's easy
// interface blocks); its bytes go into a bounded queue that `next` drains. A full queue blocks the
// transfer thread (backpressure: a slow reader never makes the daemon buffer a whole file), and
// that waiting does not count against the stall deadline. The state is under the project's one
// lock type; the full queue's wait is a semaphore the reader signals (no second lock kind, D-006). `fetchContents` returns once the
// response's status is known, so a changed version (412, or another ETag) or a missing item
// throws there. A response whose stated checksum covers exactly the bytes asked for, when they
// are at most `checksumLimit`, makes the stream `.checksummed` (D-495): the cache verifies them
// before any counts as present. A stream may be one part of a larger fetch (D-513): it asks for
// its part, and delivers the whole fetch when the server ignores Range and answers 200.

import Dispatch
import Foundation
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

final class WebDAVContentStream: ContentStream, @unchecked Sendable {
    // Safe: every `var` below is only touched with `monitor` held.
    private let monitor = Lock()
    /// Signalled once for each time the transfer thread waits on a full queue (`producerWaits`).
    private let spaceAvailable = DispatchSemaphore(value: 0)
    private var producerWaits = false
    private var chunks: [[UInt8]] = []
    private var headOffset = 0
    private var buffered = 0
    /// The response's status was judged (the first body byte, or the end of a bodiless answer).
    private var decided = false
    private var ended = false
    private var failure: ProviderError?
    private var closed = false
    private var waiter: CheckedContinuation<Void, Never>?
    /// Queued bytes that wake a waiting reader (`fill`; else the first byte does).
    private var wanted = 1
    /// The running `fill` has waited long enough: any byte queued ends it.
    private var fillExpired = false
    /// How the transfer failed, as `HTTPRetry` reads it (set on the transfer thread).
    private var failedAs: HTTPRetry.Outcome = .other

    /// Bytes the queue holds before the transfer thread waits.
    static let capacity = 8 << 20

    let identifier: ItemIdentifier
    let version: ContentVersion
    let range: Range<Int64>
    /// What a 200 (Range ignored) delivers: `range`, or the whole fetch `range` is the first part of.
    let whole: Range<Int64>
    let context: TransferContext
    /// Bytes still to skip (a server that ignored Range sent the file from its start) and to deliver.
    private var skip: Int64 = 0
    private var remaining: Int64
    /// Body bytes the server sent (the transfer thread's count).
    private var bodyBytes: Int64 = 0
    /// A range up to this long is verified against a checksum the answer states for it (D-495).
    let checksumLimit: Int64
    /// The file's checksums its listing stated (`oc:checksums`, D-519): used when the answer is
    /// the whole file and states none of its own.
    let listedChecksums: [ContentChecksum]
    /// The checksum the bytes are verified with (set when the response is judged).
    private var verifiedBy: StatedChecksum?
    /// The server answered 200: Range ignored, the stream delivers `whole`.
    private var answeredWhole = false

    init(
        identifier: ItemIdentifier, version: ContentVersion, range: Range<Int64>, stallTimeout: Duration,
        checksumLimit: Int64 = 0, listedChecksums: [ContentChecksum] = [], whole: Range<Int64>? = nil
    ) {
        self.identifier = identifier
        self.version = version
        self.range = range
        self.whole = whole ?? range
        self.checksumLimit = checksumLimit
        self.listedChecksums = listedChecksums
        remaining = Int64(range.count)
        context = TransferContext(stallTimeout: stallTimeout)
    }

    deinit { close() }

    /// An already ended stream (an empty range, or a range past the end).
    static func empty(
        _ identifier: ItemIdentifier, _ version: ContentVersion, _ range: Range<Int64>
    )
        -> WebDAVContentStream
    {
        let stream = WebDAVContentStream(
            identifier: identifier, version: version, range: range, stallTimeout: .seconds(1))
        stream.monitor.withLock {
            stream.decided = true
            stream.ended = true
        }
        return stream
    }

    /// Starts the GET on its own thread and waits until its status is known; throws what the
    /// server answered instead of the bytes (`.versionChanged`, `.noSuchItem`, …).
    func start(_ request: HTTPRequest, transport: HTTPTransport) async throws {
        context.onBody = { [unowned self] chunk in self.received(chunk) }
        context.check = { [unowned self] in self.shortBody() }
        let thread = Thread { [self] in
            var thrown: ProviderError?
            do { try transport.perform(request, context: context) } catch { thrown = ProviderError.from(error) }
            // A response that ended without a body is judged now; a transport failure needs no judging.
            if thrown == nil, !decidedNow() { decide() }
            finish(thrown)
        }
        thread.name = "webdav-get"
        thread.start()
        while true {
            // A transfer that broke after bytes came (even all of them, before `start` looked)
            // hands them over first, then fails at `next` (D-466).
            let state = monitor.withLock { () -> (ready: Bool, failure: ProviderError?) in
                (decided || ended, buffered > 0 ? nil : failure)
            }
            if state.ready {
                if let failure = state.failure {
                    close()
                    throw failure
                }
                return
            }
            await waitForChange(orDecision: true)
            // A cancelled caller (an interrupted read) stops the GET: the wait above no longer
            // waits, and this loop would spin until the server answered or the stall deadline.
            if Task.isCancelled {
                close()
                throw CancellationError()
            }
        }
    }

    private func decidedNow() -> Bool { monitor.withLock { decided } }

    /// Whether the server ignored Range (a 200): known once `start` returned.
    var ignoredRange: Bool { monitor.withLock { answeredWhole } }

    /// How `start` failed, for a retry (D-452): the server's answer, or the transfer's failure.
    var failureOutcome: HTTPRetry.Outcome { monitor.withLock { failedAs } }

    /// Judges the response: its status, its range, its version (see the file's header).
    /// Called on the transfer thread, before the first body byte is taken or at the end.
    private func decide() {
        let status = context.status
        let headers = context.headers
        var problem: ProviderError?
        var empty = false
        switch status {
        case 206:
            // "bytes first-last/total": the range must start where asked (ContentRange: strictly).
            let value = headers["content-range"] ?? ""
            if ContentRange(value)?.first != range.lowerBound {
                problem = ProviderError(
                    .io, "GET \(identifier): asked for bytes from \(range.lowerBound), got '\(value)'", errno: EIO)
            }
        case 200:
            // The server ignored Range: the body is the whole file; the bytes before the range are
            // skipped, and the whole fetch is delivered (not only this part of it).
            skip = range.lowerBound
            remaining = Int64(whole.count)
        case 416:
            empty = true  // the range starts past the end: nothing to deliver (the caller sees the count)
        default:
            problem = WebDAVProvider.statusError(status, "GET \(identifier)", conflict: .versionChanged)
        }
        if problem == nil, !empty, let mismatch = versionMismatch(headers) { problem = mismatch }
        // libcurl reads "12abc" as 12: no byte of such an answer is taken (D-466).
        if problem == nil, let length = headers["content-length"], !HTTPTransport.isDecimal(length) {
            problem = ProviderError(
                .io, "GET \(identifier): the server sent Content-Length '\(length.prefix(40))'", errno: EIO)
        }
        let answered = HTTPRetry.Outcome.status(status, retryAfter: headers["retry-after"])
        let stated =
            problem == nil && !empty
            ? ResponseChecksum.usable(
                status: status, headers: headers, range: range, limit: checksumLimit, listed: listedChecksums) : nil
        let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
            decided = true
            answeredWhole = status == 200
            verifiedBy = stated
            if let problem, failure == nil {
                failure = problem
                failedAs = answered
            }
            if empty { ended = true }
            defer { waiter = nil }
            return waiter
        }
        waiting?.resume()
        if let problem { context.abortReason = problem }
        if empty { context.stoppedOnPurpose = true }
    }

    /// `.versionChanged` when the response names another version than the one asked for: its
    /// ETag (weak and strong alike compared by their opaque text), or, for a version made of the
    /// last-modified time and size, those.
    private func versionMismatch(_ headers: [String: String]) -> ProviderError? {
        let asked = version.rawValue
        // An answer that names no version at all is not taken for the file's bytes (D-515): a
        // login portal's or a proxy's page (200, no ETag, no Last-Modified) would be cached as them.
        if WebDAVProvider.isETag(asked) {
            guard let etag = headers["etag"] else { return Self.namesNoVersion(identifier, "ETag") }
            if WebDAVProvider.opaqueTag(etag) != WebDAVProvider.opaqueTag(asked) {
                return ProviderError(.versionChanged, "\(identifier) changed: \(asked) is now \(etag)")
            }
            return nil
        }
        guard let modified = headers["last-modified"].flatMap(MultiStatus.httpDate) else {
            return Self.namesNoVersion(identifier, "Last-Modified")
        }
        let total: Int64? =
            if context.status == 206 {
                headers["content-range"].flatMap { ContentRange($0)?.total }
            } else {
                headers["content-length"].flatMap { Int64($0) }
            }
        guard let total else { return nil }
        let now = WebDAVProvider.fallbackVersion(lastModified: modified, size: total)
        return now.rawValue == asked
            ? nil : ProviderError(.versionChanged, "\(identifier) changed: \(asked) is now \(now)")
    }

    static func namesNoVersion(_ identifier: ItemIdentifier, _ header: String) -> ProviderError {
        ProviderError(
            .io, "GET \(identifier): the answer names no version (no \(header)): not taken for the file", errno: EIO)
    }

    /// The transfer thread's body callback: judge the response first, then queue the bytes of the
    /// range, waiting while the queue is full. False stops the transfer.
    private func received(_ chunk: UnsafeRawBufferPointer) -> Bool {
        if !decidedNow() { decide() }
        if context.abortReason != nil || context.stoppedOnPurpose { return false }
        bodyBytes += Int64(chunk.count)
        var bytes = chunk[...]
        if skip > 0 {
            let dropped = Int(min(skip, Int64(bytes.count)))
            bytes = bytes.dropFirst(dropped)
            skip -= Int64(dropped)
        }
        let taken = Int(min(remaining, Int64(bytes.count)))
        let extra = bytes.count > taken
        remaining -= Int64(taken)
        if taken > 0 {
            let copy = [UInt8](bytes.prefix(taken))
            let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
                guard !closed else { return nil }
                chunks.append(copy)
                buffered += copy.count
                guard buffered >= wanted || remaining == 0 else { return nil }
                defer { waiter = nil }
                return waiter
            }
            waiting?.resume()
            // Wait while the queue is full: the reader (or `close`) signals once it has made room.
            // Once the range is all queued the transfer ends without waiting: a part fetched ahead
            // (D-513) frees its connection and thread as soon as its bytes are here.
            while monitor.withLock({ () -> Bool in
                guard buffered >= Self.capacity, remaining > 0, !closed else { return false }
                producerWaits = true
                return true
            }) {
                spaceAvailable.wait()
            }
            let open = monitor.withLock { !closed }
            context.resetStallClock()
            if !open { return false }
        }
        if remaining == 0, extra {
            // More than the range (a server that ignored Range): the rest is not needed.
            context.stoppedOnPurpose = true
            return false
        }
        return true
    }

    /// A 206 whose body ended before the bytes its Content-Range announced (a Content-Length
    /// shorter than the range, which libcurl takes at its word): `.io`, never a clean end that
    /// passes a short range off as the file's end (D-466). Nil for any other ending.
    private func shortBody() -> ProviderError? {
        guard context.status == 206, !context.stoppedOnPurpose, !monitor.withLock({ closed }),
            let value = context.headers["content-range"]
        else { return nil }
        guard let span = ContentRange(value), bodyBytes < span.count else { return nil }
        return ProviderError(
            .io, "GET \(identifier): the body ended after \(bodyBytes) of the \(span.count) bytes of '\(value)'",
            errno: EIO)
    }

    private func finish(_ thrown: ProviderError?) {
        let transport = thrown == nil ? HTTPRetry.Outcome.other : HTTPTransport.outcome(context.code)
        let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
            ended = true
            if let thrown, failure == nil, !closed {
                failure = thrown
                failedAs = transport
            }
            defer { waiter = nil }
            return waiter
        }
        waiting?.resume()
    }

    /// Suspends until the transfer thread queued bytes (or, with `orDecision`, judged the
    /// response), ended, or the stream was closed or its task cancelled.
    private func waitForChange(orDecision: Bool = false) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = monitor.withLock { () -> Bool in
                    if buffered >= wanted || ended || closed || (decided && (orDecision || failure != nil))
                        || Task.isCancelled
                    {
                        return true
                    }
                    waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
                defer { waiter = nil }
                return waiter
            }
            waiting?.resume()
        }
    }

    /// Waits until `count` bytes are queued (at most the queue's capacity), or the range is all
    /// queued, or the stream ended, failed or was closed, or half a second passed with a byte
    /// queued: a reader of parts fetched ahead (D-513) takes them in chunks as large as it asks
    /// for, not in the pieces the network brought (each chunk costs the cache a few thread hops),
    /// and a slow network still hands over what came before the cache's stall deadline.
    func fill(_ count: Int) async {
        let target = max(1, min(count, Self.capacity))
        monitor.withLock { fillExpired = false }
        let timer = Task { [weak self] in
            // Cancelled (the fill ended): no expiry, which would cut the next fill short.
            guard (try? await Task.sleep(for: .milliseconds(500))) != nil else { return }
            self?.expireFill()
        }
        defer {
            timer.cancel()
            monitor.withLock { wanted = 1 }
        }
        while !Task.isCancelled {
            let full = monitor.withLock { () -> Bool in
                let full =
                    buffered >= target || ended || closed || failure != nil || (fillExpired && buffered > 0)
                wanted = full || fillExpired ? 1 : target
                return full
            }
            if full { return }
            await waitForChange()
        }
    }

    private func expireFill() {
        let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
            fillExpired = true
            wanted = 1
            guard buffered > 0 else { return nil }
            defer { waiter = nil }
            return waiter
        }
        waiting?.resume()
    }

    func next(maximumLength: Int) async throws -> [UInt8]? {
        while true {
            try Task.checkCancellation()
            enum Step {
                case bytes([UInt8])
                case end
                case fail(ProviderError)
                case wait
            }
            var wake = false
            let step = monitor.withLock { () -> Step in
                if closed { return .end }
                if buffered > 0 {
                    var out: [UInt8] = []
                    out.reserveCapacity(min(maximumLength, buffered))
                    while out.count < maximumLength, !chunks.isEmpty {
                        let head = chunks[0]
                        let count = min(maximumLength - out.count, head.count - headOffset)
                        out += head[headOffset..<headOffset + count]
                        headOffset += count
                        if headOffset == head.count {
                            chunks.removeFirst()
                            headOffset = 0
                        }
                    }
                    buffered -= out.count
                    if producerWaits, buffered < Self.capacity {
                        producerWaits = false
                        wake = true
                    }
                    return .bytes(out)
                }
                if let failure { return .fail(failure) }
                if ended { return .end }
                return .wait
            }
            if wake { spaceAvailable.signal() }
            switch step {
            case .bytes(let bytes): return bytes
            case .end: return nil
            case .fail(let error): throw error
            case .wait: await waitForChange()
            }
        }
    }

    /// `.checksummed` when the answer states a checksum of exactly these bytes (known once `start`
    /// returned).
    var capabilities: ContentStreamCapabilities { monitor.withLock { verifiedBy == nil ? [] : .checksummed } }

    var checksumAlgorithm: ContentChecksum.Algorithm {
        monitor.withLock { verifiedBy?.checksum.algorithm ?? .sha256 }
    }

    /// The stated checksum, once every byte was handed over (the protocol's "after `next`
    /// returned nil").
    var checksum: ContentChecksum? {
        monitor.withLock { ended && buffered == 0 && failure == nil ? verifiedBy?.checksum : nil }
    }

    /// Which header the bytes are verified against (nil: none), for tests and messages.
    var checksumHeader: String? { monitor.withLock { verifiedBy?.header } }

    func close() {
        var wake = false
        let waiting = monitor.withLock { () -> CheckedContinuation<Void, Never>? in
            closed = true
            chunks = []
            buffered = 0
            if producerWaits {
                producerWaits = false
                wake = true
            }
            defer { waiter = nil }
            return waiter
        }
        if wake { spaceAvailable.signal() }
        context.cancelled.withLock { $0 = true }
        waiting?.resume()
    }
}
