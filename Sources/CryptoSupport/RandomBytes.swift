// Random bytes from libcrypto's generator (RAND_bytes), which OpenSSL seeds from the kernel's
// random source (getrandom). For secrets: access tokens, their salt, their public ids.

import CLibCrypto

/// `count` bytes from RAND_bytes. A generator that cannot answer stops the process: a secret made
/// from anything weaker must never be handed out.
public func randomBytes(_ count: Int) -> [UInt8] {
    precondition(count >= 0, "randomBytes: negative count \(count)")
    var bytes = [UInt8](repeating: 0, count: count)
    guard count > 0 else { return bytes }
    let rc = bytes.withUnsafeMutableBufferPointer { RAND_bytes($0.baseAddress, Int32($0.count)) }
    guard rc == 1 else { fatalError("libcrypto RAND_bytes failed (\(rc)): no random source, refusing to go on") }
    return bytes
}
