// Digests through OpenSSL's libcrypto (never hand-written cryptography): content checksums of the
// cache and the fault wrapper, and the access tokens' salted hashes (AccessTokens).

import CLibCrypto

/// SHA-256 fetched from the default provider once: `EVP_sha256()` makes every `EVP_DigestInit_ex`
/// fetch it again (OpenSSL 3's implicit fetch, a lock and a lookup per hash; access-path checks
/// hash on every request). Never freed: it lives as long as the process.
nonisolated(unsafe) private let sha256Algorithm: OpaquePointer? = EVP_MD_fetch(nil, "SHA256", nil) ?? EVP_sha256()

/// A streaming SHA-256: `update` with successive pieces, `finalize` once. Not shared between
/// threads (one owner feeds it), but may move between them.
public struct SHA256: ~Copyable, @unchecked Sendable {
    // Safe: the context is owned by this non-copyable value and used by one owner at a time.
    private let context: OpaquePointer

    public init() {
        guard let context = EVP_MD_CTX_new(), EVP_DigestInit_ex(context, sha256Algorithm, nil) == 1 else {
            fatalError("libcrypto cannot create a SHA-256 context")
        }
        self.context = context
    }

    deinit { EVP_MD_CTX_free(context) }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        _ = EVP_DigestUpdate(context, base, bytes.count)
    }

    public mutating func update(_ bytes: [UInt8]) { bytes.withUnsafeBytes { update($0) } }

    /// The 32-byte digest of everything fed so far. Ends the hasher.
    public consuming func finalize() -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        _ = digest.withUnsafeMutableBufferPointer { EVP_DigestFinal_ex(context, $0.baseAddress, &length) }
        return digest
    }

    /// The digest of `bytes`.
    public static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(bytes)
        return hasher.finalize()
    }
}

/// Compares two byte strings in time that depends only on their lengths (CRYPTO_memcmp).
public func constantTimeEquals(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
    guard lhs.count == rhs.count else { return false }
    if lhs.isEmpty { return true }
    return lhs.withUnsafeBytes { left in
        rhs.withUnsafeBytes { right in CRYPTO_memcmp(left.baseAddress, right.baseAddress, lhs.count) == 0 }
    }
}

/// Lowercase hexadecimal, two digits per byte.
public func hexString(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var text = [UInt8]()
    text.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        text.append(digits[Int(byte >> 4)])
        text.append(digits[Int(byte & 0xF)])
    }
    return String(decoding: text, as: UTF8.self)
}
