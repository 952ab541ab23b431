// The digests a server may state for content (D-495): SHA-256, SHA-512, SHA-1 and MD5 through
// libcrypto (each fetched once, as SHA-256 is), and Adler-32 (zlib's checksum, RFC 1950 §9),
// which is no cryptography and which libcrypto does not have: a few additions, written here.

import CLibCrypto

nonisolated(unsafe) private let sha512Algorithm: OpaquePointer? = EVP_MD_fetch(nil, "SHA512", nil) ?? EVP_sha512()
nonisolated(unsafe) private let sha1Algorithm: OpaquePointer? = EVP_MD_fetch(nil, "SHA1", nil) ?? EVP_sha1()
nonisolated(unsafe) private let md5Algorithm: OpaquePointer? = EVP_MD_fetch(nil, "MD5", nil) ?? EVP_md5()
nonisolated(unsafe) private let sha256Fetched: OpaquePointer? = EVP_MD_fetch(nil, "SHA256", nil) ?? EVP_sha256()

/// A streaming digest of one of `Kind`: `update` with successive pieces, `finalize` once. Not
/// shared between threads (one owner feeds it), but may move between them.
public struct Digest: ~Copyable, @unchecked Sendable {
    // Safe: the context is owned by this non-copyable value and used by one owner at a time.
    public enum Kind: Sendable, Hashable, CaseIterable {
        case sha256, sha512, sha1, md5, adler32

        /// The digest's length in bytes.
        public var length: Int {
            switch self {
            case .sha256: 32
            case .sha512: 64
            case .sha1: 20
            case .md5: 16
            case .adler32: 4
            }
        }
    }

    public let kind: Kind
    /// libcrypto's context; nil for Adler-32.
    private let context: OpaquePointer?
    /// Adler-32's two sums (RFC 1950: a starts at 1).
    private var a: UInt32 = 1
    private var b: UInt32 = 0

    public init(_ kind: Kind) {
        self.kind = kind
        let algorithm: OpaquePointer?
        switch kind {
        case .sha256: algorithm = sha256Fetched
        case .sha512: algorithm = sha512Algorithm
        case .sha1: algorithm = sha1Algorithm
        case .md5: algorithm = md5Algorithm
        case .adler32:
            context = nil
            return
        }
        guard let context = EVP_MD_CTX_new(), EVP_DigestInit_ex(context, algorithm, nil) == 1 else {
            fatalError("libcrypto cannot create a \(kind) context")
        }
        self.context = context
    }

    deinit { if let context { EVP_MD_CTX_free(context) } }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard let context else {
            // Sums reduced modulo 65521 at least every 5552 bytes, before b can overflow (zlib's NMAX).
            var index = 0
            while index < bytes.count {
                let end = min(bytes.count, index + 5552)
                while index < end {
                    a &+= UInt32(bytes[index])
                    b &+= a
                    index += 1
                }
                a %= 65521
                b %= 65521
            }
            return
        }
        _ = EVP_DigestUpdate(context, base, bytes.count)
    }

    public mutating func update(_ bytes: [UInt8]) { bytes.withUnsafeBytes { update($0) } }

    /// The digest of everything fed so far (`kind.length` bytes; Adler-32 big-endian). Ends it.
    public consuming func finalize() -> [UInt8] {
        guard let context else {
            let sum = b << 16 | a
            return [UInt8(sum >> 24), UInt8(sum >> 16 & 0xFF), UInt8(sum >> 8 & 0xFF), UInt8(sum & 0xFF)]
        }
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        _ = digest.withUnsafeMutableBufferPointer { EVP_DigestFinal_ex(context, $0.baseAddress, &length) }
        return Array(digest.prefix(Int(length)))
    }

    /// The digest of `bytes`.
    public static func hash(_ kind: Kind, _ bytes: [UInt8]) -> [UInt8] {
        var digest = Digest(kind)
        digest.update(bytes)
        return digest.finalize()
    }
}
