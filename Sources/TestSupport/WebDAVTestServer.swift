// Real HTTP servers on 127.0.0.1 for the WebDAV provider's tests: `rclone serve webdav` of a
// directory (Debian rclone), Apache 2.4 with mod_dav + mod_dav_fs + DavLockDB (a class-2 server,
// from a config written into the server's temporary directory), and Python's `http.server` (a
// plain server that ignores Range, for the fallback path). Each runs as a child process on a free
// port, is waited for until it accepts connections, and is stopped by its PID (SIGTERM, then
// SIGKILL) in `stop`, which `deinit` also calls: a failing test leaves no server behind. Apache's
// parent forks its workers: SIGTERM to the parent stops them and it waits for them; when it must
// be killed, its workers (found by their parent PID) are killed by PID too.
//
// Apache refuses to run as root: under root (CI) its workers run as `nobody`, and the served tree
// is given to `nobody` (its ancestors made searchable) so that they can read and write it.
//
// WebDAV tests never skip silently: without rclone or apache2 they fail, unless
// PROVIDERFS_SKIP_WEBDAV_TESTS=1 is set, and then the suite is reported skipped with that reason.

import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Whether the WebDAV tests that need a server run, and what is missing when they cannot.
public enum WebDAVTestGate {
    /// False only when the environment asks to skip them.
    public static var enabled: Bool { currentEnvironment()["PROVIDERFS_SKIP_WEBDAV_TESTS"] != "1" }

    /// Nil when rclone and apache2 (Debian apache2-bin) are installed, else the sentence to fail the test with.
    public static var problem: String? {
        let missing = [rclone == nil ? "rclone" : nil, apache == nil ? "apache2-bin" : nil].compactMap { $0 }
        guard !missing.isEmpty else { return nil }
        return
            "\(missing.joined(separator: " and ")) not installed (apt-get install \(missing.joined(separator: " ")), "
            + "or Scripts/install-deps); WebDAV tests cannot run (set PROVIDERFS_SKIP_WEBDAV_TESTS=1 to skip them)"
    }

    /// The rclone executable, if any.
    public static var rclone: String? { findExecutable("rclone") }

    /// The apache2 executable (Debian keeps it in /usr/sbin) and its modules, if any.
    public static var apache: String? {
        let modules = apacheModules + "/mod_dav_fs.so"
        guard access(modules, R_OK) == 0 else { return nil }
        return findExecutable("apache2") ?? (access("/usr/sbin/apache2", X_OK) == 0 ? "/usr/sbin/apache2" : nil)
    }

    static let apacheModules = "/usr/lib/apache2/modules"

    static func findExecutable(_ name: String) -> String? {
        let path = currentEnvironment()["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for directory in path.split(separator: ":").map(String.init) + ["/usr/bin"] {
            let candidate = directory + "/" + name
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

/// A server process on 127.0.0.1 (see the file's header).
public final class WebDAVTestServer: @unchecked Sendable {
    // Safe: `process` and `port` are only replaced by `start`/`stop` of the one test that owns the
    // server.
    public enum Kind: Sendable {
        /// `rclone serve webdav ROOT`, with basic authentication when a user is given.
        case rclone(user: String?, password: String?)
        /// `rclone serve webdav ROOT` with rclone's directory cache (5 min): what changes in ROOT
        /// behind its back is not seen, but a listing of thousands of entries takes milliseconds
        /// (without the cache, rclone reads the directory again for each entry: 2,000 took 2 min).
        case rcloneCachingListings
        /// `rclone serve webdav ROOT` over https, with this certificate and key (PEM files).
        case rcloneTLS(certificate: String, key: String)
        /// Apache 2.4: mod_dav + mod_dav_fs with a DavLockDB (class 1 and 2), mpm_event.
        case apache
        /// `python3 -m http.server`: GET only, Range ignored.
        case pythonStatic
        /// A proxy in front of `upstream` (a server's URL) that answers 503 with Retry-After 0 to
        /// every request but each `passEvery`-th of the same method and path, which it forwards
        /// (0: every request is 503).
        case busyProxy(upstream: String, passEvery: Int)
        /// A proxy in front of `upstream` that passes every request on and spoils its answer as
        /// `tamper(_:)` last said (issue 26's bad input).
        case tampering(upstream: String)
        /// `.tampering` over https, with this certificate and key (PEM files).
        case tamperingTLS(upstream: String, certificate: String, key: String)
    }

    /// How a `.tampering` proxy spoils answers (`tamper(_:)`); the script reads it per request.
    public enum Tampering: String, Sendable, CaseIterable {
        /// Answers as the server does.
        case none
        /// GET: `If-Match` dropped on the way (a server that ignores it), and the answer's ETag
        /// another one (the file changed between the PROPFIND and the GET).
        case etagChangedOnGet = "etag-changed-on-get"
        /// Every answer's ETags (headers and 207 bodies) are new ones: a server whose ETags change
        /// on every request.
        case etagPerRequest = "etag-per-request"
        /// PROPFIND answered 200 with an HTML error page.
        case htmlPropfind = "html-propfind"
        /// 207 answers get more responses, with hrefs outside the collection, with `..` (plain
        /// and encoded), with an encoded `/`, and on another host.
        case foreignHrefs = "foreign-hrefs"
        /// Every href of a 207 answer is replaced by one outside the collection (`/../escaped`).
        case onlyForeignHrefs = "only-foreign-hrefs"
        /// GET: a Content-Length 1,000 bytes longer than the body, then the connection closed.
        case longerContentLength = "longer-content-length"
        /// GET: a Content-Length 10 bytes shorter than the body (all of it sent), then closed.
        case shorterContentLength = "shorter-content-length"
        /// GET and PROPFIND: the true Content-Length, half the body, then the connection closed.
        case closedMidBody = "closed-mid-body"
        /// GET and PROPFIND: a header line of 300 KiB.
        case hugeHeader = "huge-header"
        /// GET and PROPFIND: `Content-Length: 12abc`.
        case garbageContentLength = "garbage-content-length"
        /// A class-1 server: `OPTIONS` says `DAV: 1`, LOCK and UNLOCK are answered 405.
        case classOne = "class-one"
        /// PROPFIND: a 207 answer of more than 4 KiB is sent but for its last 64 bytes, which
        /// wait until the mode is another one (at most 60 s): a listing whose end is slow to come.
        case holdPropfindEnd = "hold-propfind-end"
        /// GET: `Content-Digest: sha-256=:…:` of the answer's body (D-495).
        case contentDigest = "content-digest"
        /// GET: the true body's Content-Digest, and one byte in the middle of the body flipped on
        /// the way.
        case contentDigestFlipped = "content-digest+flip-byte"
        /// GET: `OC-Checksum: SHA1:<hex>` of the whole file (the proxy reads it all from upstream),
        /// on every answer, a part's too (as Nextcloud).
        case ocChecksum = "oc-checksum"
        /// GET: the whole file's true OC-Checksum, one byte of the body flipped.
        case ocChecksumFlipped = "oc-checksum+flip-byte"
        /// GET: `Repr-Digest: sha-512=:…:` of the whole file.
        case reprDigest = "repr-digest"
        /// GET: the whole file's true Repr-Digest, one byte of the body flipped.
        case reprDigestFlipped = "repr-digest+flip-byte"
        /// GET: one byte of the body flipped, the headers as the server sent them (Apache's own
        /// Content-MD5 included).
        case flipByte = "flip-byte"
        /// GET: checksum headers that are not of their grammars (and the body as it is).
        case malformedChecksums = "malformed-checksums"
        /// GET: the whole file's true OC-Checksum, a byte flipped, and all of the body but its
        /// first 64 KiB held until the mode is another one (at most 60 s).
        case ocChecksumFlippedHeld = "oc-checksum+flip-byte+hold-get-body"
        /// GET, HEAD, PROPFIND and OPTIONS: answered `307` to the same path with `?moved` added
        /// (relative Location), which is passed on without the query.
        case redirect = "redirect"
        /// GET: `200` with an HTML page and no ETag or Last-Modified (a login portal, a proxy's
        /// error page).
        case htmlGet = "html-get"
        /// GET, HEAD, PROPFIND and OPTIONS: `302` to the same path, every time.
        case redirectLoop = "redirect-loop"
        /// GET, HEAD, PROPFIND and OPTIONS: `302` to `ftp://127.0.0.1:9/` (another protocol).
        case redirectToFTP = "redirect-ftp"
        /// GET, HEAD, PROPFIND and OPTIONS: `302` to the same path at the upstream server, in the
        /// clear (a `.tamperingTLS` proxy sending its client from https to http).
        case redirectToHTTP = "redirect-http"
        /// GET: answered 0.2 s late, so GETs a client sends together are answered together
        /// (`mostConcurrentGets` sees them whatever the machine's load).
        case slowGets = "slow-gets"
        /// PROPFIND: every collection in a 207 answer gets a CalendarServer `getctag`, the hash of
        /// the upstream server's Depth 1 answer for it (sorted responses): it changes when a
        /// child's ETag, size, date or name does, as a real ctag (D-518).
        case getctag = "getctag"
        /// PROPFIND: as `getctag`, but the hash takes in every collection below too, so a change
        /// at any depth changes the ctag of every ancestor (a server that promises it, D-525).
        case getctagTree = "getctag-tree"
        /// PROPFIND: every file in a 207 answer gets ownCloud's `oc:checksums`, `SHA1:… MD5:…
        /// ADLER32:…` of its upstream content (D-519).
        case ocChecksums = "oc-checksums"
        /// PROPFIND: `oc:checksums` of the right form but of other bytes (the content with "!"
        /// appended).
        case ocChecksumsWrong = "oc-checksums-wrong"
        /// PROPFIND as `ocChecksumsWrong`, GET as `contentDigest` (a true one).
        case ocChecksumsWrongWithContentDigest = "oc-checksums-wrong+content-digest"
        /// PROPFIND: `oc:checksums` that must all be ignored: outside the grammar, unknown
        /// algorithms, wrong digest lengths, longer than 1 KiB, and wrong ones in other
        /// namespaces or beside garbage in the same value.
        case ocChecksumsHostile = "oc-checksums-hostile"
    }

    /// The GET and PROPFIND requests a `.tampering` proxy passed on, oldest first: `GET <path>
    /// range=<Range header or -> want-content=<…> want-repr=<…>`, `PROPFIND <path> depth=<Depth>`.
    public func requestLog() -> [String] {
        (readTextFile(scratch + "/requests") ?? "").split(separator: "\n").map(String.init)
    }

    /// The most GETs a `.tampering` proxy was answering at once (from the request's arrival until
    /// its answer began to be sent: a client that has the whole answer is never still counted),
    /// 0 before the first.
    public func mostConcurrentGets() -> Int {
        Int((readTextFile(scratch + "/get-peak") ?? "").filter(\.isNumber)) ?? 0
    }

    /// Written by the tampering proxy once it holds its port.
    private var readyFile: String { scratch + "/ready" }
    private var waitsForReady: Bool {
        switch kind {
        case .tampering, .tamperingTLS: return true
        default: return false
        }
    }

    /// Sets how a `.tampering` proxy spoils the answers to requests from now on.
    public func tamper(_ tampering: Tampering) throws {
        try writeText(tampering.rawValue, to: scratch + "/tampering")
    }

    /// The directory served.
    public let root: String
    public let kind: Kind
    public private(set) var port: Int32 = 0
    public private(set) var process: ChildProcess?
    private let scratch: String

    /// Lines added to Apache's configuration (`.apache`), e.g. `ContentDigest On`.
    private let apacheDirectives: String

    /// Starts serving `root` (created if missing).
    public init(root: String, kind: Kind = .rclone(user: nil, password: nil), apacheDirectives: String = "") throws {
        self.root = root
        self.kind = kind
        self.apacheDirectives = apacheDirectives
        mkdir(root, 0o755)
        scratch = try makeTemporaryDirectory(prefix: "webdav-server")
        do {
            if case .apache = kind { try prepareApache() }
            try start()
        } catch {
            removeTreeWithinFileSystem(scratch)
            throw error
        }
    }

    deinit {
        stop()
        removeTreeWithinFileSystem(scratch)
    }

    /// `http://127.0.0.1:<port>/` (https for `.rcloneTLS`).
    public var url: String {
        switch kind {
        case .rcloneTLS, .tamperingTLS: return "https://127.0.0.1:\(port)/"
        default: break
        }
        return "http://127.0.0.1:\(port)/"
    }

    /// Starts the server again (after `stop`), on a new free port unless `samePort`.
    public func start(samePort: Bool = false) throws {
        var lastError = ""
        for _ in 0..<5 {
            if !samePort || port == 0 { port = try Self.freePort() }
            let (executable, arguments, environment) = try command()
            unlink(readyFile)
            let child = try ChildProcess(executable, arguments, environment: environment)
            let deadline = ContinuousClock.now + .seconds(15)
            while ContinuousClock.now < deadline {
                // The tampering proxy says it holds the port (another test's server may answer on
                // it when two took the same free port at once, and this one's bind failed).
                if Self.accepts(port), !waitsForReady || access(readyFile, F_OK) == 0 {
                    process = child
                    return
                }
                if child.poll() != nil { break }
                usleep(20_000)
            }
            lastError = child.standardError + (readTextFile(scratch + "/error.log") ?? "")
            Self.kill(Self.children(of: child.pid))
            child.signal(SIGKILL)
            child.wait(timeout: .seconds(5))
        }
        throw SystemCallError("start a test server on 127.0.0.1: \(lastError.suffix(500))", Errno(EADDRINUSE))
    }

    private func command() throws -> (String, [String], [String: String]) {
        switch kind {
        case .rclone, .rcloneTLS, .rcloneCachingListings:
            guard let rclone = WebDAVTestGate.rclone else {
                throw SystemCallError(WebDAVTestGate.problem ?? "rclone is missing", Errno(ENOENT))
            }
            // No rclone configuration of the user's; the password through the environment.
            var environment = ["RCLONE_CONFIG": scratch + "/rclone.conf"]
            // No directory cache: a change made in `root` behind the server's back is what the
            // next PROPFIND shows (rclone's VFS would otherwise serve its cached metadata for 5 min).
            var arguments = ["serve", "webdav", "--addr", "127.0.0.1:\(port)", root]
            if case .rcloneCachingListings = kind {} else { arguments += ["--dir-cache-time", "0s"] }
            if case .rclone(let user?, let password) = kind {
                arguments += ["--user", user]
                environment["RCLONE_PASS"] = password ?? ""
            }
            if case .rcloneTLS(let certificate, let key) = kind { arguments += ["--cert", certificate, "--key", key] }
            return (rclone, arguments, environment)
        case .apache:
            guard let apache = WebDAVTestGate.apache else {
                throw SystemCallError(WebDAVTestGate.problem ?? "apache2 is missing", Errno(ENOENT))
            }
            let configuration = scratch + "/httpd.conf"
            try writeText(apacheConfiguration(), to: configuration)
            return (apache, ["-f", configuration, "-DFOREGROUND"], [:])
        case .pythonStatic:
            guard let python = WebDAVTestGate.findExecutable("python3") else {
                throw SystemCallError("python3 is missing", Errno(ENOENT))
            }
            return (python, ["-m", "http.server", "--bind", "127.0.0.1", "--directory", root, "\(port)"], [:])
        case .busyProxy(let upstream, let passEvery):
            guard let python = WebDAVTestGate.findExecutable("python3") else {
                throw SystemCallError("python3 is missing", Errno(ENOENT))
            }
            let script = scratch + "/busy-proxy.py"
            try writeText(Self.busyProxyScript, to: script)
            return (python, [script, "\(port)", upstream, "\(passEvery)"], [:])
        case .tampering(let upstream), .tamperingTLS(let upstream, _, _):
            guard let python = WebDAVTestGate.findExecutable("python3") else {
                throw SystemCallError("python3 is missing", Errno(ENOENT))
            }
            let script = scratch + "/tampering-proxy.py"
            try writeText(Self.tamperingProxyScript, to: script)
            var arguments = [script, "\(port)", upstream, scratch + "/tampering"]
            if case .tamperingTLS(_, let certificate, let key) = kind { arguments += [certificate, key] }
            return (python, arguments, [:])
        }
    }

    /// The `tampering` server: HTTP/1.1, any method, forwarded to the upstream server, the answer
    /// spoiled per the mode file (`Tampering`).
    static let tamperingProxyScript = #"""
        import base64, hashlib, http.client, http.server, re, socket, sys, threading, time, urllib.parse, zlib
        port, upstream, modefile = int(sys.argv[1]), urllib.parse.urlsplit(sys.argv[2]), sys.argv[3]
        requests = modefile.rsplit('/', 1)[0] + '/requests'; peakfile = modefile.rsplit('/', 1)[0] + '/get-peak'
        lock = threading.Lock(); counter = [0]; gets = [0, 0]
        FOREIGN = ['/../escaped.txt', '/%2e%2e/escaped.txt', '/docs/..%2F..%2Fescaped.txt', '/docs%2Fescaped.txt',
                   '/docs/../../escaped.txt', 'http://127.0.0.2:9/escaped.txt', '/docs/nested/deeper.txt', '//escaped.txt']
        def entry(href):
            return ('<D:response><D:href>%s</D:href><D:propstat><D:prop><D:resourcetype/>'
                    '<D:getcontentlength>6</D:getcontentlength><D:getetag>"evil"</D:getetag></D:prop>'
                    '<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>' % href).encode()
        RESPONSE = re.compile(rb'<(?:[A-Za-z0-9]+:)?response\b.*?</(?:[A-Za-z0-9]+:)?response>', re.S)
        PROPSTAT = re.compile(rb'<(?:[A-Za-z0-9]+:)?propstat>.*?</(?:[A-Za-z0-9]+:)?propstat>', re.S)
        CS = b' xmlns:cs="http://calendarserver.org/ns/"'; OC = b' xmlns:oc="http://owncloud.org/ns"'
        PROPS = (b'<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:prop><D:resourcetype/><D:getetag/>'
                 b'<D:getcontentlength/><D:getlastmodified/></D:prop></D:propfind>')
        def upstream_request(method, path, headers=None, body=None):
            connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
            connection.request(method, path, body=body, headers=headers or {})
            data = connection.getresponse().read(); connection.close()
            return data
        def value(name, block):
            found = re.search(rb'<(?:[A-Za-z0-9]+:)?%s\b[^>]*>([^<]*)<' % name, block)
            return found.group(1) if found else b''
        def ctag(path, tree=False):
            # The children's names, ETags, sizes and dates (not the collection's own date: rclone
            # gives its root the time of asking), in any order the server lists them; `tree`: and
            # the ctag of every child collection, taken the same way.
            listing = upstream_request('PROPFIND', path, {'Depth': '1'}, PROPS)
            children = []
            for g in RESPONSE.finditer(listing):
                child = urllib.parse.urlsplit(value(b'href', g.group(0)).decode()).path
                if child == path: continue
                children.append(b' '.join([value(b'href', g.group(0)), value(b'getetag', g.group(0)),
                                           value(b'getcontentlength', g.group(0)), value(b'getlastmodified', g.group(0))]))
                if tree and re.search(rb'<(?:[A-Za-z0-9]+:)?collection\b', g.group(0)) is not None:
                    children.append(ctag(child, True).encode())
            return '"ctag-%s"' % hashlib.sha1(b'\n'.join(sorted(children))).hexdigest()
        def checksums(path, m):
            data = upstream_request('GET', path) + (b'!' if m == 'oc-checksums-wrong' else b'')
            if m == 'oc-checksums-hostile':
                wrong = hashlib.sha1(data + b'!').hexdigest()
                values = ['SHA1:nothex', 'CRC32:deadbeef', 'SHA1:' + wrong + ' garbage', 'MD5:' + wrong,
                          'SHA1:' + wrong + ' ' * 1000 + 'MD5:' + '0' * 32, 'SHA1:' + wrong[:-1], 'SHA1::' + wrong, '']
                return (b'<oc:checksums' + OC + b'>' + b''.join(b'<oc:checksum>%s</oc:checksum>' % v.encode()
                        for v in values) + b'</oc:checksums><x:checksums xmlns:x="http://example.com/ns">'
                        b'<x:checksum>SHA1:%s</x:checksum></x:checksums>' % wrong.encode())
            value = 'SHA1:%s MD5:%s ADLER32:%08x' % (hashlib.sha1(data).hexdigest(), hashlib.md5(data).hexdigest(),
                                                     zlib.adler32(data) & 0xffffffff)
            return b'<oc:checksums' + OC + b'><oc:checksum>' + value.encode() + b'</oc:checksum></oc:checksums>'
        def annotated(block, modes):
            href = re.search(rb'<(?:[A-Za-z0-9]+:)?href>([^<]*)<', block)
            if href is None: return block
            path = urllib.parse.urlsplit(href.group(1).decode()).path
            collection = re.search(rb'<(?:[A-Za-z0-9]+:)?collection\b', block) is not None
            if collection and ('getctag' in modes or 'getctag-tree' in modes):
                extra = b'<cs:getctag' + CS + b'>' + ctag(path, 'getctag-tree' in modes).encode() + b'</cs:getctag>'
            elif not collection and any(x.startswith('oc-checksums') for x in modes):
                extra = checksums(path, next(x for x in modes if x.startswith('oc-checksums')))
            else:
                return block
            for stat in PROPSTAT.finditer(block):
                if b' 200 ' in stat.group(0):
                    inner = re.sub(rb'(</(?:[A-Za-z0-9]+:)?prop>)', lambda g: extra + g.group(1), stat.group(0), count=1)
                    return block[:stat.start()] + inner + block[stat.end():]
            return block
        def mode():
            try:
                with open(modefile) as f: return f.read().strip()
            except OSError: return 'none'
        def fresh():
            with lock:
                counter[0] += 1
                return '"tag-%d"' % counter[0]
        class Proxy(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            def log_message(self, *args): pass
            def uncount(self):
                if getattr(self, 'counted', False):
                    self.counted = False
                    with lock: gets[0] -= 1
            def send_raw(self, status, headers, body, length=None, cut=None):
                self.uncount()
                head = 'HTTP/1.1 %d X\r\n' % status
                for k, v in headers: head += '%s: %s\r\n' % (k, v)
                head += 'Content-Length: %s\r\n\r\n' % (len(body) if length is None else length)
                self.wfile.write(head.encode()); self.wfile.write(body if cut is None else body[:cut])
                self.wfile.flush()
                if cut is not None or length is not None:
                    self.close_connection = True
                    try: self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError: pass
            def send_held(self, status, headers, body):
                self.uncount()
                head = 'HTTP/1.1 %d X\r\n' % status
                for k, v in headers: head += '%s: %s\r\n' % (k, v)
                head += 'Content-Length: %d\r\n\r\n' % len(body)
                self.wfile.write(head.encode()); self.wfile.write(body[:-64]); self.wfile.flush()
                for _ in range(3000):
                    if mode() != 'hold-propfind-end': break
                    time.sleep(0.02)
                self.wfile.write(body[-64:]); self.wfile.flush()
            def send_held_get(self, status, headers, body):
                self.uncount()
                head = 'HTTP/1.1 %d X\r\n' % status
                for k, v in headers: head += '%s: %s\r\n' % (k, v)
                head += 'Content-Length: %d\r\n\r\n' % len(body)
                self.wfile.write(head.encode()); self.wfile.write(body[:65536]); self.wfile.flush()
                for _ in range(3000):
                    if 'hold-get-body' not in mode().split('+'): break
                    time.sleep(0.02)
                self.wfile.write(body[65536:]); self.wfile.flush()
            def whole(self, headers):
                connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
                plain = {k: v for k, v in headers.items() if k.lower() not in ('range', 'if-match')}
                connection.request('GET', self.path, headers=plain)
                data = connection.getresponse().read(); connection.close()
                return data
            def answer(self):
                if self.command != 'GET': return self.answer_one()
                with lock:
                    gets[0] += 1; gets[1] = max(gets[1], gets[0])
                    with open(peakfile, 'w') as f: f.write(str(gets[1]))
                self.counted = True
                try: return self.answer_one()
                finally: self.uncount()
            def answer_one(self):
                m = mode(); method = self.command; modes = m.split('+')
                if method == 'GET':
                    with lock, open(requests, 'a') as log:
                        log.write('GET %s range=%s want-content=%s want-repr=%s\n' % (self.path,
                            self.headers.get('Range', '-'), self.headers.get('Want-Content-Digest', '-'),
                            self.headers.get('Want-Repr-Digest', '-')))
                    if 'slow-gets' in modes: time.sleep(0.2)
                if method == 'PROPFIND':
                    with lock, open(requests, 'a') as log:
                        log.write('PROPFIND %s depth=%s\n' % (self.path, self.headers.get('Depth', '-')))
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else None
                if m == 'html-propfind' and method == 'PROPFIND':
                    page = b'<!DOCTYPE html><html><body><h1>Down for maintenance</h1></body></html>'
                    return self.send_raw(200, [('Content-Type', 'text/html')], page)
                path, _, query = self.path.partition('?')
                if m.startswith('redirect') and method in ('GET', 'HEAD', 'PROPFIND', 'OPTIONS'):
                    target = {'redirect': None if query == 'moved' else path + '?moved', 'redirect-loop': self.path,
                              'redirect-ftp': 'ftp://127.0.0.1:9' + path,
                              'redirect-http': 'http://%s%s' % (upstream.netloc, path)}[m]
                    if target is not None:
                        return self.send_raw(307 if m == 'redirect' else 302, [('Location', target)], b'moved')
                    self.path = path
                if m == 'html-get' and method == 'GET':
                    page = b'<!DOCTYPE html><html><body><h1>Sign in to continue</h1></body></html>'
                    return self.send_raw(200, [('Content-Type', 'text/html')], page)
                if m == 'class-one' and method in ('LOCK', 'UNLOCK'):
                    allow = 'OPTIONS, GET, HEAD, PUT, DELETE, PROPFIND, PROPPATCH, MKCOL, COPY, MOVE'
                    return self.send_raw(405, [('Allow', allow)], b'')
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ('host', 'connection')}
                for k in [k for k in headers if k.lower() == 'destination']:
                    target = urllib.parse.urlsplit(headers[k])
                    headers[k] = target._replace(scheme=upstream.scheme, netloc=upstream.netloc).geturl()
                if m == 'etag-changed-on-get' and method == 'GET':
                    headers = {k: v for k, v in headers.items() if k.lower() != 'if-match'}
                connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
                connection.request(method, self.path, body=body, headers=headers)
                response = connection.getresponse(); data = response.read(); connection.close()
                out = [(k, v) for k, v in response.getheaders()
                       if k.lower() not in ('transfer-encoding', 'connection', 'content-length', 'keep-alive')]
                status = response.status
                if m == 'class-one' and method == 'OPTIONS':
                    out = [(k, v) for k, v in out if k.lower() != 'dav'] + [('DAV', '1')]
                if m == 'etag-changed-on-get' and method == 'GET':
                    out = [(k, v) for k, v in out if k.lower() != 'etag'] + [('ETag', fresh())]
                if m == 'etag-per-request':
                    out = [(k, v) for k, v in out if k.lower() != 'etag'] + [('ETag', fresh())]
                    data = re.sub(rb'(<[A-Za-z0-9]*:?getetag>)[^<]*(</)', lambda g: g.group(1) + fresh().encode() + g.group(2), data)
                if status == 207 and m == 'foreign-hrefs':
                    extra = b''.join(entry(h) for h in FOREIGN)
                    data = re.sub(rb'(</[A-Za-z0-9]*:?multistatus>)', lambda g: extra + g.group(1), data)
                if status == 207 and any(x.startswith('getctag') or x.startswith('oc-checksums') for x in modes):
                    data = RESPONSE.sub(lambda g: annotated(g.group(0), modes), data)
                if status == 207 and m == 'only-foreign-hrefs':
                    data = re.sub(rb'(<[A-Za-z0-9]*:?href>)[^<]*(</)', lambda g: g.group(1) + b'/../escaped.txt' + g.group(2), data)
                if method == 'GET' and status in (200, 206):
                    if 'content-digest' in modes:
                        out.append(('Content-Digest', 'sha-256=:%s:' % base64.b64encode(hashlib.sha256(data).digest()).decode()))
                    if 'oc-checksum' in modes:
                        out.append(('OC-Checksum', 'SHA1:' + hashlib.sha1(self.whole(headers)).hexdigest()))
                    if 'repr-digest' in modes:
                        out.append(('Repr-Digest', 'sha-512=:%s:' % base64.b64encode(hashlib.sha512(self.whole(headers)).digest()).decode()))
                    if 'malformed-checksums' in modes:
                        out += [('Content-Digest', 'sha-256=:not base64:'), ('Repr-Digest', 'SHA-256=:AAAA:'),
                                ('OC-Checksum', 'SHA1:xyz'), ('Digest', 'MD5'), ('Content-MD5', 'short')]
                    if 'flip-byte' in modes and data:
                        data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
                    if 'hold-get-body' in modes and len(data) > 65536:
                        return self.send_held_get(status, out, data)
                spoils = method in ('GET', 'PROPFIND')
                if method == 'GET' and m == 'longer-content-length':
                    return self.send_raw(status, out, data, length=len(data) + 1000)
                if method == 'GET' and m == 'shorter-content-length':
                    return self.send_raw(status, out, data, length=max(0, len(data) - 10))
                if spoils and m == 'closed-mid-body':
                    return self.send_raw(status, out, data, cut=len(data) // 2)
                if spoils and m == 'huge-header':
                    out.append(('X-Filler', 'a' * (300 << 10)))
                if status == 207 and m == 'hold-propfind-end' and len(data) > 4096:
                    return self.send_held(status, out, data)
                if spoils and m == 'garbage-content-length':
                    return self.send_raw(status, out, data, length='12abc')
                self.send_raw(status, out, data if method != 'HEAD' else b'')
            do_GET = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = do_PROPFIND = do_MKCOL = do_MOVE = do_COPY = answer
            do_LOCK = do_UNLOCK = do_PROPPATCH = do_POST = answer
        server = http.server.ThreadingHTTPServer(('127.0.0.1', port), Proxy)
        if len(sys.argv) > 5:
            import ssl
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); tls.load_cert_chain(sys.argv[4], sys.argv[5])
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        open(modefile.rsplit('/', 1)[0] + '/ready', 'w').close()
        server.serve_forever()
        """#

    /// The `busyProxy` server: HTTP/1.1, any method, bodies forwarded both ways.
    static let busyProxyScript = """
        import http.client, http.server, sys, threading, urllib.parse
        port, upstream, every = int(sys.argv[1]), urllib.parse.urlsplit(sys.argv[2]), int(sys.argv[3])
        lock = threading.Lock(); seen = {}
        class Proxy(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            def log_message(self, *args): pass
            def answer(self):
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else None
                with lock:
                    key = (self.command, self.path)
                    seen[key] = seen.get(key, 0) + 1
                    busy = every == 0 or seen[key] % every != 0
                if busy:
                    self.send_response(503); self.send_header('Retry-After', '0')
                    self.send_header('Content-Length', '0'); self.end_headers(); return
                connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ('host', 'connection')}
                for k in [k for k in headers if k.lower() == 'destination']:
                    target = urllib.parse.urlsplit(headers[k])
                    headers[k] = target._replace(scheme=upstream.scheme, netloc=upstream.netloc).geturl()
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse(); data = response.read(); connection.close()
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ('transfer-encoding', 'connection', 'content-length', 'keep-alive'):
                        self.send_header(k, v)
                self.send_header('Content-Length', str(len(data))); self.end_headers()
                if self.command != 'HEAD': self.wfile.write(data)
            do_GET = do_HEAD = do_PUT = do_DELETE = do_OPTIONS = do_PROPFIND = do_MKCOL = do_MOVE = do_COPY = answer
            do_LOCK = do_UNLOCK = do_PROPPATCH = do_POST = answer
        http.server.ThreadingHTTPServer(('127.0.0.1', port), Proxy).serve_forever()
        """

    /// Stops the server by its PID: SIGTERM, then SIGKILL after 5 s (Apache's workers with it).
    /// Safe to call more than once.
    public func stop() {
        guard let process else { return }
        self.process = nil
        let workers = Self.children(of: process.pid)
        process.signal(SIGTERM)
        if process.wait(timeout: .seconds(5)) == nil { Self.killStopped(process, with: workers) }
        Self.kill(workers)
    }

    /// Kills the server at once (SIGKILL, its workers with it): its connections break mid-answer.
    public func kill() {
        guard let process else { return }
        self.process = nil
        Self.killStopped(process, with: [])
    }

    /// SIGKILLs `process` and its children. It is stopped (SIGSTOP) first and its children are
    /// listed only once it is: Apache's parent forks a new worker for each one that dies, and a
    /// worker forked after the list was read would outlive it, still accepting on its port.
    private static func killStopped(_ process: ChildProcess, with known: [ProcessIdentity]) {
        process.signal(SIGSTOP)
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, process.isRunning, ProcessInfoFiles.state(of: "\(process.pid)") != "T" {
            usleep(1000)
        }
        kill(known + children(of: process.pid))
        process.signal(SIGKILL)
        process.wait(timeout: .seconds(5))
    }

    /// One process for the life of the system: its PID and when it started (a PID the kernel
    /// gives again, to another test's server say, names a process that started later).
    public struct ProcessIdentity: Hashable, Sendable, CustomStringConvertible {
        public let pid: Int32
        public let startTime: UInt64

        /// The process with `pid` now; nil when there is none.
        public init?(_ pid: Int32) {
            guard let startTime = ProcessInfoFiles.startTime(of: pid) else { return nil }
            self.pid = pid
            self.startTime = startTime
        }

        /// Whether this very process still runs (not gone, not a zombie, not a later one with its PID).
        public var isRunning: Bool { ProcessInfoFiles.isRunning(pid, startedAt: startTime) }

        public var description: String { "pid \(pid) (started at tick \(startTime))" }
    }

    /// The processes whose parent is `pid` (Apache's workers), from /proc.
    public static func children(of pid: Int32) -> [ProcessIdentity] {
        guard let stream = opendir("/proc") else { return [] }
        defer { closedir(stream) }
        var found: [ProcessIdentity] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard let candidate = Int32(name), ProcessInfoFiles.parentProcess(of: candidate) == pid,
                let process = ProcessIdentity(candidate)
            else { continue }
            found.append(process)
        }
        return found
    }

    /// SIGKILLs `processes` that still run (a PID given again to another process is left alone)
    /// and waits (up to 5 s) until none runs (a zombie waiting for its parent's reaper runs nothing).
    static func kill(_ processes: [ProcessIdentity]) {
        for process in processes where process.isRunning { Glibc.kill(process.pid, SIGKILL) }
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, processes.contains(where: \.isRunning) { usleep(10_000) }
    }

    // MARK: Apache

    /// Whether Apache's workers run as `nobody` (the tests run as root).
    private var apacheDropsPrivileges: Bool { geteuid() == 0 }

    /// Makes the served tree and the lock database's directory usable by the workers: under root
    /// they run as `nobody`, which must search the ancestors (mkdtemp makes them 0700) and own
    /// what it writes.
    private func prepareApache() throws {
        guard WebDAVTestGate.apache != nil else {
            throw SystemCallError(WebDAVTestGate.problem ?? "apache2 is missing", Errno(ENOENT))
        }
        mkdir(scratch + "/lock", 0o755)
        guard apacheDropsPrivileges else { return }
        var ancestor = root
        while let slash = ancestor.lastIndex(of: "/"), slash != ancestor.startIndex {
            ancestor = String(ancestor[..<slash])
            var info = stat()
            if stat(ancestor, &info) == 0, info.st_mode & S_IXOTH == 0 {
                chmod(ancestor, (info.st_mode & 0o7777) | 0o711)
            }
        }
        chmod(scratch, 0o711)
        let given = try ChildProcess.run("/bin/chown", ["-R", "nobody:nogroup", root, scratch + "/lock"])
        guard given.status == 0 else { throw SystemCallError("chown nobody \(root): \(given.error)", Errno(EPERM)) }
    }

    private func apacheConfiguration() -> String {
        let modules = WebDAVTestGate.apacheModules
        let user = apacheDropsPrivileges ? "User nobody\nGroup nogroup\n" : ""
        return """
            ServerRoot "\(scratch)"
            ServerName 127.0.0.1
            Listen 127.0.0.1:\(port)
            PidFile "\(scratch)/httpd.pid"
            DefaultRuntimeDir "\(scratch)"
            Mutex file:\(scratch)
            ErrorLog "\(scratch)/error.log"
            LogLevel warn
            \(user)LoadModule mpm_event_module \(modules)/mod_mpm_event.so
            LoadModule authz_core_module \(modules)/mod_authz_core.so
            LoadModule dav_module \(modules)/mod_dav.so
            LoadModule dav_fs_module \(modules)/mod_dav_fs.so
            StartServers 1
            ServerLimit 2
            ThreadsPerChild 8
            MaxRequestWorkers 16
            MinSpareThreads 1
            MaxSpareThreads 16
            DocumentRoot "\(root)"
            DavLockDB "\(scratch)/lock/DavLock"
            \(apacheDirectives)
            <Directory "/">
              AllowOverride None
              Require all denied
            </Directory>
            <Directory "\(root)">
              Dav On
              Require all granted
            </Directory>

            """
    }

    /// A port for a test server: one that no other server of this process was given, outside
    /// the kernel's ephemeral range, and free right now (a bind to it succeeds). A server stopped
    /// and started again keeps its port (`start(samePort:)`): had it come from a bind to port 0,
    /// the kernel could give it to another test's server while this one is stopped, and that
    /// server would answer on it (a test checking that nothing accepts on it failed now and then).
    /// Ports from the ephemeral range (any bind to port 0, every client socket, the scenario
    /// scripts' servers) never fall here, and none is handed out twice.
    public static func freePort() throws -> Int32 {
        let range = portsOutsideEphemeralRange()
        return try givenPorts.withLock { given in
            let width = range.upperBound - range.lowerBound
            let start = Int32.random(in: 0..<width)
            for step in 0..<width {
                let port = range.lowerBound + (start + step) % width
                guard !given.contains(port), bindable(port) else { continue }
                given.insert(port)
                return port
            }
            throw SystemCallError("no free port in \(range) on 127.0.0.1", Errno(EADDRINUSE))
        }
    }

    /// The ports `freePort` gave in this process.
    private static let givenPorts = Locked<Set<Int32>>([])

    /// The larger of the ranges below and above `net.ipv4.ip_local_port_range` (from 10000 up):
    /// 10000..<32768 with Linux's default 32768–60999.
    static func portsOutsideEphemeralRange() -> Range<Int32> {
        let bounds = (readTextFile("/proc/sys/net/ipv4/ip_local_port_range") ?? "")
            .split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int32($0) }
        let (low, high) = bounds.count == 2 ? (bounds[0], bounds[1]) : (32768, 60999)
        let below: Range<Int32> = 10000..<max(10001, low)
        let above: Range<Int32> = min(high + 1, 65535)..<65536
        return below.count >= above.count ? below : above
    }

    /// Whether a socket can bind 127.0.0.1:`port` now (no listener, no connection on it).
    private static func bindable(_ port: Int32) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port`.
    public static func accepts(_ port: Int32) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    private static func loopback(port: Int32) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return address
    }
}

/// Writes `text` to `path` (created or truncated).
private func writeText(_ text: String, to path: String) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw SystemCallError("open \(path)") }
    defer { close(fd) }
    let bytes = Array(text.utf8)
    if case .failure(let error) = bytes.withUnsafeBytes({
        writeFully(fd, from: $0.baseAddress!, count: $0.count, at: 0)
    }) {
        throw error
    }
}
