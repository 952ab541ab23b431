// The validator against files built byte by byte (TestPDF) and, for encryption, files the qpdf
// command (Debian package qpdf, installed by Scripts/install-deps) encrypts.

import Foundation
import PDFValidation
import TestSupport
import Testing

@Suite("PDF validation with libqpdf")
final class PDFValidatorTests {
    let directory: TemporaryDirectory

    init() throws { directory = try TemporaryDirectory(prefix: "pdf-validation") }

    deinit { directory.remove() }

    func file(_ name: String, _ bytes: [UInt8]) throws -> String {
        try directory.write(name, bytes)
        return directory.path + "/" + name
    }

    func refusal(
        _ path: String, _ options: PDFValidationOptions = PDFValidationOptions()
    ) -> PDFValidationError? {
        do {
            let result = try PDFValidator.validate(path: path, options: options)
            Issue.record("accepted: \(result)")
            return nil
        } catch {
            return error
        }
    }

    @Test("a correct file is accepted with its page count, version and no warnings")
    func correctFile() throws {
        let path = try file("three.pdf", TestPDF(pages: 3, version: "1.6").bytes())
        let result = try PDFValidator.validate(path: path)
        #expect(result.pageCount == 3)
        #expect(result.pdfVersion == "1.6")
        #expect(!result.encrypted)
        #expect(result.warnings.isEmpty, "\(result.warnings)")
        #expect(!result.repaired)
        #expect(result.size == Int64(try readFile(path).count))
        #expect(result.validator.hasPrefix("libqpdf 11."))
        // Strict mode accepts a clean file.
        #expect(try PDFValidator.validate(path: path, options: PDFValidationOptions(strict: true)) == result)
    }

    @Test("a file qpdf repairs (its cross-reference table is wrong) is accepted but flagged; strict refuses it")
    func repairedFile() throws {
        let path = try file("repaired.pdf", TestPDF(pages: 2, wrongOffsets: true).bytes())
        let result = try PDFValidator.validate(path: path)
        #expect(result.pageCount == 2)
        #expect(result.repaired)
        #expect(!result.warnings.isEmpty)
        guard case .repaired(let warnings)? = refusal(path, PDFValidationOptions(strict: true)) else {
            Issue.record("strict mode did not refuse the repaired file")
            return
        }
        #expect(warnings == result.warnings)
    }

    @Test("the extension proves nothing: text, random bytes, an empty file, a directory are refused")
    func notPDFs() throws {
        #expect(refusal(try file("notes.pdf", Array("just some text\n".utf8)))?.kind == "notAPDF")
        var random = SeededRandom(seed: 12)
        let noise = (0..<65_536).map { _ in UInt8.random(in: 0...255, using: &random) }
        #expect(refusal(try file("noise.pdf", noise))?.kind == "notAPDF")
        #expect(refusal(try file("empty.pdf", [])) == .empty)
        #expect(refusal(directory.path)?.kind == "notAPDF")
        guard case .unreadable(let code, _)? = refusal(directory.path + "/missing.pdf") else {
            Issue.record("a missing file was not unreadable")
            return
        }
        #expect(code == ENOENT)
    }

    @Test("a header followed by garbage, or a file cut short, is never accepted as clean")
    func damagedFiles() throws {
        var random = SeededRandom(seed: 7)
        let garbage = Array("%PDF-1.7\n".utf8) + (0..<20_000).map { _ in UInt8.random(in: 0...255, using: &random) }
        #expect(refusal(try file("garbage.pdf", garbage))?.kind == "damaged")
        let whole = TestPDF(pages: 4).bytes()
        for cut in [whole.count / 4, whole.count / 2, whole.count - 20] {
            let path = try file("cut-\(cut).pdf", Array(whole.prefix(cut)))
            do {
                let result = try PDFValidator.validate(path: path)
                #expect(result.repaired, "a file cut at \(cut) of \(whole.count) bytes passed as clean")
            } catch {
                #expect(["damaged", "noPages", "pageContent"].contains(error.kind), "cut at \(cut): \(error)")
            }
        }
    }

    @Test("a page whose content stream does not decode is refused or flagged, never clean")
    func brokenContent() throws {
        let path = try file("content.pdf", TestPDF(pages: 2, brokenContent: true).bytes())
        do {
            let result = try PDFValidator.validate(path: path)
            #expect(result.repaired, "broken content passed as clean")
            #expect(result.warnings.contains { $0.contains("stream") }, "\(result.warnings)")
        } catch {
            #expect(["damaged", "pageContent"].contains(error.kind), "\(error)")
        }
        #expect(refusal(path, PDFValidationOptions(strict: true)) != nil)
    }

    @Test("a document without pages is refused")
    func zeroPages() throws {
        #expect(refusal(try file("none.pdf", TestPDF.withoutPages())) == .noPages)
    }

    @Test("encrypted: a password is required, a wrong one refused, the right one (user or owner) accepted")
    func encrypted() throws {
        let plain = try file("plain.pdf", TestPDF(pages: 2).bytes())
        let locked = directory.path + "/locked.pdf"
        try qpdf(["--encrypt", "user-secret", "owner-secret", "256", "--", plain, locked])
        #expect(refusal(locked) == .passwordRequired)
        #expect(refusal(locked, PDFValidationOptions(password: "nope")) == .wrongPassword)
        for password in ["user-secret", "owner-secret"] {
            let result = try PDFValidator.validate(path: locked, options: PDFValidationOptions(password: password))
            #expect(result.encrypted)
            #expect(result.pageCount == 2)
            #expect(!result.repaired, "\(result.warnings)")
        }
        // Encrypted with an empty user password: opens without one (as readers do), still encrypted.
        let open = directory.path + "/open.pdf"
        try qpdf(["--encrypt", "", "owner-secret", "256", "--", plain, open])
        let result = try PDFValidator.validate(path: open)
        #expect(result.encrypted)
    }

    @Test("linearization is not checked: a wrong /E in a linearized file imports clean, as D-395 decides")
    func linearizationProblemsAreNotRepairs() throws {
        let plain = try file("plain.pdf", TestPDF(pages: 3).bytes())
        let linearized = directory.path + "/linearized.pdf"
        try qpdf(["--linearize", plain, linearized])
        // Change the linearization dictionary's /E (end of the first page) to a wrong value of the
        // same width, so that no offset moves: the objects, streams and pages stay intact.
        var bytes = try readFile(linearized)
        let key = Array("/E ".utf8)
        guard let at = (0..<min(bytes.count, 300)).first(where: { bytes[$0..<($0 + key.count)].elementsEqual(key) })
        else {
            Issue.record("no /E in the linearization dictionary")
            return
        }
        let digits = bytes[(at + key.count)...].prefix { (48...57).contains($0) }
        guard let end = Int(String(decoding: digits, as: UTF8.self)) else {
            Issue.record("no number after /E")
            return
        }
        let wrong = Array(String(String(end + 10).count == digits.count ? end + 10 : end - 10).utf8)
        bytes.replaceSubrange(digits.startIndex..<digits.endIndex, with: wrong)
        try directory.write("wrong-e.pdf", bytes)
        let damaged = directory.path + "/wrong-e.pdf"
        // The fixture is what it claims: qpdf --check warns about linearization, and only that.
        let check = try qpdfCheck(damaged)
        #expect(check.status == 3, "\(check.output)")
        let warnings = check.output.split(separator: "\n").filter { $0.hasPrefix("WARNING:") }
        #expect(warnings.count == 1 && warnings.allSatisfy { $0.contains("(/E) mismatch") }, "\(check.output)")
        for path in [linearized, damaged] {
            let result = try PDFValidator.validate(path: path, options: PDFValidationOptions(strict: true))
            #expect(result.pageCount == 3)
            #expect(!result.repaired && result.warnings.isEmpty, "\(path): \(result.warnings)")
        }
    }

    @Test("concurrent validations do not disturb each other")
    func concurrent() async throws {
        let good = try file("good.pdf", TestPDF(pages: 5).bytes())
        let bad = try file("bad.pdf", TestPDF(pages: 2, wrongOffsets: true).bytes())
        let results = await withTaskGroup(of: (Int, Bool).self) { group in
            for index in 0..<16 {
                group.addTask {
                    let result = try? PDFValidator.validate(path: index % 2 == 0 ? good : bad)
                    return (index, result?.repaired ?? true)
                }
            }
            var collected: [Int: Bool] = [:]
            for await (index, repaired) in group { collected[index] = repaired }
            return collected
        }
        for (index, repaired) in results { #expect(repaired == (index % 2 == 1), "validation \(index)") }
    }

    @Test("fuzz: single-byte changes and truncations of a correct file never crash and never pass unflagged")
    func fuzz() throws {
        let original = TestPDF(pages: 2).bytes()
        var random = SeededRandom(seed: 99)
        var clean = 0
        for round in 0..<200 {
            var bytes = original
            switch round % 3 {
            case 0: bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
            case 1: bytes = Array(bytes.prefix(Int.random(in: 1..<bytes.count, using: &random)))
            default:
                bytes.insert(
                    UInt8.random(in: 0...255, using: &random), at: Int.random(in: 0..<bytes.count, using: &random))
            }
            let path = try file("fuzz.pdf", bytes)
            if let result = try? PDFValidator.validate(path: path), !result.repaired {
                // A change inside a string or a comment can leave a file that is still correct.
                #expect(result.pageCount == 2, "round \(round): accepted clean with \(result.pageCount) pages")
                clean += 1
            }
        }
        #expect(clean < 200, "every mutation passed as clean")
    }

    /// `qpdf --check PATH`: its exit status and its stdout and stderr together.
    func qpdfCheck(_ path: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/qpdf")
        process.arguments = ["--check", path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }

    func qpdf(_ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/qpdf")
        process.arguments = arguments
        do {
            try process.run()
        } catch {
            throw TestSupportError(
                "the qpdf command is needed for this test (Scripts/install-deps installs it): \(error)")
        }
        process.waitUntilExit()
        guard process.terminationStatus == 0 || process.terminationStatus == 3 else {
            throw TestSupportError("qpdf \(arguments.joined(separator: " ")) exited \(process.terminationStatus)")
        }
    }
}
