// Require-token mode on the control socket (D-319): requests that reach plain items need the
// owner's providerfs command; requests that present a token are for any program of the owner.

import ControlWire
import SystemSupport
import Testing
import VirtualFileSystem

@testable import ProviderFSCommands

/// Allows only thread 42.
private struct OnlyThread42: PlainPathPolicy {
    func decide(_ context: RequestContext) -> PlainPathDecision {
        context.threadID == 42 ? .allowed : .refused(reason: "thread \(context.threadID) is not a providerfs command")
    }
}

@Suite("Require-token mode on the control socket")
struct RequireTokenControlTests {
    let command = UnixSocket.PeerCredentials(pid: 42, uid: 1000, gid: 1000)
    let app = UnixSocket.PeerCredentials(pid: 7, uid: 1000, gid: 1000)

    @Test func plainRequestsNeedTheOwnersCommandTokenRequestsDoNot() {
        let plain: [ControlRequest] = [
            .status, .item(path: "a"), .download(path: "a"), .faultList, .faultClear(path: nil),
            .tokenGrant(TokenGrantRequest(path: "a", write: false, ttlMilliseconds: nil, pid: nil, uses: nil)),
            .tokenList(includeEnded: false), .tokenRevoke(id: "x"), .tokenExpire(id: "x"), .tokenLog(after: 0),
            .identifyItem(ItemLocator(token: nil, path: "a")), .resolveItem(ItemIdentity(identifier: "a")),
        ]
        for request in plain {
            let refusal = MountControl.requireTokenRefusal(request, peer: app, policy: OnlyThread42())
            #expect(refusal?.code == .permissionDenied, "\(request.kind)")
            #expect(refusal?.message.contains("require-token") == true)
            #expect(MountControl.requireTokenRefusal(request, peer: command, policy: OnlyThread42()) == nil)
            #expect(MountControl.requireTokenRefusal(request, peer: app, policy: nil) == nil, "not in the mode")
        }
        let withToken: [ControlRequest] = [
            .tokenDerive(token: "pfs_t"), .tokenRelease(token: "pfs_t"),
            .identifyItem(ItemLocator(token: "pfs_t", path: "a")),
            .resolveItem(ItemIdentity(token: "pfs_t", identifier: "a")),
        ]
        for request in withToken {
            #expect(
                MountControl.requireTokenRefusal(request, peer: app, policy: OnlyThread42()) == nil, "\(request.kind)")
        }
    }
}
