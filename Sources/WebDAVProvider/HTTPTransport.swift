// HTTP for the WebDAV provider, on libcurl's easy interface (D-415): no hand-written HTTP client.
// Easy handles are kept in a small pool and reset between requests (curl_easy_reset keeps their
// live connections, DNS and TLS session caches, so requests reuse connections). Every request has
// a deadline: metadata requests a total one (CURLOPT_TIMEOUT_MS), transfers a stall deadline (no
// byte moved for `stallTimeout`, time spent waiting for a slow consumer not counted), and every
// connect one. Failures become `ProviderError`s the cache already understands (see `failure`).

import CCurl
import Foundation
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// What every request of one provider shares: credentials, deadlines, TLS trust.
struct HTTPSettings: Sendable {
    var user: String?
    /// Never logged, never in a message (`WebDAVConfiguration.description` leaves it out).
    var password: String?
    var connectTimeout: Duration
    var requestTimeout: Duration
    var stallTimeout: Duration
    /// A PEM file of CA certificates to trust instead of the system's store (https).
    var caFile: String?
}

/// One HTTP request.
struct HTTPRequest: Sendable {
    var method: String
    var url: String
    var headers: [String] = []
    /// A small request body (PROPFIND's XML).
    var body: [UInt8]?
    /// A file whose bytes are the request body (PUT).
    var uploadFile: String?
    /// `Range: bytes=lower-(upper-1)`.
    var range: Range<Int64>?
    var followRedirects = false
    /// Whether the request gets the total deadline (`HTTPSettings.requestTimeout`); transfers of
    /// content only get the stall deadline.
    var totalDeadline = true
    /// Response bodies longer than this fail the request (`.io`).
    var maximumResponseBytes = 1 << 20
}

/// One HTTP response (the last one, after redirects).
struct HTTPResponse: Sendable {
    var status: Int
    /// Header names lowercased; a repeated header keeps its last value (`listHeaders` are joined).
    var headers: [String: String]
    var body: [UInt8]

    func header(_ name: String) -> String? { headers[name.lowercased()] }

    /// Headers whose repeated lines are joined with ", " (every other keeps its last line).
    static let listHeaders: Set<String> = ["dav", "allow", "content-digest", "repr-digest", "digest"]
}

/// The per-transfer state libcurl's callbacks reach through their context pointer. Used by the
/// one thread running `curl_easy_perform` (its callbacks run there), except `cancelled`.
final class TransferContext: @unchecked Sendable {
    // Safe: everything but `cancelled` is only touched by the thread performing the transfer.
    var status = 0
    var headers: [String: String] = [:]
    /// Receives each body chunk; false stops the transfer (a write error that `abortReason` or
    /// `stoppedOnPurpose` explains).
    var onBody: (UnsafeRawBufferPointer) -> Bool = { _ in true }
    /// Set by whoever stopped the transfer for a reason of its own.
    var abortReason: ProviderError?
    /// The body was cut short on purpose (enough bytes arrived): not a failure.
    var stoppedOnPurpose = false
    /// Judges a response that libcurl took as complete (a stream's body against its
    /// Content-Range): an error fails the request and closes its connection (D-466).
    var check: () -> ProviderError? = { nil }
    var uploadFD: Int32 = -1
    var uploadFailure: Int32 = 0
    let stallTimeout: Duration
    var lastProgress = ContinuousClock.now
    var lastBytes: Int64 = -1
    let cancelled = Locked(false)
    let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE) + 1)

    init(stallTimeout: Duration) {
        self.stallTimeout = stallTimeout
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    }

    deinit { errorBuffer.deallocate() }

    /// Time spent outside libcurl's control (a consumer that is not reading) does not count as a
    /// stall of the server.
    func resetStallClock() { lastProgress = ContinuousClock.now }

    var errorText: String { String(cString: errorBuffer) }

    /// libcurl's result of the transfer (CURLE_OK until it failed).
    var code = CURLE_OK
}

/// libcurl's easy handles, reused.
final class CurlHandles: @unchecked Sendable {
    // Safe: `idle` is only touched under `lock`.
    private let lock = Lock()
    private var idle: [UnsafeMutableRawPointer] = []
    private let keep: Int

    init(keep: Int) { self.keep = keep }

    deinit { for handle in idle { curl_easy_cleanup(handle) } }

    func take() -> UnsafeMutableRawPointer? {
        if let handle = lock.withLock({ idle.popLast() }) { return handle }
        return curl_easy_init()
    }

    /// Back to the pool, its options reset (its connections, DNS and TLS caches stay); closed
    /// with its connections unless `reusable` (D-466).
    func give(_ handle: UnsafeMutableRawPointer, reusable: Bool = true) {
        curl_easy_reset(handle)
        let kept = lock.withLock { () -> Bool in
            guard reusable, idle.count < keep else { return false }
            idle.append(handle)
            return true
        }
        if !kept { curl_easy_cleanup(handle) }
    }
}

/// Sends requests with libcurl (see the file's header).
final class HTTPTransport: Sendable {
    let settings: HTTPSettings
    let handles = CurlHandles(keep: 8)
    /// Connections libcurl had to open (CURLINFO_NUM_CONNECTS summed): how well they are reused.
    let connectionsOpened = Locked(0)
    /// Blocking metadata requests run here, off the cooperative pool; content transfers run on
    /// threads of their own (a transfer waiting for its reader must not hold up a listing).
    let pool: BlockingIOPool

    /// curl_global_init, once per process, before any handle exists (it is not thread-safe).
    private static let initialized: Bool = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) == CURLE_OK

    /// When `send` asks again (D-452).
    let retry: HTTPRetry
    /// Requests `send` asked again (status and tests).
    let retries = Locked(0)

    init(settings: HTTPSettings, threads: Int = 8, retry: HTTPRetry = HTTPRetry()) {
        _ = Self.initialized
        self.settings = settings
        self.retry = retry
        pool = BlockingIOPool(threadCount: threads)
    }

    deinit { pool.shutdown() }

    /// Sends `request` and collects its response (at most `maximumResponseBytes` of body).
    /// Transport failures throw `ProviderError` (see `failure`); any HTTP status is returned.
    /// A busy server (502, 503, 504, 429) and a connection that failed are asked again after a
    /// backoff (`retry`, D-452); a cancelled task stops the wait.
    func send(_ request: HTTPRequest) async throws -> HTTPResponse {
        try await retrying(request.method) {
            let context = TransferContext(stallTimeout: settings.stallTimeout)
            do {
                let response = try await sendOnce(request, context: context)
                return (.success(response), .status(response.status, retryAfter: response.header("retry-after")))
            } catch {
                let outcome =
                    context.abortReason != nil || error is CancellationError ? .other : Self.outcome(context.code)
                return (.failure(error), outcome)
            }
        }
    }

    /// Runs `attempt` until `retry` says its outcome is the answer, waiting its backoffs (D-452):
    /// the one loop of `send` and of a GET's start (`WebDAVProvider.fetchContents`).
    func retrying<T>(
        _ method: String, _ attempt: () async -> (Result<T, any Error>, HTTPRetry.Outcome)
    ) async throws -> T {
        var number = 1
        while true {
            let (answer, outcome) = await attempt()
            guard let wait = retry.delay(after: number, method: method, outcome: outcome) else {
                return try answer.get()
            }
            retries.withLock { $0 += 1 }
            try await Task.sleep(for: wait)
            number += 1
        }
    }

    /// A failed transfer as `HTTPRetry` reads it.
    static func outcome(_ code: CURLcode) -> HTTPRetry.Outcome {
        switch code {
        case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST: .notConnected
        case CURLE_GOT_NOTHING, CURLE_SEND_ERROR, CURLE_RECV_ERROR: .noAnswer
        default: .other
        }
    }

    /// One attempt of `send`.
    private func sendOnce(_ request: HTTPRequest, context: TransferContext) async throws -> HTTPResponse {
        let body = Locked<[UInt8]>([])
        context.onBody = { chunk in
            let fits = body.withLock { body in
                guard body.count + chunk.count <= request.maximumResponseBytes else { return false }
                body.append(contentsOf: chunk)
                return true
            }
            if !fits {
                context.abortReason = ProviderError(
                    .io,
                    "\(request.method) \(request.url): the response is longer than "
                        + "\(request.maximumResponseBytes) bytes", errno: EIO)
            }
            return fits
        }
        return try await run(request, context: context) { failure in
            if let failure { throw failure }
            return HTTPResponse(status: context.status, headers: context.headers, body: body.withLock { $0 })
        }
    }

    /// Runs `request` on the pool, its body going to `context.onBody` (set by the caller), then
    /// `finish` on the same thread with the transfer's failure (nil: the response ended): where a
    /// streamed body's reader is waited for (D-478). A cancelled task stops the transfer.
    func run<T: Sendable>(
        _ request: HTTPRequest, context: TransferContext,
        finish: @escaping @Sendable ((any Error)?) throws -> T
    ) async throws -> T {
        try Task.checkCancellation()
        return try await withTaskCancellationHandler {
            try await pool.run { () throws -> T in
                var failure: (any Error)?
                do { try self.perform(request, context: context) } catch { failure = error }
                return try finish(failure)
            }
        } onCancel: {
            context.cancelled.withLock { $0 = true }
        }
    }

    /// Runs `request` on the calling thread, handing the body to `context.onBody`. Throws the
    /// transport's failure; returns once the response (any status) has ended.
    func perform(_ request: HTTPRequest, context: TransferContext) throws {
        guard let handle = handles.take() else { throw ProviderError(.io, "curl_easy_init failed", errno: ENOMEM) }
        var headerList: UnsafeMutablePointer<curl_slist>?
        // A connection that carried a failed or lying answer may hold what is left of it: never
        // used again (the next request read "HTTP/0.9" there, D-466).
        var reusable = false
        defer {
            curl_slist_free_all(headerList)
            handles.give(handle, reusable: reusable)
            if context.uploadFD >= 0 {
                close(context.uploadFD)
                context.uploadFD = -1
            }
        }
        for header in request.headers + ["Expect:"] { headerList = curl_slist_append(headerList, header) }
        let opaque = Unmanaged.passUnretained(context).toOpaque()
        var ok = true
        func set(_ code: CURLcode) { if code != CURLE_OK { ok = false } }

        set(pfs_curl_setopt_string(handle, CURLOPT_URL, request.url))
        set(pfs_curl_setopt_string(handle, CURLOPT_PROTOCOLS_STR, "http,https"))
        set(pfs_curl_setopt_string(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https"))
        // Threads without signal handlers: no SIGALRM for DNS timeouts, no SIGPIPE.
        set(pfs_curl_setopt_long(handle, CURLOPT_NOSIGNAL, 1))
        set(pfs_curl_setopt_pointer(handle, CURLOPT_ERRORBUFFER, context.errorBuffer))
        set(pfs_curl_setopt_long(handle, CURLOPT_CONNECTTIMEOUT_MS, Self.milliseconds(settings.connectTimeout)))
        if request.totalDeadline {
            set(pfs_curl_setopt_long(handle, CURLOPT_TIMEOUT_MS, Self.milliseconds(settings.requestTimeout)))
        }
        if let user = settings.user {
            set(pfs_curl_setopt_string(handle, CURLOPT_USERNAME, user))
            set(pfs_curl_setopt_string(handle, CURLOPT_PASSWORD, settings.password ?? ""))
            set(pfs_curl_setopt_long(handle, CURLOPT_HTTPAUTH, 1))  // CURLAUTH_BASIC
        }
        if let caFile = settings.caFile { set(pfs_curl_setopt_string(handle, CURLOPT_CAINFO, caFile)) }
        if request.followRedirects {
            set(pfs_curl_setopt_long(handle, CURLOPT_FOLLOWLOCATION, 1))
            set(pfs_curl_setopt_long(handle, CURLOPT_MAXREDIRS, 5))
            set(pfs_curl_setopt_long(handle, CURLOPT_POSTREDIR, 7))  // CURL_REDIR_POST_ALL: keep the body
            // Only to HTTP(S), never from https down to http (D-514): a server's Location must not
            // send the request to another protocol (ftp, …) or in the clear.
            let schemes = request.url.lowercased().hasPrefix("https:") ? "https" : "http,https"
            set(pfs_curl_setopt_string(handle, CURLOPT_REDIR_PROTOCOLS_STR, schemes))
        }
        set(pfs_curl_setopt_list(handle, CURLOPT_HTTPHEADER, headerList))

        set(pfs_curl_setopt_pointer(handle, CURLOPT_WRITEDATA, opaque))
        set(
            pfs_curl_setopt_data_callback(handle, CURLOPT_WRITEFUNCTION) { buffer, size, count, context in
                let transfer = Unmanaged<TransferContext>.fromOpaque(context!).takeUnretainedValue()
                let length = size * count
                let accepted = transfer.onBody(UnsafeRawBufferPointer(start: buffer, count: length))
                transfer.resetStallClock()
                return accepted ? length : 0
            })
        set(pfs_curl_setopt_pointer(handle, CURLOPT_HEADERDATA, opaque))
        set(
            pfs_curl_setopt_data_callback(handle, CURLOPT_HEADERFUNCTION) { buffer, size, count, context in
                let transfer = Unmanaged<TransferContext>.fromOpaque(context!).takeUnretainedValue()
                let length = size * count
                let line = String(decoding: UnsafeRawBufferPointer(start: buffer, count: length), as: UTF8.self)
                    .trimmingCharacters(in: .whitespacesAndNewlines)
                if line.hasPrefix("HTTP/") {
                    // A new response (after a redirect or a 100 Continue): its headers only.
                    transfer.headers = [:]
                    transfer.status = MultiStatus.statusCode(line) ?? 0
                } else if let colon = line.firstIndex(of: ":") {
                    let name = line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()
                    let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                    // The list headers a server repeats (Apache: `DAV: 1,2` and `DAV: <…propset…>`)
                    // are joined, as RFC 9110 §5.3 allows; any other keeps its last value.
                    if let earlier = transfer.headers[name], HTTPResponse.listHeaders.contains(name) {
                        transfer.headers[name] = earlier + ", " + value
                    } else {
                        transfer.headers[name] = value
                    }
                }
                return length
            })
        // The stall deadline and cancellation, checked about once a second and on every progress.
        set(pfs_curl_setopt_long(handle, CURLOPT_NOPROGRESS, 0))
        set(pfs_curl_setopt_pointer(handle, CURLOPT_XFERINFODATA, opaque))
        set(
            pfs_curl_setopt_progress_callback(handle) { context, _, downloaded, _, uploaded in
                let transfer = Unmanaged<TransferContext>.fromOpaque(context!).takeUnretainedValue()
                if transfer.cancelled.withLock({ $0 }) {
                    if transfer.abortReason == nil { transfer.abortReason = ProviderError(.cancelled, "cancelled") }
                    return 1
                }
                let moved = Int64(downloaded) + Int64(uploaded)
                if moved != transfer.lastBytes {
                    transfer.lastBytes = moved
                    transfer.resetStallClock()
                } else if ContinuousClock.now - transfer.lastProgress > transfer.stallTimeout {
                    transfer.abortReason = ProviderError(
                        .timedOut, "no byte moved for \(transfer.stallTimeout)", errno: ETIMEDOUT)
                    return 1
                }
                return 0
            })

        if let body = request.body {
            set(pfs_curl_setopt_offset(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)))
            body.withUnsafeBufferPointer { raw in
                raw.withMemoryRebound(to: CChar.self) { chars in
                    set(
                        pfs_curl_setopt_pointer(
                            handle, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: chars.baseAddress)))
                }
            }
        }
        if let path = request.uploadFile {
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                let code = errno
                throw ProviderError(.io, "open \(path): \(String(cString: strerror(code)))", errno: code)
            }
            context.uploadFD = fd
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw ProviderError(.io, "fstat \(path)", errno: errno) }
            set(pfs_curl_setopt_long(handle, CURLOPT_UPLOAD, 1))
            set(pfs_curl_setopt_offset(handle, CURLOPT_INFILESIZE_LARGE, curl_off_t(info.st_size)))
            set(pfs_curl_setopt_pointer(handle, CURLOPT_READDATA, opaque))
            set(
                pfs_curl_setopt_data_callback(handle, CURLOPT_READFUNCTION) { buffer, size, count, context in
                    let transfer = Unmanaged<TransferContext>.fromOpaque(context!).takeUnretainedValue()
                    while true {
                        let got = read(transfer.uploadFD, buffer, size * count)
                        if got >= 0 { return got }
                        if errno == EINTR { continue }
                        transfer.uploadFailure = errno
                        return pfs_curl_read_abort()
                    }
                })
        }
        if let range = request.range {
            set(pfs_curl_setopt_string(handle, CURLOPT_RANGE, "\(range.lowerBound)-\(range.upperBound - 1)"))
        }
        if request.method == "GET" {
            set(pfs_curl_setopt_long(handle, CURLOPT_HTTPGET, 1))
        } else if !(request.method == "PUT" && request.uploadFile != nil) {
            set(pfs_curl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, request.method))
        }
        guard ok else { throw ProviderError(.io, "libcurl refused an option of \(request.method) \(request.url)") }

        context.resetStallClock()
        let code = curl_easy_perform(handle)
        var status = 0
        _ = pfs_curl_getinfo_long(handle, CURLINFO_RESPONSE_CODE, &status)
        if status != 0 { context.status = status }
        var opened = 0
        if pfs_curl_getinfo_long(handle, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK, opened > 0 {
            connectionsOpened.withLock { $0 += opened }
        }
        if code == CURLE_OK || context.stoppedOnPurpose {
            if let length = context.headers["content-length"], !Self.isDecimal(length) {
                throw ProviderError(
                    .io, "\(request.method) \(request.url): the server sent Content-Length '\(length.prefix(40))'",
                    errno: EIO)
            }
            if let problem = context.check() { throw problem }
            reusable = true
            return
        }
        context.code = code
        throw failure(code, request: request, context: context)
    }

    /// A transport failure as the cache reads it: a server that cannot be reached (refused,
    /// unresolvable, the connection closed before any answer) is `.unreachable`, so cached items
    /// stay readable; a deadline is `.timedOut`; a transfer broken midway is `.io` (EIO).
    func failure(_ code: CURLcode, request: HTTPRequest, context: TransferContext) -> ProviderError {
        if let reason = context.abortReason { return reason }
        let detail = context.errorText.isEmpty ? String(cString: curl_easy_strerror(code)) : context.errorText
        let what = "\(request.method) \(request.url): \(detail)"
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_CONNECT, CURLE_GOT_NOTHING,
            CURLE_SEND_ERROR:
            return ProviderError(.unreachable, what, errno: ENETUNREACH)
        case CURLE_OPERATION_TIMEDOUT:
            return ProviderError(.timedOut, what, errno: ETIMEDOUT)
        case _ where context.uploadFailure != 0:
            return ProviderError(.io, what, errno: context.uploadFailure)
        default:
            return ProviderError(.io, what, errno: EIO)
        }
    }

    /// Whether a Content-Length is a number (RFC 9110 §8.6: 1*DIGIT).
    static func isDecimal(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { (48...57).contains($0) }
    }

    static func milliseconds(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.components
        return max(1, Int(seconds) * 1000 + Int(attoseconds / 1_000_000_000_000_000))
    }
}
