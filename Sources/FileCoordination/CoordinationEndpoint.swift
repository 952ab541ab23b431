// Where a domain's claims and presenters go: the endpoint protocol, the delegate it reports to,
// and the in-process endpoint (`LocalEndpoint`); the socket one is `ServerLink`.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where claims and presenters of a domain go.
protocol CoordinationEndpoint: AnyObject, Sendable {
    func submit(
        local: UInt64, purpose: String, intents: [ClaimIntent], heldByCaller: [UInt64], waitTimeout: UInt64,
        presenterTimeout: UInt64)
    func release(local: UInt64)
    func cancel(local: UInt64)
    func addPresenter(local: UInt64, purpose: String, item: ResolvedItem, methods: PresenterMethods)
    func removePresenter(local: UInt64)
    func reply(messageID: UInt64, error: String?)
    func itemMoved(from: String, to: String, purpose: String)
    func versionChanged(path: String, change: VersionChange, version: String, versionName: String)
    /// Someone needs messages from this endpoint without waiting on a thread for them (a
    /// presenter, an async claim, a claim cancelled before its answer): +1 / -1.
    func changeReaderDemand(by delta: Int)
    /// Blocks until `waiter` has a result; the endpoint may read the answer on this thread. Nil
    /// when the endpoint died first: the domain then resubmits the claim elsewhere or fails it.
    func wait(for waiter: Waiter) -> Result<[String], CoordinationError>?
    /// Whether the endpoint is gone (its connection broke); never for an in-process one.
    var isLost: Bool { get }
    /// The socket of the server; nil in-process. Claims of a dead server move only to the next
    /// server on the same socket: only it has the dead one's holders file (D-402).
    var address: String? { get }
    /// This connection as a holder of claims, for a successor server (D-402); nil in-process.
    var holderKey: ClaimHolder? { get }
    /// Re-establishes claims held under the dead server as `previous` (D-402).
    func reclaim(previous: ClaimHolder, claims: [ReclaimedClaim])
    /// This endpoint's claims are for process `pid` from now on (D-406).
    func holdFor(pid: Int32, startTime: UInt64)
    /// Whether the server has handled everything sent on this endpoint so far, waiting at most
    /// `milliseconds` for it to say so (a round trip); always true in-process.
    func confirmReceived(milliseconds: Int) -> Bool
    /// Whether this is the coordination server of a ProviderFS mount: reads of its items get
    /// their content before the accessor runs (rules 50–52).
    var servesProviderMount: Bool { get }
    /// The descriptor whose last close ends this endpoint's claims (the server sees EOF), or nil
    /// when claims live in this process. A child that inherits it keeps the claims alive (D-136).
    var claimDescriptor: Int32? { get }
}

/// How an endpoint reports back to its domain.
protocol EndpointDelegate: AnyObject, Sendable {
    func granted(local: UInt64, paths: [String])
    func failed(local: UInt64, error: CoordinationError)
    func deliver(presenter local: UInt64, messageID: UInt64, message: PresenterMessage, claim: ClaimID?)
    func endpointLost(_ endpoint: any CoordinationEndpoint)
}

/// Forwards endpoint callbacks to a domain without a reference cycle.
final class DelegateBox: EndpointDelegate, @unchecked Sendable {
    // Safe: `domain` is set once, right after the domain is initialised, before any endpoint can
    // call back, and never changed.
    weak var domain: CoordinationDomain?
    func granted(local: UInt64, paths: [String]) { domain?.granted(local: local, paths: paths) }
    func failed(local: UInt64, error: CoordinationError) { domain?.failed(local: local, error: error) }
    func deliver(presenter local: UInt64, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        domain?.deliver(presenter: local, messageID: messageID, message: message, claim: claim)
    }
    func endpointLost(_ endpoint: any CoordinationEndpoint) { domain?.endpointLost(endpoint) }
}

/// An endpoint in this process: the domain is one owner of an `ArbiterHost`.
final class LocalEndpoint: CoordinationEndpoint, ArbiterSink, @unchecked Sendable {
    // Safe: `owner` is set once in init before the endpoint is shared; the rest is immutable.
    let host: ArbiterHost
    private(set) var owner: UInt64 = 0
    let delegate: any EndpointDelegate
    let pid = getpid()

    init(host: ArbiterHost, delegate: any EndpointDelegate) {
        self.host = host
        self.delegate = delegate
        owner = host.addOwner(self)
    }

    func submit(
        local: UInt64, purpose: String, intents: [ClaimIntent], heldByCaller: [UInt64], waitTimeout: UInt64,
        presenterTimeout: UInt64
    ) {
        let now = host.now
        host.submit(
            ClaimRequest(
                id: ClaimID(owner: owner, local: local), pid: pid, purpose: purpose, intents: intents,
                heldByCaller: heldByCaller.map { ClaimID(owner: owner, local: $0) },
                waitDeadline: now &+ waitTimeout, presenterTimeout: presenterTimeout))
    }
    func release(local: UInt64) { host.release(ClaimID(owner: owner, local: local)) }
    func cancel(local: UInt64) { host.cancel(ClaimID(owner: owner, local: local)) }
    func addPresenter(local: UInt64, purpose: String, item: ResolvedItem, methods: PresenterMethods) {
        host.addPresenter(
            PresenterRegistration(
                id: PresenterID(owner: owner, local: local), pid: pid, purpose: purpose, path: item.path,
                identity: item.identity, isDirectory: item.isDirectory, packageRoot: item.packageRoot,
                methods: methods))
    }
    func removePresenter(local: UInt64) { host.removePresenter(PresenterID(owner: owner, local: local)) }
    func reply(messageID: UInt64, error: String?) { host.reply(messageID: messageID, error: error, from: owner) }
    func itemMoved(from: String, to: String, purpose: String) {
        host.itemMoved(from: from, to: to, purpose: purpose)
    }
    func versionChanged(path: String, change: VersionChange, version: String, versionName: String) {
        host.versionChanged(path: path, change: change, version: version, versionName: versionName)
    }
    func changeReaderDemand(by delta: Int) {}  // actions arrive on the acting thread
    func wait(for waiter: Waiter) -> Result<[String], CoordinationError>? { waiter.wait() }
    var holderKey: ClaimHolder? { nil }
    var isLost: Bool { false }
    var address: String? { nil }
    func reclaim(previous: ClaimHolder, claims: [ReclaimedClaim]) {}
    func holdFor(pid: Int32, startTime: UInt64) { host.holdFor(owner, pid: pid) }
    func confirmReceived(milliseconds: Int) -> Bool { true }  // handled on the calling thread
    var servesProviderMount: Bool { false }
    var claimDescriptor: Int32? { nil }

    func granted(_ claim: ClaimID, paths: [String]) { delegate.granted(local: claim.local, paths: paths) }
    func failed(_ claim: ClaimID, error: CoordinationError) { delegate.failed(local: claim.local, error: error) }
    func deliver(_ presenter: PresenterID, messageID: UInt64, message: PresenterMessage, claim: ClaimID?) {
        delegate.deliver(presenter: presenter.local, messageID: messageID, message: message, claim: claim)
    }
}
