// The authority's two files in the mount's cache directory, both mode 0600 and neither holding a
// token: `tokens.json` (tag, salt, hashed tokens; replaced atomically on every change) and
// `tokens-audit.jsonl` (the audit log, one JSON object a line, appended; rewritten with the
// entries kept when it holds twice as many). A file that cannot be read is moved aside and logged.

import Foundation
import SystemSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

final class TokenStore: Sendable {
    let tokensPath: String
    let auditPath: String
    private let log: @Sendable (String) -> Void
    /// Orders whole-file writes: held across the write by design (only writers take it; the
    /// authority's state lock is never held while waiting for it).
    private let writer = Lock()
    private let files = Locked(Files())

    private struct Files {
        var tokensGeneration: UInt64 = 0
        var auditLines = 0
    }

    init(directory: String, log: @escaping @Sendable (String) -> Void) {
        tokensPath = directory + "/tokens.json"
        auditPath = directory + "/tokens-audit.jsonl"
        self.log = log
    }

    enum Loaded {
        case loaded(StoredTokens)
        case missing
        /// Unreadable, moved aside; the string says why and where it went.
        case setAside(String)
    }

    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .secondsSince1970
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }

    static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        return decoder
    }

    func loadTokens() -> Loaded {
        let bytes: [UInt8]
        switch AtomicFile.contents(of: tokensPath) {
        case .success(let read): bytes = read
        case .failure(let error) where error == .noSuchFileOrDirectory: return .missing
        case .failure(let error): return setAside(tokensPath, "cannot read it: \(error.message)")
        }
        do {
            let stored = try Self.decoder().decode(StoredTokens.self, from: Data(bytes))
            guard stored.version == StoredTokens.formatVersion else {
                return setAside(tokensPath, "format version \(stored.version) is not \(StoredTokens.formatVersion)")
            }
            return .loaded(stored)
        } catch {
            return setAside(tokensPath, "it is not a token store (\(error))")
        }
    }

    /// Moves a damaged file aside for a person to look at.
    func setAside(_ path: String, _ reason: String) -> Loaded {
        let aside = path + ".bad-\(time(nil))-\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
        if rename(path, aside) == 0 {
            let message = "\(path) is unreadable (\(reason)); kept as \(aside)"
            log(message)
            return .setAside(message)
        }
        let message = "\(path) is unreadable (\(reason)) and cannot be moved aside (\(Errno.current.message))"
        log(message)
        return .setAside(message)
    }

    /// The audit file's entries in sequence order (the newest `limit`), and how many lines could
    /// not be read (skipped, not fatal: a crash may cut the last line short).
    func loadAudit(limit: Int) -> (entries: [TokenAuditEntry], badLines: Int) {
        guard case .success(let bytes) = AtomicFile.contents(of: auditPath) else { return ([], 0) }
        let decoder = Self.decoder()
        var entries: [TokenAuditEntry] = []
        var bad = 0
        var lines = 0
        for line in bytes.split(separator: UInt8(ascii: "\n")) {
            lines += 1
            if let entry = try? decoder.decode(TokenAuditEntry.self, from: Data(line)) {
                entries.append(entry)
            } else {
                bad += 1
            }
        }
        files.withLock { $0.auditLines = lines }
        if bad > 0 { log("\(auditPath): \(bad) unreadable lines skipped") }
        entries.sort { $0.sequence < $1.sequence }
        return (Array(entries.suffix(limit)), bad)
    }

    /// Writes the token file unless a newer generation was written already. Returns why it
    /// failed, or nil.
    func save(_ stored: StoredTokens, generation: UInt64) -> String? {
        guard let data = try? Self.encoder().encode(stored) else { return "cannot encode the tokens" }
        return writer.withLock { () -> String? in
            let newest = files.withLock { $0.tokensGeneration }
            guard generation > newest || generation == 0 else { return nil }
            if let failure = AtomicFile.replace(tokensPath, with: Array(data) + [0x0A]) { return failure }
            files.withLock { $0.tokensGeneration = max($0.tokensGeneration, generation) }
            return nil
        }
    }

    /// Appends entries; true when the file holds more than `compactAbove` lines and should be
    /// rewritten with `rewriteAudit`.
    func appendAudit(_ entries: [TokenAuditEntry], compactAbove: Int) -> Bool {
        guard !entries.isEmpty else { return false }
        let encoder = Self.encoder()
        var bytes: [UInt8] = []
        for entry in entries {
            guard let data = try? encoder.encode(entry) else { continue }
            bytes += data
            bytes.append(0x0A)
        }
        let failure = writer.withLock { AtomicFile.append(bytes, to: auditPath) }
        if let failure {
            log("cannot append to \(auditPath): \(failure)")
            return false
        }
        return files.withLock { files in
            files.auditLines += entries.count
            return files.auditLines > compactAbove
        }
    }

    /// Replaces the audit file with `entries` (the ones kept in memory).
    func rewriteAudit(_ entries: [TokenAuditEntry]) {
        let encoder = Self.encoder()
        var bytes: [UInt8] = []
        for entry in entries {
            guard let data = try? encoder.encode(entry) else { continue }
            bytes += data
            bytes.append(0x0A)
        }
        let failure = writer.withLock { AtomicFile.replace(auditPath, with: bytes) }
        if let failure {
            log("cannot rewrite \(auditPath): \(failure)")
            return
        }
        files.withLock { $0.auditLines = entries.count }
    }
}
