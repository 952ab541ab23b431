// What the report says about a source before anything is copied: its category (an access path,
// a plain path in a ProviderFS mount, a local file), what its first bytes are, and the versions
// of everything involved.

import AccessTokens
import Foundation
import PDFValidation
import SystemSupport

#if canImport(Glibc)
import Glibc
#endif

/// Facts about a source path.
public struct SourceInspection: Sendable, Equatable {
    public var category: SourceCategory
    /// The ProviderFS mount point holding it, if any.
    public var mountPoint: String?
    /// Left "unread" here: the first bytes are only looked at in the copy (`fileType(_:)`), since
    /// opening the source before access is started would spend a use of a `--uses` grant and read
    /// outside the coordinated read.
    public var fileType: String
    public var versions: Versions

    /// The app's version (the project's version; reading-list ships with providerfs).
    public static let appVersion = "0.1.0"

    public static func inspect(_ path: String) -> SourceInspection {
        let mount = MountTable.containing(path).flatMap { $0.fileSystemType == "fuse.providerfs" ? $0 : nil }
        var category = SourceCategory.localFile
        if let mount {
            let relative = String(mountPointPath(path).dropFirst(mount.mountPoint.count))
            category = relative.hasPrefix("/.scoped/") ? .tokenPath : .mountPath
        }
        var provider: String?
        if let mount {
            let itemVersion = extendedAttribute(path, "user.providerfs.version")
            provider =
                "ProviderFS mount of \(mount.source) at \(mount.mountPoint)"
                + (itemVersion.map { "; item version \($0)" } ?? "")
        }
        return SourceInspection(
            category: category, mountPoint: mount?.mountPoint, fileType: "unread",
            versions: Versions(
                system: systemVersion(), provider: provider,
                app: "reading-list \(appVersion); libqpdf \(PDFValidator.libraryVersion)"))
    }

    /// `text` with every access token (`pfs_…`) replaced by `<token>`: what records, reports and
    /// messages show (a token is a secret, docs/TOKENS.md).
    public static func redacted(_ text: String) -> String { TokenRedaction.redacted(text) }

    /// "pdf", "empty", "zip", "text", "unknown", or "unreadable", from the first bytes of a file
    /// (the import's staged copy). Reads at most 8 bytes.
    static func fileType(_ path: String) -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return "unreadable" }
        defer { close(descriptor) }
        var head = [UInt8](repeating: 0, count: 8)
        let count = head.withUnsafeMutableBytes { buffer in
            retryingOnInterrupt { read(descriptor, buffer.baseAddress, 8) }
        }
        guard count >= 0 else { return "unreadable" }
        let bytes = Array(head.prefix(count))
        if bytes.isEmpty { return "empty" }
        if bytes.starts(with: Array("%PDF-".utf8)) { return "pdf" }
        if bytes.starts(with: [0x50, 0x4B, 0x03, 0x04]) { return "zip" }
        if bytes.allSatisfy(isTextByte) { return "text" }
        return "unknown"
    }

    static func isTextByte(_ byte: UInt8) -> Bool {
        byte == 9 || byte == 10 || byte == 13 || (32..<127).contains(byte)
    }

    /// "Linux <release>; <PRETTY_NAME of /etc/os-release>".
    static func systemVersion() -> String {
        var names = utsname()
        uname(&names)
        let release = withUnsafeBytes(of: &names.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        var system = "Linux \(release)"
        if let text = readTextFile("/etc/os-release"),
            let line = text.split(separator: "\n").first(where: { $0.hasPrefix("PRETTY_NAME=") })
        {
            var name = line.dropFirst("PRETTY_NAME=".count)
            while name.first == "\"" { name.removeFirst() }
            while name.last == "\"" { name.removeLast() }
            system += "; " + name
        }
        return system
    }

    static func extendedAttribute(_ path: String, _ name: String) -> String? {
        guard case .success(let bytes) = ExtendedAttributes.value(name, of: path) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }
}
