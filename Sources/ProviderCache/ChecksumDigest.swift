// The digest a checksummed fetch is hashed with: the algorithm the stream states (D-495).

import CryptoSupport
import ProviderModel

extension Digest {
    /// A digest in `algorithm` (every `ContentChecksum.Algorithm` has its `Digest.Kind`).
    init(_ algorithm: ContentChecksum.Algorithm) {
        switch algorithm {
        case .sha256: self.init(Digest.Kind.sha256)
        case .sha512: self.init(Digest.Kind.sha512)
        case .sha1: self.init(Digest.Kind.sha1)
        case .md5: self.init(Digest.Kind.md5)
        case .adler32: self.init(Digest.Kind.adler32)
        }
    }
}
