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
    /// One upload attempt of `version`. A rename while it runs moves its entry: the identifier
    /// is looked up again before and after the provider's call.
    func upload(_ requested: ItemIdentifier, version: ContentVersion, base: ContentVersion?) async {
        var identifier = uploadKey(requested, version: version)
        let provider = environment.provider
        let result: Result<ProviderItem, any Error>
        var conflictName: String?
        var entry: ContentEntry?
        // A file created through the mount and closed unwritten: the empty file (D-386).
        let empty = version.isUnborn ? try? await writeBackContent.emptyFile() : nil
        if !version.isUnborn, let item = writeBackCatalog.knownItem(identifier), item.contentVersion == version,
            let pinned = try? await writeBackContent.pin(item, isCurrent: { _ in true })
        {
            entry = pinned
        }
        defer { if let entry { writeBackContent.unpin(entry) } }
        // Every byte of the version must be in its content file: a pin of a version the store
        // has no complete record of (a race with a move) makes an empty entry, whose file would
        // upload as zeros.
        // A file to create whose item the catalog lost (its directory removed outside the mount,
        // D-386): there is nothing to create it from or in; the record goes, or it would retry
        // forever.
        if writeBackCatalog.knownItem(identifier) == nil, dropOrphanedCreate(identifier, version: version) { return }
        guard let item = writeBackCatalog.knownItem(identifier),
            let path = empty
                ?? entry.flatMap({ $0.isMaterialized ? writeBackContent.contentFilePath(identifier, version) : nil })
        else {
            // (A move during the pin retires the pinned entry: retried under the new identifier.)
            let (current, next, _) = applyToUpload(identifier, version: version) {
                $0.failed(version, message: "the local version is no longer stored")
            }
            return perform(current, next)
        }
        // No move through the mount changes the item's name while the provider's call runs.
        identifier = await beginUploadCall(identifier, version: version)
        // The record went while this waited (a delete, or a birth that left nothing to upload,
        // D-386): nothing to send, and its identifier may name another file by now.
        guard state.withLock({ $0.uploads[identifier]?.inFlight == version }) else {
            endUploadCall(identifier)
            return
        }
        // What the provider shows of the item until its result is recorded is this upload
        // (D-403: not told as a change of the provider's).
        let own = writeBackCatalog.beginOwnChange(of: [identifier], naming: [])
        // Its directory's metadata is passing until the call ends (D-384).
        let directory = writeBackCatalog.knownItem(identifier)?.parent ?? item.parent
        let holding = writeBackCatalog.beginWriting(into: directory, current: try? provider.itemNow(for: directory))
        // The base as it is now: a chmod or utimens through the mount may have rebased it while
        // this call waited (D-375).
        // The permissions a chmod during the edit set (D-385) ride along.
        let (base, permissions, creates) = state.withLock { state -> (ContentVersion?, UInt16?, Bool) in
            guard let machine = state.uploads[identifier], machine.inFlight == version else {
                return (base, nil, false)
            }
            return (machine.record.baseVersion, machine.record.permissions, machine.record.creates)
        }
        let current = writeBackCatalog.knownItem(identifier) ?? item
        do {
            // Not at the provider yet (D-386): created under its name, with its mode and mtime.
            let target: UploadTarget =
                creates ? .create(name: current.name, in: current.parent) : .replace(identifier, baseVersion: base)
            let uploaded = try await provider.upload(
                from: path, to: target, permissions: creates ? permissions ?? current.permissions : permissions,
                modificationTime: current.modificationTime)
            // Made by the upload: given to whoever created it through the mount (D-397).
            result = .success(
                creates
                    ? await environment.owned(
                        uploaded, by: current.owner, permissions: permissions ?? current.permissions)
                    : uploaded)
        } catch let error as ProviderError
            where error.code == .versionChanged || (creates && error.code == .alreadyExists)
        {
            // Keep both: the local edit under a conflict name, the provider's under the original.
            environment.logger.notice("\(identifier): the provider's version changed since the edit began: \(error)")
            do {
                let (name, created) = try await uploadConflictCopy(current, from: path)
                conflictName = name
                result = .success(created)
            } catch {
                result = .failure(error)
            }
        } catch {
            result = .failure(error)
        }
        // The result is applied before the call counts as ended: a move or a chmod/utimens that
        // waited for it (D-372, D-375) then sees the provider version this upload made, and
        // rebases from it (applied after, it was left with the version before its own change,
        // and the next edit became a conflict copy).
        defer {
            if holding { writeBackCatalog.endWriting(into: directory) }
            writeBackCatalog.endOwnChange(own)
            endUploadCall(identifier)
        }
        switch result {
        case .success(let uploaded):
            // Created (or kept as a conflict copy): the provider's answers about the identifier
            // count again (D-386).
            if creates { writeBackCatalog.born(identifier) }
            if let conflictName {
                writeBackCatalog.dropLocal(identifier)
                writeBackCatalog.applyCreated(uploaded)
                _ = try? await writeBackCatalog.item(identifier, maximumAge: .zero)
                let (current, next, _) = applyToUpload(identifier, version: version) {
                    $0.conflictResolved(conflictName: conflictName)
                }
                environment.logger.notice("\(current): conflict; the local edit is kept as \(conflictName)")
                perform(current, next)
            } else {
                let (current, next, phase) = applyToUpload(identifier, version: version) {
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
                // An empty file created unwritten: the provider's empty version is the item's now.
                if creates { writeBackCatalog.apply(uploaded, origin: .mount, appeared: false) }
                perform(current, next)
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
