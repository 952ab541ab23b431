// The presenter side: Apple's NSFilePresenter, as a Swift protocol whose optional methods have
// default implementations that behave like "not implemented" (rule 32).

public import Foundation

/// A version of a file, for the version hooks (Linux has no NSFileVersion; this names one).
public struct FileVersion: Sendable, Hashable {
    /// Where the version's content lives.
    public var url: URL
    /// A provider- or application-defined name of the version.
    public var name: String
    /// A version named `name` stored at `url`.
    public init(url: URL, name: String) {
        self.url = url
        self.name = name
    }
}

/// An object that presents a file or directory and wants to be told before others read or write it
/// and after they did (Apple's `NSFilePresenter`). Register it with
/// `FileCoordinator.addFilePresenter(_:)`; the registry keeps it alive until
/// `removeFilePresenter(_:)` (rule 68). Every method except `presentedItemURL` runs on
/// `presentedItemOperationQueue` (rule 30). Methods with a completion handler must call it; one
/// that does not within the claimant's presenter deadline counts as having answered, and the event
/// is recorded in the claim dump (a ProviderFS addition: Apple waits forever).
public protocol FilePresenter: AnyObject, Sendable {
    /// The presented item; nil while it does not exist yet (rule 46). Must be thread-safe.
    var presentedItemURL: URL? { get }
    /// Where the other methods run. A serial queue delivers messages in order.
    var presentedItemOperationQueue: OperationQueue { get }
    /// The optional methods this presenter implements; others are skipped without a round trip.
    /// Default: all but `.accommodateEviction` (rule 34).
    var implementedPresenterMethods: PresenterMethods { get }

    /// Another coordinator wants to read: stop writing, then call `reader` with an optional
    /// reacquirer, which runs when that read is over (rules 17, 31).
    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// Another coordinator wants to write: stop using the item, then call `writer` (rule 20).
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// Save unsaved changes, then call the handler (nil: saved or nothing to save) (rules 18, 24).
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// The item is about to be deleted: close it, then call the handler; an error vetoes (rule 22).
    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// The item's local content is about to be evicted (rule 34): close it, call
    /// `FileCoordinator.removeFilePresenter(self)`, then call the handler with nil; an error vetoes
    /// the eviction. Only sent when `implementedPresenterMethods` contains `.accommodateEviction`;
    /// a presenter without it makes every eviction of its item fail.
    func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// An item inside the presented package/directory is about to be deleted (rule 22).
    func accommodatePresentedSubitemDeletion(
        at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// The item moved (rules 35–36); the registry already follows it.
    func presentedItemDidMove(to newURL: URL)
    /// A coordinated write changed the item (rule 41).
    func presentedItemDidChange()
    /// A coordinated write changed or created an item inside the presented directory (rules 41–42).
    func presentedSubitemDidChange(at url: URL)
    /// An item inside the presented directory moved (rule 37).
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL)
    /// An item appeared inside the presented directory (not relied upon, rule 42).
    func presentedSubitemDidAppear(at url: URL)
    /// A version of the item was added.
    func presentedItemDidGain(_ version: FileVersion)
    /// A version of the item was removed.
    func presentedItemDidLose(_ version: FileVersion)
    /// A conflict version of the item was resolved.
    func presentedItemDidResolveConflict(_ version: FileVersion)
    /// A version of an item inside the presented directory was added.
    func presentedSubitem(at url: URL, didGain version: FileVersion)
    /// A version of an item inside the presented directory was removed.
    func presentedSubitem(at url: URL, didLose version: FileVersion)
    /// A conflict version of an item inside the presented directory was resolved.
    func presentedSubitem(at url: URL, didResolve version: FileVersion)
}

/// Default implementations: "not implemented" (answers at once, ignores notifications, rule 32).
extension FilePresenter {
    /// Default: every method except `.accommodateEviction` (each default answers at once or does
    /// nothing; an eviction is vetoed without a round trip, rule 34).
    public var implementedPresenterMethods: PresenterMethods { .all }
    /// Default: relinquishes at once, without a reacquirer.
    public func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        reader(nil)
    }
    /// Default: relinquishes at once, without a reacquirer.
    public func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        writer(nil)
    }
    /// Default: nothing to save.
    public func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(nil)
    }
    /// Default: accepts the deletion.
    public func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(nil)
    }
    /// Default: refuses (not implemented, rule 34). Never called unless `implementedPresenterMethods`
    /// lists `.accommodateEviction`.
    public func accommodatePresentedItemEviction(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(
            CoordinationError(.presenterFailed, "This presenter does not implement accommodatePresentedItemEviction."))
    }
    /// Default: accepts the deletion.
    public func accommodatePresentedSubitemDeletion(
        at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void
    ) {
        completionHandler(nil)
    }
    /// Default: does nothing.
    public func presentedItemDidMove(to newURL: URL) {}
    /// Default: does nothing.
    public func presentedItemDidChange() {}
    /// Default: does nothing.
    public func presentedSubitemDidChange(at url: URL) {}
    /// Default: does nothing.
    public func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {}
    /// Default: does nothing.
    public func presentedSubitemDidAppear(at url: URL) {}
    /// Default: does nothing.
    public func presentedItemDidGain(_ version: FileVersion) {}
    /// Default: does nothing.
    public func presentedItemDidLose(_ version: FileVersion) {}
    /// Default: does nothing.
    public func presentedItemDidResolveConflict(_ version: FileVersion) {}
    /// Default: does nothing.
    public func presentedSubitem(at url: URL, didGain version: FileVersion) {}
    /// Default: does nothing.
    public func presentedSubitem(at url: URL, didLose version: FileVersion) {}
    /// Default: does nothing.
    public func presentedSubitem(at url: URL, didResolve version: FileVersion) {}
}
