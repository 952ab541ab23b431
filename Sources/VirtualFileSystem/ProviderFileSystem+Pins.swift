// Pin states in the file system (issue 27 item 2, D-445): `providerfs pin`, `unpin`, `pin
// --inherit` through the control socket (by path), and `user.providerfs.pin` for ordinary tools
// (getfattr shows it, setfattr sets it: setting `unpinned` evicts, as `providerfs unpin` does;
// removing it is `inherited`). `user.providerfs.policy` shows the effective policy (read only).

import Diagnostics
public import ProviderCache
import ProviderModel

#if canImport(Glibc)
import Glibc
#endif

extension ProviderFileSystem {
    /// An item's pin state, its effective policy and its status.
    public struct PinInfo: Sendable, Equatable {
        public var status: ItemStatus
        public var state: PinState
        public var policy: PinPolicy
    }

    /// The pin state of the item at `path` (relative to the mount root).
    public func pinInfo(ofPath path: String) async throws(FileSystemError) -> PinInfo {
        let status = try await status(ofPath: path)
        return pinInfo(status)
    }

    private func pinInfo(_ status: ItemStatus) -> PinInfo {
        PinInfo(
            status: cache.status(of: status.identifier) ?? status, state: cache.pinState(of: status.identifier),
            policy: cache.pinPolicy(of: status.identifier))
    }

    /// Sets the pin state of the item at `path`. Nothing is evicted here: the control socket's
    /// `pin` evicts an unpinned item's files through `evict` (presenters asked first).
    public func setPinState(_ pin: PinState, ofPath path: String) async throws(FileSystemError) -> PinInfo {
        let status = try await status(ofPath: path)
        do { try cache.setPinState(pin, of: status.identifier) } catch { throw FileSystemError(error) }
        return pinInfo(status)
    }

    /// `user.providerfs.pin`'s value as a state: exactly `pinned`, `unpinned` or `inherited`
    /// (a trailing newline or NUL, as `echo` or a C string leaves, is taken off); else EINVAL.
    static func pinState(from value: [UInt8]) throws(FileSystemError) -> PinState {
        var bytes = value[...]
        while let last = bytes.last, last == 0 || last == UInt8(ascii: "\n") { bytes = bytes.dropLast() }
        guard let text = String(validating: bytes, as: UTF8.self), let pin = PinState(rawValue: text) else {
            throw FileSystemError(
                .invalidArgument,
                "user.providerfs.pin takes pinned, unpinned or inherited (got \(String(decoding: value, as: UTF8.self)))"
            )
        }
        return pin
    }

    /// setxattr/removexattr of `user.providerfs.pin` on `node`: the state set, and for
    /// `unpinned` the files under it evicted where eviction allows (those in use, not uploaded
    /// or pinned below are kept), each after its presenters agreed (`evictionClaims`, as
    /// `providerfs unpin` asks them; a presenter that refuses keeps its file).
    func setPinAttribute(
        _ pin: PinState, of node: InodeTable.Node, flags: Int32, context: RequestContext
    ) async throws(FileSystemError) {
        // The attribute always exists: XATTR_CREATE fails as for any existing attribute.
        if flags & 1 != 0 {  // XATTR_CREATE
            throw FileSystemError(.exists, "user.providerfs.pin always exists")
        }
        do { try cache.setPinState(pin, of: node.identifier) } catch { throw FileSystemError(error) }
        guard pin == .unpinned else { return }
        let pid = Self.process(of: context) ?? getpid()
        for file in cache.filesWithContent(atOrUnder: node.identifier) {
            guard let evictionClaims, let path = cache.catalog.path(of: file) else {
                _ = try? await evict(file)
                continue
            }
            do throws(FileSystemError) {
                _ = try await evictionClaims.evictingClaim(path, pid: pid) { try? await self.evict(file) }
            } catch {
                logger.info("\(path): kept by user.providerfs.pin=unpinned: \(error.message)")
            }
        }
    }

    /// `user.providerfs.pin` and `user.providerfs.policy` of an item, or nil for another name.
    func pinAttribute(_ name: String, of identifier: ItemIdentifier) -> String? {
        switch name {
        case AttributeName.pin: cache.pinState(of: identifier).rawValue
        case AttributeName.policy: cache.pinPolicy(of: identifier).pinned ? "pinned" : "unpinned"
        default: nil
        }
    }
}
