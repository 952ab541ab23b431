import ControlWire
import Foundation
import Testing

@testable import ProviderFSCommands

@Suite("The ScopedAccess control requests: arguments")
struct ItemAccessRequestTests {
    func parse(_ json: String) -> Result<ControlRequest, ControlError> {
        ControlProtocol.parseRequest(Array(json.utf8)).request
    }

    func code(_ json: String) -> ControlError.Code? {
        guard case .failure(let error) = parse(json) else { return nil }
        return error.code
    }

    @Test func requestsRoundTripThroughTheParser() throws {
        let requests: [ControlRequest] = [
            .tokenDerive(token: "pfs_abcdefgh_x"), .tokenRelease(token: "pfs_abcdefgh_y"),
            .identifyItem(ItemLocator(token: nil, path: "docs/a.txt")),
            .identifyItem(ItemLocator(token: "pfs_t", path: "inner/a.txt")),
            .resolveItem(
                ItemIdentity(token: "pfs_t", identifier: "docs/a.txt", fingerprint: "i12", path: "docs/a.txt")),
            .resolveItem(ItemIdentity(identifier: "")),
        ]
        for request in requests {
            var reader = ControlFrameReader()
            reader.append(ControlProtocol.requestFrame(id: 7, request))
            let payload = try #require(try reader.next())
            #expect(try ControlProtocol.parseRequest(payload).request.get() == request)
        }
    }

    @Test func badArgumentsAreNamedErrors() {
        let head = "{\"version\":1,\"request\":"
        #expect(code(head + "\"tokenDerive\",\"arguments\":{}}") == .invalidArguments)
        #expect(code(head + "\"tokenDerive\",\"arguments\":{\"token\":5}}") == .invalidArguments)
        #expect(code(head + "\"tokenDerive\",\"arguments\":{\"token\":\"\"}}") == .invalidArguments)
        let long = String(repeating: "a", count: 300)
        #expect(code(head + "\"tokenRelease\",\"arguments\":{\"token\":\"\(long)\"}}") == .invalidArguments)
        #expect(code(head + "\"tokenDerive\",\"arguments\":{\"token\":\"t\",\"pid\":1}}") == .invalidArguments)
        #expect(code(head + "\"identifyItem\",\"arguments\":{\"path\":\"../x\"}}") == .invalidArguments)
        #expect(code(head + "\"identifyItem\",\"arguments\":{\"path\":\".scoped/pfs_x/a\"}}") == .invalidArguments)
        #expect(code(head + "\"resolveItem\",\"arguments\":{\"path\":\"a\"}}") == .invalidArguments)
        #expect(
            code(head + "\"resolveItem\",\"arguments\":{\"identifier\":\"a\",\"fingerprint\":\"\"}}")
                == .invalidArguments)
        #expect(
            code(head + "\"resolveItem\",\"arguments\":{\"identifier\":\"a\",\"path\":\"/etc\"}}") == .invalidArguments)
    }
}
