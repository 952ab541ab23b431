// chmod and utimens around the write-back (D-460): one of a file whose upload must come first (its
// create is queued or running, or held attributes still wait to be made) is held by the upload
// record instead of waiting for that upload; the upload carries it, or the write-back makes it
// at the provider right after. And what follows a chmod or utimens made at the provider, whoever
// made it (`ProviderCache.setAttributes`, its twin `setAttributesNow`, the write-back's own call).

import Diagnostics
import ProviderModel
import SystemSupport

extension LocalWrites {
    /// A chmod or utimens of `identifier` while its write-back record must reach the provider
    /// first: its create is queued or running (the provider does not have the file yet, D-386),
    /// or attributes held earlier wait to be made after its upload (phase `.attributes`). Held by
    /// the record, saved before this returns (a restart finds it), then carried by the upload
    /// call that reads its terms next, or made at the provider right after the running one.
    /// Shown by the catalog under the same lock as the hold, so that the write-back's end of
    /// what it held (`heldAttributesEnded`) never comes before it. Held (false: nothing done),
    /// and the item as the catalog shows it now.
    func holdForUpload(_ identifier: ItemIdentifier, _ attributes: HeldAttributes) -> (Bool, ProviderItem?) {
        guard !attributes.isEmpty else { return (false, nil) }
        let held = state.withLock { state -> (UploadRecord, ProviderItem?)? in
            guard let record = state.uploads[identifier]?.record, record.isPending,
                record.creates || record.phase == .attributes
            else { return nil }
            _ = state.uploads[identifier]!.hold(attributes)
            return (state.uploads[identifier]!.record, writeBackCatalog.attributesHeld(identifier, attributes))
        }
        guard let (saved, shown) = held else { return (false, nil) }
        save(saved)
        return (true, shown)
    }

    /// `change` of the item's write-back, and the end of the attributes it held when that
    /// leaves none to make (under the same lock as a hold, `holdForUpload`): the catalog shows
    /// the provider's item as it comes again.
    func applyEndingHeld(
        _ identifier: ItemIdentifier, version: ContentVersion, _ change: (inout UploadMachine) -> [UploadMachine.Action]
    ) -> (ItemIdentifier, [UploadMachine.Action], UploadPhase?) {
        applyToUpload(identifier, version: version) { machine in
            let actions = change(&machine)
            if machine.record.phase == .materialized { writeBackCatalog.heldAttributesEnded(machine.record.identifier) }
            return actions
        }
    }

    /// The write-back's call for attributes held past an upload (`.setAttributes`): made at the
    /// provider as a chmod or utimens through the mount is, the item's name held still like an
    /// upload call's (D-372: moves and chmods of it wait, as for an upload), then recorded. A
    /// failure retries after the backoff; an item gone at the provider has nothing to make them
    /// on (they are dropped).
    func makeHeldAttributes(_ requested: ItemIdentifier, version: ContentVersion) async {
        let identifier = await beginUploadCall(uploadKey(requested, version: version), version: version)
        let terms = state.withLock { state -> (HeldAttributes, ContentVersion?)? in
            guard state.uploads[identifier]?.inFlight == version, state.uploads[identifier]!.record.phase == .attributes
            else { return nil }
            return (state.uploads[identifier]!.sendingAttributes(), state.uploads[identifier]!.record.providerVersion)
        }
        guard let (held, uploaded) = terms else {
            endUploadCall(identifier)
            return
        }
        // Applied before the call counts as ended, as an upload's result is.
        let own = writeBackCatalog.beginOwnChange(of: [identifier], naming: [])  // D-403
        defer {
            writeBackCatalog.endOwnChange(own)
            endUploadCall(identifier)
        }
        let provider = environment.provider
        var before = try? provider.itemNow(for: identifier)
        if before == nil { before = try? await provider.item(for: identifier) }
        var gone = false
        do {
            let item = try await provider.setAttributes(identifier, held.changes)
            // The catalog's local version keeps the time it shows (what was held, or one held since).
            versionChanged(identifier, before: before, by: item, modificationTime: nil)
        } catch let error as ProviderError where error.code == .noSuchItem {
            environment.logger.notice("\(identifier): gone before its held chmod or utimens was made: \(error)")
            gone = true
        } catch {
            let message = "\(CacheError.from(error))"
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: message)
            }
            environment.logger.warning("\(current): a held chmod or utimens failed: \(message)")
            perform(current, next)
            return
        }
        let (current, next, phase) = applyEndingHeld(identifier, version: version) {
            $0.attributesMade(version, gone: gone)
        }
        if phase == .materialized, let made = uploadRecord(of: current)?.providerVersion {
            writeBackCatalog.localUploaded(current, version: version, providerVersion: made, base: uploaded)
        }
        perform(current, next)
    }

    /// A chmod or utimens through the mount made the provider's `before` into `item` (the shared
    /// core of `ProviderCache.setAttributes`, its twin and `makeHeldAttributes`): the edits that
    /// started from the version before follow it (D-375: the queued upload's base, open staging
    /// copies', the catalog's local version), for each name of the file (D-396), and the catalog
    /// records the item. `modificationTime`: the time a utimens set, which the local version now
    /// shows and its upload carries. Returns the item as the catalog keeps it.
    @discardableResult
    func versionChanged(
        _ identifier: ItemIdentifier, before: ProviderItem?, by item: ProviderItem, modificationTime: ItemTime?
    ) -> ProviderItem {
        if let before, before.contentVersion != item.contentVersion {
            for name in [identifier] + writeBackCatalog.otherNames(of: identifier) {
                rebase(name, from: before.contentVersion, to: item.contentVersion)
                writeBackCatalog.providerVersionChanged(
                    name, from: before.contentVersion, to: item.contentVersion, modificationTime: modificationTime)
            }
        }
        return writeBackCatalog.apply(item, origin: .mount, appeared: false) { [] }
    }
}
