// The write claims of write handles through the mount (issue 14, D-399): the same embedded
// coordination server and claim table as `MountReadClaims`, kind `.write`, taken at the write
// open and held until the handle's release. Ending one makes the arbiter send
// presentedItemDidChange to the item's presenters.

import FileCoordination
import SystemSupport
package import VirtualFileSystem

extension MountReadClaims: WriteClaimProvider {
    package func acquireWriteClaim(_ request: ReadClaimRequest) async throws(FileSystemError) -> WriteClaimToken {
        let (path, pid) = claimTarget(of: request)
        let claim: KernelClaim
        do {
            claim = try await server.claim(path, kind: .write, onBehalfOf: pid, deadline: deadline)
        } catch {
            throw Self.fileSystemError(error, path: path)
        }
        return WriteClaimToken(rawValue: holdClaim(claim, writes: true))
    }

    package func acquireWriteClaimNow(_ request: ReadClaimRequest) -> WriteClaimToken? {
        let (path, pid) = claimTarget(of: request)
        guard let claim = server.claimNow(path, kind: .write, onBehalfOf: pid) else { return nil }
        return WriteClaimToken(rawValue: holdClaim(claim, writes: true))
    }

    package func releaseWriteClaim(_ token: WriteClaimToken) {
        releaseReadClaim(ReadClaimToken(rawValue: token.rawValue))
    }
}
