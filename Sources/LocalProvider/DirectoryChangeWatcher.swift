// Change tracking for LocalDirectoryProvider's listings (D-224): one inotify watch per listed
// directory, a generation per watch that every event in it bumps. A listing's token is the
// generation before the listing began; an unchanged generation later means nothing the listing
// shows can have changed, so the cache revalidates it without listing again.
//
// What inotify does not report, and so is only seen at the next full listing
// (`CacheOptions.fullListingInterval`): writes through a shared mapping (mmap), changes made
// through a hard link in another directory, changes on a file system that is not local
// (no token is given there), and the metadata of a subdirectory that was never listed when
// something inside it changes.
//
// Changes are also pushed (`observe`): a Dispatch read source on the inotify descriptor turns the
// events into `ProviderChange`s for the cache and, through it, the kernel's caches (D-228).

import Dispatch
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

final class DirectoryChangeWatcher: Sendable {
    private struct Watch {
        /// Unique per watch in this instance (a watch descriptor number can be reused).
        var serial: UInt64
        var generation: UInt64 = 0
        /// The identifiers listed through this watch (two when a directory is bind-mounted
        /// inside the tree: one inode, one watch).
        var identifiers: Set<ItemIdentifier> = []
    }

    private struct State {
        var fd: Int32 = -1
        var unavailable = false
        var watches: [Int32: Watch] = [:]
        var watchByIdentifier: [ItemIdentifier: Int32] = [:]
        var nextSerial: UInt64 = 1
        /// Changes read from the queue and not handed to the observer yet; `lostEvents`: the
        /// queue overflowed (anything may have changed).
        var pending: Set<ProviderChange> = []
        var lostEvents = false
        var observer: (@Sendable ([ProviderChange]?) -> Void)?
        var source: (any DispatchSourceRead)?
        var deliveryScheduled = false
    }

    /// Where pushed changes are read and delivered, one batch at a time.
    private let deliveryQueue = DispatchQueue(label: "providerfs.local-provider.changes")

    private let state = Locked(State())

    // inotify constants (the Glibc module imports some of them as enums, so spelled out here).
    /// IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF,
    /// IN_MOVE_SELF.
    static let events: UInt32 = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
    /// Changes of a directory's entries (its mtime changes): IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE,
    /// IN_DELETE.
    static let entryChanges: UInt32 = 0x40 | 0x80 | 0x100 | 0x200
    static let onlyDirectoryNoFollow: UInt32 = 0x0100_0000 | 0x0200_0000
    static let queueOverflow: UInt32 = 0x4000
    /// At most this many directories are watched at once (fs.inotify.max_user_watches is often
    /// 8,192 for all of a user's programs together on older systems).
    static let maximumWatches = 4096
    static let ignored: UInt32 = 0x8000

    /// The local file systems (SystemSupport's list), plus the less common ones the provider may
    /// serve from, and overlayfs (changes made through the overlay, not to its layers directly).
    static let localFileSystems = MountTable.localFileSystemTypes.union(["zfs", "bcachefs", "overlay"])

    /// Whether the file system of device `device` is local, per /proc/self/mountinfo, remembered
    /// per device (a listing of each directory asks).
    private let localDevices = Locked<[UInt64: Bool]>([:])

    private func isLocal(device: UInt64) -> Bool {
        if let known = localDevices.withLock({ $0[device] }) { return known }
        let entries = MountTable.entries(onDevice: device)
        let local = !entries.isEmpty && entries.allSatisfy { Self.localFileSystems.contains($0.fileSystemType) }
        localDevices.withLock { $0[device] = local }
        return local
    }

    deinit {
        state.withLock { state in
            // With a read source the descriptor is closed by its cancel handler (never under it).
            if let source = state.source {
                source.cancel()
            } else if state.fd >= 0 {
                SystemCalls.close(state.fd)
            }
        }
    }

    /// Starts handing changes to `observer`, in batches, on a queue of its own: each the entry of a
    /// watched directory that was created, deleted, renamed, written or had its metadata changed
    /// (a directory's own metadata as its entry in its parent); nil when events were lost and
    /// anything may have changed. One observer; a second call replaces it, nil stops.
    func observe(_ observer: (@Sendable ([ProviderChange]?) -> Void)?) {
        state.withLock { state in
            state.observer = observer
            if observer != nil { startSource(&state) }
        }
    }

    /// The read source on the inotify descriptor, once both exist.
    private func startSource(_ state: inout State) {
        guard state.observer != nil, state.source == nil, state.fd >= 0 else { return }
        let fd = state.fd
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: deliveryQueue)
        source.setEventHandler { [weak self] in self?.deliver() }
        source.setCancelHandler { SystemCalls.close(fd) }
        state.source = source
        source.resume()
    }

    /// Reads what is queued and hands every pending change to the observer (on `deliveryQueue`).
    private func deliver() {
        let (observer, changes) = state.withLock {
            state -> ((@Sendable ([ProviderChange]?) -> Void)?, [ProviderChange]?) in
            state.deliveryScheduled = false
            if state.fd >= 0 { Self.drain(&state) }
            defer {
                state.pending.removeAll()
                state.lostEvents = false
            }
            guard state.lostEvents || !state.pending.isEmpty else { return (nil, []) }
            return (state.observer, state.lostEvents ? nil : Array(state.pending))
        }
        observer?(changes)
    }

    /// After a drain outside `deliver` (a token or a check read the queue first): its changes
    /// still go to the observer, from the delivery queue.
    private func scheduleDelivery(_ state: inout State) {
        guard state.observer != nil, !state.deliveryScheduled, state.lostEvents || !state.pending.isEmpty else {
            return
        }
        state.deliveryScheduled = true
        deliveryQueue.async { [weak self] in self?.deliver() }
    }

    /// Watches the directory at `path` (listed as `identifier`, on device `device`) and returns the
    /// token for now; nil when it cannot be tracked. Call before listing it.
    func token(for identifier: ItemIdentifier, path: String, device: UInt64) -> ListingChangeToken? {
        guard isLocal(device: device) else { return nil }
        return state.withLock { state -> ListingChangeToken? in
            if state.fd < 0 {
                guard !state.unavailable else { return nil }
                state.fd = inotify_init1(Int32(O_NONBLOCK | O_CLOEXEC))
                guard state.fd >= 0 else {
                    state.unavailable = true
                    return nil
                }
                startSource(&state)
            }
            Self.drain(&state)
            scheduleDelivery(&state)
            // Watches are a per-user budget shared with every other program (editors, indexers):
            // past `maximumWatches` new directories are simply not tracked.
            guard state.watches.count < Self.maximumWatches || state.watchByIdentifier[identifier] != nil else {
                return nil
            }
            // ENOSPC (out of watches), ENOENT, ENOTDIR, a symbolic link: not tracked.
            let wd = inotify_add_watch(state.fd, path, Self.events | Self.onlyDirectoryNoFollow)
            guard wd >= 0 else { return nil }
            if state.watches[wd] == nil {
                state.watches[wd] = Watch(serial: state.nextSerial)
                state.nextSerial += 1
            }
            if let previous = state.watchByIdentifier[identifier], previous != wd {
                state.watches[previous]?.identifiers.remove(identifier)
            }
            state.watchByIdentifier[identifier] = wd
            state.watches[wd]!.identifiers.insert(identifier)
            let watch = state.watches[wd]!
            return ListingChangeToken(watch: Int64(wd), serial: watch.serial, generation: watch.generation)
        }
    }

    /// Whether the directory listed as `identifier` is watched now (so on a local file system).
    func isWatched(_ identifier: ItemIdentifier) -> Bool {
        state.withLock { $0.watchByIdentifier[identifier] != nil }
    }

    /// See `Provider.hasChanges(since:)`.
    func hasChanges(since token: ListingChangeToken) -> Bool {
        state.withLock { state in
            guard state.fd >= 0 else { return true }
            Self.drain(&state)
            scheduleDelivery(&state)
            guard let watch = state.watches[Int32(truncatingIfNeeded: token.watch)], watch.serial == token.serial
            else { return true }
            return watch.generation != token.generation
        }
    }

    /// Reads every queued event and bumps the generations they concern.
    private static func drain(_ state: inout State) {
        readInotifyEvents(state.fd) { events in
            for event in events {
                apply(wd: event.watch, mask: event.mask, name: event.name, to: &state)
            }
            return true
        }
    }

    private static func apply(wd: Int32, mask: UInt32, name: String, to state: inout State) {
        let hasName = !name.isEmpty
        // The provider's own upload staging files (D-351) are never pushed as changes: only the
        // rename that publishes one is, under the name it gets (its IN_MOVED_TO), with the
        // directory's own entry. Tokens still count them (conservative: the directory's mtime did
        // change).
        let staging = hasName && LocalDirectoryProvider.isTemporaryName(name)
        if mask & queueOverflow != 0 {
            // Events were lost: every token is void.
            for key in state.watches.keys { state.watches[key]!.generation &+= 1 }
            state.lostEvents = true
            return
        }
        guard var watch = state.watches[wd] else { return }
        watch.generation &+= 1
        if hasName, !staging, state.observer != nil {
            // A name that is not UTF-8 was repaired in decoding and names nothing: all entries.
            let unknown = name.unicodeScalars.contains("\u{FFFD}")
            let membership = mask & entryChanges != 0
            for identifier in watch.identifiers {
                state.pending.insert(
                    unknown
                        ? .entries(directory: identifier)
                        : membership
                            ? .membership(directory: identifier, name: name) : .entry(directory: identifier, name: name)
                )
            }
        }
        // The directory's own metadata is in its parent's listing: its mtime changes with its
        // entries, and an event without a name is about the directory itself.
        let parentsChanged = mask & entryChanges != 0 || !hasName
        if mask & ignored != 0 {
            // The watch is gone (directory deleted, file system unmounted): tokens of it are void.
            state.watches[wd] = nil
            for identifier in watch.identifiers where state.watchByIdentifier[identifier] == wd {
                state.watchByIdentifier[identifier] = nil
            }
        } else {
            state.watches[wd] = watch
        }
        guard parentsChanged else { return }
        for identifier in watch.identifiers where identifier != .root {
            let path = identifier.rawValue
            let slash = path.lastIndex(of: "/")
            let parent = slash.map { ItemIdentifier(String(path[..<$0])) } ?? .root
            if let parentWatch = state.watchByIdentifier[parent] { state.watches[parentWatch]?.generation &+= 1 }
            if state.observer != nil, !staging {
                let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
                state.pending.insert(.entry(directory: parent, name: name))
            }
        }
    }
}
