// One upload attempt: the bytes of a local version sent to the provider (a replace of its base
// version, or the create of a file made through the mount), a conflict copy when the provider's
// version changed meanwhile, and the result recorded in the catalog and the queue.

import Diagnostics
import ProviderModel
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

extension LocalWrites {
    /// One upload attempt of `version`, in steps: the version it replaces secured for the
    /// handles that still read it (`secureReplaced`, D-494), the bytes found (`uploadSource`,
    /// `itemToSend`), the item's name held still (`beginUploadCall`, D-372), the catalog told of
    /// the call (`holdCatalog`), the provider called (`send`), the result recorded (`record`). A
    /// rename while it runs moves its entry: the identifier is looked up again before and after
    /// the provider's call.
    func upload(_ requested: ItemIdentifier, version: ContentVersion, base: ContentVersion?) async {
        // The provider keeps one version: what open handles of the one this upload replaces
        // have not read yet is fetched first (else they met ESTALE, D-494).
        guard await writeBackContent.secureReplaced(uploadKey(requested, version: version)) else {
            let (current, next, _) = applyToUpload(requested, version: version) {
                $0.failed(version, message: "the version open handles read is not cached in full yet")
            }
            perform(current, next)
            return
        }
        var identifier = uploadKey(requested, version: version)
        let source = await uploadSource(identifier, version: version)
        defer { if let entry = source.entry { writeBackContent.unpin(entry) } }
        guard let (item, path) = itemToSend(identifier, version: version, source: source) else { return }
        // No move through the mount changes the item's name while the provider's call runs.
        identifier = await beginUploadCall(identifier, version: version)
        // The record went while this waited (a delete, or a birth that left nothing to upload,
        // D-386): nothing to send, and its identifier may name another file by now.
        guard state.withLock({ $0.uploads[identifier]?.inFlight == version }) else {
            endUploadCall(identifier)
            return
        }
        let hold = holdCatalog(for: identifier, item: item)
        let terms = uploadTerms(identifier, version: version, base: base)
        let current = writeBackCatalog.knownItem(identifier) ?? item
        let (result, conflictName) = await send(path, of: current, as: identifier, terms)
        // The result is applied before the call counts as ended: a move or a chmod/utimens that
        // waited for it (D-372, D-375) then sees the provider version this upload made, and
        // rebases from it (applied after, it was left with the version before its own change,
        // and the next edit became a conflict copy).
        defer {
            releaseCatalog(hold)
            endUploadCall(identifier)
        }
        await record(result, conflictName: conflictName, of: identifier, version: version, terms: terms)
    }

    /// Where the bytes of `version` are: its pinned content entry (unpinned when the attempt
    /// ends), or the empty file for a file created through the mount and closed unwritten.
    struct UploadSource {
        var entry: ContentEntry?
        var empty: String?
    }

    /// Step 1: the bytes of `version`, as the store holds them now.
    private func uploadSource(_ identifier: ItemIdentifier, version: ContentVersion) async -> UploadSource {
        // A file created through the mount and closed unwritten: the empty file (D-386).
        let empty = version.isUnborn ? try? await writeBackContent.emptyFile() : nil
        var entry: ContentEntry?
        if !version.isUnborn, let item = writeBackCatalog.knownItem(identifier), item.contentVersion == version,
            let pinned = try? await writeBackContent.pin(item, isCurrent: { _ in true })
        {
            entry = pinned
        }
        return UploadSource(entry: entry, empty: empty)
    }

    /// Step 2: the item to send and the file that holds every byte of its version; nil when
    /// there is none (the record is dropped, or fails to retry).
    private func itemToSend(
        _ identifier: ItemIdentifier, version: ContentVersion, source: UploadSource
    ) -> (item: ProviderItem, path: String)? {
        // Every byte of the version must be in its content file: a pin of a version the store
        // has no complete record of (a race with a move) makes an empty entry, whose file would
        // upload as zeros.
        // A file to create whose item the catalog lost (its directory removed outside the mount,
        // D-386): there is nothing to create it from or in; the record goes, or it would retry
        // forever.
        if writeBackCatalog.knownItem(identifier) == nil, dropOrphanedCreate(identifier, version: version) {
            return nil
        }
        guard let item = writeBackCatalog.knownItem(identifier),
            let path = source.empty
                ?? source.entry.flatMap({
                    $0.isMaterialized ? writeBackContent.contentFilePath(identifier, version) : nil
                })
        else {
            // (A move during the pin retires the pinned entry: retried under the new identifier.)
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: "the local version is no longer stored")
            }
            perform(current, next)
            return nil
        }
        return (item, path)
    }

    /// What the catalog holds while an upload call runs (`releaseCatalog` once its result is
    /// recorded).
    struct CatalogHold {
        var own: [String]
        var directory: ItemIdentifier
        var holding: Bool
    }

    /// Step 3: the catalog told of the call.
    private func holdCatalog(for identifier: ItemIdentifier, item: ProviderItem) -> CatalogHold {
        // What the provider shows of the item until its result is recorded is this upload
        // (D-403: not told as a change of the provider's).
        let own = writeBackCatalog.beginOwnChange(of: [identifier], naming: [])
        // Its directory's metadata is passing until the call ends (D-384).
        let directory = writeBackCatalog.knownItem(identifier)?.parent ?? item.parent
        let provider = environment.provider
        let holding = writeBackCatalog.beginWriting(into: directory, current: { try? provider.itemNow(for: directory) })
        return CatalogHold(own: own, directory: directory, holding: holding)
    }

    private func releaseCatalog(_ hold: CatalogHold) {
        if hold.holding { writeBackCatalog.endWriting(into: hold.directory) }
        writeBackCatalog.endOwnChange(hold.own)
    }

    /// What the call sends besides the bytes, as the record says now.
    struct UploadTerms {
        /// The base version a replace names: a chmod or utimens through the mount may have
        /// rebased it while this call waited (D-375).
        var base: ContentVersion?
        /// The permissions a chmod during the edit set (D-385), or one held while the upload
        /// waited or ran (D-460): they ride along.
        var permissions: UInt16?
        /// The mtime a utimens held while the upload waited (D-460); nil: the item's.
        var modificationTime: ItemTime?
        /// Not at the provider yet: created by this call (D-386).
        var creates: Bool
    }

    /// Step 4: the terms, read from the record under the lock (what it holds of chmod and
    /// utimens is noted as carried: what is held after this is made after the call, D-460).
    private func uploadTerms(
        _ identifier: ItemIdentifier, version: ContentVersion, base: ContentVersion?
    ) -> UploadTerms {
        state.withLock { state in
            guard state.uploads[identifier]?.inFlight == version else {
                return UploadTerms(base: base, permissions: nil, creates: false)
            }
            let held = state.uploads[identifier]!.sendingAttributes()
            let record = state.uploads[identifier]!.record
            return UploadTerms(
                base: record.baseVersion, permissions: held.permissions, modificationTime: held.modificationTime,
                creates: record.creates)
        }
    }

    /// Step 5: the provider's call. A changed version (or, for a create, a taken name) keeps
    /// both: the local edit under a conflict name, the provider's under the original. The
    /// result, with the conflict name when one was made.
    private func send(
        _ path: String, of current: ProviderItem, as identifier: ItemIdentifier, _ terms: UploadTerms
    ) async -> (Result<ProviderItem, any Error>, conflictName: String?) {
        let (base, permissions, creates) = (terms.base, terms.permissions, terms.creates)
        do {
            // Not at the provider yet (D-386): created under its name, with its mode and mtime.
            let target: UploadTarget =
                creates ? .create(name: current.name, in: current.parent) : .replace(identifier, baseVersion: base)
            let uploaded = try await environment.provider.upload(
                from: path, to: target, permissions: creates ? permissions ?? current.permissions : permissions,
                modificationTime: terms.modificationTime ?? current.modificationTime)
            // Made by the upload: given to whoever created it through the mount (D-397).
            return (
                .success(
                    creates
                        ? await environment.owned(
                            uploaded, by: current.owner, permissions: permissions ?? current.permissions)
                        : uploaded), nil
            )
        } catch let error as ProviderError
            where error.code == .versionChanged || (creates && error.code == .alreadyExists)
        {
            // Keep both: the local edit under a conflict name, the provider's under the original.
            environment.logger.notice("\(identifier): the provider's version changed since the edit began: \(error)")
            // The copy is the mount's file: with a chmod or utimens held since the call began
            // (D-460), which the record then drops.
            var copy = writeBackCatalog.knownItem(identifier) ?? current
            let held = state.withLock { $0.uploads[identifier]?.record.heldAttributes } ?? HeldAttributes()
            held.apply(to: &copy)
            do {
                let (name, created) = try await uploadConflictCopy(copy, from: path)
                return (.success(created), name)
            } catch {
                return (.failure(error), nil)
            }
        } catch {
            return (.failure(error), nil)
        }
    }

    /// Step 6: the result recorded in the catalog and the queue, whose next actions then run.
    private func record(
        _ result: Result<ProviderItem, any Error>, conflictName: String?, of identifier: ItemIdentifier,
        version: ContentVersion, terms: UploadTerms
    ) async {
        switch result {
        case .success(let uploaded):
            // Created (or kept as a conflict copy): the provider's answers about the identifier
            // count again (D-386).
            if terms.creates { writeBackCatalog.born(identifier) }
            if let conflictName {
                await recordConflictCopy(uploaded, named: conflictName, of: identifier, version: version)
            } else {
                recordUploaded(uploaded, of: identifier, version: version, terms: terms)
            }
        case .failure(let error):
            let message = "\(CacheError.from(error))"
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: message)
            }
            environment.logger.warning("\(current): upload failed: \(message)")
            perform(current, next)
        }
    }

    /// The local edit is kept as `copy`, named `conflictName`: the item is the provider's again.
    private func recordConflictCopy(
        _ copy: ProviderItem, named conflictName: String, of identifier: ItemIdentifier, version: ContentVersion
    ) async {
        writeBackCatalog.dropLocal(identifier)
        writeBackCatalog.applyCreated(copy)
        _ = try? await writeBackCatalog.item(identifier, maximumAge: .zero)
        let (current, next, _) = applyToUpload(identifier, version: version) {
            $0.conflictResolved(conflictName: conflictName)
        }
        environment.logger.notice("\(current): conflict; the local edit is kept as \(conflictName)")
        perform(current, next)
    }

    /// `version` is at the provider as `uploaded`: the item's, and its other names'.
    private func recordUploaded(
        _ uploaded: ProviderItem, of identifier: ItemIdentifier, version: ContentVersion, terms: UploadTerms
    ) {
        let base = terms.base
        // Materialized: the upload carried what was held (D-460).
        let (current, next, phase) = applyEndingHeld(identifier, version: version) {
            $0.uploaded(version, providerVersion: uploaded.contentVersion, now: self.environment.timeline.now)
        }
        if phase == .materialized {
            writeBackCatalog.localUploaded(
                current, version: version, providerVersion: uploaded.contentVersion, base: base)
        }
        // The file's other names (hard links, D-396) have the new version too: an edit
        // through one of them that started from the version replaced starts from it now,
        // and what they showed is asked for again (D-410).
        for name in writeBackCatalog.otherNames(of: current) {
            if let base { rebase(name, from: base, to: uploaded.contentVersion) }
            writeBackCatalog.otherNameUploaded(name, from: base, to: uploaded.contentVersion)
        }
        // A created file: the provider's item is the catalog's now (the version itself when it
        // was created empty), saved with the record in one transaction (D-529).
        if terms.creates {
            writeBackCatalog.apply(uploaded, origin: .mount, appeared: false) { next.compactMap(\.savedRecord) }
            perform(current, next.filter { $0.savedRecord == nil })
        } else {
            perform(current, next)
        }
    }

    /// Uploads the local edit beside the provider's version, as "name (conflict YYYY-MM-DD
    /// HHMMSS).ext" (with " 2", " 3"… before the extension when taken).
    private func uploadConflictCopy(_ item: ProviderItem, from path: String) async throws -> (String, ProviderItem) {
        let stamp = Self.conflictStamp(wallClockTime())
        var attempt = 1
        while true {
            let name = Self.conflictName(item.name, stamp: stamp, attempt: attempt)
            do {
                let created = try await environment.provider.upload(
                    from: path, to: .create(name: name, in: item.parent), permissions: item.permissions,
                    modificationTime: item.modificationTime)
                return (name, created)
            } catch let error as ProviderError where error.code == .alreadyExists && attempt < 100 {
                attempt += 1
            }
        }
    }

    /// "YYYY-MM-DD HHMMSS" (UTC) of `time`.
    static func conflictStamp(_ time: ItemTime) -> String {
        var seconds = time_t(time.seconds)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday)) "
            + "\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec))"
    }

    /// `name` with " (conflict STAMP)" before its extension ("a.txt" → "a (conflict …).txt"; a
    /// leading dot is not an extension).
    static func conflictName(_ name: String, stamp: String, attempt: Int = 1) -> String {
        let suffix = attempt > 1 ? " (conflict \(stamp) \(attempt))" : " (conflict \(stamp))"
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return String(name[..<dot]) + suffix + String(name[dot...])
        }
        return name + suffix
    }
}
