// Digests through OpenSSL's libcrypto (never hand-written cryptography): content checksums of the
// cache and the fault wrapper, and the access tokens' salted hashes (AccessTokens).

import CLibCrypto

/// A streaming SHA-256: `update` with successive pieces, `finalize` once. Not shared between
/// threads (one owner feeds it), but may move between them.
///
/// libcrypto's SHA256_Init/Update/Final (the shim's wrappers), not EVP: an EVP digest starts
/// OpenSSL's provider machinery at its first fetch (its configuration, every algorithm's name
/// registered), ~6M instructions, paid by every short-lived process that hashes once: a
/// reading-list import (D-533). The same assembly does the hashing either way.
public struct SHA256: ~Copyable, @unchecked Sendable {
    // Safe: the context is owned by this non-copyable value and used by one owner at a time.
    private let context: UnsafeMutablePointer<SHA256_CTX>

    public init() {
        context = .allocate(capacity: 1)
        guard clibcrypto_sha256_init(context) == 1 else { fatalError("libcrypto cannot start a SHA-256") }
    }

    deinit { context.deallocate() }

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        _ = clibcrypto_sha256_update(context, base, bytes.count)
    }

    public mutating func update(_ bytes: [UInt8]) { bytes.withUnsafeBytes { update($0) } }

    /// The 32-byte digest of everything fed so far. Ends the hasher.
    public consuming func finalize() -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        _ = digest.withUnsafeMutableBufferPointer { clibcrypto_sha256_final($0.baseAddress, context) }
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
