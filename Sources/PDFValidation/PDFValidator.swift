// Deciding whether a file is a PDF a reader will open, with a real parser (libqpdf's C API).
// The extension proves nothing and neither does a successful open, because qpdf repairs damaged
// files while it reads them: the decision comes after the page count, a full check (every object
// and stream read and decoded, `qpdf_check_pdf`) and a pass over every page's content, with every
// warning collected. A file that needed repair is accepted but flagged (`repaired`); strict mode
// refuses it. docs/PDF-VALIDATION.md.

import CQPDF
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// How to validate.
public struct PDFValidationOptions: Sendable, Equatable {
    /// The password of an encrypted file (its user or owner password); nil for none.
    public var password: String?
    /// Refuse a file qpdf had to repair or warned about (`PDFValidationError.repaired`).
    public var strict: Bool
    /// The name messages use for the file instead of its path (a staging copy's path means
    /// nothing to a person).
    public var displayName: String?

    public init(password: String? = nil, strict: Bool = false, displayName: String? = nil) {
        self.password = password
        self.strict = strict
        self.displayName = displayName
    }
}

/// What validation found in a file it accepted.
public struct PDFValidation: Sendable, Equatable, Codable {
    /// Bytes in the file validated.
    public var size: Int64
    public var pageCount: Int
    /// The header's version, e.g. "1.7".
    public var pdfVersion: String
    public var encrypted: Bool
    /// Every warning qpdf gave while reading, checking and reading page content, in order (a
    /// damaged cross-reference table, a stream of the wrong length, …). Not empty: `repaired`.
    public var warnings: [String]
    /// qpdf had to repair or work around something in the objects, streams or pages: accepted
    /// (unless strict) but flagged. Wrong linearization data does not count (D-395).
    public var repaired: Bool { !warnings.isEmpty }
    /// The libqpdf version that decided.
    public var validator: String
}

/// Why a file is not accepted as a PDF. Each case says what a person can do about it.
public enum PDFValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file cannot be opened or read (errno and its text).
    case unreadable(errno: Int32, String)
    /// Zero bytes.
    case empty
    /// No `%PDF-` header in the first 1024 bytes (PDF readers look no further).
    case notAPDF(String)
    /// The parser gave up: damaged beyond what qpdf can repair.
    case damaged(String)
    /// Encrypted, and no password was given.
    case passwordRequired
    /// Encrypted, and the password given is not its user or owner password.
    case wrongPassword
    /// A document without pages.
    case noPages
    /// A page, numbered from 1, whose content cannot be read.
    case pageContent(page: Int, String)
    /// Strict mode: qpdf had to repair or warned (the warnings).
    case repaired(warnings: [String])

    public var description: String {
        switch self {
        case .unreadable(_, let message): "cannot read the file: \(message)"
        case .empty: "the file is empty (0 bytes)"
        case .notAPDF(let why): "not a PDF: \(why)"
        case .damaged(let why): "damaged PDF: \(why)"
        case .passwordRequired: "the PDF is encrypted: a password is needed (--password-file)"
        case .wrongPassword: "the PDF is encrypted and the password given does not open it"
        case .noPages: "the PDF has no pages"
        case .pageContent(let page, let why): "page \(page) cannot be read: \(why)"
        case .repaired(let warnings):
            "the PDF needed repair (strict mode refuses it): "
                + (warnings.prefix(3).joined(separator: "; ") + (warnings.count > 3 ? "; …" : ""))
        }
    }

    /// A short machine word for reports: unreadable, empty, notAPDF, damaged, passwordRequired, …
    public var kind: String {
        switch self {
        case .unreadable: "unreadable"
        case .empty: "empty"
        case .notAPDF: "notAPDF"
        case .damaged: "damaged"
        case .passwordRequired: "passwordRequired"
        case .wrongPassword: "wrongPassword"
        case .noPages: "noPages"
        case .pageContent: "pageContent"
        case .repaired: "repaired"
        }
    }
}

/// Validates PDF files. Each call has its own parser: calls may run concurrently.
public enum PDFValidator {
    /// At most this many warnings are kept (a badly damaged file can produce thousands); the
    /// last one kept says how many more there were.
    public static let maximumWarnings = 200

    /// The libqpdf version linked.
    public static var libraryVersion: String { String(cString: qpdf_get_qpdf_version()) }

    /// Validates the file at `path`. Reads it (all of it, for the check), writes nothing.
    public static func validate(
        path: String, options: PDFValidationOptions = PDFValidationOptions()
    ) throws(PDFValidationError) -> PDFValidation {
        let size = try checkHeader(path)
        guard let qpdf = qpdf_init() else { throw .damaged("libqpdf could not start") }
        var handle: qpdf_data? = qpdf
        defer { qpdf_cleanup(&handle) }
        // Warnings are collected, not printed; errors are read through the API, not printed.
        qpdf_set_suppress_warnings(qpdf, QPDF_TRUE)
        qpdf_silence_errors(qpdf)
        var warnings = Warnings(path: path, displayName: options.displayName)

        let status = qpdf_read(qpdf, path, options.password ?? "")
        warnings.collect(qpdf)
        if status & QPDF_ERRORS != 0 {
            let (code, message) = lastError(qpdf)
            if code == qpdf_e_password { throw options.password == nil ? .passwordRequired : .wrongPassword }
            if code == qpdf_e_system { throw .unreadable(errno: EIO, warnings.named(message)) }
            throw .damaged(warnings.named(message))
        }
        let encrypted = qpdf_is_encrypted(qpdf) != QPDF_FALSE
        let version = String(cString: qpdf_get_pdf_version(qpdf))

        let pages = qpdf_get_num_pages(qpdf)
        warnings.collect(qpdf)
        guard pages >= 0 else { throw .damaged(warnings.named(lastError(qpdf).message)) }
        guard pages > 0 else { throw .noPages }

        // Every object and stream read and decoded, as `qpdf --check` does; not its linearization
        // check (no C entry point; readers ignore bad linearization data, so it repairs nothing: D-395).
        let check = qpdf_check_pdf(qpdf)
        warnings.collect(qpdf)
        if check & QPDF_ERRORS != 0 { throw .damaged(warnings.named(lastError(qpdf).message)) }

        // Every page is a page, and its content streams decode.
        for index in 0..<Int(pages) {
            let page = qpdf_get_page_n(qpdf, Int(index))
            defer { qpdf_oh_release(qpdf, page) }
            warnings.collect(qpdf)
            if qpdf_has_error(qpdf) != QPDF_FALSE {
                throw .pageContent(page: index + 1, warnings.named(lastError(qpdf).message))
            }
            guard qpdf_oh_is_dictionary(qpdf, page) != QPDF_FALSE else {
                throw .pageContent(page: index + 1, "the page object is not a dictionary")
            }
            var buffer: UnsafeMutablePointer<UInt8>?
            var length = 0
            let content = qpdf_oh_get_page_content_data(qpdf, page, &buffer, &length)
            free(buffer)
            warnings.collect(qpdf)
            if content & QPDF_ERRORS != 0 {
                throw .pageContent(page: index + 1, warnings.named(lastError(qpdf).message))
            }
        }
        qpdf_oh_release_all(qpdf)

        let result = PDFValidation(
            size: size, pageCount: Int(pages), pdfVersion: version, encrypted: encrypted,
            warnings: warnings.list, validator: "libqpdf " + libraryVersion)
        if options.strict, result.repaired { throw .repaired(warnings: result.warnings) }
        return result
    }

    /// The file's size, after checking it opens, is not empty and has a `%PDF-` header within
    /// its first 1024 bytes.
    static func checkHeader(_ path: String) throws(PDFValidationError) -> Int64 {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let code = errno
            throw .unreadable(errno: code, String(cString: strerror(code)))
        }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else {
            let code = errno
            throw .unreadable(errno: code, String(cString: strerror(code)))
        }
        guard info.st_mode & S_IFMT == S_IFREG else { throw .notAPDF("not a regular file") }
        guard info.st_size > 0 else { throw .empty }
        var head = [UInt8](repeating: 0, count: 1024)
        let count = head.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        guard count >= 0 else {
            let code = errno
            throw .unreadable(errno: code, String(cString: strerror(code)))
        }
        let marker = Array("%PDF-".utf8)
        let window = head.prefix(count)
        guard window.count >= marker.count,
            (0...(window.count - marker.count)).contains(where: { window[$0..<$0 + marker.count].elementsEqual(marker) }
            )
        else { throw .notAPDF("no %PDF- header in the first 1024 bytes") }
        return Int64(info.st_size)
    }

    static func lastError(_ qpdf: qpdf_data) -> (code: qpdf_error_code_e, message: String) {
        guard qpdf_has_error(qpdf) != QPDF_FALSE, let error = qpdf_get_error(qpdf) else {
            return (qpdf_e_internal, "libqpdf reported an error without a message")
        }
        let code = qpdf_get_error_code(qpdf, error)
        let message = String(cString: qpdf_get_error_full_text(qpdf, error))
        return (code, message)
    }

    struct Warnings {
        let path: String
        let displayName: String?
        private var kept: [String] = []
        private var dropped = 0

        init(path: String, displayName: String?) {
            self.path = path
            self.displayName = displayName
        }

        /// `message` with the file's path replaced by its display name, if one was given.
        func named(_ message: String) -> String {
            guard let displayName else { return message }
            return message.replacingOccurrences(of: path, with: displayName)
        }

        /// The warnings in order; past the limit, a last line saying how many more there were.
        var list: [String] { dropped == 0 ? kept : kept + ["… and \(dropped) more warnings"] }

        mutating func collect(_ qpdf: qpdf_data) {
            while qpdf_more_warnings(qpdf) != QPDF_FALSE {
                guard let warning = qpdf_next_warning(qpdf) else { break }
                if kept.count < PDFValidator.maximumWarnings - 1 {
                    kept.append(named(String(cString: qpdf_get_error_full_text(qpdf, warning))))
                } else {
                    dropped += 1
                }
            }
        }
    }
}
